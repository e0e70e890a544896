"""Input streams and log watching for node tests over DDS: cameras and state at a camera's rate, /rosout lines.

``InputStream`` publishes a frame per camera (and a joint state) every period from its own thread, as camera
drivers do; a test changes what it sends while it runs (a camera's clock offset, a camera that stops, bad frames,
NaN states). ``RosoutLines`` collects the policy node's /rosout lines, to count what it logged.
"""

from __future__ import annotations

import math
import threading
import time

from rcl_interfaces.msg import Log
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import Image

STREAM_HZ = 30.0


class InputStream:
    """Frames of every camera in ``cameras`` stamped now + ``offsets_s[camera]``, and a state, each period."""

    def __init__(self, harness, offsets_s=(0.0, 0.003), rate_hz: float = STREAM_HZ):
        self.harness = harness
        self.offsets_s = list(offsets_s)
        self.cameras = set(range(len(harness.camera_publishers)))
        self.bad_cameras: set[int] = set()        # these send an image of an unsupported encoding
        self.images: dict = {}                    # camera -> the message it sends (restamped) instead of a pattern
        self.send_state = True
        self.nan_state = False                    # True: every state sent is NaN (invalid)
        self.period_s = 1.0 / rate_hz
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "InputStream":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        h = self.harness
        while not self._stop.is_set():
            now = h.now_ns()
            if self.send_state:
                values = [math.nan] * h.node.policy.state_dim if self.nan_state else None
                h.send_state(now, values)
            for camera in sorted(self.cameras):
                image = self.images.get(camera)
                if camera in self.bad_cameras:
                    image = Image(height=4, width=4, encoding="yuv422", step=8, data=bytes(32))
                h.send_frame(camera, now + int(round(self.offsets_s[camera] * 1e9)), image)
            self._stop.wait(self.period_s)


class RosoutLines:
    """The /rosout lines of the harness's policy node (transient local: lines logged before discovery too)."""

    def __init__(self, harness):
        self.logger_name = f"{harness.namespace.strip('/')}.policy_node"
        self.lines: list[Log] = []
        qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL)
        harness.driver.create_subscription(Log, "/rosout", self._on_log, qos)

    def _on_log(self, msg: Log) -> None:
        if msg.name == self.logger_name:
            self.lines.append(msg)

    def count(self, text: str) -> int:
        return sum(text in line.msg for line in list(self.lines))

    def with_text(self, text: str) -> list[str]:
        return [line.msg for line in list(self.lines) if text in line.msg]


def seconds_since(start: float) -> float:
    return time.monotonic() - start


__all__ = ["InputStream", "RosoutLines", "STREAM_HZ", "seconds_since"]
