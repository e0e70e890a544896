"""Every parameter of the policy node, declared in one place, validated, converted once to NodeSettings.

- ``PARAMETERS``: one ``ParamSpec`` per parameter (default, description, range or choices, ``changeable``).
  ``changeable`` says when a new value takes effect (``Changeable``): STARTUP parameters are read when the process
  starts and are read-only; CONFIGURE parameters are read at configure, so they can be set while the node is
  unconfigured (e.g. a new checkpoint after a failed configure) and are refused while it is configured;
  RUNTIME parameters apply at once in every state.
- ``declare_parameters(node)``: declares them with descriptors, each with a typed value (empty lists included),
  so ``ros2 param dump`` / GetParameters answer every one of them.
- ``validate(name, value)``: the reason a value is invalid, or None. ``on_set_parameters`` wraps it as
  the node's on-set callback, so ``ros2 param set`` with a bad value (or a configure-time parameter while the
  node is configured) is rejected with that reason.
- ``read_settings(node)``: reads and cross-checks all values into a frozen ``NodeSettings``; raises
  ``SettingsError`` naming every problem (the node turns it into a configure FAILURE).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import re
from typing import Any, Sequence

from rcl_interfaces.msg import (FloatingPointRange, IntegerRange, ParameterDescriptor, ParameterType,
                                SetParametersResult)
from rclpy.parameter import Parameter

from flashrt_ros.inference_worker import DEFAULT_HANDOVER_TIMEOUT_S
from flashrt_ros.node_executor import DEFAULT_EXECUTOR, EXECUTORS


class SettingsError(ValueError):
    """One or more parameter values are invalid; the message lists each problem."""


class TriggerMode(enum.Enum):
    ON_OBSERVATION = "on_observation"   # infer on each new complete observation (when the worker is free)
    RATE = "rate"                       # infer at inference_rate_hz on the newest observation


class Changeable(enum.Enum):
    """When a new value of a parameter takes effect (the "changeable" column of docs/node.md)."""

    STARTUP = "at start-up"           # read once when the process starts: read-only
    CONFIGURE = "while unconfigured"  # read at configure: settable while unconfigured, refused while configured
    RUNTIME = "any time"              # applied at once


class StateInput(enum.Enum):
    JOINT_STATE = "joint_state"         # sensor_msgs/JointState, picked by state_joint_names
    FLOAT_ARRAY = "float_array"         # std_msgs/Float64MultiArray, used as is


MODEL_CONFIGS = ("auto", "pi05", "pi0", "pi05_tiny", "pi0_tiny", "pi0fast", "pi0fast_tiny", "groot_n1.6",
                 "groot_n1.6_tiny")
PRECISIONS = ("auto", "float32", "bfloat16", "float16", "fp8")   # flashrt_core.api.PRECISIONS' names
DEFAULT_TUNING_CACHE = "~/.cache/flashrt/tuning"
DEFAULT_FP8_SCALE_CACHE = "~/.cache/flashrt/fp8_scales"
RTC_MODES = ("off", "guided", "guided_identity", "hard_prefix", "training_time")    # "off" and flashrt_core.rtc.MODES
HARDWARE_PATTERN = re.compile(r"^(auto|reference|cpu|sm\d{2,3}|gfx[0-9a-f]{3,4})$")


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    name: str
    default: Any
    description: str
    changeable: Changeable = Changeable.CONFIGURE
    type: int = ParameterType.PARAMETER_NOT_SET      # inferred from default when NOT_SET
    float_range: tuple[float, float] | None = None
    int_range: tuple[int, int] | None = None
    choices: tuple[str, ...] = ()

    def descriptor(self) -> ParameterDescriptor:
        descriptor = ParameterDescriptor(name=self.name, type=self.param_type(), read_only=self.read_only)
        if self.changeable is Changeable.CONFIGURE:
            descriptor.additional_constraints = "read at configure: settable while the node is unconfigured"
        text = self.description
        if self.choices:
            text += f" One of: {', '.join(self.choices)}."
        descriptor.description = text
        if self.float_range is not None:
            descriptor.floating_point_range = [FloatingPointRange(
                from_value=float(self.float_range[0]), to_value=float(self.float_range[1]), step=0.0)]
        if self.int_range is not None:
            descriptor.integer_range = [IntegerRange(
                from_value=int(self.int_range[0]), to_value=int(self.int_range[1]), step=1)]
        return descriptor

    @property
    def read_only(self) -> bool:
        """ROS read-only: only start-up parameters (the others are refused by the on-set callback when their
        value would not take effect)."""
        return self.changeable is Changeable.STARTUP

    def param_type(self) -> int:
        if self.type != ParameterType.PARAMETER_NOT_SET:
            return self.type
        if isinstance(self.default, bool):
            return ParameterType.PARAMETER_BOOL
        if isinstance(self.default, int):
            return ParameterType.PARAMETER_INTEGER
        if isinstance(self.default, float):
            return ParameterType.PARAMETER_DOUBLE
        if isinstance(self.default, str):
            return ParameterType.PARAMETER_STRING
        raise TypeError(f"{self.name}: give an explicit type for default {self.default!r}")


STARTUP, RUNTIME = Changeable.STARTUP, Changeable.RUNTIME
STRING_ARRAY = ParameterType.PARAMETER_STRING_ARRAY
INTEGER_ARRAY = ParameterType.PARAMETER_INTEGER_ARRAY

PARAMETERS: tuple[ParamSpec, ...] = (
    # model
    ParamSpec("checkpoint", "", "Checkpoint directory (a flashrt, lerobot or openpi folder), or a Hugging Face hub "
              "id such as lerobot/pi05_base (org/name[@revision], resolved through huggingface_hub's cache: "
              "downloaded once, read offline with HF_HUB_OFFLINE=1); empty = the embedded demo checkpoint of "
              "flashrt_core."),
    ParamSpec("asset_id", "", "Which assets/<asset_id>/norm_stats.json holds the statistics, for an openpi "
              "checkpoint with several (e.g. physical-intelligence/libero); empty = the only one there is."),
    ParamSpec("model_config", "auto", "flashrt_core config preset; auto = the one recorded in the checkpoint "
              "(flashrt_config.json, or groot_n1.6 for a GR00T config.json), else pi05.", choices=MODEL_CONFIGS),
    ParamSpec("embodiment", "", "GR00T N1.6 only: the embodiment tag (projector slice, views, joint groups and "
              "statistics of the robot, docs/groot.md); empty for the pi family."),
    ParamSpec("device", "auto", "Inference device: auto, cpu, cuda or cuda:N."),
    ParamSpec("precision", "auto", "What inference computes in (flashrt_core.load_model's precision): auto = bf16 "
              "on GPU, fp32 on CPU; fp8 = the GPU engine's FP8 GEMMs (CUDA GPU with FP8 tensor cores, refused "
              "elsewhere): pi0 / pi0.5 on the backbone's MLP, calibrated on real observations before the node "
              "publishes (calibration_observations, calibration_bag); pi0-FAST and GR00T weight-only FP8 (no "
              "calibration).", choices=PRECISIONS),
    ParamSpec("calibration_observations", 8, "precision fp8: real observations the FP8 scales are calibrated on. "
              "Without calibration_bag, the first complete observations after activation: the node publishes nothing "
              "until it has them (and the gate's), then calibrates and starts publishing; the warm-up's frames never "
              "count. Progress in the log and /diagnostics (fp8_calibration).", int_range=(1, 1000)),
    ParamSpec("calibration_gate_observations", 2, "precision fp8: further real observations held out for the "
              "accuracy gate after the calibration (FP8 vs the bf16 engine, cosine >= 0.998; below it the node "
              "publishes nothing and /diagnostics shows ERROR); 0 = no gate.", int_range=(0, 100)),
    ParamSpec("calibration_bag", "", "precision fp8: a rosbag2 whose first complete observations (paired by this "
              "node's topics and rules) calibrate at configure instead of live ones; empty = live observations."),
    ParamSpec("fp8_scale_cache", DEFAULT_FP8_SCALE_CACHE, "With calibration_bag: directory where the FP8 scales are "
              "kept under a key of the checkpoint's weight content (SHA-256 of its weight files: 5-11 s for pi0.5's "
              "6.7 GB of bf16 weights on a 2-core CPU), the model configuration and the bag's observations, and read "
              "at the next configure with the same ones instead of calibrating. A leading ~ is the user's home. "
              "Empty = calibrate at every configure."),
    ParamSpec("hardware", "auto", "Engine dispatch target: auto (detected), reference (the eager reference path), "
              "cpu, smXY (e.g. sm90) or gfxNNN (e.g. gfx942)."),
    ParamSpec("warmup_iterations", 2, "Forward passes run at configure (warm-up and graph capture).",
              int_range=(0, 100)),
    ParamSpec("warmup_image_size", [640, 480], "[width, height] of the images used to warm up: set it to the "
              "cameras' resolution, the GPU engine captures one graph per image size.", type=INTEGER_ARRAY),
    ParamSpec("warmup_all_text_buckets", True, "With warmup_iterations > 0, also run one forward pass per text "
              "bucket of the engine that an instruction can land in (the GPU engine captures one graph per "
              "prompt-length bucket; GR00T's: per padded prompt length, for instructions of up to "
              "flashrt_core.groot_policy.WARMUP_INSTRUCTION_TOKENS tokens), so "
              "no instruction length costs a graph capture at runtime; false = only the warm-up prompt's bucket."),
    ParamSpec("engine_tuning_cache", DEFAULT_TUNING_CACHE, "Directory where the GPU engine keeps the picks of its "
              "load-time tuning (flashrt_core/engine/tuning_cache.py) and reuses them at the next configure of the "
              "same model, GPU, software and engine options: on an H200 a pi0.5 load took 35.5 s measuring and 1.6 "
              "s reading the picks, with the same kernels. A leading ~ is the user's home. Empty = measure at every "
              "configure; FLASHRT_TUNING_CACHE in the environment wins (empty there turns it off too)."),
    ParamSpec("engine_text_buckets", [], "Token-buffer lengths of the GPU engine's prompt graphs "
              "(EngineOptions.text_buckets; max_token_len is always added): a prompt runs in the smallest that holds "
              "it and pays for its padding (on an H200 ~0.3 ms per 64 tokens, pi0.5 bf16). Empty = the engine's "
              "default, every 16 tokens to 176; FLASHRT_TEXT_BUCKETS in the environment wins.", type=INTEGER_ARRAY),
    ParamSpec("executor", DEFAULT_EXECUTOR, "rclpy executor that spins the node in its executables "
              "(flashrt_ros.node_executor): single_threaded; multi_threaded (4 threads: its spin loop "
              "busy-waits while a camera callback runs, which starved the process on the GPU benchmark "
              "machine; A/B only). Read at start-up.", choices=EXECUTORS, changeable=STARTUP),
    ParamSpec("autostart", False, "Configure and then activate the node once, right after start-up (the launch "
              "file sets it from its autostart argument); a transition that fails leaves the node where it stopped, "
              "and later transitions are the user's (ros2 lifecycle set): nothing re-activates the node. false = "
              "start unconfigured.", changeable=STARTUP),
    ParamSpec("yield_to_inference_thread", True, "A callback that completes an observation gives up the Python "
              "GIL once (time.sleep(0)) when the inference thread is idle, so inference starts at once instead of "
              "after the interpreter's next thread switch (up to 5 ms); measured: the queue wait fell from 1.1 to "
              "0.2 ms median on a 2-core machine. false = off (A/B)."),
    ParamSpec("inference_handover_timeout", DEFAULT_HANDOVER_TIMEOUT_S, "Longest wait [s] of a callback that "
              "completed an observation while the inference thread was idle, until that thread has taken the "
              "observation and converted its inputs (the GIL released meanwhile; never a wait on the GPU), so the "
              "thread's wake-up and the input conversion do not queue behind the executor for the GIL; measured on "
              "the GPU benchmark machine: queue wait p99 1.18 -> 0.35 ms, medians unchanged. 0 = off: only the "
              "yield above (A/B).", float_range=(0.0, 0.01)),
    ParamSpec("freeze_gc_after_configure", True, "After the model is loaded and warmed up, move every Python "
              "object alive into the garbage collector's permanent generation (gc.freeze, flashrt_ros.gc_pauses), "
              "so full collections at runtime skip torch, the engine and rclpy: on the GPU benchmark machine their "
              "GIL-holding pauses fell from 169 to 2.3 ms median (230 to 129 ms p99). Process-wide; false = leave "
              "the collector alone (A/B)."),
    ParamSpec("keep_large_buffers_on_heap", True, "At configure, raise glibc's mmap and trim thresholds for the "
              "process (mallopt, flashrt_ros.heap_reuse), so the image-sized buffers every frame allocates reuse "
              "mapped memory instead of faulting in fresh zeroed pages: a plain subscriber's capture -> "
              "complete 640x480 pair fell from 4.4 to 2.1 ms median on the GPU machine, the node's overhead p99 "
              "from 5.3-7.0 to 4.5-5.0 ms. Keeps up to 256 MiB of freed memory in the "
              "process; glibc's own MALLOC_* variables win. Process-wide and one-way: false = glibc's defaults, "
              "set from the process start (A/B)."),
    ParamSpec("noise_seed", -1, "Pins the flow noise to (seed, observation stamp) so replays repeat "
              "(flashrt_ros.pinned_noise); -1 = fresh random noise for every chunk.", int_range=(-1, 2**31 - 1)),
    # inputs
    ParamSpec("camera_topics", ["camera_0/image_raw", "camera_1/image_raw"],
              "Camera topics, one per view. A topic ending in /compressed is read as sensor_msgs/CompressedImage "
              "(jpeg/png), any other as sensor_msgs/Image.", type=STRING_ARRAY),
    ParamSpec("camera_views", [], "Model view name for each camera topic; empty = the model's first views in "
              "order.", type=STRING_ARRAY),
    ParamSpec("instruction_topic", "instruction", "std_msgs/String task instruction (reliable, transient local)."),
    ParamSpec("default_instruction", "", "Instruction used until one arrives on instruction_topic; empty = wait.",
              changeable=RUNTIME),
    ParamSpec("state_topic", "", "Robot state topic; empty = the model gets no state."),
    ParamSpec("state_type", StateInput.JOINT_STATE.value, "Message type of state_topic.",
              choices=tuple(m.value for m in StateInput)),
    ParamSpec("state_joint_names", [], "joint_state: joint names picked in this order (empty = all, as sent).",
              type=STRING_ARRAY),
    ParamSpec("sync_slop", 0.02, "Largest stamp difference [s] between the frames of one observation.",
              changeable=RUNTIME, float_range=(0.0, 1.0)),
    ParamSpec("max_observation_age", 0.5, "Observations older than this [s] (node clock) are not used.",
              changeable=RUNTIME, float_range=(0.001, 60.0)),
    ParamSpec("max_future_stamp", 0.05, "Largest amount [s] by which a camera frame's or a JointState's header "
              "stamp may lie ahead of the node clock (clock offset between machines, jitter). Within it the stamp "
              "is used as it is (a chunk's staleness can then be negative by up to this much); beyond it the "
              "message is rejected, counted (rejected_future_stamp) and logged (throttled).",
              changeable=RUNTIME, float_range=(0.0, 10.0)),
    ParamSpec("camera_timeout", 0.5, "A camera that sends no frame for this long [s] (node clock) while the node is "
              "active, or whose every frame in this time is rejected (bad image, stamp in the future or too old, "
              "undecodable), turns /diagnostics ERROR with the reason, logged once (throttled) and counted.",
              changeable=RUNTIME, float_range=(0.01, 60.0)),
    ParamSpec("pairing_timeout", 0.5, "While every camera delivers usable frames, no complete observation for this "
              "long [s] (node clock: their stamps never come within sync_slop, e.g. one camera's clock is off) is a "
              "pairing stall: /diagnostics ERROR naming the stamp offset, logged once (throttled) and counted.",
              changeable=RUNTIME, float_range=(0.01, 60.0)),
    ParamSpec("max_state_age", 0.5, "With state_topic: the newest valid state may be at most this old [s] (node "
              "clock minus its stamp; a Float64MultiArray is stamped on arrival) when the inference thread takes an "
              "observation. An older one (the state topic stopped, or only NaN states since) is never used: the "
              "observation is skipped and counted (rejected_stale_state), /diagnostics turns ERROR and the node "
              "logs it once (throttled).", changeable=RUNTIME, float_range=(0.001, 60.0)),
    # triggering
    ParamSpec("trigger", TriggerMode.ON_OBSERVATION.value, "When to run inference.",
              choices=tuple(m.value for m in TriggerMode)),
    ParamSpec("inference_rate_hz", 10.0, "Inference rate when trigger is rate.", float_range=(0.1, 1000.0)),
    # outputs
    ParamSpec("output_topic", "action_chunk", "flashrt_ros/ActionChunk output topic."),
    ParamSpec("trajectory_topic", "", "Also publish trajectory_msgs/JointTrajectory here; empty = off."),
    ParamSpec("frame_id", "", "header.frame_id of the outputs: the frame the actions are expressed in."),
    ParamSpec("action_dt", 0.02, "Time between consecutive actions of a chunk [s].", float_range=(1e-4, 10.0)),
    ParamSpec("action_names", [], "Name of each action dimension (length action_dim), or empty.",
              type=STRING_ARRAY),
    # real-time chunking (docs/action_executor.md, RTC)
    ParamSpec("rtc", "off", "Real-time chunking: condition each chunk on the actions the action executor will "
              "still execute (its pending_topic), the rows executed during the inference (from the measured "
              "latency) kept: guided (soft mask + guidance through the denoiser's Jacobian: a backward per step), "
              "guided_identity (the same with the Jacobian as identity, as lerobot does), hard_prefix (cheap), "
              "training_time (checkpoints trained for it); every mode in the graph engine and on the reference "
              "path; off = plain chunks.",
              choices=RTC_MODES),
    ParamSpec("rtc_pending_topic", "pending_actions", "rtc: the action executor's pending_topic "
              "(flashrt_ros/ActionChunk)."),
    ParamSpec("rtc_execution_horizon", 0, "rtc guided / guided_identity: the row at which the soft mask reaches 0; 0 = as far as the "
              "pending actions reach.", int_range=(0, 100000)),
    ParamSpec("rtc_max_guidance_weight", 10.0, "rtc guided / guided_identity: the clip of the guidance weight (the paper's beta).",
              float_range=(1e-3, 1000.0)),
    ParamSpec("rtc_latency_margin", 0.005, "rtc: added [s] to the measured latency (the largest of the last 10 "
              "inferences, taken to published) when the frozen rows are counted.", float_range=(0.0, 10.0)),
    # diagnostics
    ParamSpec("staleness_warn_threshold", 0.2, "Diagnostics turn WARN when the staleness p99 passes this [s].",
              changeable=RUNTIME, float_range=(0.0, 60.0)),
    ParamSpec("diagnostics_window", 10.0, "Window [s] of the latency / staleness / rate statistics.",
              float_range=(1.0, 600.0)),
    ParamSpec("diagnostics_period", 1.0, "Period [s] of /diagnostics and ~/status (also published at once when an "
              "input fault appears or clears). Read at start-up.", float_range=(0.05, 60.0), changeable=STARTUP),
)

SPECS: dict[str, ParamSpec] = {spec.name: spec for spec in PARAMETERS}
RUNTIME_PARAMETERS = tuple(spec.name for spec in PARAMETERS if spec.changeable is Changeable.RUNTIME)
CONFIGURE_PARAMETERS = tuple(spec.name for spec in PARAMETERS if spec.changeable is Changeable.CONFIGURE)
UNCONFIGURED = "unconfigured"     # the lifecycle state in which configure-time parameters can be set


def declare_specs(node, specs: Sequence[ParamSpec]) -> None:
    """Declare every parameter of ``specs`` on ``node`` with its descriptor and a typed default.

    rclpy infers an empty list as a byte array, so an empty-list parameter is declared by its type and, unless an
    override gave it a value, then set to a typed empty list. Left NOT_SET, Kilted would answer any GetParameters
    request that names it (``ros2 param dump``) with no values at all.
    """
    for spec in specs:
        if not (isinstance(spec.default, list) and not spec.default):
            node.declare_parameter(spec.name, spec.default, spec.descriptor())
            continue
        kind = Parameter.Type(spec.param_type())
        node.declare_parameter(spec.name, kind, spec.descriptor())
        if node.get_parameter_or(spec.name).type_ == Parameter.Type.NOT_SET:
            node.set_parameters([Parameter(spec.name, kind, [])])


def declare_parameters(node) -> None:
    """Declare every parameter of the policy node (PARAMETERS)."""
    declare_specs(node, PARAMETERS)


def spec_value(node, spec: ParamSpec) -> Any:
    """Value of the parameter of ``spec`` on ``node``; the spec's default where the parameter is unset."""
    parameter = node.get_parameter_or(spec.name, None)
    if parameter is None or parameter.type_ == Parameter.Type.NOT_SET:
        return spec.default
    return parameter.value


def parameter_value(node, name: str) -> Any:
    """Value of the policy node's parameter ``name``; its default where the parameter is unset."""
    return spec_value(node, SPECS[name])


def check_spec_value(spec: ParamSpec, value: Any) -> str | None:
    """What every parameter's spec says of a value: one of its choices, inside its range, no empty entry in a
    string array. The reason it fails, or None."""
    name = spec.name
    if spec.choices and value not in spec.choices:
        return f"{name}={value!r} is not one of {list(spec.choices)}"
    if spec.float_range is not None:
        low, high = spec.float_range
        if not (isinstance(value, (int, float)) and math.isfinite(value) and low <= value <= high):
            return f"{name}={value!r} is outside [{low}, {high}]"
    if spec.int_range is not None:
        low, high = spec.int_range
        if not low <= value <= high:
            return f"{name}={value!r} is outside [{low}, {high}]"
    if spec.type == STRING_ARRAY and any(not item for item in value):
        return f"{name} has an empty entry: {list(value)}"
    return None


def validate(name: str, value: Any) -> str | None:
    """Reason why ``value`` is invalid for parameter ``name``, or None (ranges are checked by rclpy too)."""
    spec = SPECS.get(name)
    if spec is None:
        return None    # not ours (use_sim_time, qos overrides...)
    if (reason := check_spec_value(spec, value)) is not None:
        return reason
    if name == "warmup_image_size" and not (len(value) == 2 and all(1 <= int(v) <= 16384 for v in value)):
        return f"warmup_image_size={list(value)}: expected [width, height], each in 1..16384"
    if name == "engine_text_buckets" and any(not 1 <= int(v) <= 4096 for v in value):
        return f"engine_text_buckets={list(value)}: every entry must be a token count in 1..4096"
    if name == "hardware" and not HARDWARE_PATTERN.match(value):
        return f"hardware={value!r}: expected auto, reference, cpu, smXY or gfxNNN"
    if name == "device" and not _valid_device(value):
        return f"device={value!r}: expected auto, cpu, cuda or cuda:N"
    if name in ("camera_topics", "instruction_topic", "output_topic", "rtc_pending_topic") and not value:
        return f"{name} must not be empty"
    if name in ("camera_topics", "camera_views", "state_joint_names", "action_names") and \
            len(set(value)) != len(value):
        return f"{name} has duplicate entries: {list(value)}"
    return None


def on_set_parameters(parameters: Sequence, lifecycle_state: str = UNCONFIGURED) -> SetParametersResult:
    """rclpy on-set callback: reject the whole set if any value is invalid, or if it sets a configure-time
    parameter while the node is not unconfigured (the value would silently not apply); the reason names each."""
    return set_parameters_result(parameters, lifecycle_state, validate, CONFIGURE_PARAMETERS)


def set_parameters_result(parameters: Sequence, lifecycle_state: str, validate_value,
                          configure_names: Sequence[str]) -> SetParametersResult:
    """The on-set answer of a lifecycle node: every value valid by ``validate_value(name, value)``, and none of
    ``configure_names`` (read at configure) set unless the node is unconfigured; the reason names each problem."""
    reasons = [reason for parameter in parameters if (reason := validate_value(parameter.name, parameter.value))]
    if lifecycle_state != UNCONFIGURED:
        reasons += [f"{parameter.name} is read at configure: set it while the node is unconfigured (it is "
                    f"{lifecycle_state}; deactivate and cleanup first)"
                    for parameter in parameters if parameter.name in configure_names]
    return SetParametersResult(successful=not reasons, reason="; ".join(reasons))


def _valid_device(value: str) -> bool:
    if value in ("auto", "cpu", "cuda"):
        return True
    return value.startswith("cuda:") and value[5:].isdigit()


@dataclasses.dataclass(frozen=True)
class NodeSettings:
    """Parameter values as the node uses them (seconds as floats, enums instead of strings)."""

    checkpoint: str
    asset_id: str
    model_config: str
    embodiment: str
    device: str
    precision: str
    calibration_observations: int
    calibration_gate_observations: int
    calibration_bag: str
    fp8_scale_cache: str
    hardware: str
    warmup_iterations: int
    warmup_image_size: tuple[int, int]
    warmup_all_text_buckets: bool
    engine_tuning_cache: str
    engine_text_buckets: tuple[int, ...]
    executor: str
    autostart: bool
    yield_to_inference_thread: bool
    inference_handover_timeout: float
    freeze_gc_after_configure: bool
    keep_large_buffers_on_heap: bool
    noise_seed: int
    camera_topics: tuple[str, ...]
    camera_views: tuple[str, ...]
    instruction_topic: str
    default_instruction: str
    state_topic: str
    state_type: StateInput
    state_joint_names: tuple[str, ...]
    sync_slop: float
    max_observation_age: float
    max_future_stamp: float
    camera_timeout: float
    pairing_timeout: float
    max_state_age: float
    trigger: TriggerMode
    inference_rate_hz: float
    output_topic: str
    trajectory_topic: str
    frame_id: str
    action_dt: float
    action_names: tuple[str, ...]
    rtc: str
    rtc_pending_topic: str
    rtc_execution_horizon: int
    rtc_max_guidance_weight: float
    rtc_latency_margin: float
    staleness_warn_threshold: float
    diagnostics_window: float
    diagnostics_period: float

    @property
    def config(self) -> str | None:
        """The ``config`` argument of flashrt_core.load_model."""
        return None if self.model_config == "auto" else self.model_config

    @property
    def load_precision(self) -> str | None:
        """The ``precision`` argument of flashrt_core.load_model (None: auto)."""
        return None if self.precision == "auto" else self.precision

    def engine_options(self):
        """The ``engine_options`` argument of flashrt_core.load_model: None (defaults and the environment) unless
        engine_tuning_cache or engine_text_buckets is set; the environment wins over both. A leading ~ in the cache
        directory is the user's home (the engine's TuningCache expands it)."""
        if not (self.engine_tuning_cache or self.engine_text_buckets):
            return None
        from flashrt_core.engine import EngineOptions      # here: the module stays importable without torch
        fields = {"tuning_cache": self.engine_tuning_cache}
        if self.engine_text_buckets:
            fields["text_buckets"] = self.engine_text_buckets
        return EngineOptions.from_env(EngineOptions(**fields))

    def config_id(self) -> str:
        """Short hash of the settings that change what the model computes."""
        fields = {name: getattr(self, name) for name in (
            "checkpoint", "asset_id", "model_config", "embodiment", "device", "precision", "hardware", "camera_views",
            "state_joint_names", "action_dt", "noise_seed", "rtc")}
        fields["camera_count"] = len(self.camera_topics)
        digest = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()
        return digest[:12]

    def with_runtime_values(self, values: dict[str, Any]) -> "NodeSettings":
        """Copy with runtime-changeable parameters replaced (names from RUNTIME_PARAMETERS)."""
        unknown = set(values) - set(RUNTIME_PARAMETERS)
        if unknown:
            raise SettingsError(f"not changeable at runtime: {sorted(unknown)}")
        return dataclasses.replace(self, **values)


def settings_from_values(values: dict[str, Any]) -> NodeSettings:
    """Validate raw parameter values (name -> value) and build NodeSettings; SettingsError lists problems."""
    problems = [reason for name in SPECS if (reason := validate(name, values[name]))]
    views, topics = list(values["camera_views"]), list(values["camera_topics"])
    if views and len(views) != len(topics):
        problems.append(f"camera_views has {len(views)} entries but camera_topics has {len(topics)}")
    if problems:
        raise SettingsError("invalid parameters: " + "; ".join(problems))
    kwargs = {name: values[name] for name in SPECS}
    for name in ("camera_topics", "camera_views", "state_joint_names", "action_names"):
        kwargs[name] = tuple(kwargs[name])
    kwargs["warmup_image_size"] = tuple(int(v) for v in kwargs["warmup_image_size"])
    kwargs["engine_text_buckets"] = tuple(int(v) for v in kwargs["engine_text_buckets"])
    kwargs["state_type"] = StateInput(kwargs["state_type"])
    kwargs["trigger"] = TriggerMode(kwargs["trigger"])
    for name in ("sync_slop", "max_observation_age", "max_future_stamp", "camera_timeout", "pairing_timeout",
                 "max_state_age", "inference_rate_hz", "action_dt", "inference_handover_timeout",
                 "staleness_warn_threshold", "diagnostics_window", "diagnostics_period", "rtc_max_guidance_weight",
                 "rtc_latency_margin"):
        kwargs[name] = float(kwargs[name])
    return NodeSettings(**kwargs)


def read_settings(node) -> NodeSettings:
    """Read all parameters of ``node`` into NodeSettings (raises SettingsError)."""
    return settings_from_values({name: parameter_value(node, name) for name in SPECS})


def spec_markdown_table(specs: Sequence[ParamSpec]) -> str:
    """A parameter reference table (name, default, range or choices, when a change takes effect, description)."""
    rows = ["| name | default | range / choices | changeable | description |", "|---|---|---|---|---|"]
    for spec in specs:
        bounds = spec.float_range or spec.int_range
        limits = f"{bounds[0]} .. {bounds[1]}" if bounds else ", ".join(spec.choices)
        default = json.dumps(spec.default)
        rows.append(f"| `{spec.name}` | `{default}` | {limits} | {spec.changeable.value} | "
                    f"{spec.description} |")
    return "\n".join(rows)


def markdown_table() -> str:
    """The parameter reference of docs/node.md, generated from PARAMETERS (a test keeps the doc equal to it)."""
    return spec_markdown_table(PARAMETERS)


if __name__ == "__main__":
    print(markdown_table())


__all__ = ["CONFIGURE_PARAMETERS", "PARAMETERS", "RUNTIME_PARAMETERS", "SPECS", "Changeable", "NodeSettings",
           "ParamSpec", "SettingsError", "StateInput", "TriggerMode", "check_spec_value", "declare_parameters",
           "declare_specs", "markdown_table", "on_set_parameters", "parameter_value", "read_settings",
           "set_parameters_result", "settings_from_values", "spec_markdown_table", "spec_value", "validate"]
