"""Pairs camera frames into observations by header stamp, keeping only the newest one.

Pure Python (no rclpy): the policy node and the bag evaluator share these pairing rules.

Rules (all stamps are int nanoseconds on one clock, the node clock / the bag's header clock):

1. Frames arrive per camera (``view``). Each camera keeps its last ``history`` frames.
2. When a frame arrives, the buffer tries to complete an observation anchored on it: for every
   other camera it takes the frame whose stamp is closest to the new frame's stamp. The set is
   complete when every camera has a frame and ``max(stamps) - min(stamps) <= slop_ns``.
3. A complete observation becomes the *pending* one only if it is newer (by its oldest stamp)
   than the pending and the last taken observation. A pending observation that is replaced
   before anyone took it is counted in ``replaced``. Frames used by an observation (and older
   ones) are dropped from their queues, so a frame never enters two observations.
4. The observation stamp is the OLDEST camera stamp in it (the most conservative age).
5. A frame older than ``max_age_ns`` relative to ``now_ns`` at arrival is rejected (``stale``);
   ``take`` returns no observation older than ``max_age_ns`` either (counted as ``stale``).
6. Time jumping backwards by more than ``jump_tolerance_ns`` (a frame stamp older than the
   previous frame of the same camera, or ``now_ns`` older than the newest ``now_ns`` seen, e.g. a
   looping bag) clears everything and starts over; counted in ``time_resets``, and a pending
   observation dropped by it (or by ``clear``) in ``dropped_by_reset``. A frame whose stamp
   is not newer than the previous frame of its camera, but within the tolerance, is a duplicate or
   out-of-order delivery and is rejected (``out_of_order``). ``now_ns`` going back by less than the
   tolerance (callbacks reading the clock on different threads) is ignored.

The buffer is thread-safe: ROS callbacks add frames while the inference thread takes.

    buffer = ObservationBuffer(["base_0_rgb", "left_wrist_0_rgb"], slop_ns=20_000_000, max_age_ns=500_000_000)
    buffer.add_frame("base_0_rgb", stamp_ns, msg, now_ns)         # -> AddResult
    observation = buffer.take(now_ns)                             # newest complete one, or None
    observation.stamp_ns, observation.view_stamps_ns, [f.payload for f in observation.frames]
    buffer.counters()                                             # completed / taken / replaced / stale / ...
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import threading
from typing import Deque, Generic, Sequence, TypeVar

Payload = TypeVar("Payload")


@dataclasses.dataclass(frozen=True)
class Frame(Generic[Payload]):
    """One camera frame: its header stamp and an opaque payload (a message or an array)."""

    stamp_ns: int
    payload: Payload


@dataclasses.dataclass(frozen=True)
class Observation(Generic[Payload]):
    """A complete set of frames, one per view, in the buffer's view order."""

    frames: tuple[Frame[Payload], ...]
    completed_ns: int = 0        # ``now_ns`` of the add_frame call that completed it

    @property
    def stamp_ns(self) -> int:
        """Observation stamp: the oldest camera stamp."""
        return min(frame.stamp_ns for frame in self.frames)

    @property
    def view_stamps_ns(self) -> tuple[int, ...]:
        return tuple(frame.stamp_ns for frame in self.frames)

    @property
    def spread_ns(self) -> int:
        """Newest minus oldest camera stamp."""
        stamps = self.view_stamps_ns
        return max(stamps) - min(stamps)


class AddResult(enum.Enum):
    """What ``ObservationBuffer.add_frame`` did with a frame."""

    QUEUED = "queued"                # kept, no complete observation yet
    COMPLETED = "completed"          # completed a new pending observation
    STALE = "stale"                  # older than max_age at arrival: dropped
    OUT_OF_ORDER = "out_of_order"    # not newer than the previous frame of this view: dropped
    OUTDATED = "outdated"            # would only complete an observation older than one already seen
    RESET = "reset"                  # time went backwards: buffer cleared, frame kept as a new start


@dataclasses.dataclass(frozen=True)
class BufferCounters:
    """Counters since construction or ``reset_counters``."""

    frames: int = 0
    completed: int = 0
    taken: int = 0
    replaced: int = 0
    stale: int = 0
    out_of_order: int = 0
    time_resets: int = 0
    dropped_by_reset: int = 0     # pending observations a time reset or clear() dropped before anyone took them


class ObservationBuffer(Generic[Payload]):
    """Newest-complete-observation buffer for N cameras (see the module docstring for the rules)."""

    def __init__(self, view_names: Sequence[str], slop_ns: int, max_age_ns: int, history: int = 4,
                 jump_tolerance_ns: int = 200_000_000):
        if not view_names:
            raise ValueError("ObservationBuffer needs at least one view name")
        if len(set(view_names)) != len(view_names):
            raise ValueError(f"view names must be unique, got {list(view_names)}")
        if slop_ns < 0:
            raise ValueError(f"slop_ns must be >= 0, got {slop_ns}")
        if max_age_ns <= 0:
            raise ValueError(f"max_age_ns must be > 0, got {max_age_ns}")
        if history < 1:
            raise ValueError(f"history must be >= 1, got {history}")
        if jump_tolerance_ns < 0:
            raise ValueError(f"jump_tolerance_ns must be >= 0, got {jump_tolerance_ns}")
        self._jump_tolerance_ns = int(jump_tolerance_ns)
        self.view_names: tuple[str, ...] = tuple(view_names)
        self._index = {name: i for i, name in enumerate(self.view_names)}
        self._slop_ns = int(slop_ns)
        self._max_age_ns = int(max_age_ns)
        self._lock = threading.Lock()
        self._queues: list[Deque[Frame[Payload]]] = [collections.deque(maxlen=history) for _ in view_names]
        self._last_stamp_ns: list[int | None] = [None] * len(view_names)
        self._last_now_ns: int | None = None
        self._pending: Observation[Payload] | None = None
        self._newest_stamp_ns: int | None = None   # stamp of the newest observation completed
        self._counts = collections.Counter()

    # -- settings ---------------------------------------------------------------------------
    def set_limits(self, slop_ns: int | None = None, max_age_ns: int | None = None) -> None:
        """Change the pairing slop and/or the age limit (applies to the next frames)."""
        with self._lock:
            if slop_ns is not None:
                if slop_ns < 0:
                    raise ValueError(f"slop_ns must be >= 0, got {slop_ns}")
                self._slop_ns = int(slop_ns)
            if max_age_ns is not None:
                if max_age_ns <= 0:
                    raise ValueError(f"max_age_ns must be > 0, got {max_age_ns}")
                self._max_age_ns = int(max_age_ns)

    # -- input ------------------------------------------------------------------------------
    def add_frame(self, view: str | int, stamp_ns: int, payload: Payload, now_ns: int) -> AddResult:
        """Add one frame of ``view`` (name or index) captured at ``stamp_ns``, received at ``now_ns``."""
        index = self._view_index(view)
        stamp_ns, now_ns = int(stamp_ns), int(now_ns)
        with self._lock:
            self._counts["frames"] += 1
            result = AddResult.QUEUED
            if self._time_went_back(index, stamp_ns, now_ns):
                self._clear_locked()
                self._counts["time_resets"] += 1
                result = AddResult.RESET
            elif self._last_stamp_ns[index] is not None and stamp_ns <= self._last_stamp_ns[index]:
                self._counts["out_of_order"] += 1
                return AddResult.OUT_OF_ORDER
            self._last_now_ns = max(now_ns, self._last_now_ns or now_ns)
            self._last_stamp_ns[index] = stamp_ns
            if now_ns - stamp_ns > self._max_age_ns:
                self._counts["stale"] += 1
                return AddResult.STALE
            frame = Frame(stamp_ns, payload)
            self._queues[index].append(frame)
            observation = self._complete_around(index, frame, now_ns)
            if observation is None:
                return result
            if self._newest_stamp_ns is not None and observation.stamp_ns <= self._newest_stamp_ns:
                return AddResult.OUTDATED if result is AddResult.QUEUED else result
            self._consume(observation)
            if self._pending is not None:
                self._counts["replaced"] += 1
            self._pending = observation
            self._newest_stamp_ns = observation.stamp_ns
            self._counts["completed"] += 1
            return AddResult.COMPLETED if result is AddResult.QUEUED else result

    def note_time(self, now_ns: int) -> bool:
        """Tell the buffer the current time; clears it and returns True if time went backwards."""
        with self._lock:
            now_ns = int(now_ns)
            if self._last_now_ns is not None and now_ns < self._last_now_ns - self._jump_tolerance_ns:
                self._clear_locked()
                self._counts["time_resets"] += 1
                self._last_now_ns = now_ns
                return True
            self._last_now_ns = max(now_ns, self._last_now_ns or now_ns)
            return False

    # -- output -----------------------------------------------------------------------------
    def take(self, now_ns: int) -> Observation[Payload] | None:
        """Remove and return the pending observation, or None if there is none or it is too old."""
        with self._lock:
            observation, self._pending = self._pending, None
            if observation is None:
                return None
            if int(now_ns) - observation.stamp_ns > self._max_age_ns:
                self._counts["stale"] += 1
                return None
            self._counts["taken"] += 1
            return observation

    def has_pending(self) -> bool:
        with self._lock:
            return self._pending is not None

    def counters(self) -> BufferCounters:
        with self._lock:
            return BufferCounters(**{f.name: self._counts[f.name] for f in dataclasses.fields(BufferCounters)})

    def clear(self) -> None:
        """Drop all frames and the pending observation (keeps the counters)."""
        with self._lock:
            self._clear_locked()

    def reset_counters(self) -> None:
        with self._lock:
            self._counts.clear()

    # -- internals (lock held) --------------------------------------------------------------
    def _view_index(self, view: str | int) -> int:
        if isinstance(view, int):
            if not 0 <= view < len(self.view_names):
                raise ValueError(f"view index {view} out of range for {len(self.view_names)} views")
            return view
        try:
            return self._index[view]
        except KeyError:
            raise ValueError(f"unknown view {view!r}; known views: {list(self.view_names)}") from None

    def _time_went_back(self, index: int, stamp_ns: int, now_ns: int) -> bool:
        last_stamp = self._last_stamp_ns[index]
        if last_stamp is not None and stamp_ns < last_stamp - self._jump_tolerance_ns:
            return True
        return self._last_now_ns is not None and now_ns < self._last_now_ns - self._jump_tolerance_ns

    def _clear_locked(self) -> None:
        if self._pending is not None:
            self._counts["dropped_by_reset"] += 1
        for queue in self._queues:
            queue.clear()
        self._last_stamp_ns = [None] * len(self.view_names)
        self._last_now_ns = None
        self._pending = None
        self._newest_stamp_ns = None

    def _complete_around(self, index: int, anchor: Frame[Payload], now_ns: int) -> Observation[Payload] | None:
        frames: list[Frame[Payload]] = []
        for i, queue in enumerate(self._queues):
            if i == index:
                frames.append(anchor)
                continue
            if not queue:
                return None
            frames.append(min(queue, key=lambda f: abs(f.stamp_ns - anchor.stamp_ns)))
        observation = Observation(tuple(frames), completed_ns=now_ns)
        return observation if observation.spread_ns <= self._slop_ns else None

    def _consume(self, observation: Observation[Payload]) -> None:
        for queue, used in zip(self._queues, observation.frames):
            while queue and queue[0].stamp_ns <= used.stamp_ns:
                queue.popleft()


def seconds_to_ns(seconds: float) -> int:
    """Convert seconds (float) to int nanoseconds, rounding to the nearest ns."""
    return int(round(seconds * 1e9))


__all__ = ["AddResult", "BufferCounters", "Frame", "Observation", "ObservationBuffer", "seconds_to_ns"]
