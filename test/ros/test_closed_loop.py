"""The policy node and the action executor close a loop over real DDS around a simulated plant.

Cameras and a position-servo plant (its joint states) feed the policy node; a scripted policy (after a fixed
inference delay) plans each chunk from the observed state toward a goal; the action executor turns the chunks into
100 Hz commands, which drive the plant. The plant must reach the goal, and the executor must see each chunk's real
age: it reads the chunks by their observation stamps, so every switch happens at least the inference delay after
the observation the new chunk came from."""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest
from rclpy.parameter import Parameter
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray

from flashrt_ros import qos_profiles
from flashrt_ros.action_executor import ActionExecutor
from node_harness import BorrowedPolicy, NodeHarness, shared_policy, wait_until

pytestmark = pytest.mark.ros

INFERENCE_DELAY_S = 0.05
ACTION_DT = 0.02
POLICY_TAU_S = 0.08        # the scripted policy's plan approaches the goal with this time constant
SERVO_TAU_S = 0.03         # the plant follows its command with this time constant
CAMERA_PERIOD_S = 0.05
RUN_S = 3.0
GOAL_TOLERANCE = 0.05      # of the distance from the start to the goal


class ScriptedPolicy(BorrowedPolicy):
    """A chunk planned from the observed state toward GOAL: row i = x + (goal - x)(1 - exp(-(i + 1) dt / tau))."""

    def __init__(self, policy, goal: np.ndarray):
        super().__init__(policy, delay_s=INFERENCE_DELAY_S)
        self.goal = goal

    def predict(self, images, prompt, state=None, noise=None):
        self.calls += 1
        time.sleep(self.delay_s)
        x = np.asarray(state, dtype=np.float64)[:self.action_dim]
        steps = np.arange(1, self.horizon + 1)[:, None] * ACTION_DT
        return (x + (self.goal - x) * (1.0 - np.exp(-steps / POLICY_TAU_S))).astype(np.float32)


class ServoPlant:
    """x <- x + (u - x)(1 - exp(-period / tau)) at each tick; publishes its joint states stamped now."""

    def __init__(self, harness: NodeHarness, dim: int, period_s: float = 0.01):
        self.x = np.zeros(dim)
        self.command = np.zeros(dim)
        self.commands = 0
        self.alpha = 1.0 - math.exp(-period_s / SERVO_TAU_S)
        self._lock = threading.Lock()
        node = harness.driver
        self._clock = node.get_clock()
        self._states = node.create_publisher(JointState, "joint_states", qos_profiles.state_qos())
        node.create_subscription(Float64MultiArray, "joint_command", self._on_command, qos_profiles.output_qos())
        node.create_timer(period_s, self._tick)
        self._names = [f"joint_{i}" for i in range(dim)]

    def _on_command(self, msg: Float64MultiArray) -> None:
        with self._lock:
            self.command = np.asarray(msg.data, dtype=np.float64)
            self.commands += 1

    def _tick(self) -> None:
        with self._lock:
            self.x = self.x + (self.command - self.x) * self.alpha
            position = self.x.tolist()
        msg = JointState(name=self._names, position=position)
        msg.header.stamp = self._clock.now().to_msg()
        self._states.publish(msg)


@pytest.fixture
def loop():
    policy = shared_policy()
    goal = np.linspace(-1.0, 1.0, policy.action_dim)
    harness = NodeHarness({"action_dt": ACTION_DT}, policy_factory=lambda _: ScriptedPolicy(policy, goal))
    executor_node = ActionExecutor(namespace=harness.namespace, context=harness.context, parameter_overrides=[
        Parameter("autostart", value=True), Parameter("control_rate_hz", value=100.0),
        Parameter("diagnostics_period", value=0.25)])
    harness.executor.add_node(executor_node)
    plant = ServoPlant(harness, policy.action_dim)
    yield harness, executor_node, plant, goal
    harness.executor.remove_node(executor_node)
    executor_node.destroy_node()
    harness.close()


def test_policy_and_executor_drive_the_plant_to_the_goal(loop):
    harness, executor_node, plant, goal = loop
    assert harness.lifecycle.change("configure") and harness.lifecycle.change("activate")
    assert wait_until(lambda: executor_node.lifecycle_state() == "active")
    harness.wait_for_subscribers()
    harness.send_instruction("reach the goal")
    end = time.monotonic() + RUN_S
    while time.monotonic() < end:
        now = harness.now_ns()
        harness.send_frame(0, now)
        harness.send_frame(1, now + 3_000_000)
        time.sleep(CAMERA_PERIOD_S)
    counters = executor_node.counters
    with plant._lock:
        error = float(np.max(np.abs(plant.x - goal)))
    assert counters.chunks_received >= 5 and plant.commands >= 50, (counters, plant.commands, len(harness.chunks))
    assert error < GOAL_TOLERANCE * float(np.max(np.abs(goal))), f"plant {error:.3f} from the goal"
    # every chunk was read by its observation stamp: it took over no sooner than the inference delay after it
    assert counters.switches >= 5
    assert counters.chunk_age_at_switch_max >= INFERENCE_DELAY_S
    assert min(chunk.staleness for chunk in harness.chunks) >= INFERENCE_DELAY_S
