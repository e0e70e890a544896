"""Image-sized buffers from reused heap memory instead of fresh pages (glibc ``mallopt``).

On its way into a Python callback, one 640x480 rgb8 frame is allocated several times at 921,600 bytes: the
rmw's C message, the bytes object rclpy builds from it, the array the message field holds, the node's numpy
copy. glibc serves a request of that size from fresh ``mmap`` pages or from the top of a heap that it trims back
to the kernel once more than ``M_TRIM_THRESHOLD`` is free there (twice the dynamic mmap threshold: ~2 MB once a
frame-sized block has been freed). Either way the next frame writes into pages the kernel has to fault in and
zero again: a few hundred page faults per frame per buffer, on the callback's critical path.

:func:`keep_large_buffers_on_heap` raises both limits once for the process: ``M_MMAP_THRESHOLD`` to 32 MiB
(glibc's maximum; a 4K rgb8 frame is 24.9 MB) and ``M_TRIM_THRESHOLD`` to 256 MiB, so freed frame buffers stay
mapped and the next frame reuses them. Measured with ``tools/benchmark_node_overhead.py`` (its transport floor: a
plain subscriber, capture -> the later frame of a 640x480 pair, before and after this call in one process): on the
H200 machine 4.42 -> 2.13 ms median, 5.81 -> 2.90 ms p99; on the 2-core dev machine 8.61 -> 4.19 ms median
(2026-11-29). The price: up to 256 MiB of
freed memory stays with the process instead of going back to the kernel.

Process-wide and one-way (glibc has no "back to the dynamic defaults"): the node applies it at configure when its
``keep_large_buffers_on_heap`` parameter is true; an A/B starts a fresh process with the parameter false. A user
who tunes glibc with ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` / ``GLIBC_TUNABLES`` keeps their
settings: the function then changes nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

M_TRIM_THRESHOLD = -1          # glibc malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024      # HEAP_MAX_SIZE / 2 on 64-bit glibc: the largest value it accepts
TRIM_THRESHOLD_BYTES = 256 * 1024 * 1024
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")

APPLIED = "on"
LEFT_TO_USER = "left to the environment"
UNAVAILABLE = "unavailable"

_lock = threading.Lock()
_state: str | None = None      # what the first call did; later calls report it


def keep_large_buffers_on_heap() -> str:
    """Raise glibc's mmap and trim thresholds once for this process; returns what happened.

    ``"on"``: applied (now or by an earlier call). ``"left to the environment (...)"``: the user set glibc's own
    malloc variables, which win. ``"unavailable (...)"``: not glibc, or mallopt refused.
    """
    global _state
    with _lock:
        if _state is None:
            _state = _apply()
        return _state


def heap_reuse_state() -> str | None:
    """What :func:`keep_large_buffers_on_heap` did in this process, None if it was never called."""
    return _state


def _apply() -> str:
    user = [name for name in USER_SETTINGS if os.environ.get(name)]
    if user:
        return f"{LEFT_TO_USER} ({', '.join(user)})"
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError) as error:
        return f"{UNAVAILABLE} (no glibc mallopt: {error})"
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    if mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) != 1 or mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) != 1:
        return f"{UNAVAILABLE} (mallopt refused)"
    return APPLIED
