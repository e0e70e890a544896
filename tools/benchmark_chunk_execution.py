#!/usr/bin/env python3
"""Closed-loop comparison of the chunk executors in simulated time (flashrt_ros.closed_loop_sim): tracking error,
seams at chunk switches and missed deadlines for naive execution (each chunk from its first row at arrival),
stamp-aware `latest` and `temporal_fusion`, and `latest` with real-time chunking (RTC: guided, guided_identity,
hard_prefix), with the observation-to-chunk delay swept over 0-300 ms.

    python tools/benchmark_chunk_execution.py --out docs/benchmarks/<date>/chunk_execution_cpu.md

Two chunk sources, one table each. The flow source (flashrt_ros.flow_chunk_source) samples every chunk with a
flow-matching sampler from a multi-modal mixture, so consecutive chunks disagree as a policy's do and RTC can
condition it: its table has every executor, the non-RTC columns from the same noise being the baseline. The
scripted source (closed_loop_sim.scripted_chunk: the target planned from the observed plant, the error fed back,
a constant offset per chunk) cannot be conditioned; its table compares the executors without sampling."""

from __future__ import annotations

import argparse
import dataclasses
import platform
import sys
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashrt_ros.closed_loop_sim import EXECUTORS, RTC_EXECUTORS, LoopConfig, run_loop  # noqa: E402

DEFAULT_DELAYS_MS = (0, 50, 100, 200, 300)


def results_table(delays_ms: list[int], seeds: int, base: LoopConfig, executors: tuple[str, ...]) -> str:
    rows = ["| delay | executor | tracking RMS | seam max | seam mean | switches | missed deadlines |",
            "|---|---|---|---|---|---|---|"]
    for delay_ms in delays_ms:
        for executor in executors:
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
    parser.add_argument("--flow-duration-s", type=float, default=4.0,
                        help="simulated seconds per flow-source run (each chunk is a 10-step sampler call)")
    parser.add_argument("--out", type=Path, help="also write the report (markdown) here")
    args = parser.parse_args()
    scripted = LoopConfig()
    flow = dataclasses.replace(scripted, source="flow", duration_s=args.flow_duration_s)
    flow_table = results_table(args.delays_ms, args.seeds, flow, EXECUTORS + RTC_EXECUTORS)
    scripted_table = results_table(args.delays_ms, args.seeds, scripted, EXECUTORS)
    fields = lambda config, names: ", ".join(f"{n}={getattr(config, n)}" for n in names)    # noqa: E731
    common = [f.name for f in dataclasses.fields(scripted) if f.name not in ("delay_s", "seed", "source")
              and not f.name.startswith(("flow_", "rtc_")) and f.name != "duration_s"]
    flow_only = [f.name for f in dataclasses.fields(scripted) if f.name.startswith(("flow_", "rtc_"))]
    report = (f"# Chunk execution in a simulated closed loop\n\n"
              f"Command: `python tools/benchmark_chunk_execution.py --seeds {args.seeds} --flow-duration-s "
              f"{args.flow_duration_s:g}`; {date.today().isoformat()}, Python {platform.python_version()}, CPU only "
              f"(simulated time: the numbers do not depend on the machine).\n\n"
              f"Loop: {fields(scripted, common)}; {args.seeds} seeds per cell (means; seam max over all seeds). "
              f"Tracking RMS in the target's units (amplitude 1).\n\n"
              f"Two chunk sources: only a sampler can be conditioned, so the RTC columns need the flow source, and "
              f"its non-RTC columns (same noise) are their baseline; the scripted source keeps the executors' "
              f"comparison free of sampling (one chunk per observation, one random offset per chunk).\n\n"
              f"## Flow source: a sampler RTC can condition\n\n"
              f"Each chunk is sampled (flashrt_ros/flow_chunk_source.py) from a Gaussian mixture around the scripted "
              f"chunk whose modes lie a few chunk_noise apart; `rtc_*` is `latest` with each chunk conditioned on the "
              f"executor's pending actions in that RTC mode (training_time needs a checkpoint trained for it: not "
              f"here). Every column samples from the same noise. {fields(flow, flow_only)}, "
              f"duration_s={flow.duration_s:g}.\n\n{flow_table}\n\n"
              f"## Scripted source: the executors without sampling\n\n"
              f"The scripted chunk with a random constant offset per chunk; duration_s={scripted.duration_s:g}."
              f"\n\n{scripted_table}\n")
    print(report)
    if args.out:
        args.out.write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
