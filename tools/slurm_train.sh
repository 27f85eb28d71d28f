#!/usr/bin/env bash
# Train on a Slurm cluster, one task per GPU (mmengine's slurm launcher reads SLURM_PROCID, SLURM_NTASKS and the
# node list; several nodes need nothing more):
#   GPUS=16 GPUS_PER_NODE=8 bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [extra args]
# Add --auto-scale-lr when GPUS x the per-GPU batch is not the config's reference batch (docs/guides/distributed.md).
# tools/slurm_test.sh runs tools/test.py through this script (TOOL=test, CHECKPOINT in place of WORK_DIR).
set -euo pipefail
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
TOOL=${TOOL:-train}
if [ "$TOOL" = train ]; then FOURTH="--work-dir=$4"; else FOURTH=$4; fi
shift 4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON=${PYTHON:-python}
# shellcheck disable=SC2086  # SRUN_ARGS holds several options
PYTHONPATH="$ROOT:${PYTHONPATH:-}" srun -p "$PARTITION" --job-name="$JOB_NAME" --gres=gpu:"$GPUS_PER_NODE" \
    --ntasks="$GPUS" --ntasks-per-node="$GPUS_PER_NODE" --cpus-per-task="$CPUS_PER_TASK" --kill-on-bad-exit=1 \
    $SRUN_ARGS "$PYTHON" -u "$ROOT/tools/$TOOL.py" "$CONFIG" "$FOURTH" --launcher=slurm "$@"
