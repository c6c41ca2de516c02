#!/usr/bin/env bash
# Create .venv (if missing) and install lpq-core, every plugin of this repo (editable)
# and their frameworks. Idempotent: re-running only installs what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
$PIP install --quiet --upgrade pip
# torch first and pinned: the CPU build. Anything unpinned would pull CUDA wheels.
$PIP install --quiet "torch==2.13.0"
# TensorFlow (CPU build) shares .venv with torch/onnx/onnxruntime: it changes none of their
# versions (numpy, protobuf, ml_dtypes). lpq-tf brings ai-edge-litert and ai-edge-quantizer.
$PIP install --quiet "tensorflow-cpu==2.21.*"
# lpq-mxnet without its `mxnet` extra: listed by `lpq plugins list`, numpy left alone.
$PIP install --quiet -e ".[dev]" -e "plugins/lpq-onnxrt[test]" -e "plugins/lpq-torch[test]" \
  -e "plugins/lpq-tf[test]" -e plugins/lpq-mxnet
# MXNet needs numpy<1.24: its adaptor is tested in a second environment, .venv-mxnet.
bash scripts/setup_mxnet.sh
