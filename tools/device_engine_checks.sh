#!/usr/bin/env bash
# The engine's open GPU checks, in two parts that each fit one device call (<= 10 minutes with the machine's start):
#
#   OUT=/path bash tools/device_engine_checks.sh tests   # every GPU test (test/gpu), ~5-6 minutes (pytest.log)
#   OUT=/path bash tools/device_engine_checks.sh bench   # engine A/B rows + the critical path of one replay, ~5 min
#   OUT=/path bash tools/device_engine_checks.sh         # both, when one call has the time
#
# tests: the kernels at real shapes (the deeper skinny GEMM candidates, the shared-memory TMA GEMM of
#   kernels/smem_gemm.py, GeGLU with an FP8 out, both PDL modes), the accuracy gates of pi0.5 and pi0 with the chain
#   tuning on (and pi0.5 with the TMA GEMMs forced), replay, the fusion switches, the chain tuning.
# bench: pi0.5 2 views h10, bf16 and FP8, beside the A/B rows of the chain tuning off, the prefix attention tuning
#   off, the early PDL trigger, the TMA GEMMs (with and without the early trigger) and the FP8 fused quantization off
#   (engine_device_checks_<date>.json/.md, engine.log); then the critical path per kernel of one bf16 replay
#   (timeline.json, timeline.log).
# A short table last (summary.txt). Each step has its own time limit, so a step that hangs still leaves the
# others' results. Full-size random checkpoints are generated into $FLASHRT_FULL_CKPT_ROOT (default /tmp/full).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-test_output/device_engine_checks}"
PART="${1:-all}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export FLASHRT_FULL_CKPT_ROOT="${FLASHRT_FULL_CKPT_ROOT:-/tmp/full}"
PY="${FLASHRT_PYTHON:-python3}"

if [ "$PART" = tests ] || [ "$PART" = all ]; then
  timeout 420 "$PY" -m pytest -q test/gpu > "$OUT/pytest.log" 2>&1
  echo "pytest rc=$?" >> "$OUT/pytest.log"
fi

if [ "$PART" = bench ] || [ "$PART" = all ]; then
  timeout 300 "$PY" tools/benchmark_engine.py --ckpt-root "$FLASHRT_FULL_CKPT_ROOT" --configs pi05 --views 2 \
    --horizons 10 --fp8-configs pi05 --reference-calls 2 --no-gate \
    --ab-options with_pdl_early_trigger with_smem_gemm with_smem_gemm-with_pdl_early_trigger \
    --ab-switches-off chain_tuning prefix_attention_tuning \
    --ab-fp8-switches-off fp8_fused_quant --out-dir "$OUT" --tag device_checks > "$OUT/engine.log" 2>&1
  timeout 60 "$PY" tools/profile_engine_timeline.py --ckpt-root "$FLASHRT_FULL_CKPT_ROOT" --config pi05 \
    --views 2 --out "$OUT/timeline.json" > "$OUT/timeline.log" 2>&1
fi

{
  echo "== GPU tests"; tail -n 6 "$OUT/pytest.log" 2>/dev/null
  echo "== engine"; grep -hE '^\| pi05' "$OUT"/engine_device_checks_*.md 2>/dev/null || tail -n 5 "$OUT/engine.log"
  echo "== one denoising layer"
  grep -A12 "one denoising layer" "$OUT/timeline.log" 2>/dev/null || tail -n 5 "$OUT/timeline.log" 2>/dev/null
} | tee "$OUT/summary.txt"
