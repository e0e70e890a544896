#!/usr/bin/env python3
"""Closed-loop comparison of the chunk executors in simulated time (flashrt_ros.closed_loop_sim): tracking error,
seams at chunk switches and missed deadlines for naive execution (each chunk from its first row at arrival),
stamp-aware `latest` and `temporal_fusion`, with the observation-to-chunk delay swept over 0-300 ms.

    python tools/benchmark_chunk_execution.py --out docs/benchmarks/<date>/chunk_execution_cpu.md

The chunk source is scripted (closed_loop_sim.scripted_chunk): the target trajectory planned from the observed
plant, the tracking error fed back, and a constant offset drawn per chunk as model error."""

from __future__ import annotations

import argparse
import dataclasses
import platform
import sys
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashrt_ros.closed_loop_sim import EXECUTORS, LoopConfig, run_loop  # noqa: E402

DEFAULT_DELAYS_MS = (0, 50, 100, 200, 300)


def results_table(delays_ms: list[int], seeds: int, base: LoopConfig) -> str:
    rows = ["| delay | executor | tracking RMS | seam max | seam mean | switches | missed deadlines |",
            "|---|---|---|---|---|---|---|"]
    for delay_ms in delays_ms:
        for executor in EXECUTORS:
            runs = [run_loop(dataclasses.replace(base, delay_s=delay_ms / 1000.0, seed=seed), executor)
                    for seed in range(seeds)]
            mean = lambda f: sum(getattr(r, f) for r in runs) / len(runs)     # noqa: E731
            rows.append(f"| {delay_ms} ms | {executor} | {mean('tracking_rms'):.4f} | "
                        f"{max(r.seam_max for r in runs):.4f} | {mean('seam_mean'):.4f} | "
                        f"{mean('switches'):.0f} | {mean('deadline_misses'):.1f} |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delays-ms", type=int, nargs="+", default=list(DEFAULT_DELAYS_MS))
    parser.add_argument("--seeds", type=int, default=5, help="runs per cell (means; seam max over all)")
    parser.add_argument("--out", type=Path, help="also write the report (markdown) here")
    args = parser.parse_args()
    base = LoopConfig()
    table = results_table(args.delays_ms, args.seeds, base)
    fields = ", ".join(f"{f.name}={getattr(base, f.name)}" for f in dataclasses.fields(base)
                       if f.name not in ("delay_s", "seed"))
    report = (f"# Chunk execution in a simulated closed loop\n\n"
              f"Command: `python tools/benchmark_chunk_execution.py --seeds {args.seeds}`; "
              f"{date.today().isoformat()}, Python {platform.python_version()}, CPU only (simulated time: "
              f"the numbers do not depend on the machine).\n\n"
              f"Loop: {fields}; {args.seeds} seeds per cell (means; seam max over all seeds). "
              f"Tracking RMS in the target's units (amplitude 1).\n\n{table}\n")
    print(report)
    if args.out:
        args.out.write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
