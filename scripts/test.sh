#!/usr/bin/env bash
# Set everything up in .venv and .venv-mxnet, then run the linter, the type checker and
# every test (core, the ONNX Runtime, PyTorch, TensorFlow and MXNet adaptors) with plugins in
# strict mode. Every suite runs even when an earlier one fails; the exit status is non-zero
# if any failed, and the last lines list which.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
failed=()
suite() {
  local name=$1
  shift
  echo "== $name"
  "$@"
  local code=$?
  if [ "$code" -ne 0 ]; then
    failed+=("$name (exit $code)")
  fi
}
suite ruff .venv/bin/ruff check core tests plugins bench examples
suite mypy .venv/bin/mypy
suite pytest env LPQ_PLUGINS_STRICT=1 .venv/bin/python -m pytest tests plugins/lpq-onnxrt/tests \
  plugins/lpq-torch/tests plugins/lpq-tf/tests plugins/lpq-mxnet/tests/test_mxnet_absent.py -q "$@"
# The MXNet adaptor in its own environment (MXNet 1.9 needs numpy<1.24). Exit code 5 means
# the extra pytest arguments selected none of its tests: not a failure.
mxnet_tests() {
  LPQ_PLUGINS_STRICT=1 .venv-mxnet/bin/python -m pytest plugins/lpq-mxnet/tests -q "$@"
  local code=$?
  [ "$code" -eq 5 ] && return 0
  return "$code"
}
suite "pytest (mxnet)" mxnet_tests "$@"
if [ ${#failed[@]} -ne 0 ]; then
  echo "FAILED suites: ${failed[*]}" >&2
  exit 1
fi
echo "all suites passed"
