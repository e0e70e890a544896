"""Stopping a long load between its steps: the checkpoint's tensors, the engine's tunings, its graph captures and the
warm-ups of its text buckets take from seconds to half a minute for a full-size model, and a caller that is shutting
down (the ROS node on SIGINT, an application closing) should not wait for all of it.

    with stop_when(lambda: shutting_down):      # the caller's condition, consulted at every step
        policy = load_model(...)                 # raises Stopped at the first step after the condition holds

The long loops of flashrt_core call ``raise_if_stopped(step)`` once per step (a tensor read, a tuning candidate, a
graph capture, a bucket warmed up): it asks every condition installed by the ``stop_when`` blocks around it, on this
thread, and raises ``Stopped`` naming the step where one holds. Outside any ``stop_when`` it does nothing. The
conditions are context-local (a contextvars variable): a thread sees only the blocks it entered itself, so a caller
that loads on another thread enters ``stop_when`` on that thread.

``Stopped`` derives from BaseException, as asyncio's CancelledError does: the core catches Exception where a
candidate may fail (a tuning candidate that does not compile is left out, not fatal), and a stop must pass through
those handlers to the caller. What a stopped load had built is released by garbage collection as the exception
unwinds; nothing is left half-installed, since a load returns its policy only at its end.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

_CONDITIONS: contextvars.ContextVar[tuple[Callable[[], bool], ...]] = contextvars.ContextVar(
    "flashrt_stop_conditions", default=())


class Stopped(BaseException):
    """A load (or warm-up) stopped at one of its steps because a stop_when condition held; the message names the
    step."""


@contextlib.contextmanager
def stop_when(condition: Callable[[], bool]) -> Iterator[None]:
    """Within the block, every raise_if_stopped on this thread raises Stopped once condition() returns True (also
    when an enclosing block's condition does)."""
    token = _CONDITIONS.set(_CONDITIONS.get() + (condition,))
    try:
        yield
    finally:
        _CONDITIONS.reset(token)


def raise_if_stopped(step: str) -> None:
    """Raise Stopped("stopped at <step>") when a condition of the enclosing stop_when blocks holds; else nothing."""
    if any(condition() for condition in _CONDITIONS.get()):
        raise Stopped(f"stopped at {step}")
