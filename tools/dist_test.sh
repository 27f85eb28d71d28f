#!/usr/bin/env bash
# Distributed test through torch.distributed (torchrun) and mmengine.
#   bash tools/dist_test.sh CONFIG CHECKPOINT GPUS [extra args]
# Several nodes: NNODES, NODE_RANK, MASTER_ADDR and PORT, e.g. on node 0 of 2:
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 bash tools/dist_test.sh ...
# Without CUDA the processes join a gloo group by themselves (no option needed).
set -euo pipefail
CONFIG=$1
CHECKPOINT=$2
GPUS=$3
shift 3
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON=${PYTHON:-python}
PYTHONPATH="$ROOT:${PYTHONPATH:-}" exec "$PYTHON" -m torch.distributed.run \
    --nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}" --master_addr="${MASTER_ADDR:-127.0.0.1}" \
    --nproc_per_node="$GPUS" --master_port="${PORT:-29500}" \
    "$ROOT/tools/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "$@"
