#!/usr/bin/env bash
# The engine's open GPU checks in one device call (about 8 minutes on the H200 machine, fresh start included):
#  1. every GPU test (test/gpu: kernels at real shapes incl. the deeper skinny GEMM candidates of session 6, both
#     PDL launch modes, the accuracy gates of pi0.5 and pi0 with the chain tuning on, replay, fusion switches)
#     (pytest.log);
#  2. the engine, pi0.5 2 views h10, bf16 and FP8, with the A/B rows of the chain tuning off (it now also weighs
#     the deeper qkv / gate_up candidates) and of pdl_early_trigger on (the chain tuning then also picks the launch
#     policy, ops.LAUNCH_POLICIES), and the FP8 row with fp8_fused_quant off (the GeGLU kernel quantizing the down
#     GEMM's input) (engine_device_checks_<date>.json/.md, engine.log);
#  3. the critical path per kernel of one bf16 replay (timeline.json, timeline.log);
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
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export FLASHRT_FULL_CKPT_ROOT="${FLASHRT_FULL_CKPT_ROOT:-/tmp/full}"
PY="${FLASHRT_PYTHON:-python3}"

timeout 280 "$PY" -m pytest -q test/gpu > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?" >> "$OUT/pytest.log"

timeout 240 "$PY" tools/benchmark_engine.py --ckpt-root "$FLASHRT_FULL_CKPT_ROOT" --configs pi05 --views 2 \
  --horizons 10 --fp8-configs pi05 --reference-calls 2 --no-gate --ab-switches-off chain_tuning \
  --ab-switches-on pdl_early_trigger --ab-fp8-switches-off fp8_fused_quant \
  --out-dir "$OUT" --tag device_checks > "$OUT/engine.log" 2>&1

timeout 60 "$PY" tools/profile_engine_timeline.py --ckpt-root "$FLASHRT_FULL_CKPT_ROOT" --config pi05 --views 2 \
  --out "$OUT/timeline.json" > "$OUT/timeline.log" 2>&1

{
  echo "== GPU tests"; tail -n 4 "$OUT/pytest.log"
  echo "== engine"; grep -hE '^\| pi05' "$OUT"/engine_device_checks_*.md 2>/dev/null || tail -n 5 "$OUT/engine.log"
  echo "== one denoising layer"; grep -A12 "one denoising layer" "$OUT/timeline.log" || tail -n 5 "$OUT/timeline.log"
} | tee "$OUT/summary.txt"
