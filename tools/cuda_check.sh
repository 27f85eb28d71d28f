#!/usr/bin/env bash
# The CUDA checks in one run (a machine with a CUDA GPU, torch and timm; no MMLab packages needed):
#   bash tools/cuda_check.sh [OUT_DIR]
# 1. `pytest -m cuda`: backbones, attention operators, neck and denoisers under fp16 / bf16 autocast vs fp32, the batched
#    per-sample depthwise conv (one grouped conv; the shift-sum of compiled graphs) vs the CPU loop, outputs and
#    gradients, activation memory of WF-T vs DeiT-T at 1024 and 1248;
# 2. tools/analysis/benchmark.py on CUDA at 224 / 1024 / 1248 (throughput, peak and activation memory);
# 3. tools/analysis/train_step_benchmark.py: a training step of WF-T vs DeiT-T, the ImageNet recipe's (batch 256 at
#    224, AMP) and backbone + SimpleFeaturePyramid at 1024 (batch 4, AMP);
# 4. tools/analysis/generation_benchmark.py: WF-DiT vs DiT training and sampling steps at batch 32 (with
#    facebookresearch DiT's models.py and the release's model/wfm_dit.py when $DIT_MODELS / $RELEASE_DIT name them);
# 4b. tools/analysis/engine_split.py: one block's token mixer against its channel mixer, 224 to 2048 px, and its plot;
# 4c. tools/analysis/onnx_benchmark.py: ONNX Runtime's CUDA execution provider (fp32 and fp16) against eager PyTorch,
#     WF-T and DeiT-T at 224 and 1024 (when onnxruntime-gpu and onnxscript are installed);
# 5. with two GPUs: the generation configs' per-rank seeds, TF32 and DDP under NCCL, one table.
# mmengine and pytest are installed first when missing: from the wheels in $MMWF_WHEELS if set (offline), else PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-${OUT:-work_dirs/cuda_check}}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
for pkg in mmengine pytest; do
  if ! "$PY" -c "import $pkg" 2>/dev/null; then
    if [ -n "${MMWF_WHEELS:-}" ]; then
      "$PY" -m pip install -q --no-index --find-links "$MMWF_WHEELS" "$pkg"
    else
      "$PY" -m pip install -q "$pkg"
    fi
  fi
done
"$PY" -c 'import torch; assert torch.cuda.is_available(), "no CUDA device visible"; print(torch.cuda.get_device_name())' \
  | tee "$OUT/device.txt"
"$PY" -m pytest -m cuda tests/test_cuda.py -p no:cacheprovider -rA -s 2>&1 | tee "$OUT/pytest_cuda.txt"
"$PY" tools/analysis/benchmark.py --device cuda --sizes 224 1024 1248 --models wf-t wf-s static-t deit-t deit-s \
  --batch 224:64 --rounds 5 --iters 5 --plot "$OUT/benchmark.png" 2>&1 | tee "$OUT/benchmark.txt"
for spec in "classifier 256 224" "backbone+pyramid 4 1024"; do
  set -- $spec
  "$PY" tools/analysis/train_step_benchmark.py --device cuda --part "$1" --batch "$2" --size "$3" --amp \
    2>&1 | tee -a "$OUT/train_step.txt"
done
REFS=()
[ -n "${DIT_MODELS:-}" ] && REFS+=(--dit-models "$DIT_MODELS")
[ -n "${RELEASE_DIT:-}" ] && REFS+=(--release-dit "$RELEASE_DIT")
"$PY" tools/analysis/generation_benchmark.py --device cuda --batch 32 --rounds 5 "${REFS[@]}" 2>&1 \
  | tee "$OUT/generation.txt"
"$PY" tools/analysis/engine_split.py --device cuda --rounds 5 --plot "$OUT/engine_split.png" 2>&1 \
  | tee "$OUT/engine_split.txt"
if "$PY" -c 'import onnxscript, onnxruntime as o; assert "CUDAExecutionProvider" in o.get_available_providers()' \
    2>/dev/null; then
  for precision in "" --fp16; do
    "$PY" tools/analysis/onnx_benchmark.py --device cuda $precision --rounds 10 --repeat 10 \
      --work-dir "$OUT/onnx" 2>&1 | tee -a "$OUT/onnx_benchmark.txt"
  done
else
  echo "onnx_benchmark: skipped (no onnxruntime-gpu with CUDAExecutionProvider, or no onnxscript)" \
    | tee "$OUT/onnx_benchmark.txt"
fi
# 5. two GPUs (when the machine has them): the per-rank seed rule of the generation configs under NCCL, as
#    tests/engine/test_world.py checks it on gloo (the other families' configs need mmdet / mmseg / mmpretrain)
if [ "$("$PY" -c 'import torch; print(torch.cuda.device_count())')" -ge 2 ]; then
  "$PY" -m torch.distributed.run --nproc_per_node 2 -m tests.engine.world_size_run "$OUT/nccl" \
    configs/generation/wf_dit_s_2_in256.py configs/generation/dit_s_2_in256.py
  "$PY" - "$OUT/nccl" <<'PYEOF' | tee "$OUT/nccl.txt"
import json, sys
ranks = [json.load(open(f'{sys.argv[1]}/rank{r}.json')) for r in (0, 1)]
print('| config | backend | rank | seed (rule: seed 5 x 2 + rank) | first draw | TF32 in the run | params equal across ranks |')
print('|---|---|---|---|---|---|---|')
for config in ranks[0]:
    same = ranks[0][config]['params'] == ranks[1][config]['params']
    for rank, seen in enumerate(ranks):
        row = seen[config]
        print(f"| {config} | {row['backend']} | {rank} | {row['seed']} | {row['draws'][0]:.6f} | {row['tf32']} | {same} |")
PYEOF
else
  echo "fewer than two GPUs: the NCCL check (5.) skipped" | tee "$OUT/nccl.txt"
fi
