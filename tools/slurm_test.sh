#!/usr/bin/env bash
# Test on a Slurm cluster, one task per GPU (GPUS, GPUS_PER_NODE, CPUS_PER_TASK, SRUN_ARGS as tools/slurm_train.sh):
#   GPUS=8 bash tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [extra args]
set -euo pipefail
TOOL=test exec bash "$(dirname "$0")/slurm_train.sh" "$@"
