#!/usr/bin/env bash
# Create .venv (if missing) and install lpq-core, every plugin of this repo (editable)
# and their frameworks. Idempotent and quiet: a stamp file (.venv/.lpq-setup-stamp) holds
# a hash of everything that decides what gets installed (the pyproject files, these
# scripts, the Python version); when it matches and the packages import, nothing is
# installed again. pip's output goes to .venv/setup.log, printed only when a step fails.
# LPQ_SETUP_FORCE=1 re-installs regardless.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
STAMP=.venv/.lpq-setup-stamp
LOG=.venv/setup.log
stamp() {
  { .venv/bin/python --version; cat pyproject.toml plugins/*/pyproject.toml scripts/setup.sh; } \
    | sha256sum | cut -d' ' -f1
}
WANT=$(stamp)
if [ "${LPQ_SETUP_FORCE:-0}" != 1 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] \
  && .venv/bin/python -c "import lpq, lpq_onnxrt, lpq_torch, lpq_tf, lpq_mxnet, torch, tensorflow" \
    >/dev/null 2>&1; then
  echo "setup: .venv is up to date (delete $STAMP or set LPQ_SETUP_FORCE=1 to reinstall)"
else
  echo "setup: installing into .venv (pip output: $LOG)"
  : >"$LOG"
  run() {
    if ! "$@" >>"$LOG" 2>&1; then
      echo "setup: failed: $*" >&2
      tail -n 60 "$LOG" >&2
      exit 1
    fi
  }
  PIP=".venv/bin/python -m pip"
  run $PIP install --quiet --upgrade pip
  # torch first and pinned: the CPU build. Anything unpinned would pull CUDA wheels.
  run $PIP install --quiet "torch==2.13.0"
  # TensorFlow (CPU build) shares .venv with torch/onnx/onnxruntime: it changes none of their
  # versions (numpy, protobuf, ml_dtypes). lpq-tf brings ai-edge-litert and ai-edge-quantizer.
  run $PIP install --quiet "tensorflow-cpu==2.21.*"
  # lpq-mxnet without its `mxnet` extra: listed by `lpq plugins list`, numpy left alone.
  run $PIP install --quiet -e ".[dev]" -e "plugins/lpq-onnxrt[test]" -e "plugins/lpq-torch[test]" \
    -e "plugins/lpq-tf[test]" -e plugins/lpq-mxnet
  echo "$WANT" >"$STAMP"
  echo "setup: .venv ready"
fi
# MXNet needs numpy<1.24: its adaptor is tested in a second environment, .venv-mxnet.
bash scripts/setup_mxnet.sh
