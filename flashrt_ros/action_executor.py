"""The action executor: a ROS 2 lifecycle node that turns observation-stamped action chunks into the command for
now, at the control rate.

Path: ActionChunk subscription -> ChunkSchedule (flashrt_ros.chunk_schedule: every chunk read by the time of its
observation, rows whose time has passed skipped, switching ``latest`` or ``temporal_fusion``) -> a timer at
``control_rate_hz`` on the node's clock publishes the command for now (Float64MultiArray, JointState or
JointTrajectory) -> /diagnostics (commands, missed deadlines, seams, chunk age at a switch).

When no chunk covers now the policy has missed its deadline: ``on_deadline_miss`` holds the last command or stops
publishing. After every chunk it accepts, the node publishes the actions it will still command on ``pending_topic``
(ChunkSchedule.preview), for a policy node that conditions its next chunk on them (real-time chunking,
flashrt_ros/rtc_sharing.py). Under ``use_sim_time`` the timer and "now" follow /clock, so a bag replay executes as on the robot.

Lifecycle: configure reads the parameters and creates the command publisher (a lifecycle publisher: silent while
inactive) and /diagnostics; activate subscribes and starts the control timer; deactivate stops both and forgets
the chunks; cleanup destroys the publishers. ``autostart`` configures and activates once after start-up.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import rclpy
from builtin_interfaces.msg import Duration as DurationMsg
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rcl_interfaces.msg import SetParametersResult
from rclpy.clock import Clock, ClockType
from rclpy.executors import SingleThreadedExecutor
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.time import Time
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from flashrt_ros import qos_profiles
from flashrt_ros.chunk_schedule import ChunkRejected, ChunkSchedule, Command, timed_chunk
from flashrt_ros.executor_parameters import (RUNTIME_PARAMETERS, DeadlineMiss, ExecutorSettings, OutputType,
                                             declare_parameters, on_set_parameters, read_settings)
from flashrt_ros.msg import ActionChunk
from flashrt_ros.node_executor import spin_until_shutdown
from flashrt_ros.node_parameters import SettingsError

NODE_NAME = "action_executor"
HARDWARE_ID = "flashrt_action_executor"
LOG_THROTTLE_S = 2.0
REASON_CHARS = 200          # longest log line text taken from an input


@dataclasses.dataclass
class ExecutionCounters:
    """Counts since activation; the seam and age figures are of the switches since activation."""

    commands: int = 0
    deadline_misses: int = 0
    chunks_received: int = 0
    chunks_rejected: int = 0
    switches: int = 0
    seam_max: float = 0.0
    seam_last: float = 0.0
    chunk_age_at_switch_last: float = math.nan
    chunk_age_at_switch_max: float = 0.0
    last_rejection: str = ""
    misses_at_last_report: int = 0

    def record(self, command: Command) -> None:
        self.commands += 1
        if command.switched:
            self.switches += 1
            self.seam_last = command.seam
            self.seam_max = max(self.seam_max, command.seam)
            self.chunk_age_at_switch_last = command.chunk_age_s
            self.chunk_age_at_switch_max = max(self.chunk_age_at_switch_max, command.chunk_age_s)


class ActionExecutor(LifecycleNode):
    def __init__(self, node_name: str = NODE_NAME, **kwargs):
        super().__init__(node_name, **kwargs)
        declare_parameters(self)
        self.add_on_set_parameters_callback(self._check_parameters)
        self.add_post_set_parameters_callback(self._on_parameters_set)
        self._settings: ExecutorSettings | None = None
        self._schedule: ChunkSchedule | None = None
        self._command_publisher = None
        self._pending_publisher = None
        self._diagnostics_publisher = None
        self._diagnostics_timer = None
        self._subscription = None
        self._control_timer = None
        self._joint_names: tuple[str, ...] = ()
        self._active = False
        self.counters = ExecutionCounters()
        self._autostart_timer = None
        if self.get_parameter("autostart").value:
            self._autostart_timer = self.create_timer(0.0, self._autostart)

    def _autostart(self) -> None:
        """autostart: configure, then activate, once (a failed configure leaves the node unconfigured)."""
        self.destroy_timer(self._autostart_timer)
        self._autostart_timer = None
        if self.trigger_configure() == TransitionCallbackReturn.SUCCESS:
            self.trigger_activate()

    # lifecycle -------------------------------------------------------------------------------------------------

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """SUCCESS: parameters read, publishers created (-> inactive). FAILURE: invalid parameters, logged by
        name (-> unconfigured, can be configured again)."""
        try:
            settings = read_settings(self)
        except SettingsError as error:
            self.get_logger().error(f"configure failed: {error}")
            return TransitionCallbackReturn.FAILURE
        self._settings = settings
        self._schedule = ChunkSchedule(settings.switching, settings.fusion_decay, settings.interpolate)
        message_type = {OutputType.FLOAT_ARRAY: Float64MultiArray, OutputType.JOINT_STATE: JointState,
                        OutputType.JOINT_TRAJECTORY: JointTrajectory}[settings.output_type]
        self._command_publisher = self.create_lifecycle_publisher(message_type, settings.output_topic,
                                                                  qos_profiles.output_qos())
        if settings.pending_topic:
            self._pending_publisher = self.create_lifecycle_publisher(ActionChunk, settings.pending_topic,
                                                                      qos_profiles.output_qos())
        self._diagnostics_publisher = self.create_publisher(DiagnosticArray, "/diagnostics",
                                                            qos_profiles.diagnostics_qos())
        # /diagnostics on the steady clock: it keeps reporting while sim time is paused (a stopped bag)
        self._diagnostics_timer = self.create_timer(settings.diagnostics_period, self._publish_diagnostics,
                                                    clock=Clock(clock_type=ClockType.STEADY_TIME))
        self.get_logger().info(f"configured: {settings.output_type.value} on {settings.output_topic} at "
                               f"{settings.control_rate_hz:g} Hz, switching {settings.switching.value}")
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """SUCCESS: subscribed, the control timer runs, commands go out (-> active)."""
        settings = self._settings
        self.counters = ExecutionCounters()
        self._schedule.clear()
        self._subscription = self.create_subscription(ActionChunk, settings.input_topic, self._on_chunk,
                                                      qos_profiles.output_qos())
        self._control_timer = self.create_timer(settings.control_period_s, self._on_control_tick)
        self._active = True
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """SUCCESS: no more commands; the stored chunks are forgotten (-> inactive)."""
        self._active = False
        self._stop_inputs()
        self._schedule.clear()
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        """SUCCESS: publishers and timers destroyed (-> unconfigured)."""
        self._release()
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._active = False
        self._release()
        return TransitionCallbackReturn.SUCCESS

    def _stop_inputs(self) -> None:
        if self._control_timer is not None:
            self.destroy_timer(self._control_timer)
            self._control_timer = None
        if self._subscription is not None:
            self.destroy_subscription(self._subscription)
            self._subscription = None

    def _release(self) -> None:
        self._stop_inputs()
        if self._diagnostics_timer is not None:
            self.destroy_timer(self._diagnostics_timer)
            self._diagnostics_timer = None
        for publisher in (self._command_publisher, self._pending_publisher, self._diagnostics_publisher):
            if publisher is not None:
                self.destroy_publisher(publisher)
        self._command_publisher = self._pending_publisher = self._diagnostics_publisher = None
        self._settings = self._schedule = None

    # inputs and the control loop --------------------------------------------------------------------------------

    def _on_chunk(self, msg: ActionChunk) -> None:
        if not self._active:
            return
        self.counters.chunks_received += 1
        try:
            actions = np.asarray(msg.actions, dtype=np.float64)
            if msg.horizon * msg.action_dim != actions.size:
                raise ChunkRejected(f"{actions.size} actions for horizon {msg.horizon} x action_dim "
                                    f"{msg.action_dim}")
            chunk = timed_chunk(Time.from_msg(msg.header.stamp).nanoseconds * 1e-9, msg.dt,
                                actions.reshape(msg.horizon, msg.action_dim), msg.sequence)
            self._check_joint_names(msg, chunk.actions.shape[1])
            self._schedule.add(chunk)
        except ChunkRejected as error:
            self.counters.chunks_rejected += 1
            self.counters.last_rejection = str(error)[:REASON_CHARS]
            self.get_logger().warning(f"chunk {msg.sequence} rejected: {self.counters.last_rejection}",
                                      throttle_duration_sec=LOG_THROTTLE_S)
            return
        if self._pending_publisher is not None:
            self._publish_pending(msg, chunk)

    def _publish_pending(self, msg: ActionChunk, chunk) -> None:
        """The actions the schedule will command from now on, every dt of the accepted chunk, as far as its chunks
        reach (rtc_sharing: what a policy in rtc mode conditions its next chunk on)."""
        now = self.get_clock().now()
        actions = self._schedule.preview(now.nanoseconds * 1e-9, chunk.dt, len(chunk.actions))
        pending = ActionChunk()
        pending.header.stamp = now.to_msg()
        pending.header.frame_id = msg.header.frame_id
        pending.sequence = msg.sequence
        pending.horizon, pending.action_dim = actions.shape[0], chunk.actions.shape[1]
        pending.dt = chunk.dt
        pending.action_names = list(msg.action_names)
        pending.actions = actions.astype(np.float32).reshape(-1)
        pending.model_id, pending.config_id = msg.model_id, msg.config_id
        self._pending_publisher.publish(pending)

    def _check_joint_names(self, msg: ActionChunk, action_dim: int) -> None:
        """Joint-named outputs need one name per action dimension: the parameter's, else the chunk's."""
        if self._settings.output_type is OutputType.FLOAT_ARRAY:
            return
        names = self._settings.joint_names or tuple(msg.action_names)
        if len(names) != action_dim:
            source = "joint_names" if self._settings.joint_names else "the chunk's action_names"
            raise ChunkRejected(f"{self._settings.output_type.value} output needs {action_dim} joint names, "
                                f"{source} has {len(names)}")
        self._joint_names = names

    def _on_control_tick(self) -> None:
        if not self._active:
            return
        now = self.get_clock().now()
        command = self._schedule.command(now.nanoseconds * 1e-9)
        if command is None:
            self.counters.deadline_misses += 1
            self.get_logger().warning("no chunk covers now: the policy missed its deadline "
                                      f"({self._settings.on_deadline_miss.value})",
                                      throttle_duration_sec=LOG_THROTTLE_S)
            last = self._schedule.last_action
            if self._settings.on_deadline_miss is DeadlineMiss.HOLD and last is not None:
                self._publish_command(last, now)
            return
        self.counters.record(command)
        self._publish_command(command.action, now)

    def _publish_command(self, action: np.ndarray, now: Time) -> None:
        settings = self._settings
        values = [float(v) for v in action]
        if settings.output_type is OutputType.FLOAT_ARRAY:
            msg = Float64MultiArray()
            msg.data = values
        elif settings.output_type is OutputType.JOINT_STATE:
            msg = JointState()
            msg.header.stamp = now.to_msg()
            msg.name = list(self._joint_names)
            msg.position = values
        else:
            msg = JointTrajectory()
            msg.header.stamp = now.to_msg()
            msg.joint_names = list(self._joint_names)
            point = JointTrajectoryPoint()
            point.positions = values
            period_ns = int(round(settings.control_period_s * 1e9))
            point.time_from_start = DurationMsg(sec=period_ns // 1_000_000_000, nanosec=period_ns % 1_000_000_000)
            msg.points = [point]
        self._command_publisher.publish(msg)

    # diagnostics and parameters ---------------------------------------------------------------------------------

    def _publish_diagnostics(self) -> None:
        counters, settings = self.counters, self._settings
        new_misses = counters.deadline_misses - counters.misses_at_last_report
        counters.misses_at_last_report = counters.deadline_misses
        status = DiagnosticStatus(name=f"{self.get_fully_qualified_name()}: action execution",
                                  hardware_id=HARDWARE_ID)
        if not self._active:
            status.level, status.message = DiagnosticStatus.OK, "inactive"
        elif new_misses:
            status.level = DiagnosticStatus.WARN
            status.message = f"{new_misses} missed deadlines since the last report ({settings.on_deadline_miss.value})"
        else:
            status.level, status.message = DiagnosticStatus.OK, "executing"
        fields = {
            "commands": counters.commands, "deadline_misses": counters.deadline_misses,
            "chunks_received": counters.chunks_received, "chunks_rejected": counters.chunks_rejected,
            "chunks_stored": self._schedule.chunk_count if self._schedule else 0,
            "switches": counters.switches, "seam_last": f"{counters.seam_last:.6g}",
            "seam_max": f"{counters.seam_max:.6g}",
            "chunk_age_at_switch_last_s": f"{counters.chunk_age_at_switch_last:.6f}",
            "chunk_age_at_switch_max_s": f"{counters.chunk_age_at_switch_max:.6f}",
            "switching": settings.switching.value, "control_rate_hz": f"{settings.control_rate_hz:g}",
            "last_rejection": counters.last_rejection,
        }
        status.values = [KeyValue(key=key, value=str(value)) for key, value in fields.items()]
        array = DiagnosticArray()
        array.header.stamp = self.get_clock().now().to_msg()
        array.status = [status]
        self._diagnostics_publisher.publish(array)

    @property
    def stored_chunks(self) -> int:
        """Chunks the schedule holds now (0 before configure)."""
        return self._schedule.chunk_count if self._schedule is not None else 0

    def lifecycle_state(self) -> str:
        """unconfigured, inactive or active."""
        if self._settings is None:
            return "unconfigured"
        return "active" if self._active else "inactive"

    def _check_parameters(self, parameters) -> SetParametersResult:
        """On-set callback: every value valid, a configure-time parameter only while unconfigured."""
        return on_set_parameters(parameters, self.lifecycle_state())

    def _on_parameters_set(self, parameters) -> None:
        """Runtime parameters take effect at once; the stored chunks stay."""
        changed = {p.name: p.value for p in parameters if p.name in RUNTIME_PARAMETERS}
        if not changed or self._settings is None:
            return
        try:
            settings = read_settings(self)
        except SettingsError as error:          # the on-set callback has checked each value already
            self.get_logger().error(f"parameters not applied: {error}")
            return
        self._settings = settings
        self._schedule.switching = settings.switching
        self._schedule.fusion_decay = settings.fusion_decay
        self._schedule.interpolate = settings.interpolate
        self.get_logger().info(f"parameters changed: {changed}")


def main(args: list[str] | None = None) -> int:
    """Run the executor until SIGINT, SIGTERM or shutdown (configure/activate it through its lifecycle services).
    The signals shut rclpy's context down; spin_until_shutdown then ends quietly, also when the shutdown lands while
    the executor builds its next wait set."""
    with rclpy.init(args=args):
        node = ActionExecutor()
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        try:
            spin_until_shutdown(executor, node.context, timeout_sec=None)
        except KeyboardInterrupt:
            pass
        finally:
            executor.shutdown(timeout_sec=1.0)
            node.destroy_node()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
