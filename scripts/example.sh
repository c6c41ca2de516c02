#!/usr/bin/env bash
# Set everything up in .venv, list the plugins, then tune the built-in digits example:
# a small CNN trained on scikit-learn's digits, quantized to int8 within 1% accuracy.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/lpq plugins list
.venv/bin/lpq tune --example digits "$@"
