"""The views of one observation preprocessed at once, on worker threads.

A predict's host work on camera frames runs view by view in OpenCV, Pillow and numpy: GR00T's INTER_AREA
scalings and bicubic resize (groot_inputs.prepare_views), and the pi family's resize-with-pad where the frames are
not resized in the graph (preprocess.prepare_images). Those libraries release the GIL while they work on a frame,
so the views of an observation take about the time of one when each has a CPU.

`map_views(fn, items)` returns [fn(item) for item in items] in order: the first item in the calling thread, the
others on a shared pool of up to `usable_cpus() - 1` threads (host_threads.usable_cpus: the affinity mask and the
cgroup's CPU quota). It runs everything in the calling thread where there is one item, one usable CPU, or
FLASHRT_PARALLEL_VIEWS=0 (the switch for A/B tests and bug reports). An exception of fn is raised in the caller,
the first item's first.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from flashrt_core.host_threads import usable_cpus

SWITCH = "FLASHRT_PARALLEL_VIEWS"
MAX_WORKERS = 7                 # robots carry up to a handful of cameras; the caller's thread takes one view
THREAD_PREFIX = "flashrt-views"

T = TypeVar("T")
R = TypeVar("R")

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _workers() -> int:
    return min(MAX_WORKERS, usable_cpus() - 1)


def _shared_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=_workers(), thread_name_prefix=THREAD_PREFIX)
        return _pool


def _forget_pool() -> None:
    """In a forked child the parent's worker threads do not exist: the child makes its own pool when it needs one."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def parallel() -> bool:
    """Whether map_views uses worker threads: the switch on and more than one usable CPU."""
    from flashrt_core.engine.options import read_switch    # here: the engine package imports preprocess
    return read_switch(SWITCH) and _workers() > 0


def map_views(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """[fn(item) for item in items], the items after the first on the shared pool when `parallel()`."""
    if len(items) < 2 or not parallel():
        return [fn(item) for item in items]
    futures = [_shared_pool().submit(fn, item) for item in items[1:]]
    try:
        first = fn(items[0])
    except BaseException:
        for future in futures:
            future.cancel()
        raise
    return [first] + [future.result() for future in futures]
