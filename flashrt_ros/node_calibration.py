"""The policy node's FP8 calibration: real observations only, never the warm-up's frames.

An FP8 policy (``precision: fp8``) refuses to predict until its activation scales are set from real observations
(flashrt_core's Policy.calibrate). The node gets them in one of two ways:

- ``calibration_bag`` set: at configure, the first ``calibration_observations`` + ``calibration_gate_observations``
  complete observations of a rosbag2 (paired by the node's own rules: ``bag_observations``, through the offline
  evaluator's reader), the first ones to calibrate and the rest held out for the accuracy gate. The scales are kept
  in ``fp8_scale_cache`` under a key of the checkpoint's weight content and the bag's observations, so the next
  configure with the same checkpoint and bag reads them instead of running the forwards.
- else, after activation (``LiveCalibration``): the inference thread takes the first complete observations as they
  come (each one once, as it would infer on them), publishes nothing meanwhile, calibrates on the first
  ``calibration_observations``, runs the gate on the next ``calibration_gate_observations``, then publishes.

Progress and outcome are logged and shown in /diagnostics (``fp8_calibration``; WARN while collecting, ERROR when
the calibration or its gate failed: the node then publishes nothing until it is configured again).
"""

from __future__ import annotations

import enum
import logging
import time
from pathlib import Path

import numpy as np

LOGGER = logging.getLogger(__name__)


class CalibrationState(enum.Enum):
    COLLECTING = "collecting"
    DONE = "done"
    FAILED = "failed"


class LiveCalibration:
    """The first real observations after activation, then Policy.calibrate (on the inference thread)."""

    def __init__(self, calibrate_count: int, gate_count: int):
        if calibrate_count < 1 or gate_count < 0:
            raise ValueError(f"calibration needs >= 1 observation and >= 0 held out, got {calibrate_count}, "
                             f"{gate_count}")
        self.calibrate_count = calibrate_count
        self.gate_count = gate_count
        self.observations: list[tuple] = []
        self.state = CalibrationState.COLLECTING
        self.status = f"collecting 0/{self.needed} real observations"
        self.report = None

    @property
    def needed(self) -> int:
        return self.calibrate_count + self.gate_count

    @property
    def publishing(self) -> bool:
        return self.state is CalibrationState.DONE

    def add(self, images: dict, prompt: str, state: np.ndarray | None) -> bool:
        """Keep one observation (copies: the frames' buffers are the node's). True once enough are kept."""
        if self.state is not CalibrationState.COLLECTING:
            return False
        kept = {view: np.array(image, copy=True) for view, image in images.items()}
        self.observations.append((kept, prompt, None if state is None else np.array(state, copy=True)))
        self.status = f"collecting {len(self.observations)}/{self.needed} real observations"
        return len(self.observations) >= self.needed

    def run(self, policy, scale_cache: str | None = None):
        """Calibrate on the kept observations and gate on the held-out ones; the report, or the error raised
        (state FAILED, status naming it)."""
        calibration = self.observations[:self.calibrate_count]
        held_out = self.observations[self.calibrate_count:]
        try:
            self.report = policy.calibrate(calibration, held_out=held_out, scale_cache=scale_cache)
        except Exception as error:
            self.state = CalibrationState.FAILED
            self.status = f"failed: {type(error).__name__}: {error}"
            raise
        finally:
            self.observations = []
        self.state = CalibrationState.DONE
        self.status = self.report.summary()
        return self.report


def calibrate_from_bag(policy, bag: str | Path, settings, calibrate_count: int, gate_count: int,
                       scale_cache: str | None, namespace: str = "/"):
    """Policy.calibrate on a bag's first complete observations (bag_observations); returns the report."""
    start = time.perf_counter()
    observations = bag_observations(Path(bag).expanduser(), policy, settings, calibrate_count + gate_count,
                                    namespace)
    if len(observations) < calibrate_count + gate_count:
        raise ValueError(f"calibration_bag {bag} has {len(observations)} complete observations under the node's "
                         f"settings; calibration_observations {calibrate_count} + calibration_gate_observations "
                         f"{gate_count} are needed")
    LOGGER.info("read %d calibration observations from %s in %.2f s", len(observations), bag,
                time.perf_counter() - start)
    return policy.calibrate(observations[:calibrate_count], held_out=observations[calibrate_count:],
                            scale_cache=scale_cache or None)


def calibrate_offline(policy, settings, bag: str | Path, namespace: str = "/"):
    """An FP8 policy of the offline tools (bag_evaluator, bag_regression), calibrated as the node calibrates with
    calibration_bag: on that bag, or on the evaluated `bag` where none is set (a live node with live calibration
    sees other observations, so its scales differ). None for other policies."""
    if not getattr(policy, "fp8", False):
        return None
    return calibrate_from_bag(policy, settings.calibration_bag or bag, settings, settings.calibration_observations,
                              settings.calibration_gate_observations, settings.fp8_scale_cache, namespace)


class _Enough(Exception):
    """Enough observations were read from the bag."""


class _Collector:
    """Stands in for the policy in the offline evaluator: keeps each observation it is asked to infer on."""

    def __init__(self, policy, count: int):
        self._policy = policy
        self.count = count
        self.observations: list[tuple] = []

    def __getattr__(self, name):
        return getattr(self._policy, name)

    def predict(self, images, prompt, state=None, noise=None):
        self.observations.append((dict(images), prompt, state))
        if len(self.observations) >= self.count:
            raise _Enough
        return np.zeros((self._policy.horizon, self._policy.action_dim), np.float32)


def bag_observations(bag: Path, policy, settings, count: int, namespace: str = "/") -> list[tuple]:
    """The first ``count`` complete observations of ``bag`` as (images by view, prompt, state), paired, checked and
    decoded by the node's rules (flashrt_ros.bag_evaluator's reader)."""
    from rosbags.rosbag2 import Reader

    from flashrt_ros.bag_common import BagError, bag_typestore
    from flashrt_ros.bag_evaluator import _Evaluator

    if not bag.exists():
        raise BagError(f"calibration_bag {bag} does not exist")
    collector = _Collector(policy, count)
    evaluator = _Evaluator(collector, settings, 0, namespace)       # the noise seed is unused: nothing is inferred
    store = bag_typestore()
    with Reader(bag) as reader:
        present = {c.topic for c in reader.connections}
        missing = sorted(t for t in evaluator.camera_index if t not in present)
        if missing:
            raise BagError(f"calibration_bag {bag} lacks the camera topics {missing} (it has {sorted(present)})")
        connections = [c for c in reader.connections if c.topic in evaluator.topics]
        try:
            for conn, receive_ns, raw in reader.messages(connections=connections):
                evaluator.feed(conn.topic, receive_ns, store.deserialize_cdr(raw, conn.msgtype))
        except _Enough:
            pass
    return collector.observations
