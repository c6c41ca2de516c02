#!/usr/bin/env bash
# Set everything up in .venv, then run the linter, the type checker and every test
# (core, the ONNX Runtime adaptor, the PyTorch adaptor) with plugins in strict mode.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check core tests plugins bench
.venv/bin/mypy
LPQ_PLUGINS_STRICT=1 .venv/bin/python -m pytest tests plugins/lpq-onnxrt/tests plugins/lpq-torch/tests -q "$@"
