"""Plots of a run, from a bag of its ActionChunks: what a robotics engineer looks at first.

    python -m flashrt_ros.chunk_plots BAG --out-dir runs/plots [--topic /action_chunk] [--control-rate-hz 100]

writes three PNG files:

- ``staleness.png``: each chunk's observation-to-action staleness and inference time over the run (bag time);
- ``latency_histogram.png``: the distributions of both, with median and p99;
- ``executed_actions.png``: the commands the action executor gives at ``--control-rate-hz`` (its chunk schedule
  replayed offline, each chunk from the time the bag received it, switching ``--switching``), per action
  dimension, with each switch to a newer chunk marked by its seam.

The bag is a recording of the live node (``bag_recorder`` or ``ros2 bag record``) or an evaluator output.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flashrt_ros.bag_common import BagError
from flashrt_ros.bag_evaluator import Chunk, read_chunk_bag
from flashrt_ros.chunk_schedule import ChunkRejected, ChunkSchedule, Switching, TimedChunk

LOGGER = logging.getLogger(__name__)
PLOT_FILES = ("staleness.png", "latency_histogram.png", "executed_actions.png")
DEFAULT_DIMS = 3


@dataclass(frozen=True)
class ExecutedTrace:
    """The executor's commands at the control rate: times [s, bag clock], commands [ticks, action_dim], and the
    switches (time, seam, chunk sequence)."""

    times_s: np.ndarray
    commands: np.ndarray
    switch_times_s: np.ndarray
    seams: np.ndarray
    switch_sequences: np.ndarray
    deadline_misses: int


def executed_trace(chunks: Sequence[Chunk], control_rate_hz: float, switching: Switching = Switching.LATEST,
                   fusion_decay: float = 10.0) -> ExecutedTrace:
    """Replay the action executor's schedule over the chunks: chunk ``c`` becomes known at ``c.receive_ns``; from
    the first arrival to the last chunk's end, one command per control period (a missed deadline holds)."""
    usable = sorted((c for c in chunks if c.dt > 0), key=lambda c: c.receive_ns)
    if not usable:
        raise BagError("no chunk with a positive dt to execute")
    schedule = ChunkSchedule(switching, fusion_decay, interpolate=True)
    start = usable[0].receive_ns * 1e-9
    end = max(c.stamp_ns * 1e-9 + (len(c.actions) - 1) * c.dt for c in usable)
    times = start + np.arange(int(np.floor((end - start) * control_rate_hz)) + 1) / control_rate_hz
    commands, switch_times, seams, sequences = [], [], [], []
    pending, misses, last = 0, 0, None
    for t in times:
        while pending < len(usable) and usable[pending].receive_ns * 1e-9 <= t:
            chunk = usable[pending]
            try:
                schedule.add(TimedChunk(chunk.stamp_ns * 1e-9, chunk.dt, chunk.actions.astype(np.float64),
                                        chunk.sequence))
            except ChunkRejected as error:
                LOGGER.warning("chunk %d skipped: %s", chunk.sequence, error)
            pending += 1
        command = schedule.command(float(t))
        if command is None:
            misses += 1
            commands.append(last if last is not None else np.full(usable[0].actions.shape[1], np.nan))
            continue
        if command.switched:
            switch_times.append(t)
            seams.append(command.seam)
            sequences.append(command.source_sequence)
        last = command.action
        commands.append(command.action)
    return ExecutedTrace(times, np.stack(commands), np.asarray(switch_times), np.asarray(seams),
                         np.asarray(sequences, dtype=np.int64), misses)


def _percentile_label(values_ms: np.ndarray) -> str:
    return f"median {np.median(values_ms):.1f} ms, p99 {np.percentile(values_ms, 99):.1f} ms"


def write_plots(chunks: Sequence[Chunk], out_dir: Path, control_rate_hz: float, switching: Switching,
                dims: int = DEFAULT_DIMS) -> list[Path]:
    """The three PNG files of the module docstring; returns their paths."""
    import matplotlib
    matplotlib.use("Agg")                      # files only: no display is needed or used
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = min(c.receive_ns for c in chunks)
    arrival_s = np.array([(c.receive_ns - t0) * 1e-9 for c in chunks])
    staleness_ms = np.array([c.staleness_s * 1e3 for c in chunks])
    inference_ms = np.array([c.inference_time_s * 1e3 for c in chunks])
    paths = [out_dir / name for name in PLOT_FILES]

    figure, axis = plt.subplots(figsize=(10, 4))
    axis.plot(arrival_s, staleness_ms, ".-", label=f"staleness ({_percentile_label(staleness_ms)})")
    axis.plot(arrival_s, inference_ms, ".-", label=f"inference ({_percentile_label(inference_ms)})")
    axis.set(xlabel="bag time since the first chunk [s]", ylabel="ms",
             title=f"Observation-to-action staleness of {len(chunks)} chunks")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(paths[0], dpi=100)
    plt.close(figure)

    figure, axis = plt.subplots(figsize=(8, 4))
    bins = np.linspace(0.0, max(staleness_ms.max(), inference_ms.max()) * 1.05 + 1e-3, 40)
    axis.hist(staleness_ms, bins=bins, alpha=0.6, label=f"staleness ({_percentile_label(staleness_ms)})")
    axis.hist(inference_ms, bins=bins, alpha=0.6, label=f"inference ({_percentile_label(inference_ms)})")
    axis.set(xlabel="ms", ylabel="chunks", title="Latency distribution")
    axis.legend()
    figure.tight_layout()
    figure.savefig(paths[1], dpi=100)
    plt.close(figure)

    trace = executed_trace(chunks, control_rate_hz, switching)
    shown = min(dims, trace.commands.shape[1])
    figure, axes = plt.subplots(shown, 1, figsize=(10, 2.2 * shown + 0.6), sharex=True, squeeze=False)
    times = trace.times_s - t0 * 1e-9
    switch_times = trace.switch_times_s - t0 * 1e-9
    for j, axis in enumerate(axes[:, 0]):
        axis.plot(times, trace.commands[:, j], lw=1.0, label=f"command, dimension {j}")
        if len(switch_times):
            at = np.searchsorted(trace.times_s, trace.switch_times_s)
            axis.scatter(switch_times, trace.commands[at, j], s=8 + 120 * trace.seams / max(trace.seams.max(), 1e-9),
                         c="tab:red", alpha=0.6, label="switch (size: seam)")
        axis.grid(alpha=0.3)
        axis.legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel("bag time since the first chunk [s]")
    seam_max = trace.seams.max() if len(trace.seams) else 0.0
    axes[0, 0].set_title(f"Executed at {control_rate_hz:g} Hz ({switching.value}): {len(trace.seams)} switches, "
                         f"seam max {seam_max:.3g}, {trace.deadline_misses} missed deadlines")
    figure.tight_layout()
    figure.savefig(paths[2], dpi=100)
    plt.close(figure)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashrt_ros.chunk_plots",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("bag", type=Path, help="a bag with flashrt_ros/msg/ActionChunk messages")
    parser.add_argument("--out-dir", type=Path, required=True, help="folder for the PNG files (created)")
    parser.add_argument("--topic", default=None, help="ActionChunk topic (default: any)")
    parser.add_argument("--control-rate-hz", type=float, default=100.0)
    parser.add_argument("--switching", choices=[m.value for m in Switching], default=Switching.LATEST.value)
    parser.add_argument("--dims", type=int, default=DEFAULT_DIMS, help="action dimensions to draw")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.control_rate_hz <= 0 or args.dims < 1:
        parser.error("--control-rate-hz must be > 0 and --dims >= 1")
    try:
        chunks = read_chunk_bag(args.bag, args.topic)
        paths = write_plots(chunks, args.out_dir, args.control_rate_hz, Switching(args.switching), args.dims)
    except BagError as error:
        print(f"chunk_plots: {error}", file=sys.stderr)
        return 1
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
