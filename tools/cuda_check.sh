#!/usr/bin/env bash
# The CUDA checks in one run (a machine with a CUDA GPU, torch and timm; no MMLab packages needed):
#   bash tools/cuda_check.sh [OUT_DIR]
# 1. `pytest -m cuda`: backbones, attention operators, neck and denoisers under fp16 / bf16 autocast vs fp32, the batched
#    per-sample depthwise conv (one grouped conv; the shift-sum of compiled graphs) vs the CPU loop, outputs and
#    gradients, activation memory of WF-T vs DeiT-T at 1024 and 1248;
# 2. tools/analysis/benchmark.py on CUDA at 224 / 1024 / 1248 (throughput, peak and activation memory);
# 3. tools/analysis/train_step_benchmark.py: a training step of WF-T vs DeiT-T, the ImageNet recipe's (batch 256 at
#    224, AMP) and backbone + SimpleFeaturePyramid at 1024 (batch 4, AMP).
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
"$PY" tools/analysis/generation_benchmark.py --device cuda --batch 32 --rounds 5 2>&1 | tee "$OUT/generation.txt"
