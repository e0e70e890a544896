"""Python garbage-collector pauses: measured (``gc.callbacks``) and kept short (``gc.freeze`` once the model is in).

A full (generation 2) collection walks every container object the interpreter tracks, with the GIL held: no
callback, no inference thread, no publisher of the process runs meanwhile. A loaded model brings torch, Triton,
the engine and rclpy: hundreds of thousands to millions of long-lived objects. On the GPU benchmark machine
(tools/benchmark_node_overhead.py, 2026-11-29) full collections under a 60 Hz camera stream took
169 ms median / 230 ms p99 without the freeze and 2.3 / 129 ms with it. (The longer 0.1-2.9 s stalls of those
runs were the multi-threaded executor's spin loop, flashrt_ros.node_executor, not the collector.)
``freeze_objects`` moves everything alive after configure into the permanent generation (``gc.freeze``), so later
full collections walk only what was created since.

``GcPauses`` times every collection through ``gc.callbacks`` and keeps the full collections of a time window for
/diagnostics. Its callback takes no lock (a collection can start inside any allocation, also one made while a
lock of this node is held) and appends to a deque, which the GIL keeps consistent.
"""

from __future__ import annotations

import collections
import gc
import time
from typing import Deque

import numpy as np

FULL_GENERATION = 2


class GcPauses:
    """Durations of the interpreter's garbage collections while installed; full ones kept for ``window_s``."""

    def __init__(self, window_s: float):
        self.window_s = float(window_s)
        self._full: Deque[tuple[float, float]] = collections.deque()   # (end monotonic s, duration s)
        self._started = 0.0
        self.collections = [0, 0, 0]          # per generation, since install
        self.longest_s = [0.0, 0.0, 0.0]
        self._installed = False

    def install(self) -> None:
        if not self._installed:
            gc.callbacks.append(self._on_gc)
            self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            try:
                gc.callbacks.remove(self._on_gc)
            except ValueError:
                pass
            self._installed = False

    def _on_gc(self, phase: str, info: dict) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._started = now
            return
        generation = min(int(info.get("generation", 0)), FULL_GENERATION)
        duration = now - self._started
        self.collections[generation] += 1
        self.longest_s[generation] = max(self.longest_s[generation], duration)
        if generation == FULL_GENERATION:
            self._full.append((time.monotonic(), duration))
            while len(self._full) > 10_000:      # bounded also when nobody reads it
                self._full.popleft()

    def full_pauses(self) -> np.ndarray:
        """Durations [s] of the full collections that ended in the last ``window_s`` seconds."""
        horizon = time.monotonic() - self.window_s
        return np.asarray([d for t, d in list(self._full) if t >= horizon], dtype=np.float64)


def freeze_objects() -> int:
    """Collect once, then move every object alive now into the permanent generation, which collections skip.
    Returns how many objects are frozen. What is frozen is never freed until ``unfreeze_objects``."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def unfreeze_objects() -> None:
    """Give the frozen objects back to the collector (before a model is released, so it can be freed)."""
    gc.unfreeze()


__all__ = ["GcPauses", "freeze_objects", "unfreeze_objects"]
