"""How the host waits for the GPU at the end of a predict.

Measured on the H200 machine (tools/host_trace.py): after `Policy.predict` waits ~10.6 ms in
`cudaStreamSynchronize`, the host's own steps are 2-8x slower than the same steps in a tight loop (the whole host
share 0.78 ms instead of 0.23 ms). The way of waiting is not the cause: on the project's CPU machine the same steps
slow down as much after any 10 ms pause, spinning or sleeping, and polling measured the same as the synchronize on
the GPU machine (11.58 against 11.66 ms). Running the steps' code again during the pause keeps them
fast: on the CPU machine, rehearsing them every 0.5 ms through a 10.6 ms pause takes the steps after it from 690 us
to 268 us (100 us back to back; tools/benchmark_policy_predict.py --spin-sweep 0 10.6 --rehearse, 2026-12-01).
Three ways to wait:

    sync   the stream's synchronize (the CUDA driver's wait; the default)
    poll   an event recorded after the copy out, queried until it completes, the GIL given up between queries
           (time.sleep(0)), so the thread stays on a running core and other Python threads keep running; it
           costs one busy core while the GPU works
    warm   as poll, and every WARM_INTERVAL_S between queries the owner's `rehearsal` runs (Policy registers one
           that repeats its last call's host steps without side effects: flashrt_core/host_rehearsal.py), so the
           next call's steps find their code and data in the caches; it holds the GIL for those rehearsals

(EngineOptions.host_wait / FLASHRT_HOST_WAIT.) A rehearsal that raises is logged once and dropped: the wait never
fails because of it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from .options import HOST_WAITS

log = logging.getLogger(__name__)

WARM_INTERVAL_S = 0.5e-3     # between rehearsals (CPU machine: every 0.5 ms keeps the steps
                             # at 306 us after a 10.6 ms pause, every 1 ms at 345 us, a bare spin at 594 us)


def poll_until(done: Callable[[], bool], between: Callable[[], None] | None = None,
               interval_s: float = WARM_INTERVAL_S) -> int:
    """Call done() until it returns True; between calls give up the GIL, and with `between` run it whenever
    `interval_s` has passed since it last ran (first after one interval). Returns how many calls of done() it
    took."""
    calls = 1
    last = time.perf_counter()
    while not done():
        if between is not None and time.perf_counter() - last >= interval_s:
            between()
            last = time.perf_counter()
        else:
            time.sleep(0)
        calls += 1
    return calls


class HostWait:
    """The wait at the end of a predict, on the current stream of `device` (no wait on a CPU device).
    `rehearsal`: what the "warm" mode runs during the wait (None: it polls as "poll")."""

    def __init__(self, mode: str, device: torch.device):
        if mode not in HOST_WAITS:
            raise ValueError(f"host_wait must be one of {HOST_WAITS}, got {mode!r}")
        self.mode = mode
        self.device = device
        self.rehearsal: Callable[[], None] | None = None
        self.interval_s = WARM_INTERVAL_S
        self._event = torch.cuda.Event() if mode in ("poll", "warm") and device.type == "cuda" else None

    def __call__(self) -> None:
        if self.device.type != "cuda":
            return
        stream = torch.cuda.current_stream(self.device)
        if self._event is None:
            stream.synchronize()
            return
        self._event.record(stream)
        poll_until(self._event.query, self._guarded_rehearsal if self.mode == "warm" and self.rehearsal else None,
                   self.interval_s)

    def _guarded_rehearsal(self) -> None:
        if self.rehearsal is None:                     # dropped earlier in this wait
            return
        try:
            self.rehearsal()
        except Exception:  # noqa: BLE001  a rehearsal is an optimization: it never fails the wait
            log.warning("host rehearsal failed and is dropped; the wait goes on polling", exc_info=True)
            self.rehearsal = None
