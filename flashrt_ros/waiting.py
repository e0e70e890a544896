"""Polling until a condition holds: the one wait loop of the bag tools and of the tests over DDS.

    wait_until(lambda: publisher.get_subscription_count() > 0, timeout_s=20.0)   # -> True, or False on timeout

No rclpy, no threads: the predicate reads state that other threads (an executor spinning) update.
"""

from __future__ import annotations

import time
from collections.abc import Callable

DEFAULT_PERIOD_S = 0.02


def wait_until(predicate: Callable[[], object], timeout_s: float, period_s: float = DEFAULT_PERIOD_S) -> bool:
    """Poll ``predicate`` every ``period_s`` until it is true or ``timeout_s`` passes; returns its last value
    (as a bool: evaluated once more at the deadline, so a condition met during the last sleep still counts)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(period_s)
    return bool(predicate())


__all__ = ["DEFAULT_PERIOD_S", "wait_until"]
