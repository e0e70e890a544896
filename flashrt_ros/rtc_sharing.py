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
    sequence: int = -1           # the policy node's sequence of the newest chunk they include

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


def pending_actions(start_s: float, dt: float, actions: np.ndarray, sequence: int = -1) -> PendingActions | None:
    """PendingActions from message fields, or None when there are none (no chunk covers the executor's now) or the
    fields are unusable (a non-positive dt, non-finite values)."""
    actions = np.asarray(actions, dtype=np.float64)
    if actions.ndim != 2 or actions.shape[0] < 1 or not (math.isfinite(dt) and dt > 0.0):
        return None
    if not (math.isfinite(start_s) and np.all(np.isfinite(actions))):
        return None
    return PendingActions(float(start_s), float(dt), actions, int(sequence))


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


class PolicyRtc:
    """The policy node's side in an rtc mode: the newest pending actions of the executor, the measured latency, and
    the RtcRequest (flashrt_core.rtc_request) of each inference. Pending actions arrive on a subscription callback
    and are read on the inference thread: one attribute, replaced whole.

    The inference thread takes the next observation as soon as it has published a chunk, usually before the
    executor's pending actions for that chunk come back. Until they do (their sequence is older than the node's
    last chunk), the node's last chunk itself stands for them: under `latest` switching it is what the executor
    executes from its arrival on."""

    def __init__(self, mode: str, execution_horizon: int = 0, max_guidance_weight: float = 10.0,
                 latency_margin_s: float = 0.0, latency_window: int = 10):
        self.mode = mode
        self.execution_horizon = int(execution_horizon)
        self.max_guidance_weight = float(max_guidance_weight)
        self.latency = LatencyEstimate(latency_window, latency_margin_s)
        self._pending: PendingActions | None = None
        self._published: PendingActions | None = None      # the node's own last chunk
        self.requests = 0          # inferences conditioned on pending actions
        self.skipped = 0           # inferences without: no latency measured yet, no pending actions reaching them

    def clear(self) -> None:
        self._pending = self._published = None

    def on_pending(self, start_s: float, dt: float, horizon: int, action_dim: int, actions, sequence: int) -> None:
        """An executor's pending actions (ActionChunk fields); unusable ones clear the held ones."""
        values = np.asarray(actions, dtype=np.float64)
        if horizon * action_dim != values.size or action_dim < 1:
            self._pending = None
            return
        self._pending = pending_actions(start_s, dt, values.reshape(horizon, action_dim), sequence)

    def on_published(self, stamp_s: float, dt: float, actions: np.ndarray, sequence: int) -> None:
        """The node's own chunk, as published (observation stamp, row spacing, robot-unit actions)."""
        self._published = pending_actions(stamp_s, dt, actions, sequence)

    def newest(self) -> PendingActions | None:
        """The executor's pending actions, or the node's last chunk where the executor has not answered it yet."""
        pending, published = self._pending, self._published
        if published is not None and (pending is None or pending.sequence < published.sequence):
            return published
        return pending

    def request(self, observation_s: float, start_s: float, dt: float, horizon: int, action_dim: int):
        """The RtcRequest for an inference on the observation stamped ``observation_s`` starting at ``start_s``,
        or None (then it runs without RTC): before the first measured latency, without pending actions that reach
        the observation, or with pending actions of another width."""
        latency = self.latency.value()
        pending = self.newest()
        prefix = None
        if latency is not None and pending is not None and pending.actions.shape[1] == action_dim:
            prefix = rtc_prefix(pending, observation_s, start_s + latency, dt, horizon)
        if prefix is None:
            self.skipped += 1
            return None
        from flashrt_core.rtc_request import RtcRequest   # here: this module stays importable without torch
        self.requests += 1
        return RtcRequest(prefix[0], prefix[1], self.mode, execution_horizon=self.execution_horizon or None,
                          max_guidance_weight=self.max_guidance_weight)


__all__ = ["LatencyEstimate", "PendingActions", "PolicyRtc", "pending_actions", "rtc_prefix"]
