"""GPU timing helpers: CUDA-event times of captured graphs, and the one side stream per device that warm-ups and
load-time timings run on. Used by the load-time tuning (engine/tuning.py), the executor's phase times and the
benchmarks in tools/."""

from __future__ import annotations

import functools

import numpy as np
import torch


def graph_replay_ms(graph: torch.cuda.CUDAGraph, reps: int) -> list[float]:
    """GPU time of `reps` single replays of a captured graph (CUDA events around each), in ms."""
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return samples


def interleaved_replay_ms(graphs: dict, rounds: int, reps: int) -> dict:
    """{key: ms} for captured graphs timed in turn: `rounds` rounds, each replaying every graph `reps` times
    (graph_replay_ms), the order rotated by one each round; a graph's time is the median of its rounds' medians.
    Timed in turn, graphs see the same clock and memory drift, which a graph timed after another does not."""
    keys = list(graphs)
    per_round: dict = {k: [] for k in keys}
    for r in range(rounds):
        for k in keys[r % len(keys):] + keys[:r % len(keys)]:
            per_round[k].append(float(np.median(graph_replay_ms(graphs[k], reps))))
    return {k: float(np.median(v)) for k, v in per_round.items()}


def graph_time_us(fn, reps: int, replays: int = 1) -> float:
    """GPU time of one call of fn, from `reps` calls captured in a CUDA graph (no launch overhead); the median
    over `replays` replays of that graph."""
    stream = side_stream(torch.device("cuda", torch.cuda.current_device()))
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    times = sorted(graph_replay_ms(graph, replays))
    return times[len(times) // 2] * 1e3 / reps


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The one stream per device that warm-ups before a capture and load-time timings run on. cuBLAS keeps a
    workspace per (handle, stream) for the life of the process, so a new stream per capture would grow the memory
    that a closed engine cannot give back."""
    return _side_stream(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _side_stream(index: int) -> torch.cuda.Stream:
    return torch.cuda.Stream(torch.device("cuda", index))
