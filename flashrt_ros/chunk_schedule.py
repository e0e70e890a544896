"""Which action the robot executes now, from the action chunks a policy published for past observations.

A chunk is a timetable: row i is meant for ``stamp + i * dt``, where ``stamp`` is the capture time of the
observation it was computed from (ActionChunk.header.stamp). A chunk computed from a frame 80 ms old arrives with
its first rows already in the past; the schedule reads every chunk by time, so those rows are skipped, never
executed late. A chunk covers the times ``stamp <= t <= stamp + (horizon - 1) * dt``.

Switching between chunks (``Switching``):

- ``latest``: the chunk with the newest observation that covers ``t``; a new chunk takes over at once.
- ``temporal_fusion``: the weighted mean of every chunk that covers ``t``, chunk ``c`` weighted
  ``exp(-fusion_decay * (newest_stamp - stamp_c))``: the newest observation weighs 1 and older ones decay with how
  much older they are (0 = the plain mean). This is ACT's temporal ensembling with weights on observation age;
  it trades a little lag for smaller jumps where chunks disagree.

Between two rows the action is interpolated linearly in time (``interpolate``), or the earlier row is held.

The seam of a switch is the discontinuity it causes at the switch time: the largest absolute difference over the
action dimensions between what the schedule commands with the new chunk and what it would have commanded without
it (the previous source, or the last command where nothing else covers ``t``). Nothing here knows ROS: times are
seconds on the node's clock.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np


class Switching(enum.Enum):
    LATEST = "latest"
    TEMPORAL_FUSION = "temporal_fusion"


class ChunkRejected(ValueError):
    """A chunk the schedule cannot use; the message says why."""


@dataclass(frozen=True)
class TimedChunk:
    """One chunk: ``actions[i]`` (robot units) is meant for ``stamp_s + i * dt``."""

    stamp_s: float
    dt: float
    actions: np.ndarray          # [horizon, action_dim] float64
    sequence: int = 0

    @property
    def end_s(self) -> float:
        """Time of the last row."""
        return self.stamp_s + (len(self.actions) - 1) * self.dt

    def covers(self, t: float) -> bool:
        return self.stamp_s <= t <= self.end_s

    def action_at(self, t: float, interpolate: bool) -> np.ndarray:
        """The action for time ``t`` (which the chunk covers): rows interpolated linearly, or the earlier held."""
        position = (t - self.stamp_s) / self.dt
        row = min(int(math.floor(position)), len(self.actions) - 1)
        if not interpolate or row == len(self.actions) - 1:
            return self.actions[row].copy()
        fraction = position - row
        return (1.0 - fraction) * self.actions[row] + fraction * self.actions[row + 1]


def timed_chunk(stamp_s: float, dt: float, actions: np.ndarray, sequence: int = 0) -> TimedChunk:
    """A TimedChunk from message fields, checked: ChunkRejected names what is wrong."""
    actions = np.asarray(actions, dtype=np.float64)
    if actions.ndim != 2 or actions.shape[0] < 1 or actions.shape[1] < 1:
        raise ChunkRejected(f"actions must be [horizon >= 1, action_dim >= 1], got shape {actions.shape}")
    if not (math.isfinite(dt) and dt > 0.0):
        raise ChunkRejected(f"dt must be a finite positive number of seconds, got {dt!r}")
    if not math.isfinite(stamp_s) or stamp_s <= 0.0:
        raise ChunkRejected(f"stamp must be a positive time, got {stamp_s!r} s")
    if not np.all(np.isfinite(actions)):
        raise ChunkRejected("actions contain NaN or infinity")
    return TimedChunk(float(stamp_s), float(dt), actions, int(sequence))


@dataclass(frozen=True)
class Command:
    """What to execute at one tick, and what the tick says about the chunks."""

    action: np.ndarray
    source_sequence: int         # the newest chunk that contributed
    switched: bool               # a chunk newer than the last tick's source contributes from this tick on
    seam: float                  # with switched: the discontinuity it causes (see the module docstring), else 0
    chunk_age_s: float           # t minus the newest contributing chunk's observation stamp


class ChunkSchedule:
    """Chunks by observation time, and the command for any time ``t``. Not thread-safe: one caller."""

    def __init__(self, switching: Switching = Switching.LATEST, fusion_decay: float = 0.0,
                 interpolate: bool = True):
        if fusion_decay < 0.0 or not math.isfinite(fusion_decay):
            raise ValueError(f"fusion_decay must be >= 0 [1/s], got {fusion_decay!r}")
        self.switching = switching
        self.fusion_decay = float(fusion_decay)
        self.interpolate = interpolate
        self._chunks: list[TimedChunk] = []      # ascending stamp
        self._source: TimedChunk | None = None   # the newest chunk of the last command
        self._last_action: np.ndarray | None = None

    @property
    def chunk_count(self) -> int:
        return len(self._chunks)

    @property
    def last_action(self) -> np.ndarray | None:
        return None if self._last_action is None else self._last_action.copy()

    def clear(self) -> None:
        self._chunks.clear()
        self._source = None
        self._last_action = None

    def add(self, chunk: TimedChunk) -> None:
        """Store a chunk. ChunkRejected where its width differs from the stored chunks' or a chunk of the same
        observation is stored already (a policy publishes one chunk per observation)."""
        if self._chunks and chunk.actions.shape[1] != self._chunks[-1].actions.shape[1]:
            raise ChunkRejected(f"action_dim {chunk.actions.shape[1]} differs from the stored chunks' "
                                f"{self._chunks[-1].actions.shape[1]}")
        if any(stored.stamp_s == chunk.stamp_s for stored in self._chunks):
            raise ChunkRejected(f"a chunk of the observation stamped {chunk.stamp_s:.9f} s is stored already")
        self._chunks.append(chunk)
        self._chunks.sort(key=lambda c: c.stamp_s)

    def command(self, t: float) -> Command | None:
        """The command for time ``t``, or None where no stored chunk covers ``t`` (a missed deadline). Chunks that
        end before ``t`` are dropped: time on the node's clock only moves forward between calls."""
        self._chunks = [c for c in self._chunks if c.end_s >= t]
        covering = [c for c in self._chunks if c.covers(t)]
        if not covering:
            return None
        newest = covering[-1]
        action = self._mix(covering, t)
        switched = self._source is None or newest.stamp_s > self._source.stamp_s
        seam = 0.0
        if switched and (self._source is not None or self._last_action is not None):
            older = [c for c in covering if c is not newest]
            if older:
                without = self._mix(older, t)
            elif self._source is not None and self._source.covers(t):
                without = self._source.action_at(t, self.interpolate)
            else:
                without = self._last_action
            if without is not None:
                seam = float(np.max(np.abs(action - without)))
        self._source = newest
        self._last_action = action
        return Command(action.copy(), newest.sequence, switched, seam, t - newest.stamp_s)

    def preview(self, start_s: float, dt: float, max_rows: int) -> np.ndarray:
        """The actions the schedule would command at ``start_s + i * dt`` with the chunks it holds now, for i from 0
        while a chunk covers that time (at most ``max_rows``): [rows, action_dim], rows 0 where nothing covers
        ``start_s``. Changes nothing (no chunk dropped, no switch recorded): what the executor will still execute,
        for a policy that conditions its next chunk on it (real-time chunking, flashrt_ros/rtc_sharing.py)."""
        rows = []
        for i in range(max(0, int(max_rows))):
            t = start_s + i * dt
            covering = [c for c in self._chunks if c.covers(t)]
            if not covering:
                break
            rows.append(self._mix(covering, t))
        width = self._chunks[-1].actions.shape[1] if self._chunks else 0
        return np.stack(rows) if rows else np.zeros((0, width))

    def _mix(self, covering: list[TimedChunk], t: float) -> np.ndarray:
        """The action of the covering chunks (ascending stamp) under the switching mode."""
        if self.switching is Switching.LATEST or len(covering) == 1:
            return covering[-1].action_at(t, self.interpolate)
        newest_stamp = covering[-1].stamp_s
        weights = np.array([math.exp(-self.fusion_decay * (newest_stamp - c.stamp_s)) for c in covering])
        actions = np.stack([c.action_at(t, self.interpolate) for c in covering])
        return (weights[:, None] * actions).sum(axis=0) / weights.sum()


__all__ = ["ChunkRejected", "ChunkSchedule", "Command", "Switching", "TimedChunk", "timed_chunk"]
