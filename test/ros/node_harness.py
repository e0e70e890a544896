"""Runs a PolicyNode with real rclpy over loopback DDS and a driver node that feeds and watches it.

Each harness has its own rclpy context and namespace (/t<N>), so tests in one process do not see each
other's topics. The driver publishes cameras / instruction / state like a robot would, drives the
lifecycle over the node's services (LifecycleClient) and records chunks, trajectories, statuses and
/diagnostics entries of this node.

Model: ``shared_policy()`` loads flashrt_core's embedded demo checkpoint once per test session;
``BorrowedPolicy`` hands it to a node without letting the node's cleanup close it (tests of the real
load / close path use the node's default factory instead). ``delay_s`` adds a fixed wait before each
forward pass, to make inference slower than the camera rate on any machine.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Callable

import numpy as np

import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.parameter import Parameter
from rclpy.signals import SignalHandlerOptions
from rclpy.time import Time
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Float64MultiArray, String
from trajectory_msgs.msg import JointTrajectory

from flashrt_ros import qos_profiles, waiting
from flashrt_ros.demo_main import LifecycleClient
from flashrt_ros.image_conversion import rgb_to_image_fields
from flashrt_ros.msg import ActionChunk, PolicyStatus
from flashrt_ros.node_executor import make_executor
from flashrt_ros.policy_node import PolicyNode

DISCOVERY_TIMEOUT_S = 20.0
TEST_IMAGE_SHAPE = (120, 160, 3)       # small frames keep CPU tests fast; the benchmark uses 640x480
_namespaces = itertools.count()
_shared = {}


def shared_policy():
    """The embedded demo policy, loaded once per process."""
    if "policy" not in _shared:
        import flashrt_core
        _shared["policy"] = flashrt_core.load_model(device="cpu")
    return _shared["policy"]


class BorrowedPolicy:
    """The shared policy for one node configuration; ``close`` only marks it closed."""

    def __init__(self, policy, delay_s: float = 0.0):
        self._policy = policy
        self.delay_s = delay_s
        self.closed = False
        self.calls = 0

    def __getattr__(self, name):
        return getattr(self._policy, name)

    def predict(self, images, prompt, state=None, noise=None):
        if self.closed:
            raise RuntimeError("predict after close")
        self.calls += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        return self._policy.predict(images, prompt, state=state, noise=noise)

    def close(self):
        self.closed = True


def pattern_frame(value: int) -> np.ndarray:
    frame = np.zeros(TEST_IMAGE_SHAPE, np.uint8)
    frame[..., 0] = value % 256
    frame[10:40, 20:60] = 255
    return frame


class NodeHarness:
    def __init__(self, parameters: dict | None = None, policy_factory: Callable | None = None,
                 cameras: tuple[str, ...] = ("camera_0/image_raw", "camera_1/image_raw")):
        self.namespace = f"/t{next(_namespaces)}_{int(time.time() * 1000) % 100000}"
        self.context = rclpy.Context()
        rclpy.init(context=self.context, signal_handler_options=SignalHandlerOptions.NO)
        values = {"camera_topics": list(cameras), "state_topic": "joint_states", "warmup_iterations": 0,
                  "diagnostics_period": 0.25}
        values.update(parameters or {})
        self.camera_topics = tuple(values["camera_topics"])
        overrides = [Parameter(name, value=value) for name, value in values.items()]
        kwargs = {} if policy_factory is None else {"policy_factory": policy_factory}
        self.node = PolicyNode(namespace=self.namespace, context=self.context, parameter_overrides=overrides,
                               **kwargs)
        self.driver = rclpy.create_node("test_driver", namespace=self.namespace, context=self.context)
        self.lifecycle = LifecycleClient(self.driver, f"{self.namespace}/policy_node")
        self.chunks: list[ActionChunk] = []
        self.chunk_arrival: list[float] = []
        self.trajectories: list[JointTrajectory] = []
        self.statuses: list[PolicyStatus] = []
        self.diagnostics: list = []
        self._lock = threading.Lock()
        output = values.get("output_topic", "action_chunk")
        self.driver.create_subscription(ActionChunk, output, self._on_chunk, qos_profiles.output_qos())
        if values.get("trajectory_topic"):
            self.driver.create_subscription(JointTrajectory, values["trajectory_topic"], self.trajectories.append,
                                            qos_profiles.output_qos())
        self.driver.create_subscription(PolicyStatus, "policy_node/status", self.statuses.append,
                                        qos_profiles.output_qos())
        self.driver.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics,
                                        qos_profiles.diagnostics_qos())
        self.camera_publishers = [
            self.driver.create_publisher(CompressedImage if t.endswith("/compressed") else Image, t,
                                         qos_profiles.camera_qos()) for t in self.camera_topics]
        self.instruction_publisher = self.driver.create_publisher(
            String, values.get("instruction_topic", "instruction"), qos_profiles.instruction_qos())
        self.state_type = Float64MultiArray if values.get("state_type") == "float_array" else JointState
        self.state_publisher = self.driver.create_publisher(self.state_type, values["state_topic"] or "joint_states",
                                                            qos_profiles.state_qos())
        self.clock_publisher = self.driver.create_publisher(Clock, "/clock", 10)
        self.executor = make_executor(self.node.get_parameter("executor").value, context=self.context)
        self.executor.add_node(self.node)
        self.executor.add_node(self.driver)
        self._spinner = threading.Thread(target=self.executor.spin, daemon=True)
        self._spinner.start()
        assert self.lifecycle.wait_for_services(DISCOVERY_TIMEOUT_S), "lifecycle services did not appear"

    # -- driving ------------------------------------------------------------------------------------------
    def now_ns(self) -> int:
        return self.node.get_clock().now().nanoseconds

    def wait_for_subscribers(self) -> None:
        publishers = self.camera_publishers + [self.state_publisher]
        assert wait_until(lambda: all(p.get_subscription_count() > 0 for p in publishers)), \
            "the node's subscriptions were not discovered"

    def send_instruction(self, text: str = "pick up the cube") -> None:
        self.instruction_publisher.publish(String(data=text))

    def send_state(self, stamp_ns: int, values=None) -> None:
        dim = self.node.policy.state_dim
        values = np.linspace(-0.5, 0.5, dim) if values is None else values
        if self.state_type is Float64MultiArray:       # no header: the node stamps it on arrival
            self.state_publisher.publish(Float64MultiArray(data=[float(v) for v in values]))
            return
        msg = JointState(name=[f"joint_{i}" for i in range(len(values))], position=[float(v) for v in values])
        msg.header.stamp = Time(nanoseconds=stamp_ns).to_msg()
        self.state_publisher.publish(msg)

    def send_frame(self, camera: int, stamp_ns: int, image=None) -> None:
        if image is None:
            image = Image(**rgb_to_image_fields(pattern_frame(stamp_ns // 1_000_000)))
        image.header.stamp = Time(nanoseconds=stamp_ns).to_msg()
        self.camera_publishers[camera].publish(image)

    def send_observation(self, stamp_ns: int, offsets_ns=(0, 3_000_000), with_state: bool = True) -> None:
        if with_state:
            self.send_state(stamp_ns)
        for camera, offset in enumerate(offsets_ns[:len(self.camera_publishers)]):
            self.send_frame(camera, stamp_ns + offset)

    def send_clock(self, stamp_ns: int) -> None:
        self.clock_publisher.publish(Clock(clock=Time(nanoseconds=stamp_ns).to_msg()))

    # -- watching -----------------------------------------------------------------------------------------
    def _on_chunk(self, msg: ActionChunk) -> None:
        with self._lock:
            self.chunks.append(msg)
            self.chunk_arrival.append(time.monotonic())

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.name.startswith(f"{self.namespace}/policy_node"):
                self.diagnostics.append(status)

    def latest_diagnostics(self) -> dict[str, str]:
        status = self.diagnostics[-1]
        return {kv.key: kv.value for kv in status.values}

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=5.0)
        self._spinner.join(timeout=5.0)          # spin() returns after shutdown; then the context can go
        self.node.release()
        self.node.destroy_node()
        self.driver.destroy_node()
        rclpy.try_shutdown(context=self.context)


def wait_until(predicate: Callable[[], object], timeout_s: float = DISCOVERY_TIMEOUT_S,
               period_s: float = waiting.DEFAULT_PERIOD_S) -> bool:
    """flashrt_ros.waiting.wait_until with the discovery timeout as the default."""
    return waiting.wait_until(predicate, timeout_s, period_s)


class ActiveHarnesses:
    """Active NodeHarness instances for the node tests' fixtures: each configured and activated on a borrowed
    policy (a fresh BorrowedPolicy per configuration: the shared demo policy, or the given one), its subscribers
    matched and, with instruction=True, an instruction received; close() closes them all."""

    def __init__(self) -> None:
        self.created: list[NodeHarness] = []

    def make(self, parameters=None, policy=None, delay_s: float = 0.0, instruction: bool = False,
             **kwargs) -> NodeHarness:
        def borrow(settings):
            return BorrowedPolicy(policy if policy is not None else shared_policy(), delay_s=delay_s)

        harness = NodeHarness(parameters, policy_factory=borrow, **kwargs)
        self.created.append(harness)
        assert harness.lifecycle.change("configure") and harness.lifecycle.change("activate")
        harness.wait_for_subscribers()
        if instruction:
            harness.send_instruction()
            assert wait_until(lambda: harness.node._instruction is not None), "instruction not received"
        return harness

    def close(self) -> None:
        for harness in self.created:
            harness.close()
