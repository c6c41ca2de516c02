#!/usr/bin/env bash
# Set everything up in .venv and .venv-mxnet, then run the linter, the type checker and
# every test (core, the ONNX Runtime, PyTorch, TensorFlow and MXNet adaptors) with plugins in
# strict mode.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check core tests plugins bench examples
.venv/bin/mypy
LPQ_PLUGINS_STRICT=1 .venv/bin/python -m pytest tests plugins/lpq-onnxrt/tests plugins/lpq-torch/tests \
  plugins/lpq-tf/tests plugins/lpq-mxnet/tests/test_mxnet_absent.py -q "$@"
# The MXNet adaptor in its own environment (MXNet 1.9 needs numpy<1.24). Exit code 5 means
# the extra pytest arguments selected none of its tests.
LPQ_PLUGINS_STRICT=1 .venv-mxnet/bin/python -m pytest plugins/lpq-mxnet/tests -q "$@" \
  || [ $? -eq 5 ]
