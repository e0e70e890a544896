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


def warm_up(device: torch.device, fn, runs: int = 1) -> None:
    """fn() `runs` times on side_stream(device), after the current stream's work and before its next: what a capture
    needs first (kernels compiled, library handles and workspaces created, the allocator's blocks made), off the
    stream that is captured."""
    stream = side_stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(runs):
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)


def capture(fn, pool=None) -> tuple[torch.cuda.CUDAGraph, object]:
    """fn() captured into a new CUDA graph (memory from `pool` when given) -> (graph, fn's output, static)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out


def warm_up_and_capture(device: torch.device, fn, runs: int, pool=None) -> tuple[torch.cuda.CUDAGraph, object]:
    """warm_up then capture, then a device sync (the capture's memory settled) -> (graph, fn's static output)."""
    warm_up(device, fn, runs)
    graph, out = capture(fn, pool)
    torch.cuda.synchronize(device)
    return graph, out


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The one stream per device that warm-ups before a capture and load-time timings run on. cuBLAS keeps a
    workspace per (handle, stream) for the life of the process, so a new stream per capture would grow the memory
    that a closed engine cannot give back."""
    return _side_stream(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def _side_stream(index: int) -> torch.cuda.Stream:
    return torch.cuda.Stream(torch.device("cuda", index))
