"""Real-time chunking across the two nodes: what the action executor will still execute, and how the policy node
turns it into the previous chunk and delay of its next inference (flashrt_core.rtc_request.RtcRequest).

The protocol (docs/action_executor.md, "RTC: how the two nodes share pending actions"):

- The executor publishes its pending actions (`pending_actions`): after every chunk it accepts, the actions its
  schedule will command at ``now + i * dt`` with the chunks it holds (ChunkSchedule.preview), as an ActionChunk
  stamped ``now``. Only a new chunk changes them, so one message per chunk says everything.
- The policy node keeps the newest. For an observation stamped ``t_obs`` whose inference starts at ``t_start``
  and is expected to take ``L`` (LatencyEstimate: measured), the new chunk reaches the executor at about
  ``ready = t_start + L``; its rows ``i`` with ``t_obs + i * dt < ready`` are executed from the pending actions
  before it arrives, so they are frozen: ``delay = ceil((ready - t_obs) / dt)`` (rtc_prefix). The previous
  chunk is the pending actions read at ``t_obs + i * dt``, as far as they reach.

Nothing here knows ROS: times are seconds on the nodes' clock (both nodes must share it: sim time or not).
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PendingActions:
    """What the executor will command: ``actions[i]`` (robot units) at ``start_s + i * dt``."""

    start_s: float
    dt: float
    actions: np.ndarray          # [rows, action_dim] float64

    @property
    def end_s(self) -> float:
        return self.start_s + (len(self.actions) - 1) * self.dt

    def at(self, t: float) -> np.ndarray:
        """The action at time ``t``: rows interpolated linearly, the first row before ``start_s`` (that time has
        passed; the executor commanded it already) and the last after ``end_s``."""
        position = min(max((t - self.start_s) / self.dt, 0.0), len(self.actions) - 1.0)
        row = min(int(math.floor(position)), len(self.actions) - 1)
        if row == len(self.actions) - 1:
            return self.actions[row].copy()
        fraction = position - row
        return (1.0 - fraction) * self.actions[row] + fraction * self.actions[row + 1]


def pending_actions(start_s: float, dt: float, actions: np.ndarray) -> PendingActions | None:
    """PendingActions from message fields, or None when there are none (no chunk covers the executor's now) or the
    fields are unusable (a non-positive dt, non-finite values)."""
    actions = np.asarray(actions, dtype=np.float64)
    if actions.ndim != 2 or actions.shape[0] < 1 or not (math.isfinite(dt) and dt > 0.0):
        return None
    if not (math.isfinite(start_s) and np.all(np.isfinite(actions))):
        return None
    return PendingActions(float(start_s), float(dt), actions)


def rtc_prefix(pending: PendingActions | None, observation_s: float, ready_s: float, dt: float,
               horizon: int) -> tuple[np.ndarray, int] | None:
    """(previous_chunk [rows, action_dim], delay) for an inference on the observation stamped ``observation_s``
    whose chunk reaches the executor at ``ready_s``: row i of the previous chunk is the pending action at
    ``observation_s + i * dt`` for as long as the pending actions reach (at most ``horizon`` rows); delay =
    ceil((ready_s - observation_s) / dt), at most the rows known and horizon - 1. None without pending actions
    that reach ``observation_s``: the inference then runs without RTC."""
    if pending is None or len(pending.actions) == 0 or horizon < 1:
        return None
    reach = pending.end_s - observation_s
    if reach < 0.0:
        return None
    rows = min(horizon, int(math.floor(reach / dt + 1e-9)) + 1)
    previous = np.stack([pending.at(observation_s + i * dt) for i in range(rows)])
    delay = int(math.ceil((ready_s - observation_s) / dt - 1e-9))
    return previous, max(0, min(delay, rows, horizon - 1))


class LatencyEstimate:
    """The time from the start of an inference until its chunk reaches the executor, expected for the next one: the
    largest of the last ``window`` measured, plus ``margin_s``. Overestimating freezes a row too many (harmless);
    underestimating lets the executor switch to rows computed without the actions it executed."""

    def __init__(self, window: int = 10, margin_s: float = 0.0):
        if window < 1 or not (math.isfinite(margin_s) and margin_s >= 0.0):
            raise ValueError(f"need window >= 1 and a finite margin >= 0, got {window}, {margin_s}")
        self._recent: collections.deque[float] = collections.deque(maxlen=window)
        self.margin_s = float(margin_s)

    def record(self, seconds: float) -> None:
        if math.isfinite(seconds) and seconds >= 0.0:
            self._recent.append(float(seconds))

    def value(self) -> float | None:
        """The estimate [s], or None before the first measurement."""
        return max(self._recent) + self.margin_s if self._recent else None


__all__ = ["LatencyEstimate", "PendingActions", "pending_actions", "rtc_prefix"]
