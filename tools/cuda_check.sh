#!/usr/bin/env bash
# The CUDA checks in one prepared run on a machine with a CUDA GPU, torch and timm (no MMLab packages needed):
#   bash tools/cuda_check.sh [--out DIR] [--dry-run] [--budget SECONDS] [--steps NAME ...]
# Writes DIR/results.json, DIR/results.md, DIR/log.txt and the plots (tools/analysis/cuda_check.py says what each
# step measures; the first runs the test suite on the device). --dry-run runs every step at tiny sizes on the CPU
# (CUDA-only steps skipped with the reason); without it, a machine without a CUDA device stops with an error.
# mmengine and pytest are installed first when missing: offline, every wheel in the folder $MMWF_WHEELS without
# resolving dependencies (put there mmengine and what the machine lacks of its requirements: addict, termcolor,
# yapf, platformdirs), else from the package index. mmwf runs from this checkout (PYTHONPATH), not installed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
if ! "$PY" -c "import mmengine, pytest" 2>/dev/null; then
  if [ -n "${MMWF_WHEELS:-}" ]; then
    "$PY" -m pip install -q --no-index --no-deps "$MMWF_WHEELS"/*.whl
  else
    "$PY" -m pip install -q "$(grep '^mmengine==' requirements/stack.txt)" pytest
  fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" tools/analysis/cuda_check.py "$@"
