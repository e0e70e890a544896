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

import time
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


def _median_us(fn: Callable[[], object], calls: int) -> float:
    fn()
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return float(np.median(samples)) * 1e6


def _stamped_us(steps: Sequence[tuple[str, Callable[[], object]]]) -> np.ndarray:
    """Run the steps in order, each timed: us per step."""
    t = [time.perf_counter()]
    for _, fn in steps:
        fn()
        t.append(time.perf_counter())
    return np.diff(t) * 1e6


def spin(seconds: float) -> None:
    """Keep the thread busy for `seconds` (a pure Python loop: no sleep, no system call but the clock's)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        pass


def host_steps(policy, images, prompt: str, state) -> list[tuple[str, Callable[[], object]]]:
    """The host's steps of one `Policy.predict`, in its order, as callables: validate the images, encode prompt and
    state, draw the noise, copy the frames into the staging blob (the graph engine's pinned blob when the policy
    runs one, after one predict has made it; else host arrays of the frames' shapes), unnormalize (on the host, or
    with `policy.gpu_unnormalize` in the graph: then only the slice to the robot's action width). What predict
    runs between them on the GPU path is the GPU round trip (host_steps_us). A diagnostic: it reaches into the
    executor's staging blob the way `predict_observation` does."""
    import torch

    from flashrt_core import preprocess
    views = [v for v in preprocess.validate_images(images, policy.config.view_names) if v is not None]
    entry = _engine_entry(policy, prompt, state)
    if entry is not None:
        targets = [entry.staging.host_views[f"image{j}"].numpy() for j in range(len(views))]
    else:
        targets = [np.empty_like(v) for v in views]

    def stage_frames():
        for target, view in zip(targets, views):
            target[:] = view

    actions = torch.zeros(policy.horizon, policy.config.max_action_dim)
    return [("validate_images", lambda: preprocess.validate_images(images, policy.config.view_names)),
            ("encode_prompt_and_state", lambda: policy._encode_prompt_and_state(prompt, state)),
            ("noise", lambda: policy._host_noise(None)),
            ("stage_frames", stage_frames),
            ("postprocess", (lambda: np.ascontiguousarray(actions.numpy()[:, :policy.action_dim]))
             if getattr(policy, "gpu_unnormalize", False) else (lambda: policy.postprocess(actions)))]


def _engine_entry(policy, prompt: str, state):
    """The graph engine's entry (staging blob, graph) that predict uses for this prompt, or None off the engine."""
    ex = policy.executor
    if not getattr(policy, "gpu_preprocess", False) or not hasattr(ex, "entries"):
        return None
    _, mask, _ = policy._encode_prompt_and_state(prompt, state)
    bucket = ex._bucket(int(np.flatnonzero(mask)[-1]))
    entries = [e for k, e in ex.entries.items() if k[0] == "uint8" and k[3] == bucket]
    return entries[0] if len(entries) == 1 and entries[0].graph is not None else None


def spin_sweep_us(policy, images, prompt: str, state, waits_ms: Sequence[float], calls: int) -> dict:
    """Each host step of predict (host_steps) timed right after the thread spun for each of `waits_ms` (0: in a
    tight loop), median us of `calls`; no GPU involved. Whether the host's steps slow down with the time since
    they last ran, whatever the thread did meanwhile, and by how much: {wait_ms: {step: us}}."""
    steps = host_steps(policy, images, prompt, state)
    for _, fn in steps:
        fn()
    out = {}
    for wait in waits_ms:
        samples = []
        for _ in range(calls):
            spin(wait / 1e3)
            samples.append(_stamped_us(steps))
        out[float(wait)] = dict(zip((name for name, _ in steps), np.median(np.array(samples), axis=0).tolist()))
    return out


def host_steps_us(policy, images, prompt: str, state, calls: int) -> dict[str, float]:
    """On the graph engine (after one predict): each host step (host_steps) and the GPU round trip (copy in,
    replay, copy out, the engine's wait: the stream's synchronize) timed alone (median us of `calls`, no
    profiler) and stamped in line, in predict's order (the `inline_` keys); beside them the whole predict and the
    replay alone, back to back and after 0.5 ms of host work (does an idle GPU replay slower?)."""
    from flashrt_core.engine.timing import graph_replay_ms
    ex = policy.executor
    policy.predict(images, prompt, state)
    entry = _engine_entry(policy, prompt, state)
    steps = host_steps(policy, images, prompt, state)

    def round_trip():
        entry.staging.upload()
        entry.graph.replay()
        entry.out_host.copy_(entry.ws.robot_actions if policy.gpu_unnormalize else entry.ws.actions,
                             non_blocking=True)                           # as predict_observation copies out
        ex.wait_for_gpu()                                                 # the engine's own wait

    def replay_after_gap():
        spin(5e-4)
        return graph_replay_ms(entry.graph, 1)[0]

    ordered = steps[:4] + [("gpu_round_trip", round_trip)] + steps[4:]
    inline = np.median(np.array([_stamped_us(ordered) for _ in range(calls)]), axis=0)
    out = {name: _median_us(fn, calls) for name, fn in ordered}
    out["predict"] = _median_us(lambda: policy.predict(images, prompt, state), calls)
    out["replay_back_to_back"] = float(np.median(graph_replay_ms(entry.graph, calls))) * 1e3
    out["replay_after_0.5ms_gap"] = float(np.median([replay_after_gap() for _ in range(calls)])) * 1e3
    out.update({f"inline_{name}": float(us) for (name, _), us in zip(ordered, inline)})
    return out
