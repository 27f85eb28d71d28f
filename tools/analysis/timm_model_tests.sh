#!/usr/bin/env bash
# timm's own model tests (tests/test_models.py of the installed timm's source release, fetched with pip) on the
# models mmwf registers with timm; mmwf is imported as a pytest plugin (-p mmwf) before timm's tests collect.
# Usage: [ONLY="<-k expression>"] bash tools/analysis/timm_model_tests.sh [--all] [pytest args ...]
# (ONLY narrows the selection, e.g. ONLY="default_cfgs and deit_t"; a -k of your own would replace it)
# Deselected unless --all (docs/guides/frontends.md says why): TorchScript and torch.fx (the input checks that
# give clear errors are Python control flow on shapes; features_only uses forward_intermediates instead), and
# the pretrained downloads (the release's weights on the Hugging Face hub; tests/models/backbones/test_timm.py
# runs the same path on an offline hub cache).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
DESELECT="and not torchscript and not fx and not pretrained"
if [ "${1:-}" = "--all" ]; then DESELECT=""; shift; fi
VER=$("$PY" -c 'import timm; print(timm.__version__)')
DIR="${MMWF_TIMM_SRC:-${TMPDIR:-/tmp}/mmwf-timm-src}"
if [ ! -f "$DIR/timm-$VER/tests/test_models.py" ]; then
  mkdir -p "$DIR"
  "$PY" -m pip download --no-deps --no-binary :all: "timm==$VER" -d "$DIR" -q --disable-pip-version-check
  tar xzf "$DIR/timm-$VER.tar.gz" -C "$DIR"
fi
NAMES=$("$PY" -c 'from mmwf.models.backbones import deit_study, weightformer
print(" or ".join([*weightformer.TIMM_VARIANTS, *deit_study.TIMM_VARIANTS]))')
cd "$DIR/timm-$VER"
exec "$PY" -m pytest -p mmwf tests/test_models.py -k "($NAMES) $DESELECT ${ONLY:+and ($ONLY)}" -p no:cacheprovider \
  -W ignore "$@"
