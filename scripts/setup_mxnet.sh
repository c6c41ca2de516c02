#!/usr/bin/env bash
# Create .venv-mxnet (if missing) with lpq-core and lpq-mxnet (editable) and MXNet.
# MXNet 1.9.1 imports only with numpy<1.24, so it cannot share .venv (numpy 2, TensorFlow):
# the MXNet adaptor is tested here. Idempotent and quiet like setup.sh (its own stamp file;
# pip's output in .venv-mxnet/setup.log, printed only on failure).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv-mxnet/bin/python ]; then
  "$PYTHON" -m venv .venv-mxnet
fi
STAMP=.venv-mxnet/.lpq-setup-stamp
LOG=.venv-mxnet/setup.log
WANT=$({ .venv-mxnet/bin/python --version; cat pyproject.toml plugins/lpq-mxnet/pyproject.toml \
  scripts/setup_mxnet.sh; } | sha256sum | cut -d' ' -f1)
if [ "${LPQ_SETUP_FORCE:-0}" != 1 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] \
  && .venv-mxnet/bin/python -c "import lpq, lpq_mxnet, mxnet" >/dev/null 2>&1; then
  echo "setup: .venv-mxnet is up to date"
  exit 0
fi
echo "setup: installing into .venv-mxnet (pip output: $LOG)"
: >"$LOG"
PIP=".venv-mxnet/bin/python -m pip"
for step in "install --quiet --upgrade pip" "install --quiet -e . -e plugins/lpq-mxnet[mxnet,test]"; do
  # shellcheck disable=SC2086  # the step is a word list on purpose
  if ! $PIP $step >>"$LOG" 2>&1; then
    echo "setup: failed: pip $step" >&2
    tail -n 60 "$LOG" >&2
    exit 1
  fi
done
echo "$WANT" >"$STAMP"
echo "setup: .venv-mxnet ready"
