"""How the host waits for the GPU at the end of a predict.

Measured on the H200 machine (session 13, tools/host_trace.py): after `Policy.predict` waits ~10.6 ms in
`cudaStreamSynchronize`, the host's own steps run 2-8x slower than the same steps in a tight loop (the whole host
share 0.78 ms instead of 0.23 ms). On the project's CPU machine the same steps slow down as much after any 10 ms
pause, spinning or sleeping (tools/benchmark_policy_predict.py --spin-sweep), so the way of waiting may not be
the cause; `poll` is here to measure that on the GPU machine. Two ways to wait:

    sync   the stream's synchronize (the CUDA driver's wait; the default)
    poll   an event recorded after the copy out, queried until it completes, the GIL given up between queries
           (time.sleep(0)), so the thread stays on a running core and other Python threads keep running; it
           costs one busy core while the GPU works (EngineOptions.host_wait / FLASHRT_HOST_WAIT)

Whether `poll` shortens predict is what the device part `host` of tools/device_engine_checks.sh measures; until
it does, `sync` stays the default.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from .dispatch import HOST_WAITS


def poll_until(done: Callable[[], bool]) -> int:
    """Call done() until it returns True, giving up the GIL between calls; returns how many calls it took."""
    calls = 1
    while not done():
        time.sleep(0)
        calls += 1
    return calls


class HostWait:
    """The wait at the end of a predict, on the current stream of `device` (no wait on a CPU device)."""

    def __init__(self, mode: str, device: torch.device):
        if mode not in HOST_WAITS:
            raise ValueError(f"host_wait must be one of {HOST_WAITS}, got {mode!r}")
        self.mode = mode
        self.device = device
        self._event = torch.cuda.Event() if mode == "poll" and device.type == "cuda" else None

    def __call__(self) -> None:
        if self.device.type != "cuda":
            return
        stream = torch.cuda.current_stream(self.device)
        if self._event is None:
            stream.synchronize()
            return
        self._event.record(stream)
        poll_until(self._event.query)
