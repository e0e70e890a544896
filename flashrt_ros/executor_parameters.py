"""Every parameter of the action executor node, declared in one place and converted once to ExecutorSettings.

The same ParamSpec as the policy node (flashrt_ros.node_parameters): default, description, range or choices, and
when a change takes effect (configure-time parameters are settable while the node is unconfigured and refused
once it is configured; runtime ones apply at once). docs/action_executor.md's parameter table is generated from
PARAMETERS (``python -m flashrt_ros.executor_parameters``) and a test keeps the two equal.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Sequence

from rcl_interfaces.msg import ParameterType, SetParametersResult

from flashrt_ros.chunk_schedule import Switching
from flashrt_ros.node_parameters import (UNCONFIGURED, Changeable, ParamSpec, SettingsError, check_spec_value,
                                         declare_specs, set_parameters_result, spec_markdown_table, spec_value)


class OutputType(enum.Enum):
    FLOAT_ARRAY = "float_array"            # std_msgs/Float64MultiArray: the action, as a forward command controller
    JOINT_STATE = "joint_state"            # sensor_msgs/JointState: names + positions, stamped now
    JOINT_TRAJECTORY = "joint_trajectory"  # trajectory_msgs/JointTrajectory: one point, reached in one period


class DeadlineMiss(enum.Enum):
    HOLD = "hold"      # repeat the last command
    STOP = "stop"      # publish nothing until a chunk covers the time again


STRING_ARRAY = ParameterType.PARAMETER_STRING_ARRAY

PARAMETERS: tuple[ParamSpec, ...] = (
    ParamSpec("input_topic", "action_chunk", "flashrt_ros/ActionChunk input (the policy node's output_topic)."),
    ParamSpec("output_topic", "joint_command", "Where the command for now is published."),
    ParamSpec("output_type", OutputType.FLOAT_ARRAY.value, "Message type of output_topic: float_array "
              "(std_msgs/Float64MultiArray, e.g. a forward command controller), joint_state (sensor_msgs/JointState "
              "positions) or joint_trajectory (trajectory_msgs/JointTrajectory, one point to reach in one control "
              "period).", choices=tuple(m.value for m in OutputType)),
    ParamSpec("joint_names", [], "Joint names of joint_state / joint_trajectory outputs, one per action dimension; "
              "empty = the chunks' action_names.", type=STRING_ARRAY),
    ParamSpec("control_rate_hz", 100.0, "Rate of the commands [Hz], on the node's clock (sim time under "
              "use_sim_time).", float_range=(1.0, 1000.0)),
    ParamSpec("switching", Switching.LATEST.value, "How the command moves from one chunk to the next: latest (the "
              "newest observation's chunk at once) or temporal_fusion (the mean of every chunk that covers now, "
              "weighted exp(-fusion_decay * observation age relative to the newest)).",
              choices=tuple(m.value for m in Switching), changeable=Changeable.RUNTIME),
    ParamSpec("fusion_decay", 10.0, "temporal_fusion: decay rate [1/s] of a chunk's weight with how much older its "
              "observation is than the newest; 0 = plain mean.", float_range=(0.0, 1000.0), changeable=Changeable.RUNTIME),
    ParamSpec("interpolate", True, "Interpolate linearly between a chunk's rows; false = hold each row for dt.",
              changeable=Changeable.RUNTIME),
    ParamSpec("on_deadline_miss", DeadlineMiss.HOLD.value, "When no chunk covers now (the policy fell behind): "
              "hold = repeat the last command; stop = publish nothing until a chunk covers now again.",
              choices=tuple(m.value for m in DeadlineMiss), changeable=Changeable.RUNTIME),
    ParamSpec("pending_topic", "pending_actions", "flashrt_ros/ActionChunk of the actions this node will still "
              "command, published after every chunk it accepts (stamped now, rows every dt of the chunk): the policy "
              "node's rtc mode conditions its next chunk on them (docs/action_executor.md, RTC); empty = not "
              "published."),
    ParamSpec("diagnostics_period", 1.0, "Period [s] of /diagnostics.", float_range=(0.05, 60.0)),
    ParamSpec("autostart", False, "Configure, then activate, once after start-up (the launch file sets it).",
              changeable=Changeable.STARTUP),
)

SPECS: dict[str, ParamSpec] = {spec.name: spec for spec in PARAMETERS}
RUNTIME_PARAMETERS = tuple(spec.name for spec in PARAMETERS if spec.changeable is Changeable.RUNTIME)
CONFIGURE_PARAMETERS = tuple(spec.name for spec in PARAMETERS if spec.changeable is Changeable.CONFIGURE)


@dataclasses.dataclass(frozen=True)
class ExecutorSettings:
    input_topic: str
    output_topic: str
    output_type: OutputType
    joint_names: tuple[str, ...]
    control_rate_hz: float
    switching: Switching
    fusion_decay: float
    interpolate: bool
    on_deadline_miss: DeadlineMiss
    pending_topic: str
    diagnostics_period: float
    autostart: bool

    @property
    def control_period_s(self) -> float:
        return 1.0 / self.control_rate_hz


def declare_parameters(node) -> None:
    """Declare every parameter of the executor (PARAMETERS) with its descriptor and a typed default."""
    declare_specs(node, PARAMETERS)




def validate(name: str, value: Any) -> str | None:
    """Reason why ``value`` is invalid for parameter ``name``, or None."""
    spec = SPECS.get(name)
    if spec is None:
        return None                 # not ours (use_sim_time, qos overrides...)
    if (reason := check_spec_value(spec, value)) is not None:
        return reason
    if name in ("input_topic", "output_topic") and not value:
        return f"{name} must not be empty"
    if name == "joint_names" and len(set(value)) != len(value):
        return f"joint_names has duplicate entries: {list(value)}"
    return None


def on_set_parameters(parameters: Sequence, lifecycle_state: str = UNCONFIGURED) -> SetParametersResult:
    """rclpy on-set callback: every value valid, and a configure-time parameter only while the node is
    unconfigured (it is read at the next configure; set later, it would silently not apply)."""
    return set_parameters_result(parameters, lifecycle_state, validate, CONFIGURE_PARAMETERS)


def settings_from_values(values: dict[str, Any]) -> ExecutorSettings:
    problems = [reason for name in SPECS if (reason := validate(name, values[name]))]
    if problems:
        raise SettingsError("invalid parameters: " + "; ".join(problems))
    return ExecutorSettings(
        input_topic=values["input_topic"], output_topic=values["output_topic"],
        output_type=OutputType(values["output_type"]), joint_names=tuple(values["joint_names"]),
        control_rate_hz=float(values["control_rate_hz"]), switching=Switching(values["switching"]),
        fusion_decay=float(values["fusion_decay"]), interpolate=bool(values["interpolate"]),
        on_deadline_miss=DeadlineMiss(values["on_deadline_miss"]), pending_topic=values["pending_topic"],
        diagnostics_period=float(values["diagnostics_period"]), autostart=bool(values["autostart"]))


def read_settings(node) -> ExecutorSettings:
    return settings_from_values({spec.name: spec_value(node, spec) for spec in PARAMETERS})


def markdown_table() -> str:
    """The parameter reference of docs/action_executor.md (a test keeps the doc equal to it)."""
    return spec_markdown_table(PARAMETERS)


if __name__ == "__main__":
    print(markdown_table())


__all__ = ["DeadlineMiss", "ExecutorSettings", "OutputType", "PARAMETERS", "RUNTIME_PARAMETERS", "SPECS",
           "declare_parameters", "markdown_table", "on_set_parameters", "read_settings", "settings_from_values",
           "validate"]
