#!/usr/bin/env bash
# ============================================================================
#  TrainDeck launcher for Linux and macOS (twin of train_gpu.bat)
#
#    ./train_gpu.sh                          open the GUI          (python -m gui)
#    ./train_gpu.sh --preset cpu-tiny ...    train without the GUI (python -m core.train ...)
#    ./train_gpu.sh --test [pytest args]     install the test extras, run the test suite
#    ./train_gpu.sh --help
#
#  The first run creates .venv next to this file and installs torch (a CUDA
#  build when nvidia-smi reports an NVIDIA GPU, the CPU build otherwise; on
#  macOS the regular build, which uses Metal/MPS) and TrainDeck into it.
#  Later runs skip that until pyproject.toml changes.
#
#  Environment variables (all optional):
#    TRAINDECK_PYTHON=/path/to/python3     interpreter used to create .venv
#    TRAINDECK_TORCH_VARIANT=cpu|cu128     force a torch build (cpu, cu126, ...)
# ============================================================================
set -uo pipefail

# ---- keep in sync with train_gpu.bat ----------------------------------------
TORCH_VERSION="2.13.0"
# CUDA builds of torch on PyTorch's wheel index, newest first. cuXYZ needs a
# driver whose nvidia-smi reports "CUDA Version" XY.Z or newer.
TORCH_CUDA_BUILDS="cu130 cu128 cu126"
TORCH_INDEX_BASE="https://download.pytorch.org/whl"
# -----------------------------------------------------------------------------

LAUNCHER="./$(basename -- "${BASH_SOURCE[0]}")"

# say/warn LINE... : one "[traindeck] " line per argument (warn: on stderr).
say() { printf '[traindeck] %s\n' "$@"; }
warn() { printf '[traindeck] %s\n' "$@" >&2; }
die() {
    # die LINE... : print an error and stop with exit code 1.
    warn "ERROR: $1"
    shift
    [ $# -gt 0 ] && warn "$@"
    warn "Setup did not finish. Fix the problem above and run $LAUNCHER again."
    exit 1
}

usage() {
    cat <<EOF
TrainDeck launcher - sets up .venv on first use, then runs TrainDeck.

  $LAUNCHER                         open the GUI (python -m gui)
  $LAUNCHER [training options]      train without the GUI (python -m core.train ...)
  $LAUNCHER --test [pytest args]    install the test extras and run python -m pytest -q
  $LAUNCHER --help                  this text

Examples:
  $LAUNCHER --preset cpu-tiny --max-steps 5 --out runs/try
  $LAUNCHER --max-epochs 50
  $LAUNCHER --resume latest

The first run installs torch $TORCH_VERSION - a CUDA build when nvidia-smi finds an
NVIDIA GPU, else the CPU build - and TrainDeck into .venv. Delete the .venv folder
to start over. Optional: TRAINDECK_PYTHON, TRAINDECK_TORCH_VARIANT=cpu/cu128/...
EOF
    if [ -x "$VENV_PY" ]; then
        printf '\nTraining options (python -m core.train --help):\n'
        "$VENV_PY" -m core.train --help
    fi
}

# ---- work in the folder this file lives in -----------------------------------
cd -P -- "$(dirname -- "${BASH_SOURCE[0]}")" || die "Cannot enter the folder of $0."
[ -f pyproject.toml ] || die "pyproject.toml is not next to $LAUNCHER in $(pwd)." \
    "Keep $LAUNCHER in the TrainDeck folder."
ROOT="$(pwd)"
VENV="$ROOT/.venv"
VENV_PY="$VENV/bin/python"
STAMP="$VENV/traindeck-install.stamp"
OS="$(uname -s)"

# ---- what to run ---------------------------------------------------------------
MODE=cli
EXTRAS=""
if [ $# -eq 0 ]; then
    MODE=gui
else
    case "$1" in
        --help | -h)
            usage
            exit 0
            ;;
        --test)
            MODE="test"
            EXTRAS="test"
            shift
            ;;
    esac
fi

# ---- which torch build -----------------------------------------------------------
smi() {
    # A wedged driver can make nvidia-smi hang; do not wait for ever.
    if command -v timeout >/dev/null 2>&1; then
        timeout 60 nvidia-smi "$@"
    else
        nvidia-smi "$@"
    fi
}

# Sets TORCH_VARIANT (cpu, cuXYZ, or "macos") and WANT_CUDA (1 or empty).
detect_torch_variant() {
    TORCH_VARIANT=cpu
    WANT_CUDA=""
    if [ "$OS" = Darwin ]; then
        TORCH_VARIANT=macos
        say "macOS: using the regular torch build (CPU, and Apple GPUs through MPS)."
        return 0
    fi
    if [ -n "${TRAINDECK_TORCH_VARIANT:-}" ]; then
        TORCH_VARIANT="$TRAINDECK_TORCH_VARIANT"
        case "$TORCH_VARIANT" in
            cpu) ;;
            cu[0-9]*) WANT_CUDA=1 ;;
            *) die "TRAINDECK_TORCH_VARIANT must be cpu or a CUDA build like cu128, not '$TORCH_VARIANT'." ;;
        esac
        say "Using the torch build TRAINDECK_TORCH_VARIANT=$TORCH_VARIANT asks for."
        return 0
    fi
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        say "No NVIDIA GPU found (no nvidia-smi) - using the CPU build of torch."
        return 0
    fi
    local smi_out cuda_version gpu_name build num need major minor oldest=""
    if ! smi_out="$(smi 2>&1)"; then
        say "nvidia-smi is installed but reports no working NVIDIA GPU - using the CPU build" \
            "of torch. If this machine has an NVIDIA GPU, fix the driver (nvidia-smi must list" \
            "the GPU) and run $LAUNCHER again."
        return 0
    fi
    cuda_version="$(printf '%s\n' "$smi_out" | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -n 1)"
    if [ -z "$cuda_version" ]; then
        say "WARNING: nvidia-smi works but its \"CUDA Version\" could not be read - using the" \
            "CPU build of torch. Set TRAINDECK_TORCH_VARIANT=cu128 (or cu126/cu130) to choose one."
        return 0
    fi
    gpu_name="$(smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
    say "Found NVIDIA GPU: ${gpu_name:-unknown} - driver supports CUDA $cuda_version"
    major="${cuda_version%%.*}"
    minor="${cuda_version#*.}"
    num=$((10#$major * 100 + 10#$minor))
    for build in $TORCH_CUDA_BUILDS; do
        need="${build#cu}"
        oldest="$build (CUDA $((need / 10)).$((need % 10)))"
        need=$(((need / 10) * 100 + need % 10))
        if [ "$num" -ge "$need" ]; then
            TORCH_VARIANT="$build"
            WANT_CUDA=1
            say "Using the CUDA build of torch: $TORCH_VARIANT"
            return 0
        fi
    done
    say "WARNING: this NVIDIA driver is too old for torch $TORCH_VERSION: it supports CUDA $cuda_version," \
        "the oldest CUDA build of torch, $oldest, needs more. Update the NVIDIA driver" \
        "and run $LAUNCHER again. Continuing with the CPU build of torch - training will" \
        "run on the CPU (slow)."
    return 0
}

# ---- a Python to create .venv with ----------------------------------------------
python_ok() {
    "$1" -c 'import sys; sys.exit(0 if sys.version_info[:2] >= (3, 10) else 3)' >/dev/null 2>&1
}

find_python() {
    if [ -n "${TRAINDECK_PYTHON:-}" ]; then
        python_ok "$TRAINDECK_PYTHON" || die "TRAINDECK_PYTHON is set to '$TRAINDECK_PYTHON'," \
            "but that is not a working Python 3.10 or newer."
        PYTHON="$TRAINDECK_PYTHON"
        return 0
    fi
    local cand
    for cand in python3 python3.13 python3.12 python3.11 python3.10 python; do
        if command -v "$cand" >/dev/null 2>&1 && python_ok "$cand"; then
            PYTHON="$(command -v "$cand")"
            return 0
        fi
    done
    local hint="Install it with your package manager, e.g. sudo apt install python3 python3-venv"
    [ "$OS" = Darwin ] && hint="Install it from https://www.python.org/downloads/macos/ or: brew install python@3.12"
    die "No Python 3.10 or newer found (tried python3, python3.13 ... python3.10, python)." \
        "$hint" "then run $LAUNCHER again, or set TRAINDECK_PYTHON=/path/to/python3."
}

create_venv() {
    find_python
    say "Creating the virtual environment $VENV with $PYTHON ($("$PYTHON" -c 'import platform; print(platform.python_version())'))"
    if ! "$PYTHON" -m venv "$VENV"; then
        rm -rf -- "$VENV"
        die "Could not create the virtual environment $VENV." \
            "On Debian/Ubuntu the venv module is a separate package: sudo apt install python3-venv" \
            "(or python3.X-venv for your version), then run $LAUNCHER again."
    fi
    [ -x "$VENV_PY" ] || die "Creating $VENV did not produce $VENV_PY."
    # Python 3.10's bundled pip is too old for editable installs from pyproject.toml.
    "$VENV_PY" -m pip install --upgrade pip ||
        warn "WARNING: could not upgrade pip; continuing with the bundled one."
}

install_torch() {
    local spec="torch==$TORCH_VERSION"
    case "$TORCH_VARIANT" in
        macos)
            "$VENV_PY" -m pip install "$spec"
            ;;
        cpu)
            spec="$spec+cpu"
            # A CPU wheel that is already available locally (pip's configured
            # find-links / wheel cache) needs no download; otherwise this fails
            # at once without touching the network. torch's own dependencies
            # come with pip install -e . from the usual index.
            if "$VENV_PY" -m pip install --no-deps --no-index "$spec" >/dev/null 2>&1; then
                say "Installed $spec from a local wheel."
                return 0
            fi
            "$VENV_PY" -m pip install --no-deps "$spec" --index-url "$TORCH_INDEX_BASE/cpu"
            ;;
        *)
            "$VENV_PY" -m pip install "$spec+$TORCH_VARIANT" --index-url "$TORCH_INDEX_BASE/$TORCH_VARIANT"
            ;;
    esac
}

verify_torch() {
    if [ -z "$WANT_CUDA" ]; then
        "$VENV_PY" -c "import torch; print('[traindeck] torch', torch.__version__, 'imports fine')" ||
            die "torch was installed but does not import (see the message above)." \
                "Delete the .venv folder and run $LAUNCHER again."
        return 0
    fi
    local rc=0
    "$VENV_PY" -c "import sys, torch as t; ok = t.cuda.is_available(); print('[traindeck] torch', t.__version__, '- CUDA', t.version.cuda, '- GPU usable:', ok); sys.exit(0 if ok else 4 if t.version.cuda else 3)" || rc=$?
    case "$rc" in
        0) ;;
        3) die "\"Torch not compiled with CUDA enabled\": .venv holds a CPU-only torch although an" \
            "NVIDIA GPU was found. Fix: delete the .venv folder and run $LAUNCHER again, or run" \
            "  $VENV_PY -m pip install --force-reinstall 'torch==$TORCH_VERSION+$TORCH_VARIANT' --index-url $TORCH_INDEX_BASE/$TORCH_VARIANT" ;;
        4) die "torch $TORCH_VERSION+$TORCH_VARIANT is installed but cannot use the GPU." \
            "Update the NVIDIA driver, reboot, check that nvidia-smi lists the GPU, then run" \
            "$LAUNCHER again. To train on the CPU meanwhile: TRAINDECK_TORCH_VARIANT=cpu $LAUNCHER ..." ;;
        *) die "torch was installed but does not import (see the message above)." \
            "Delete the .venv folder and run $LAUNCHER again." ;;
    esac
}

# ---- set up ------------------------------------------------------------------------
detect_torch_variant

if [ -f "$VENV/pyvenv.cfg" ] && ! "$VENV_PY" -c 'import sys' >/dev/null 2>&1; then
    say "The existing .venv does not work any more - was the Python it was made from" \
        "removed or upgraded? Creating it again."
    rm -rf -- "$VENV" || die "Could not delete the broken $VENV."
fi
[ -f "$VENV/pyvenv.cfg" ] || create_venv

DEPS_HASH="$("$VENV_PY" -c "import hashlib; print(hashlib.sha256(open('pyproject.toml', 'rb').read()).hexdigest())")" ||
    die "The Python in $VENV could not read pyproject.toml. Delete .venv and run $LAUNCHER again."
WANT_STAMP="$DEPS_HASH torch=$TORCH_VERSION+$TORCH_VARIANT"
HAVE_STAMP=""
[ -f "$STAMP" ] && HAVE_STAMP="$(head -n 1 "$STAMP")"

if [ "$HAVE_STAMP" = "$WANT_STAMP extras=test" ] ||
    { [ -z "$EXTRAS" ] && [ "$HAVE_STAMP" = "$WANT_STAMP extras=" ]; }; then
    say "Dependencies up to date (torch $TORCH_VERSION+$TORCH_VARIANT) - skipping installation."
else
    rm -f -- "$STAMP"
    say "Installing torch $TORCH_VERSION ($TORCH_VARIANT build) - the first time this takes a while ..."
    if ! install_torch; then
        msg=("Installing torch $TORCH_VERSION ($TORCH_VARIANT build) failed (see pip's message above)."
            "Check the internet connection ($TORCH_INDEX_BASE must be reachable).")
        [ -n "$WANT_CUDA" ] && msg+=("If pip found no matching torch: TRAINDECK_TORCH_VARIANT=cpu or another CUDA build: $TORCH_CUDA_BUILDS")
        die "${msg[@]}"
    fi
    PROJECT_SPEC="."
    [ -n "$EXTRAS" ] && PROJECT_SPEC=".[$EXTRAS]"
    say "Installing TrainDeck and its dependencies: pip install -e \"$PROJECT_SPEC\""
    "$VENV_PY" -m pip install -e "$PROJECT_SPEC" ||
        die "pip install -e \"$PROJECT_SPEC\" failed (see pip's message above)."
    verify_torch
    printf '%s extras=%s\n' "$WANT_STAMP" "$EXTRAS" >"$STAMP"
    say "Installation complete."
fi

# ---- run ------------------------------------------------------------------------------
case "$MODE" in
    gui)
        if [ "$OS" != Darwin ] && [ -z "${DISPLAY:-}${WAYLAND_DISPLAY:-}${QT_QPA_PLATFORM:-}" ]; then
            warn "WARNING: no display found (DISPLAY/WAYLAND_DISPLAY unset); the GUI will probably not" \
                "start. Train without it instead, e.g.: $LAUNCHER --preset cpu-tiny"
        fi
        say "Starting the GUI: python -m gui   (command-line training: $LAUNCHER --help)"
        exec "$VENV_PY" -m gui
        ;;
    test)
        if [ "$OS" != Darwin ] && [ -z "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ]; then
            export QT_QPA_PLATFORM="${QT_QPA_PLATFORM:-offscreen}"
        fi
        # ${1+"$@"}: no "unbound variable" from bash 3.2 (macOS) when $# is 0.
        say "Running the tests: python -m pytest -q ${*-}"
        exec "$VENV_PY" -m pytest -q ${1+"$@"}
        ;;
    *)
        say "Training without the GUI: python -m core.train $*"
        exec "$VENV_PY" -m core.train "$@"
        ;;
esac
