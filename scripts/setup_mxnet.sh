#!/usr/bin/env bash
# Create .venv-mxnet (if missing) with lpq-core and lpq-mxnet (editable) and MXNet.
# MXNet 1.9.1 imports only with numpy<1.24, so it cannot share .venv (numpy 2, TensorFlow):
# the MXNet adaptor is tested here. Idempotent: re-running only installs what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv-mxnet/bin/python ]; then
  "$PYTHON" -m venv .venv-mxnet
fi
PIP=".venv-mxnet/bin/python -m pip"
$PIP install --quiet --upgrade pip
$PIP install --quiet -e . -e "plugins/lpq-mxnet[mxnet,test]"
