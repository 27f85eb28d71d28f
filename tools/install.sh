#!/usr/bin/env bash
# One-command set-up of the mmwf stack in ./.venv (docs/get_started.md says what it does and why).
# Idempotent: every step is skipped when already satisfied; mmcv is built once and cached outside the repo.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MMWF_VENV:-$ROOT/.venv}"
PY_BOOT="${PYTHON:-python3.11}"
CACHE="${MMWF_CACHE:-$HOME/.cache/mmwf}"
STACK="$ROOT/requirements/stack.txt"  # the verified versions, installed as pip constraints
pin() { sed -n "s/^$1==//p" "$STACK"; }
TORCH_VER=$(pin torch)
TORCHVISION_VER=$(pin torchvision)
MMCV_VER=$(pin mmcv)

START=$SECONDS
elapsed() { printf "%d:%02d" $(( (SECONDS - START) / 60 )) $(( (SECONDS - START) % 60 )); }  # since the start
step() { CURRENT_STEP="$1"; echo "==> [mmwf install] $(elapsed) $1"; }
fail() {
  echo "!! [mmwf install] step failed: ${CURRENT_STEP:-start}" >&2
  echo "!! $1" >&2
  exit 1
}
trap 'fail "see the output above; fix the cause and re-run \`make install\` (finished steps are skipped)."' ERR

step "python interpreter"
command -v "$PY_BOOT" >/dev/null || PY_BOOT=python3
"$PY_BOOT" -c 'import sys; assert sys.version_info[:2] >= (3, 10)' \
  || fail "need Python >= 3.10 (3.11 verified); set PYTHON=/path/to/python3.11"

step "virtual environment at $VENV"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY_BOOT" -m venv "$VENV" || fail "python -m venv failed; install the venv module (Debian: apt-get install python3-venv)"
fi
PY="$VENV/bin/python"
# pip, minus the machine-level index's "Location ... is ignored" noise; keeps pip's exit status
pip_quiet() {
  "$PY" -m pip "$@" --disable-pip-version-check -q 2>&1 | { grep -v 'is ignored: it is neither a file nor a directory' || true; }
  return "${PIPESTATUS[0]}"
}
PIP=(pip_quiet install)

step "torch $TORCH_VER / torchvision $TORCHVISION_VER"
if ! "$PY" -c "import torch, torchvision; assert torch.__version__.split('+')[0] == '$TORCH_VER'" 2>/dev/null; then
  "${PIP[@]}" torch torchvision -c "$STACK" \
    || fail "pip could not install torch==$TORCH_VER torchvision==$TORCHVISION_VER (check the package index / disk space)"
fi

step "build tools and pure-Python requirements"
"${PIP[@]}" "setuptools<81" wheel ninja -r "$ROOT/requirements.txt" -c "$STACK" \
  || fail "pip could not install requirements.txt"

step "mmcv $MMCV_VER with compiled ops"
if ! "$PY" -c "import mmcv, mmcv._ext; assert mmcv.__version__ == '$MMCV_VER'" 2>/dev/null; then
  KEY=$("$PY" - <<PYEOF
import sys, torch
dev = f"cu{torch.version.cuda.replace('.', '')}" if torch.cuda.is_available() else "cpu"
print(f"mmcv{'$MMCV_VER'}-torch{torch.__version__.split('+')[0]}-{dev}-cp{sys.version_info[0]}{sys.version_info[1]}")
PYEOF
)
  WHEEL_DIR="$CACHE/wheels/$KEY"
  mkdir -p "$WHEEL_DIR"
  if ! ls "$WHEEL_DIR"/mmcv-*.whl >/dev/null 2>&1; then
    echo "    no cached wheel in $WHEEL_DIR: building mmcv from the sdist (a few minutes)"
    BUILD=$(mktemp -d)
    pip_quiet download --no-deps --no-binary :all: "mmcv==$MMCV_VER" -d "$BUILD" \
      || fail "could not download the mmcv $MMCV_VER sdist from the package index"
    tar -xzf "$BUILD"/mmcv-"$MMCV_VER".tar.gz -C "$BUILD"
    SRC="$BUILD/mmcv-$MMCV_VER"
    # torch >= 2.6 headers need C++20; the sdist hard-codes c++14/c++17.
    sed -i -e 's/-std=c++14/-std=c++20/g' -e 's/-std=c++17/-std=c++20/g' "$SRC/setup.py"
    if "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
      export FORCE_CUDA=1
      TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-$("$PY" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')}"
      export TORCH_CUDA_ARCH_LIST
    else
      export FORCE_CUDA=0
    fi
    # Nearly every source of mmcv's ops first includes csrc/common/pytorch_cpp_helper.hpp, that is torch's
    # headers: three quarters of each file's compile time. A compiler wrapper precompiles that header once, with
    # the flags of the build's first compile (all its compiles share them), and g++ then reads it from the .gch.
    # Where the .gch does not fit a compile, g++ parses the header as before: the objects are the same either way.
    # Python's flags ask for debug information (-g), about half of each compile's time on 2 cores; the wrapper
    # drops it (-g0, also for the .gch), which changes no instruction (g++ -g never changes the code; the
    # disassembly of roi_align.o is the same).
    HELPER="$SRC/mmcv/ops/csrc/common/pytorch_cpp_helper.hpp"
    mkdir "$BUILD/bin"  # named g++: torch's build checks the compiler's name
    cat > "$BUILD/bin/g++" <<CXXEOF
#!/usr/bin/env bash
set -uo pipefail
if [[ " \$* " == *" -c "* ]]; then
  exec 9>"$HELPER.lock" && flock 9
  if [ ! -e "$HELPER.tried" ]; then
    touch "$HELPER.tried"
    args=(); drop=0
    for a in "\$@"; do
      if ((drop)); then drop=0; continue; fi
      case "\$a" in
        -o|-MF) drop=1 ;;
        -c|-MMD|-MD|*.cpp|*.cc) ;;
        *) args+=("\$a") ;;
      esac
    done
    ${CXX:-c++} "\${args[@]}" -g0 -x c++-header "$HELPER" -o "$HELPER.gch.part" >/dev/null 2>&1 \
      && mv "$HELPER.gch.part" "$HELPER.gch"
  fi
  exec 9>&-
fi
exec ${CXX:-c++} "\$@" -g0
CXXEOF
    chmod +x "$BUILD/bin/g++"
    (cd "$SRC" && MMCV_WITH_OPS=1 MAX_JOBS="${MAX_JOBS:-$(nproc)}" CXX="$BUILD/bin/g++" \
      pip_quiet wheel --no-build-isolation --no-deps -w "$WHEEL_DIR" .) \
      || fail "building mmcv $MMCV_VER failed (compiler output above); a C++20 compiler (g++ >= 10) is needed"
    rm -rf "$BUILD"
  else
    echo "    using cached wheel from $WHEEL_DIR"
  fi
  "${PIP[@]}" --no-deps "$WHEEL_DIR"/mmcv-*.whl || fail "installing the cached mmcv wheel failed; delete $WHEEL_DIR and re-run"
fi

step "mmdet / mmsegmentation / mmpretrain"
"${PIP[@]}" mmdet mmsegmentation mmpretrain -c "$STACK" \
  || fail "pip could not install mmdet / mmsegmentation / mmpretrain at the versions of $STACK"

step "mmwf (editable, with its requirements) and test tools"
"${PIP[@]}" --no-build-isolation -e "$ROOT" -c "$STACK" || fail "pip install -e . failed"
"${PIP[@]}" -r "$ROOT/requirements/tests.txt" || fail "pip could not install the test requirements"
"${PIP[@]}" -r "$ROOT/requirements/deploy.txt" || fail "pip could not install the ONNX export requirements (requirements/deploy.txt)"
"${PIP[@]}" -r "$ROOT/requirements/generation.txt" || fail "pip could not install the generation requirements (requirements/generation.txt)"
"${PIP[@]}" -r "$ROOT/requirements/docs.txt" || fail "pip could not install the documentation requirements (requirements/docs.txt)"

step "cluster launchers for the tests: Slurm, munge, Open MPI (Debian packages, as root)"
LAUNCHER_PACKAGES=(slurmctld slurmd slurm-client munge openmpi-bin)
if command -v srun >/dev/null && command -v slurmctld >/dev/null && command -v munged >/dev/null \
    && command -v mpirun >/dev/null; then
  echo "    installed"
elif [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      "${LAUNCHER_PACKAGES[@]}" >/dev/null; } \
    || echo "    !! apt-get could not install ${LAUNCHER_PACKAGES[*]}: the tests through a real srun / mpirun skip"
else
  echo "    not root or no apt-get: the tests through a real srun / mpirun skip (install ${LAUNCHER_PACKAGES[*]})"
fi

step "stack check"
"$PY" -c "import mmwf; from mmwf.utils import check_stack; check_stack(require_mmcv_ops=True); print('stack ok')" \
  || fail "the stack check failed (message above)"
echo "==> [mmwf install] $(elapsed) done"
