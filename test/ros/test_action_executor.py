"""The action executor over real DDS, on sim time: the command for now read from observation-stamped chunks,
missed deadlines held or stopped, joint-named outputs, seams in /diagnostics, lifecycle."""

from __future__ import annotations

import itertools
import signal
import threading
import time

import numpy as np
import pytest
import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from rclpy.signals import SignalHandlerOptions
from rclpy.time import Time
from rosgraph_msgs.msg import Clock
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory

from flashrt_ros import qos_profiles
from flashrt_ros.action_executor import ActionExecutor
from flashrt_ros.demo_main import LifecycleClient
from flashrt_ros.msg import ActionChunk
from node_harness import DISCOVERY_TIMEOUT_S, wait_until
from ros_processes import start_python

pytestmark = pytest.mark.ros

DT = 0.02
START_NS = 1_000_000_000_000          # sim time of the first observation: 1000 s
EXACT = 1e-9
_namespaces = itertools.count()


def ramp_actions(start: float, horizon: int = 10, dim: int = 2) -> np.ndarray:
    """Row i = start + i in dimension 0 and start + i + 100 in dimension 1."""
    return start + np.arange(horizon, dtype=np.float64)[:, None] + 100.0 * np.arange(dim)[None, :]


class ExecutorHarness:
    """An ActionExecutor on sim time and a driver that publishes /clock and chunks and records the commands."""

    def __init__(self, parameters: dict | None = None, output=Float64MultiArray):
        self.namespace = f"/x{next(_namespaces)}_{int(time.time() * 1000) % 100000}"
        self.context = rclpy.Context()
        rclpy.init(context=self.context, signal_handler_options=SignalHandlerOptions.NO)
        values = {"use_sim_time": True, "control_rate_hz": 50.0, "diagnostics_period": 0.1}
        values.update(parameters or {})
        self.node = ActionExecutor(namespace=self.namespace, context=self.context,
                                   parameter_overrides=[Parameter(k, value=v) for k, v in values.items()])
        self.driver = rclpy.create_node("executor_driver", namespace=self.namespace, context=self.context)
        self.lifecycle = LifecycleClient(self.driver, f"{self.namespace}/action_executor")
        self.commands: list = []
        self.diagnostics: list = []
        self._lock = threading.Lock()
        self.chunk_publisher = self.driver.create_publisher(ActionChunk, "action_chunk", qos_profiles.output_qos())
        self.clock_publisher = self.driver.create_publisher(Clock, "/clock", 10)
        self.driver.create_subscription(output, values.get("output_topic", "joint_command"), self._on_command,
                                        qos_profiles.output_qos())
        self.driver.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics,
                                        qos_profiles.diagnostics_qos())
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.executor.add_node(self.driver)
        self._spinner = threading.Thread(target=self.executor.spin, daemon=True)
        self._spinner.start()
        assert self.lifecycle.wait_for_services(DISCOVERY_TIMEOUT_S), "lifecycle services did not appear"

    def _on_command(self, msg) -> None:
        with self._lock:
            self.commands.append(msg)

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        for status in msg.status:
            if status.name.startswith(f"{self.namespace}/action_executor"):
                with self._lock:
                    self.diagnostics.append(status)

    def start(self) -> None:
        assert self.lifecycle.change("configure") and self.lifecycle.change("activate")
        assert wait_until(lambda: self.chunk_publisher.get_subscription_count() > 0
                          and self.clock_publisher.get_subscription_count() > 0), "executor not discovered"

    def set_clock(self, stamp_ns: int) -> None:
        """Publish /clock until the executor's clock shows it."""
        target = Time(nanoseconds=stamp_ns)
        assert wait_until(lambda: (self.clock_publisher.publish(Clock(clock=target.to_msg())),
                                   self.node.get_clock().now().nanoseconds == stamp_ns)[1], period_s=0.02), \
            f"the executor's clock did not reach {stamp_ns} ns"

    def send_chunk(self, stamp_ns: int, actions: np.ndarray, sequence: int = 0, names=(), dt: float = DT) -> None:
        msg = ActionChunk()
        msg.header.stamp = Time(nanoseconds=stamp_ns).to_msg()
        msg.sequence = sequence
        msg.horizon, msg.action_dim = actions.shape
        msg.dt = dt
        msg.action_names = list(names)
        msg.actions = actions.astype(np.float32).ravel()
        count = self.node.counters.chunks_received
        self.chunk_publisher.publish(msg)
        assert wait_until(lambda: self.node.counters.chunks_received > count), "the chunk did not arrive"

    def command_after(self, stamp_ns: int):
        """Advance the clock to stamp_ns and return the first command published after that."""
        with self._lock:
            seen = len(self.commands)
        self.set_clock(stamp_ns)
        assert wait_until(lambda: len(self.commands) > seen, timeout_s=10.0), f"no command at {stamp_ns} ns"
        with self._lock:
            return self.commands[-1]

    def latest_diagnostics(self) -> dict[str, str]:
        with self._lock:
            return {kv.key: kv.value for kv in self.diagnostics[-1].values}

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=5.0)
        self._spinner.join(timeout=5.0)
        self.node.destroy_node()
        self.driver.destroy_node()
        rclpy.try_shutdown(context=self.context)


@pytest.fixture
def harness_factory():
    made = []

    def make(parameters=None, output=Float64MultiArray) -> ExecutorHarness:
        made.append(ExecutorHarness(parameters, output))
        return made[-1]

    yield make
    for harness in made:
        harness.close()


def at(rows: float) -> int:
    """Sim time [ns] `rows` chunk rows after the first observation."""
    return START_NS + int(round(rows * DT * 1e9))


def test_commands_follow_the_chunk_timetable_and_skip_the_past(harness_factory):
    harness = harness_factory()
    harness.set_clock(START_NS)
    harness.start()
    harness.send_chunk(START_NS, ramp_actions(0.0))
    # 2.5 rows after the observation: rows 0-2 are in the past, the command is halfway between rows 2 and 3
    command = harness.command_after(at(2.5))
    np.testing.assert_allclose(command.data, [2.5, 102.5], atol=1e-6)
    command = harness.command_after(at(6))
    np.testing.assert_allclose(command.data, [6.0, 106.0], atol=1e-6)


def test_a_missed_deadline_holds_the_last_command_and_warns(harness_factory):
    harness = harness_factory({"on_deadline_miss": "hold"})
    harness.set_clock(START_NS)
    harness.start()
    harness.send_chunk(START_NS, ramp_actions(0.0, horizon=5))
    last = harness.command_after(at(4))
    np.testing.assert_allclose(last.data, [4.0, 104.0], atol=1e-6)
    held = harness.command_after(at(10))          # past the chunk's end
    np.testing.assert_allclose(held.data, [4.0, 104.0], atol=1e-6)
    assert harness.node.counters.deadline_misses >= 1
    assert wait_until(lambda: any(s.level == DiagnosticStatus.WARN for s in list(harness.diagnostics)),
                      timeout_s=5.0), "no WARN in /diagnostics"
    warn = next(s for s in reversed(list(harness.diagnostics)) if s.level == DiagnosticStatus.WARN)
    assert "missed deadlines" in warn.message


def test_stop_publishes_nothing_while_no_chunk_covers_now(harness_factory):
    harness = harness_factory({"on_deadline_miss": "stop"})
    harness.set_clock(START_NS)
    harness.start()
    harness.send_chunk(START_NS, ramp_actions(0.0, horizon=5))
    harness.command_after(at(2))
    for step in range(6, 12):                                          # past the end: ticks, no commands
        harness.set_clock(at(step))
    misses = harness.node.counters.deadline_misses
    assert misses >= 1
    count = len(harness.commands)
    time.sleep(0.3)
    assert len(harness.commands) == count
    harness.send_chunk(at(11), ramp_actions(50.0), sequence=1)
    resumed = harness.command_after(at(12))
    np.testing.assert_allclose(resumed.data, [51.0, 151.0], atol=1e-6)


def test_switching_to_a_newer_chunk_reports_its_seam(harness_factory):
    harness = harness_factory({"switching": "latest"})
    harness.set_clock(START_NS)
    harness.start()
    harness.send_chunk(START_NS, ramp_actions(0.0), sequence=0)
    harness.command_after(at(3))
    harness.send_chunk(at(2), ramp_actions(50.0), sequence=1)
    command = harness.command_after(at(4))
    np.testing.assert_allclose(command.data, [52.0, 152.0], atol=1e-6)
    assert harness.node.counters.switches == 2
    assert harness.node.counters.seam_max == pytest.approx(48.0, abs=1e-6)
    assert harness.node.counters.chunk_age_at_switch_last == pytest.approx(2 * DT, abs=1e-6)
    assert wait_until(lambda: harness.diagnostics and harness.latest_diagnostics().get("seam_max") == "48",
                      timeout_s=5.0), harness.latest_diagnostics()


def test_joint_trajectory_output_names_joints_and_rejects_a_chunk_without_them(harness_factory):
    harness = harness_factory({"output_type": "joint_trajectory", "output_topic": "joint_trajectory"},
                              output=JointTrajectory)
    harness.set_clock(START_NS)
    harness.start()
    harness.send_chunk(START_NS, ramp_actions(0.0), names=("shoulder",))                 # 1 name, 2 dims
    assert harness.node.counters.chunks_rejected == 1
    assert "needs 2 joint names" in harness.node.counters.last_rejection
    harness.send_chunk(at(1), ramp_actions(10.0), sequence=1, names=("shoulder", "elbow"))
    command = harness.command_after(at(2))
    assert command.joint_names == ["shoulder", "elbow"]
    np.testing.assert_allclose(command.points[0].positions, [11.0, 111.0], atol=1e-6)
    assert command.points[0].time_from_start.nanosec == 20_000_000       # one control period at 50 Hz


def test_inactive_executor_sends_nothing_and_deactivate_forgets_the_chunks(harness_factory):
    harness = harness_factory()
    harness.set_clock(START_NS)
    assert harness.lifecycle.change("configure")
    harness.set_clock(at(1))
    time.sleep(0.2)
    assert harness.commands == []
    assert harness.lifecycle.change("activate")
    assert wait_until(lambda: harness.chunk_publisher.get_subscription_count() > 0)
    harness.send_chunk(START_NS, ramp_actions(0.0))
    harness.command_after(at(2))
    assert harness.lifecycle.change("deactivate")
    assert harness.node.counters.commands >= 1 and harness.node.stored_chunks == 0
    count = len(harness.commands)
    harness.set_clock(at(3))
    time.sleep(0.2)
    assert len(harness.commands) == count


def test_configure_time_parameters_are_writable_only_while_unconfigured(harness_factory):
    """A bad value fails configure by name; it can be corrected without a restart; once configured, a
    configure-time parameter is refused with the reason, a runtime one is taken."""
    harness = harness_factory({"joint_names": ["a", "a"]})
    assert not harness.lifecycle.change("configure")
    assert harness.node.set_parameters([Parameter("joint_names", value=["a", "b"])])[0].successful
    assert harness.lifecycle.change("configure")
    refused = harness.node.set_parameters([Parameter("control_rate_hz", value=20.0)])[0]
    assert not refused.successful and "read at configure" in refused.reason
    assert harness.node.set_parameters([Parameter("switching", value="temporal_fusion")])[0].successful
    bad = harness.node.set_parameters([Parameter("switching", value="newest")])[0]
    assert not bad.successful and "not one of" in bad.reason


def test_autostart_configures_and_activates_once(harness_factory):
    harness = harness_factory({"autostart": True})
    assert wait_until(lambda: harness.node.lifecycle_state() == "active", timeout_s=10.0)
    assert harness.lifecycle.change("deactivate") and harness.lifecycle.change("cleanup")
    assert harness.lifecycle.change("configure")
    time.sleep(0.3)
    assert harness.node.lifecycle_state() == "inactive"      # nothing activates it again


EXECUTOR_PROCESS = r"""
import sys
from flashrt_ros.action_executor import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_executor_process_exits_cleanly_on_signal(signum):
    """``python -m flashrt_ros.action_executor`` (the launch file's executable) configured and active, then SIGINT or
    SIGTERM: exit code 0, no traceback."""
    namespace = f"/xsig{int(signum)}_{int(time.time() * 1000) % 100000}"
    process = start_python(EXECUTOR_PROCESS, "--ros-args", "-r", f"__ns:={namespace}")
    context = rclpy.Context()
    rclpy.init(context=context, signal_handler_options=SignalHandlerOptions.NO)
    driver = rclpy.create_node("executor_signal_driver", context=context)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(driver)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    try:
        lifecycle = LifecycleClient(driver, f"{namespace}/action_executor")
        assert lifecycle.wait_for_services(DISCOVERY_TIMEOUT_S), "executor process did not come up"
        assert lifecycle.change("configure") and lifecycle.change("activate")
        process.send_signal(signum)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
        executor.shutdown(timeout_sec=1.0)
        driver.destroy_node()
        rclpy.try_shutdown(context=context)
    assert process.returncode == 0, f"exit code {process.returncode}\n{out}\n{err}"
    assert "Traceback" not in err, err
