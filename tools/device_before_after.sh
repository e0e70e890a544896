#!/usr/bin/env bash
# Same-run before / after of one model's grid on the GPU machine: this checkout's engine against an earlier tree's,
# pi0.5 or pi0 at 2 views, horizons 10 and 50, bf16 and FP8, each side's own tools/benchmark_engine.py with the same
# arguments, one after the other on one machine (a refactor must be within the noise of the same run).
#
#   git archive <rev> flashrt_core kernels tools | (mkdir -p .cache/before && tar -x -C .cache/before)   # here
#   run with carry [".cache/before"]:  OUT=... bash tools/device_before_after.sh pi05 [after-first|before-first]
#
# BEFORE_TREE (default .cache/before, an ignored folder that the call carries): the earlier tree. The chain tuning
# runs FLASHRT_CHAIN_TUNING_PASSES passes on both sides (default 1: the two sides of one model fit one 10-minute
# call; the default engine makes two passes). The after side also runs the accuracy gate of both precisions (the fp32
# reference, 3 observations) and a tuning cache under /tmp, so its timed engine at the gate's horizon reads the
# gate engine's picks. Writes at most 7 files under $OUT: each side's engine_<side>_<model>_*.json / .md and log,
# and summary.txt (the GPU's clocks before and after, the gates, a table of medians side by side), printed last.
set -uo pipefail
MODEL="${1:?model: pi05 or pi0}"; ORDER="${2:-after-first}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD; OUT="${OUT:-test_output/device_before_after}"; BEFORE="${BEFORE_TREE:-$ROOT/.cache/before}"
PY="${FLASHRT_PYTHON:-python3}"; CK="${FLASHRT_FULL_CKPT_ROOT:-/tmp/full}"
export PYTHONUNBUFFERED=1 FLASHRT_CHAIN_TUNING_PASSES="${FLASHRT_CHAIN_TUNING_PASSES:-1}"
[ -f "$BEFORE/tools/benchmark_engine.py" ] || { echo "device_before_after.sh: no earlier tree at $BEFORE" >&2; exit 2; }
mkdir -p "$OUT"
GRID=(--ckpt-root "$CK" --configs "$MODEL" --views 2 --horizons 10 50 --fp8-configs "$MODEL" --reference-calls 2)
after() {
  FLASHRT_TUNING_CACHE=/tmp/flashrt_tuning_cache_after timeout 320 "$PY" "$ROOT/tools/benchmark_engine.py" \
    "${GRID[@]}" --out-dir "$OUT" --tag "after_$MODEL" > "$OUT/after_$MODEL.log" 2>&1
  echo "benchmark_engine rc=$?" >> "$OUT/after_$MODEL.log"
}
before() {
  (cd "$BEFORE" && timeout 260 "$PY" tools/benchmark_engine.py "${GRID[@]}" --no-gate --out-dir "$OUT" \
    --tag "before_$MODEL" > "$OUT/before_$MODEL.log" 2>&1; echo "benchmark_engine rc=$?" >> "$OUT/before_$MODEL.log")
}
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv; } > "$OUT/summary.txt" 2>&1
"$PY" -c "import sys; sys.path.insert(0, '$ROOT'); from pathlib import Path
from tools.benchmark_engine import ensure_checkpoint; ensure_checkpoint(Path('$CK'), '$MODEL')" >> "$OUT/summary.txt" 2>&1
if [ "$ORDER" = before-first ]; then before; after; else after; before; fi
"$PY" - "$OUT" "$MODEL" >> "$OUT/summary.txt" 2>&1 <<'PY'
import glob, json, sys
out, model = sys.argv[1], sys.argv[2]
cells = {}
for side in ("before", "after"):
    for path in glob.glob(f"{out}/engine_{side}_{model}*.json"):
        data = json.load(open(path))
        for r in data["rows"]:
            if "predict_ms" in r and r["variant"].startswith("engine_"):
                cells[(side, r["variant"], r["horizon"])] = (r["predict_ms"]["median"], r["predict_ms"]["p99"],
                                                             r.get("replay_ms", {}).get("median", float("nan")))
        for g in data.get("gates", []):
            print(f"gate {side} {g['config']} {g['precision']}: min cosine {g['min']:.5f}, threshold {g['threshold']}, "
                  f"pass {g['pass']}")
        for e in data.get("errors", []):
            print(f"error {side} {e['where']}: {e['trace'].strip().splitlines()[-1]}")
print("| model | variant | horizon | before median / p99 / replay (ms) | after median / p99 / replay (ms) | after - before |")
print("|---|---|---|---|---|---|")
for (side, variant, horizon), a in sorted(cells.items()):
    if side == "after":
        b = cells.get(("before", variant, horizon))
        shown = f"{b[0]:.2f} / {b[1]:.2f} / {b[2]:.2f}" if b else "-"
        delta = f"{a[0] - b[0]:+.2f}" if b else "-"
        print(f"| {model} | {variant} | {horizon} | {shown} | {a[0]:.2f} / {a[1]:.2f} / {a[2]:.2f} | {delta} |")
PY
nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv >> "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
