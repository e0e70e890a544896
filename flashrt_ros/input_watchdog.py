"""Watches the policy node's inputs while it is active and names what keeps chunks from going out.

Pure Python (no rclpy): the node reports each frame (received, accepted or rejected, and for compressed frames
whether the inference thread could decode it), each completed observation and its newest valid state; a timer
calls ``check`` and turns the faults into /diagnostics, logs and counters. Times are seconds of the node clock
(ROS time: under use_sim_time the bag's clock, so a slowed-down replay is judged at the bag's pace and a paused one
raises no fault); the clock going backwards (a looping bag), or starting (sim time reads 0 until the first /clock),
starts the watch afresh.

Faults (each one means no chunk can be computed; ``check`` returns every one that holds):

- ``CAMERA_SILENT``: a camera sent no frame for ``camera_timeout`` (since activation, or since its last frame).
- ``CAMERA_REJECTED``: a camera sends frames, but none was usable for ``camera_timeout``: each was rejected (bad
  image, stamp in the future or older than max_observation_age, out of order) or, compressed, failed to decode.
- ``PAIRING_STALL``: every camera delivers usable frames, yet no observation completed for ``pairing_timeout``:
  their stamps never come within sync_slop (one camera's clock is off). The message names the stamp offsets.
- ``STATE_STALE``: with a state topic, no valid state for ``max_state_age`` since activation, or the newest valid
  state is older than ``max_state_age`` on the node clock (the topic stopped, or only NaN states since).

    watchdog = InputWatchdog(["camera_0/image_raw", "camera_1/image_raw"])
    watchdog.reset(now_s)                                     # at activation
    watchdog.frame_received(0, now_s); watchdog.frame_accepted(0, stamp_ns, now_s)
    faults = watchdog.check(now_s, limits, state_age_s=0.1)    # -> tuple of Fault, empty when all is well
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from typing import Sequence


class FaultKind(enum.Enum):
    CAMERA_SILENT = "camera_silent"
    CAMERA_REJECTED = "camera_rejected"
    PAIRING_STALL = "pairing_stall"
    STATE_STALE = "state_stale"


@dataclasses.dataclass(frozen=True)
class Fault:
    """One input fault: its kind, the topic it concerns and a message saying why."""

    kind: FaultKind
    subject: str
    message: str

    @property
    def key(self) -> str:
        return f"{self.kind.value}:{self.subject}"


@dataclasses.dataclass(frozen=True)
class WatchLimits:
    """The detection limits [s] (parameters camera_timeout, pairing_timeout, max_state_age) and sync_slop."""

    camera_timeout_s: float
    pairing_timeout_s: float
    max_state_age_s: float
    sync_slop_s: float


@dataclasses.dataclass
class _Camera:
    received_s: float | None = None          # last frame that arrived
    accepted_s: float | None = None          # last frame that entered the observation buffer
    stamp_ns: int | None = None              # header stamp of that frame
    rejected_reason: str = ""                # why the last rejected frame was rejected
    undecodable_s: float | None = None       # last frame that failed to decode on the inference thread
    decoded_s: float | None = None           # last frame that decoded
    usable_since_s: float | None = None      # first accepted frame since the camera was last found at fault


class InputWatchdog:
    """Input faults of one activation; thread-safe (callbacks, the inference thread and a timer use it)."""

    def __init__(self, camera_topics: Sequence[str]):
        self.camera_topics = tuple(camera_topics)
        self._lock = threading.Lock()
        self.reset(0.0)

    def reset(self, now_s: float | None) -> None:
        """Start watching afresh (activation): every limit counts from ``now_s``; None: the clock has not started
        (sim time before the first /clock), the limits count from the first check."""
        with self._lock:
            self._since_s: float | None = now_s
            self._checked_s = now_s if now_s is not None else float("-inf")
            self._cameras = [_Camera() for _ in self.camera_topics]
            self._completed_s: float | None = None

    # -- reports -------------------------------------------------------------------------------------------
    def frame_received(self, index: int, now_s: float) -> None:
        with self._lock:
            self._cameras[index].received_s = now_s

    def frame_accepted(self, index: int, stamp_ns: int, now_s: float) -> None:
        with self._lock:
            camera = self._cameras[index]
            camera.accepted_s, camera.stamp_ns = now_s, int(stamp_ns)
            if camera.usable_since_s is None:
                camera.usable_since_s = now_s

    def frame_rejected(self, index: int, reason: str) -> None:
        with self._lock:
            self._cameras[index].rejected_reason = reason

    def frame_decoded(self, index: int, now_s: float, error: str | None = None) -> None:
        """The inference thread decoded (``error`` None) or failed to decode a frame of camera ``index``."""
        with self._lock:
            camera = self._cameras[index]
            if error is None:
                camera.decoded_s = now_s
            else:
                camera.undecodable_s, camera.rejected_reason = now_s, error

    def observation_completed(self, now_s: float) -> None:
        with self._lock:
            self._completed_s = now_s

    # -- check ---------------------------------------------------------------------------------------------
    def check(self, now_s: float, limits: WatchLimits, state_topic: str = "",
              state_age_s: float | None = None) -> tuple[Fault, ...]:
        """The faults that hold at ``now_s``. ``state_age_s``: age of the newest valid state on the node clock,
        None when there is none (only looked at with a ``state_topic``)."""
        if self._since_s is None or now_s < self._checked_s:
            self.reset(now_s)            # the clock started, or went backwards: another timeline
        with self._lock:
            self._checked_s = now_s
            faults = []
            for topic, camera in zip(self.camera_topics, self._cameras):
                fault = self._camera_fault(topic, camera, now_s, limits.camera_timeout_s)
                if fault is not None:
                    faults.append(fault)
                    camera.usable_since_s = None
            if not faults:
                stall = self._pairing_fault(now_s, limits)
                if stall is not None:
                    faults.append(stall)
            if state_topic:
                fault = self._state_fault(state_topic, now_s, limits.max_state_age_s, state_age_s)
                if fault is not None:
                    faults.append(fault)
            return tuple(faults)

    def _camera_fault(self, topic: str, camera: _Camera, now_s: float, timeout_s: float) -> Fault | None:
        if now_s - _latest(camera.received_s, self._since_s) > timeout_s:
            what = "since activation" if camera.received_s is None else f"for {now_s - camera.received_s:.2f} s"
            return Fault(FaultKind.CAMERA_SILENT, topic, f"{topic}: no frame {what} (camera_timeout {timeout_s} s)")
        last_usable = _latest(camera.accepted_s, self._since_s)
        if now_s - last_usable > timeout_s:
            return Fault(FaultKind.CAMERA_REJECTED, topic, f"{topic}: every frame of the last {timeout_s} s "
                         f"rejected (last: {camera.rejected_reason or 'unknown reason'})")
        if camera.undecodable_s is not None and now_s - camera.undecodable_s <= timeout_s and \
                (camera.decoded_s is None or camera.decoded_s < camera.undecodable_s):
            return Fault(FaultKind.CAMERA_REJECTED, topic, f"{topic}: its frames fail to decode "
                         f"(last: {camera.rejected_reason})")
        return None

    def _pairing_fault(self, now_s: float, limits: WatchLimits) -> Fault | None:
        """A stall counts from the last completed observation, or from when the last camera became usable."""
        stamps = [camera.stamp_ns for camera in self._cameras]
        usable_since = [camera.usable_since_s for camera in self._cameras]
        if None in stamps or None in usable_since:
            return None
        since = _latest(self._completed_s, self._since_s, *usable_since)
        if now_s - since <= limits.pairing_timeout_s:
            return None
        oldest = min(stamps)
        offsets = ", ".join(f"{topic} {(stamp - oldest) * 1e-9:+.3f} s"
                            for topic, stamp in zip(self.camera_topics, stamps))
        what = "since activation" if self._completed_s is None else f"for {now_s - self._completed_s:.2f} s"
        return Fault(FaultKind.PAIRING_STALL, "cameras", f"no complete observation {what}: the newest frames' "
                     f"stamps differ by more than sync_slop {limits.sync_slop_s} s ({offsets})")

    def _state_fault(self, topic: str, now_s: float, max_age_s: float, age_s: float | None) -> Fault | None:
        if age_s is None:
            if now_s - self._since_s > max_age_s:
                return Fault(FaultKind.STATE_STALE, topic, f"{topic}: no valid state since activation")
            return None
        if age_s > max_age_s:
            return Fault(FaultKind.STATE_STALE, topic, f"{topic}: newest valid state is {age_s:.2f} s old "
                         f"(max_state_age {max_age_s} s)")
        return None


def _latest(*times: float | None) -> float:
    """The latest of the times given (None: not seen)."""
    return max(t for t in times if t is not None)


__all__ = ["Fault", "FaultKind", "InputWatchdog", "WatchLimits"]
