"""The rclpy executor that spins the policy node (parameter ``executor``).

The node's callbacks are short by design (inference runs on its own thread, flashrt_ros.inference_worker), so
one thread spins them all. rclpy's MultiThreadedExecutor is the wrong tool for such a node: while a callback of
a mutually exclusive group runs on a worker, the group's next message keeps the wait set ready, and the spin
thread loops in Python without blocking. On the GPU benchmark machine (16 cores) that loop took a whole CPU and
the GIL with it: every other thread of the process, the inference thread included, stopped for 0.1-2.9 s at a
time (tools/benchmark_node_overhead.py's stall watch and native stacks, 2026-11-29).

- ``single_threaded`` (default): rclpy's SingleThreadedExecutor; a ready callback runs at once, the spin thread
  blocks in the middleware's wait when nothing is ready.
- ``multi_threaded``: MultiThreadedExecutor with 4 threads, the earlier behaviour (A/B only).

rclpy's experimental EventsExecutor is not offered: in the node-overhead benchmark on the 2-core development
machine (Kilted wheels, 2026-11-29) its process spun at 100% CPU, never finished a run and ignored SIGTERM.
A second try gave the same result, with the busy thread inside rclpy's native events executor reading the
clock in a loop (gdb), while a plain subscriber node under it received 640x480 pairs ~0.5 ms sooner than under
the SingleThreadedExecutor. Worth another look when rclpy's implementation changes.

How a process stops: ``spin_until_shutdown`` is the spin loop (the node's main one, and background spin threads),
and ``sigint_shuts_down_quietly`` lets SIGINT stop it through rclpy's context shutdown, as SIGTERM already does,
instead of an exception raised wherever the main thread is.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator

EXECUTORS = ("single_threaded", "multi_threaded")
DEFAULT_EXECUTOR = "single_threaded"
MULTI_THREADED_THREADS = 4


def make_executor(kind: str, context=None):
    """An rclpy executor of ``kind`` (one of EXECUTORS) on ``context`` (None: the default context)."""
    if kind == "single_threaded":
        from rclpy.executors import SingleThreadedExecutor
        return SingleThreadedExecutor(context=context)
    if kind == "multi_threaded":
        from rclpy.executors import MultiThreadedExecutor
        return MultiThreadedExecutor(num_threads=MULTI_THREADED_THREADS, context=context)
    raise ValueError(f"unknown executor {kind!r}: one of {', '.join(EXECUTORS)}")


def spin_until_shutdown(executor, context, timeout_sec: float | None = 0.05, stop=None,
                        until: float | None = None) -> None:
    """Spin ``executor`` until ``context`` shuts down, until ``stop`` (a threading.Event) is set, or until the
    ``time.monotonic()`` deadline ``until``: the main loop of the policy node and the action executor
    (``timeout_sec=None``: each turn blocks until work is ready) and of the bag recorder (``until``: its
    ``--duration``), and the loop of a background spin thread whose owner keeps creating and destroying entities
    from its own thread (bag replay, tests, the node benchmark's lifecycle transitions).

    Entities destroyed meanwhile: rclpy can raise InvalidHandle from a destroyed subscription's QoS event handler
    while it builds the wait set. That turn is dropped; the next one no longer has the entity. An error while
    the context shuts down ends the loop; any other error propagates. With ``stop``, the owner sets it and joins
    the thread before it shuts the executor down (after ``executor.shutdown()`` a spin_once returns at once)."""
    from rclpy.exceptions import InvalidHandle

    while context.ok() and not (stop is not None and stop.is_set()) and (until is None or time.monotonic() < until):
        try:
            executor.spin_once(timeout_sec=timeout_sec)
        except InvalidHandle:
            continue
        except Exception:  # noqa: BLE001  (context shut down while spinning)
            if context.ok():
                raise


@contextlib.contextmanager
def sigint_shuts_down_quietly() -> Iterator[None]:
    """Inside: the first SIGINT leaves the process's stop to rclpy instead of raising KeyboardInterrupt.

    Enter it before ``rclpy.init``: rclpy's own SIGINT handler then chains to this one. rclpy's handler shuts the
    context down, which ends the spin loop (spin_until_shutdown), a configure at its next step (the
    node checks the context between steps) and a warm-up before its next pass. The KeyboardInterrupt that Python's
    default handler raises lands instead at whatever line the main thread runs; when that line is Python code
    that native code calls (a pybind11 callback while torch imports during the first configure, for instance),
    the exception cannot cross the native frames and the process aborts (std::terminate, exit code -6).
    A second SIGINT raises KeyboardInterrupt: the user insists. On exit the previous handler comes back. Off the
    main thread (where Python takes no signal handler) it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signalled = []

    def on_sigint(signum, frame) -> None:
        if signalled:
            raise KeyboardInterrupt
        signalled.append(signum)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


__all__ = ["DEFAULT_EXECUTOR", "EXECUTORS", "MULTI_THREADED_THREADS", "make_executor", "sigint_shuts_down_quietly",
           "spin_until_shutdown"]
