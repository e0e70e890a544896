"""Where the time of one predict call goes between the host and the GPU, from a torch.profiler trace.

A call of `Policy.predict` on the graph engine is: host work (validation, tokenization, the frames copied into the
pinned staging blob), one host-to-device copy, one graph replay, one device-to-host copy, then the host again
(waking from the stream sync, the copy of the actions, unnormalization). The profiler records the call's CPU range
(a `record_function` around it) and every GPU activity (copies, memsets and kernels, those of a graph replay
included) on one clock, so each call splits into consecutive segments that sum to its wall time:

    host_before   call start -> first GPU activity starts (the host's work before the GPU has anything to do)
    copy_in       the host-to-device copies (first GPU activity start -> last of them ends)
    launch_gap    -> the first kernel starts (the GPU waits for the graph launch)
    graph         first kernel start -> last kernel end (the replay as the GPU runs it)
    copy_out      -> the device-to-host copy ends
    host_after    -> call end (sync wake-up, copies and Python after the GPU is done)

`split_call` does the arithmetic on plain (name, start_us, end_us) tuples; `trace_calls` runs the profiler.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

SEGMENTS = ("host_before", "copy_in", "launch_gap", "graph", "copy_out", "host_after")


def _is_copy(name: str, direction: str) -> bool:
    return name.startswith("Memcpy") and direction in name


def split_call(call: tuple[float, float], gpu: Sequence[tuple[str, float, float]]) -> dict[str, float]:
    """One call's CPU range (start_us, end_us) and the GPU activities that started inside it, (name, start_us,
    end_us) with names as CUPTI gives them ("Memcpy HtoD (Pinned -> Device)", kernel names, "Memset ...") ->
    the segments of SEGMENTS in ms, in call order; they sum to the call's wall time. A call without a kernel or
    without a copy out (no GPU work, or a trace that lost it) raises ValueError: nothing to split."""
    start, end = call
    acts = sorted((a for a in gpu if start <= a[1] <= end), key=lambda a: a[1])
    kernels = [a for a in acts if not a[0].startswith(("Memcpy", "Memset"))]
    copies_out = [a for a in acts if _is_copy(a[0], "DtoH")]
    if not kernels or not copies_out:
        raise ValueError(f"call [{start}, {end}] us: {len(kernels)} kernels, {len(copies_out)} copies out of the "
                         "device in the trace; a graph-engine call has both")
    first_kernel, last_kernel_end = kernels[0][1], max(k[2] for k in kernels)
    copies_in = [a for a in acts if _is_copy(a[0], "HtoD") and a[1] < first_kernel]
    gpu_start = acts[0][1]
    copy_in_end = max((c[2] for c in copies_in), default=gpu_start)
    copy_out_end = max(max(c[2] for c in copies_out), last_kernel_end)
    cuts = [start, gpu_start, copy_in_end, first_kernel, last_kernel_end, copy_out_end, end]
    cuts = np.maximum.accumulate(cuts)                # activities that overlap a boundary never count twice
    return {name: (b - a) / 1e3 for name, a, b in zip(SEGMENTS, cuts, cuts[1:])}


def summarize(calls: Sequence[dict[str, float]]) -> dict[str, float]:
    """Median of each segment over calls, in ms, plus the median call ("total")."""
    out = {name: float(np.median([c[name] for c in calls])) for name in SEGMENTS}
    out["total"] = float(np.median([sum(c.values()) for c in calls]))
    return out


def trace_calls(fn: Callable[[], object], calls: int) -> list[dict[str, float]]:
    """Run fn `calls` times under torch.profiler (CPU + CUDA) and split each call (split_call)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            with record_function(f"host_trace_call_{i}"):
                fn()
    events = prof.events()
    ranges = sorted((e.time_range.start, e.time_range.end) for e in events
                    if e.name.startswith("host_trace_call_") and e.device_type.name == "CPU")
    gpu = [(e.name, e.time_range.start, e.time_range.end) for e in events
           if e.device_type.name == "CUDA" and not e.name.startswith("host_trace_call_")]   # not the GPU-side ranges
    return [split_call(r, gpu) for r in ranges]
