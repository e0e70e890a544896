#!/usr/bin/env bash
# The whole test suite, set-up included: bootstraps the venv (idempotent, seconds when already done),
# then runs pytest. GPU tests skip where no CUDA GPU is present. Extra arguments go to pytest.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
tools/bootstrap.sh
exec .venv/bin/python -m pytest -q "$@"
