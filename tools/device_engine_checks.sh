#!/usr/bin/env bash
# The engine's open GPU checks in one device call (about 7 minutes on the H200 machine, fresh start included):
#  1. the GPU tests of the code written without a GPU in session 5: weight-only FP8 decoder GEMMs (kernel test and
#     the pi0.5 accuracy-gate case), decoder_attention, the PDL-vs-stream-order chain, the prefetch bitwise tests,
#     the fusion switches (pytest.log);
#  2. the denoiser attention block per layer at 10 and 50 suffix rows, key blocks 32 and 64: at 50 rows, 32 is the
#     spill-free fallback plan of session 5 and 64 the plan before it (attention.json, attention.log);
#  3. the engine, pi0.5 2 views h10, bf16 and FP8, each beside its A/B row with fp8_decoder_weights
#     (engine_device_checks_<date>.json/.md, engine.log);
# then prints a short table (summary.txt). Run from anywhere; it works in the repository root.
#
#   OUT=/path bash tools/device_engine_checks.sh        # $OUT defaults to test_output/device_engine_checks
#
# Each step has its own time limit, so a step that hangs still leaves the others' results. Full-size random
# checkpoints are generated into $FLASHRT_FULL_CKPT_ROOT (default /tmp/full) on first use.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-test_output/device_engine_checks}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export FLASHRT_FULL_CKPT_ROOT="${FLASHRT_FULL_CKPT_ROOT:-/tmp/full}"
PY="${FLASHRT_PYTHON:-python3}"

timeout 260 "$PY" -m pytest -q test/gpu/test_kernels.py test/gpu/test_engine_gpu.py \
  -k "fp8_weights or fp8_decoder_weights or decoder_attention or dependent or prefetch or fusion" \
  > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?" >> "$OUT/pytest.log"

timeout 120 "$PY" tools/benchmark_attention.py --rows 10 50 --key-blocks 32 64 --out "$OUT/attention.json" \
  > "$OUT/attention.log" 2>&1

timeout 240 "$PY" tools/benchmark_engine.py --ckpt-root "$FLASHRT_FULL_CKPT_ROOT" --configs pi05 --views 2 \
  --horizons 10 --fp8-configs pi05 --reference-calls 2 --no-gate --ab-switches-on fp8_decoder_weights \
  --out-dir "$OUT" --tag device_checks > "$OUT/engine.log" 2>&1

{
  echo "== GPU tests"; tail -n 4 "$OUT/pytest.log"
  echo "== attention block per layer"; grep -E '^\| [0-9]' "$OUT/attention.log"
  echo "== engine"; grep -hE '^\| pi05' "$OUT"/engine_device_checks_*.md 2>/dev/null || tail -n 5 "$OUT/engine.log"
} | tee "$OUT/summary.txt"
