#!/usr/bin/env bash
# The whole test suite, set-up included: bootstraps the venv (idempotent, seconds when already done),
# then runs pytest. GPU tests skip where no CUDA GPU is present. Extra arguments go to pytest.
# Without arguments, on a machine without a CUDA GPU, a second pass runs the Triton kernel tests
# (test/gpu/test_kernels.py) and the engine forward with those kernels (test/gpu/test_engine_interpreted.py, GR00T's
# fused DiT and language model: test/gpu/test_groot_fused_dit_interpreted.py, test_groot_language_interpreted.py) on
# the CPU through Triton's interpreter
# (TRITON_INTERPRET=1), so the kernels' logic and the engine's wiring of them are checked against the PyTorch
# references even where no GPU is; on a GPU the first pass runs the kernels for real.
#
# FLASHRT_DEPENDENCIES=newest tools/run_tests.sh runs the same suite in .venv-newest, made with the newest releases
# that tools/requirements-venv.txt admits instead of the pins of tools/constraints.txt: the check to run before
# bumping the pins (then tools/write_constraints.py in that venv writes the new ones).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
tools/bootstrap.sh
. tools/venv.sh
PY="$VENV/bin/python"
if (($#)); then
  exec "$PY" -m pytest -q "$@"
fi
"$PY" -m pytest -q
if "$PY" -c 'import sys, torch, triton; sys.exit(torch.cuda.is_available())' 2>/dev/null; then
  echo "[run_tests] Triton kernel tests on the CPU (TRITON_INTERPRET=1)"
  TRITON_INTERPRET=1 exec "$PY" -m pytest -q test/gpu/test_kernels.py test/gpu/test_engine_interpreted.py \
    test/gpu/test_groot_fused_dit_interpreted.py test/gpu/test_groot_language_interpreted.py
fi
