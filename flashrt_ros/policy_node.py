"""The flashrt_ros policy node: a LifecycleNode, cameras + instruction (+ state) in, stamped ActionChunks out.

Lifecycle (REP-2003 style, as in ros2/demos lifecycle_py):

- ``on_configure``: read parameters (NodeSettings), load the model through flashrt_core, warm it up (and
  capture, on GPU), start the inference thread, create the (inactive) output publishers.
  Any failure -> FAILURE with a log naming the problem; everything half-built is released and the node stays
  unconfigured, ready to be configured again. SIGINT or SIGTERM during it: the configure stops at its next step
  (the core's long loads stop between their steps too: a tensor read, a tuning candidate, a graph capture,
  flashrt_core.stopping) and the process exits quietly (``ShuttingDown``).
- ``on_activate``: counters and sequence reset, subscriptions created, the input watchdog started
  (flashrt_ros.input_watchdog: silent cameras, rejected frames, pairing stalls, stale state), outputs live,
  inference enabled.
- ``on_deactivate``: inference disabled first (nothing computed before is published later), subscriptions
  destroyed, outputs inactive.
- ``on_cleanup``: inference thread stopped, model closed (weights and GPU memory released), publishers destroyed.
- ``on_shutdown`` / ``on_error``: release whatever exists, from any state.
- ``autostart`` parameter: configure, then activate, once after start-up (the launch file sets it).

Data path: subscription callbacks do O(1) checks and hand the message to the ObservationBuffer (pairing by
stamp, newest complete observation only); the InferenceWorker thread converts the images of that one
observation, runs ``policy.predict`` and publishes. /diagnostics and ~/status are published every
``diagnostics_period`` in every lifecycle state, and at once when an input fault appears or clears. Every log
line that input can cause is throttled and bounded (flashrt_ros.node_logging).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
import time
from typing import Any, Callable

import numpy as np
import rclpy
from builtin_interfaces.msg import Duration as DurationMsg
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.time import Time
from sensor_msgs.msg import CompressedImage, Image, JointState
from std_msgs.msg import Float64MultiArray, String
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from flashrt_core.stopping import Stopped, stop_when
from flashrt_ros import qos_profiles
from flashrt_ros.gc_pauses import GcPauses, freeze_objects, unfreeze_objects
from flashrt_ros.heap_reuse import heap_reuse_state, keep_large_buffers_on_heap
from flashrt_ros.image_conversion import ImageConversionError, check_image, to_rgb
from flashrt_ros.inference_worker import InferenceResult, InferenceWorker
from flashrt_ros.input_watchdog import Fault, InputWatchdog, WatchLimits
from flashrt_ros.msg import ActionChunk, PolicyStatus
from flashrt_ros.node_calibration import CalibrationState, LiveCalibration, calibrate_from_bag
from flashrt_ros.node_diagnostics import (DiagnosticsContext, NodeStatistics, diagnostic_array, status_fields)
from flashrt_ros.node_executor import make_executor, sigint_shuts_down_quietly, spin_until_shutdown
from flashrt_ros.node_logging import PythonLogBridge, ThrottledLog, bounded, quoted
from flashrt_ros.node_parameters import (RUNTIME_PARAMETERS, NodeSettings, SettingsError, StateInput,
                                         TriggerMode, declare_parameters, on_set_parameters, read_settings)
from flashrt_ros.observation_buffer import (AddResult, BufferCounters, Observation, ObservationBuffer,
                                           seconds_to_ns)
from flashrt_ros.pinned_noise import NO_SEED, observation_noise
from flashrt_ros.rtc_sharing import PolicyRtc
from flashrt_ros.state_input import FutureStampError, StateSample, state_sample

NODE_NAME = "policy_node"
WARMUP_PROMPT = "pick up the object and place it in the bin"
LOG_THROTTLE_S = 2.0
WORKER_STOP_TIMEOUT_S = 60.0
INSTRUCTION_SAMPLES_KEPT = 8           # (publisher, sequence number) of the last instructions, to handle each once
WATCH_PERIOD_LIMITS_S = (0.01, 0.1)     # the input watchdog checks 5 times per shortest detection limit, within these


def load_policy(settings: NodeSettings):
    """Default policy factory: flashrt_core.load_model with the node's settings."""
    import flashrt_core   # imported here: the node module stays importable without torch for tooling
    family = {"embodiment": settings.embodiment} if settings.embodiment else {}     # GR00T only
    return flashrt_core.load_model(checkpoint=settings.checkpoint or None, config=settings.config,
                                   device=settings.device, precision=settings.load_precision,
                                   hardware=settings.hardware, engine_options=settings.engine_options(),
                                   asset_id=settings.asset_id or None, **family)


class ShuttingDown(BaseException):
    """The process is stopping (SIGINT, context shut down) while a configure runs.

    A BaseException on purpose: it leaves the transition callback like the KeyboardInterrupt of SIGINT does,
    instead of returning a result that rclpy would turn into a transition event published (and an error logged)
    on a context that is already shut down. main() ends on it quietly."""


@dataclasses.dataclass(frozen=True)
class InferenceJob:
    observation: Observation
    images: dict[str, np.ndarray]       # view name -> HxWx3 uint8 RGB
    prompt: str
    state: StateSample | None
    taken_ns: int                       # node clock when the inference thread took the observation


def finite_chunk(actions) -> np.ndarray:
    """The chunk, or a ValueError where it holds NaN or inf (damaged weights or statistics): a robot must never
    receive it. The inference worker reports the error, and the node counts it (inference_errors) and publishes
    nothing for that observation."""
    actions = np.asarray(actions)
    finite = np.isfinite(actions)
    if not finite.all():
        raise ValueError(f"the policy returned {actions.size - int(finite.sum())} non-finite values (NaN/inf) in its "
                         f"{'x'.join(map(str, actions.shape))} chunk: not published")
    return actions


class PolicyNode(LifecycleNode):
    """Lifecycle policy node; ``policy_factory(settings)`` returns an object with the flashrt_core policy API."""

    def __init__(self, node_name: str = NODE_NAME, *, policy_factory: Callable[[NodeSettings], Any] = load_policy,
                 **kwargs):
        super().__init__(node_name, **kwargs)
        declare_parameters(self)
        self.add_on_set_parameters_callback(lambda parameters: on_set_parameters(parameters, self.lifecycle_state()))
        self.add_post_set_parameters_callback(self._on_parameters_set)
        self._policy_factory = policy_factory
        self._input_group = MutuallyExclusiveCallbackGroup()      # instruction and state
        self._timer_group = MutuallyExclusiveCallbackGroup()
        # Built by on_configure, released by on_cleanup.
        self._settings: NodeSettings | None = None
        self._policy = None
        self._gc_pauses: GcPauses | None = None
        self._gc_frozen = False
        self._view_names: tuple[str, ...] = ()
        self._buffer: ObservationBuffer | None = None
        self._worker: InferenceWorker[InferenceJob] | None = None
        self._chunk_publisher = None
        self._trajectory_publisher = None
        self._config_id = ""
        self._calibration: LiveCalibration | None = None     # an FP8 policy's live calibration (node_calibration)
        self._calibration_status = ""                          # shown in /diagnostics (fp8_calibration)
        self._rtc: PolicyRtc | None = None       # rtc mode: the executor's pending actions, the measured latency
        # Built by on_activate, released by on_deactivate.
        self._input_subscriptions: list = []
        self._trigger_timer = None
        self._watch_timer = None
        self._watchdog: InputWatchdog | None = None
        self._faults: tuple[Fault, ...] = ()        # input faults of the last watchdog check (active only)
        # Inputs shared between callbacks and the inference thread (single attribute writes).
        self._instruction: str | None = None
        self._instruction_samples: collections.deque = collections.deque(maxlen=INSTRUCTION_SAMPLES_KEPT)
        self._state: StateSample | None = None
        self._sequence = 0
        self._statistics = NodeStatistics((), window_s=10.0)
        # Diagnostics and status: every state.
        period = self.get_parameter("diagnostics_period").value
        self._diagnostics_publisher = self.create_publisher(DiagnosticArray, "/diagnostics",
                                                            qos_profiles.diagnostics_qos())
        self._status_publisher = self.create_publisher(PolicyStatus, "~/status", qos_profiles.output_qos())
        self._diagnostics_timer = self.create_timer(period, self._publish_diagnostics,
                                                    callback_group=self._timer_group)
        self._release_lock = threading.Lock()
        self._transition_lock = threading.Lock()     # a configure and release() from main() never overlap
        self._log = ThrottledLog(self.get_logger(), LOG_THROTTLE_S)
        self._python_logs = PythonLogBridge(self._log)
        self._python_logs.install()
        self._heap_reuse = ""                  # flashrt_ros.heap_reuse state, set at configure
        self._shutting_down = False            # SIGINT / context shutdown seen: transitions end quietly
        self._autostart_timer = None
        if self.get_parameter("autostart").value:
            self._autostart_timer = self.create_timer(0.0, self._autostart, callback_group=self._timer_group)

    # -- lifecycle -------------------------------------------------------------------------------------
    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Load and warm up the model. SUCCESS -> inactive; FAILURE -> stays unconfigured (all released).
        Shutdown (SIGINT, SIGTERM, ``release``) during it: ShuttingDown at the next step of the configure or of the
        core's load inside it, everything released (``release`` waits for it; main() ends on it quietly)."""
        with self._transition_lock, stop_when(self._stopping):     # the core's long load stops between its steps
            try:
                return self._configure()
            except Stopped as stopped:               # the core saw the stop first: the same quiet end
                raise ShuttingDown(str(stopped)) from None

    def _configure(self) -> TransitionCallbackReturn:
        try:
            settings = read_settings(self)
        except SettingsError as error:
            return self._configure_failed(str(error))
        self.get_logger().info(
            f"configuring: checkpoint={settings.checkpoint or '<embedded demo>'} config={settings.model_config} "
            f"device={settings.device} precision={settings.precision} cameras={list(settings.camera_topics)}")
        try:
            if settings.keep_large_buffers_on_heap:
                self._heap_reuse = keep_large_buffers_on_heap()
                self.get_logger().info(f"image-sized buffers kept on the heap (mallopt): {self._heap_reuse}")
            else:       # one-way: an earlier configure of this process may have applied it
                earlier = heap_reuse_state()
                self._heap_reuse = "off" if earlier is None else f"{earlier} (applied earlier in this process)"
            self._policy = self._policy_factory(settings)
            self._stop_if_shutting_down()
            self._view_names = self._check_model_fits(settings, self._policy)
            self._settings = settings
            self._buffer = ObservationBuffer(self._view_names, seconds_to_ns(settings.sync_slop),
                                             seconds_to_ns(settings.max_observation_age))
            self._gc_pauses = GcPauses(settings.diagnostics_window)
            self._statistics = NodeStatistics(settings.camera_topics, settings.diagnostics_window, self._gc_pauses)
            self._watchdog = InputWatchdog(settings.camera_topics)
            self._worker = InferenceWorker(self._prepare_job, self._predict, self._publish_result,
                                           self._on_inference_error,
                                           on_discard=lambda _: self._statistics.record_discarded(),
                                           yield_after_notify=settings.yield_to_inference_thread,
                                           handover_timeout_s=settings.inference_handover_timeout)
            self._worker.start()
            if settings.rtc != "off":
                self._rtc = PolicyRtc(settings.rtc, settings.rtc_execution_horizon, settings.rtc_max_guidance_weight,
                                      settings.rtc_latency_margin)
            # Warm-up (and graph capture on GPU) on the inference thread: all model calls on one thread.
            self.get_logger().info(f"model loaded: warming up ({settings.warmup_iterations} passes)")
            self._run_stoppable_on_inference_thread(lambda: self._warm_up(settings))
            self._stop_if_shutting_down()
            self._prepare_calibration(settings)
            if settings.freeze_gc_after_configure:
                self._gc_frozen = True
                frozen = freeze_objects()
                self.get_logger().info(f"{frozen} Python objects frozen out of garbage collection (gc.freeze)")
            self._gc_pauses.install()         # from here: the collections that run while the node serves
            self._stop_if_shutting_down()
            self._config_id = settings.config_id()
            self._chunk_publisher = self.create_lifecycle_publisher(ActionChunk, settings.output_topic,
                                                                    qos_profiles.output_qos())
            if settings.trajectory_topic:
                self._trajectory_publisher = self.create_lifecycle_publisher(
                    JointTrajectory, settings.trajectory_topic, qos_profiles.output_qos())
        except (ShuttingDown, Stopped):
            self._release()
            raise
        except Exception as error:   # missing checkpoint, out of memory, mismatch...: FAILURE, never a crash
            self._release()
            return self._configure_failed(f"{type(error).__name__}: {error}")
        self.get_logger().info(
            f"configured: model {self._policy.model_id} on {self._policy.device}, views {list(self._view_names)}, "
            f"horizon {self._policy.horizon} x {self._policy.action_dim}, config_id {self._config_id}")
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Subscriptions and outputs live. SUCCESS -> active; FAILURE -> stays inactive."""
        settings = self._settings
        self._sequence = 0
        self._statistics.reset()
        self._buffer.clear()
        self._buffer.reset_counters()
        if self._rtc is not None:
            self._rtc.clear()
        try:
            self._create_subscriptions(settings)
        except Exception as error:      # e.g. a topic already used with another type in this process
            self._destroy_subscriptions()
            message = f"activate failed: {type(error).__name__}: {error}"
            self.get_logger().error(message)
            self._statistics.set_last_error(message)
            return TransitionCallbackReturn.FAILURE
        if settings.trigger is TriggerMode.RATE:
            self._trigger_timer = self.create_timer(1.0 / settings.inference_rate_hz, self._worker.notify,
                                                    callback_group=self._timer_group)
        self._faults = ()
        now_s = self._clock_s()
        self._watchdog.reset(now_s if now_s > 0.0 else None)      # 0: sim time before the first /clock
        shortest = min(settings.camera_timeout, settings.pairing_timeout, settings.max_state_age)
        low, high = WATCH_PERIOD_LIMITS_S
        self._watch_timer = self.create_timer(min(max(shortest / 5.0, low), high), self._watch_inputs,
                                              callback_group=self._timer_group)
        result = super().on_activate(state)      # activates the lifecycle publishers
        self._worker.enable()
        self.get_logger().info(f"active: publishing on {self._chunk_publisher.topic_name}")
        return result

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Output stops at once: results of forward passes in flight are discarded. SUCCESS -> inactive."""
        self._worker.disable()
        self._destroy_subscriptions()
        self.get_logger().info("inactive: output stopped")
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Model and GPU memory released. SUCCESS -> unconfigured."""
        self._release()
        self.get_logger().info("cleaned up: model released")
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        """From any state: release everything. SUCCESS -> finalized."""
        self._release()
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        """After an exception in a transition: release everything. SUCCESS -> unconfigured."""
        if self.context.ok() and not self._shutting_down:
            self.get_logger().error(f"error in a transition from {state.label}: releasing everything")
        self._release()
        return TransitionCallbackReturn.SUCCESS

    def lifecycle_state(self) -> str:
        """Label of the current lifecycle state ('unconfigured', 'inactive', 'active', 'finalized')."""
        return self._state_machine.current_state[1]

    @property
    def policy(self):
        """The loaded policy (flashrt_core API) while configured, else None."""
        return self._policy

    def release(self) -> None:
        """Stop inference and free the model, whatever the state (used by main() on SIGINT). A configure running
        on another thread ends at its next step; this waits for it."""
        self._shutting_down = True
        with self._transition_lock:
            self._release()

    def destroy_node(self) -> None:
        self._python_logs.uninstall()
        super().destroy_node()

    # -- configure helpers ------------------------------------------------------------------------------
    def _configure_failed(self, reason: str) -> TransitionCallbackReturn:
        if self._shutting_down or not self.context.ok():
            return TransitionCallbackReturn.FAILURE       # SIGINT: nothing to report, nobody to report to
        message = bounded(f"configure failed: {reason}")
        self.get_logger().error(message)
        self._statistics.set_last_error(message)
        return TransitionCallbackReturn.FAILURE

    def _stopping(self) -> bool:
        """The process is stopping: SIGINT or SIGTERM shut the context down, or main() released the node."""
        return self._shutting_down or not self.context.ok()

    def _stop_if_shutting_down(self) -> None:
        """Raise ShuttingDown when the process is stopping (a configure ends at its next step)."""
        if self._stopping():
            raise ShuttingDown("the node is shutting down")

    def _run_stoppable_on_inference_thread(self, fn: Callable[[], object]) -> object:
        """fn() on the inference thread (all model calls on one thread), its long steps in flashrt_core ending at
        the next one once the node is stopping (Stopped, flashrt_core.stopping: a thread sees only the stop_when
        blocks it entered itself, so the inference thread enters its own)."""
        def stoppable() -> object:
            with stop_when(self._stopping):
                return fn()
        return self._worker.run_on_thread(stoppable)

    def _check_model_fits(self, settings: NodeSettings, policy) -> tuple[str, ...]:
        model_views = tuple(policy.view_names)
        cameras = len(settings.camera_topics)
        if cameras > len(model_views):
            raise SettingsError(f"{cameras} camera topics but the model has {len(model_views)} views {model_views}")
        views = settings.camera_views or model_views[:cameras]
        unknown = [view for view in views if view not in model_views]
        if unknown:
            raise SettingsError(f"camera_views {unknown} are not views of the model {list(model_views)}")
        if not settings.state_topic and getattr(policy, "requires_state", False):
            raise SettingsError(f"state_topic is empty, but the model {policy.model_id} needs the robot state "
                                f"({policy.state_dim} values): set state_topic (a parameter file is ignored unless "
                                f"its top-level key is /** or this node's full name {self.get_fully_qualified_name()})")
        if settings.action_names and len(settings.action_names) != policy.action_dim:
            raise SettingsError(f"action_names has {len(settings.action_names)} names, the model's action_dim "
                                f"is {policy.action_dim}")
        if settings.state_topic and settings.state_joint_names and policy.state_dim and \
                len(settings.state_joint_names) != policy.state_dim:
            raise SettingsError(f"state_joint_names has {len(settings.state_joint_names)} names, the model's "
                                f"state_dim is {policy.state_dim}")
        return tuple(views)

    def _warm_up(self, settings: NodeSettings) -> None:
        """Forward passes with inputs shaped like the real ones (image size, views, state, prompt), so the
        engine captures the graphs the cameras will use at configure and not on the first frame: the warm-up
        prompt's, then (warmup_all_text_buckets) one per text bucket, so any instruction length finds its graph."""
        width, height = settings.warmup_image_size
        images = {view: np.full((height, width, 3), 128, np.uint8) for view in self._view_names}   # (H, W, 3)
        state = np.zeros(self._policy.state_dim, np.float32) if settings.state_topic else None
        prompt = settings.default_instruction or WARMUP_PROMPT
        warming_up = getattr(self._policy, "warming_up", contextlib.nullcontext)   # FP8: never calibrates on these
        with warming_up():
            for _ in range(settings.warmup_iterations):
                self._stop_if_shutting_down()
                self._policy.predict(images, prompt, state=state)
            rtc = None
            if settings.warmup_iterations and self._rtc is not None:     # the engine's RTC graph of this signature
                from flashrt_core.rtc_request import RtcRequest
                previous = np.zeros((self._policy.horizon, self._policy.action_dim), np.float32)
                rtc = RtcRequest(previous, 1, settings.rtc)
                self._policy.predict(images, prompt, state=state, rtc=rtc)
        warm_up_buckets = getattr(self._policy, "warm_up_text_buckets", None)   # flashrt_core.Policy has it
        if settings.warmup_iterations and settings.warmup_all_text_buckets and warm_up_buckets is not None:
            buckets = warm_up_buckets(images, prompt, state=state, **({} if rtc is None else {"rtc": rtc}))
            if buckets:
                self.get_logger().info(f"warmed up text buckets {buckets} (token slots)")

    def _prepare_calibration(self, settings: NodeSettings) -> None:
        """An FP8 policy's calibration (flashrt_ros.node_calibration): from calibration_bag now, on the inference
        thread; else live, on the first real observations after activation."""
        self._calibration, self._calibration_status = None, ""
        if not getattr(self._policy, "fp8", False):
            return
        if settings.calibration_bag:
            self.get_logger().info(f"FP8: calibrating on {settings.calibration_bag}")
            report = self._run_stoppable_on_inference_thread(lambda: calibrate_from_bag(
                self._policy, settings.calibration_bag, settings, settings.calibration_observations,
                settings.calibration_gate_observations, settings.fp8_scale_cache,
                self.get_namespace()))
            self._calibration_status = report.summary()
            self.get_logger().info(self._calibration_status)
            return
        self._calibration = LiveCalibration(settings.calibration_observations, settings.calibration_gate_observations)
        self._calibration_status = self._calibration.status
        self.get_logger().info(f"FP8: calibrating on the first {self._calibration.needed} real observations after "
                               "activation; nothing is published until then")

    def _calibrate_live(self, job: InferenceJob) -> None:
        """Keep a live observation for the calibration; with enough, calibrate (on the inference thread)."""
        calibration = self._calibration
        state = job.state.values if job.state is not None else None
        if calibration.add(job.images, job.prompt, state):
            self._calibration_status = f"calibrating on {calibration.calibrate_count} observations"
            try:
                calibration.run(self._policy)
            except Exception as error:          # the gate, or anything else: nothing is published
                self._calibration_status = calibration.status
                message = bounded(f"FP8 calibration failed, publishing nothing until configured again: "
                                  f"{type(error).__name__}: {error}")
                self._statistics.record_inference_error(message)
                self._log.error("fp8_calibration", message)
                self._publish_diagnostics()
                return
            self.get_logger().info(calibration.status)
        else:
            self._log.info("fp8_calibration", f"FP8 calibration: {calibration.status}")
        self._calibration_status = calibration.status
        self._publish_diagnostics()

    # -- activation helpers -----------------------------------------------------------------------------
    def _create_subscriptions(self, settings: NodeSettings) -> None:
        # Instruction and state first: an executor hands out ready messages in subscription order, so a state
        # that arrived together with the frame completing an observation is taken before that frame's callback
        # wakes the inference thread (which, with yield_to_inference_thread, starts at once).
        # Latched and volatile publishers both reach the node (qos_profiles): a volatile publisher is incompatible
        # with the transient-local subscription only, and its messages arrive through the volatile one, so rclpy's
        # default "incompatible QoS: no messages will be received" warning would be wrong here and is not logged.
        ignore_incompatible = SubscriptionEventCallbacks(incompatible_qos=lambda event: None)
        self._input_subscriptions.append(self.create_subscription(
            String, settings.instruction_topic, self._on_instruction, qos_profiles.instruction_qos(),
            callback_group=self._input_group, event_callbacks=ignore_incompatible))
        self._input_subscriptions.append(self.create_subscription(
            String, settings.instruction_topic, self._on_instruction, qos_profiles.instruction_volatile_qos(),
            callback_group=self._input_group))
        if settings.state_topic:
            msg_type = JointState if settings.state_type is StateInput.JOINT_STATE else Float64MultiArray
            self._input_subscriptions.append(self.create_subscription(
                msg_type, settings.state_topic, self._on_state, qos_profiles.state_qos(),
                callback_group=self._input_group))
        if self._rtc is not None:
            self._input_subscriptions.append(self.create_subscription(
                ActionChunk, settings.rtc_pending_topic, self._on_pending_actions, qos_profiles.output_qos(),
                callback_group=self._input_group))
        # One mutually exclusive group per camera: frames of one camera in order (cameras in parallel only under
        # the multi_threaded executor).
        for index, topic in enumerate(settings.camera_topics):
            msg_type = CompressedImage if topic.rstrip("/").endswith("/compressed") else Image
            self._input_subscriptions.append(self.create_subscription(
                msg_type, topic, lambda msg, i=index, t=topic: self._on_image(msg, i, t),
                qos_profiles.camera_qos(), callback_group=MutuallyExclusiveCallbackGroup()))

    def _destroy_subscriptions(self) -> None:
        for subscription in self._input_subscriptions:
            self.destroy_subscription(subscription)
        self._input_subscriptions = []
        for timer in (self._trigger_timer, self._watch_timer):
            if timer is not None:
                self.destroy_timer(timer)
        self._trigger_timer = self._watch_timer = None
        self._faults = ()

    def _release(self) -> None:
        with self._release_lock:
            if self._worker is not None:
                if not self._worker.stop(WORKER_STOP_TIMEOUT_S):
                    self.get_logger().warning("inference thread still running after stop timeout")
                self._worker = None
            self._destroy_subscriptions()
            for publisher in (self._chunk_publisher, self._trajectory_publisher):
                if publisher is not None:
                    self.destroy_lifecycle_publisher(publisher)
            self._chunk_publisher = self._trajectory_publisher = None
            if self._gc_frozen:
                unfreeze_objects()      # before the last reference goes, so the collector can free the model
                self._gc_frozen = False
            if self._gc_pauses is not None:
                self._gc_pauses.uninstall()
                self._gc_pauses = None
            if self._policy is not None:
                try:
                    self._policy.close()
                except Exception as error:
                    self.get_logger().warning(f"closing the model failed: {error}")
                self._policy = None
            self._settings = None
            self._calibration, self._calibration_status = None, ""
            self._rtc = None
            self._buffer = None
            self._watchdog = None
            self._instruction = None
            self._state = None

    # -- input callbacks (never block on inference) ------------------------------------------------------
    def _on_image(self, msg, index: int, topic: str) -> None:
        buffer, worker, settings, watchdog = self._buffer, self._worker, self._settings, self._watchdog
        if buffer is None or worker is None or settings is None or watchdog is None:
            return
        self._statistics.record_frame(topic)
        now_ns = self.get_clock().now().nanoseconds
        received_s = now_ns * 1e-9
        watchdog.frame_received(index, received_s)
        try:
            check_image(msg)
        except ImageConversionError as error:
            self._reject_frame(index, "bad_image", f"{topic}: {error}")
            return
        stamp_ns = Time.from_msg(msg.header.stamp).nanoseconds
        if now_ns > 0 and stamp_ns - now_ns > seconds_to_ns(settings.max_future_stamp):   # 0: no /clock yet
            ahead_s = (stamp_ns - now_ns) * 1e-9
            self._statistics.record_future_stamp(ahead_s)
            self._reject_frame(index, "future_stamp", f"{topic}: frame stamped {ahead_s:.3f} s in the future "
                               f"(max_future_stamp {settings.max_future_stamp} s): is the camera's clock synchronised "
                               "with this node's?")
            return
        result = buffer.add_frame(index, stamp_ns, msg, now_ns)
        if result is AddResult.STALE:
            watchdog.frame_rejected(index, f"stamped {(now_ns - stamp_ns) * 1e-9:.3f} s ago, older than "
                                    f"max_observation_age {settings.max_observation_age} s")
            self._log.warning(f"stale:{topic}", f"{topic}: frame stamped {(now_ns - stamp_ns) * 1e-9:.3f} s ago, "
                              f"older than max_observation_age ({settings.max_observation_age} s), skipped")
            return
        if result is AddResult.OUT_OF_ORDER:
            watchdog.frame_rejected(index, "not newer than the previous frame")
            self._log.warning(f"order:{topic}", f"{topic}: frame not newer than the previous one, skipped")
            return
        watchdog.frame_accepted(index, stamp_ns, received_s)
        if result is AddResult.RESET:
            self._log.warning(f"reset:{topic}", f"{topic}: time jumped backwards; observation buffer reset")
        if result is AddResult.COMPLETED or (result is AddResult.RESET and buffer.has_pending()):
            watchdog.observation_completed(received_s)
        if settings.trigger is TriggerMode.ON_OBSERVATION and result in (AddResult.COMPLETED, AddResult.RESET):
            worker.notify()

    def _reject_frame(self, index: int, reason: str, message: str) -> None:
        watchdog = self._watchdog
        if watchdog is not None:
            watchdog.frame_rejected(index, bounded(message))
        self._reject(reason, message)

    def _on_instruction(self, msg: String, info: dict) -> None:
        # A latched publisher reaches both instruction subscriptions: its message is handled once.
        sample = (str(info.get("publisher_gid")), info.get("publication_sequence_number"), info.get("source_timestamp"))
        if sample in self._instruction_samples:
            return
        self._instruction_samples.append(sample)
        text = msg.data.strip()
        if not text:
            self._reject("empty_instruction", "empty instruction ignored")
            return
        if text != self._instruction:
            self._statistics.record_instruction_change()
            self._log.info("instruction", f"instruction: {quoted(text)}")
        first = self._instruction is None
        self._instruction = text
        if first:
            self._wake_on_new_input()

    def _on_state(self, msg) -> None:
        settings = self._settings
        if settings is None:
            return
        try:
            sample = self._state_sample(msg, settings)
        except FutureStampError as error:
            self._reject("future_stamp", f"{settings.state_topic}: {error}")
            return
        except ValueError as error:
            self._reject("bad_state", f"{settings.state_topic}: {error}")
            return
        first = self._state is None
        self._state = sample
        if first:
            self._wake_on_new_input()

    def _wake_on_new_input(self) -> None:
        """The first instruction / state may unblock an observation already pending."""
        worker, settings = self._worker, self._settings
        if worker is not None and settings is not None and settings.trigger is TriggerMode.ON_OBSERVATION:
            worker.notify()

    def _state_sample(self, msg, settings: NodeSettings) -> StateSample:
        policy = self._policy
        return state_sample(msg, settings, self.get_clock().now().nanoseconds, policy.state_dim if policy else 0)

    # -- inference thread --------------------------------------------------------------------------------
    def _prepare_job(self) -> InferenceJob | None:
        buffer, settings = self._buffer, self._settings
        if buffer is None or settings is None:
            return None
        # Instruction and state first: without them the observation stays pending for a later wake-up.
        prompt = self._instruction or settings.default_instruction
        if not prompt:
            if buffer.has_pending():
                self._log.warning("no_instruction", "no instruction yet: waiting for one on "
                                  f"{settings.instruction_topic} (or set default_instruction)")
            return None
        state = self._state if settings.state_topic else None
        if settings.state_topic and state is None:
            if buffer.has_pending():
                self._log.warning("no_state", f"no valid state yet on {settings.state_topic}")
            return None
        now_ns = self.get_clock().now().nanoseconds
        buffer.note_time(now_ns)
        observation = buffer.take(now_ns)
        if observation is None:
            return None
        if state is not None and now_ns - state.stamp_ns > seconds_to_ns(settings.max_state_age):
            # never a chunk from an old state: the observation is skipped (the state topic stopped, or only
            # invalid states arrived since); counted here, logged and shown in /diagnostics by the watchdog
            self._reject("stale_state", f"observation skipped: its state is {(now_ns - state.stamp_ns) * 1e-9:.2f} s "
                         f"old (max_state_age {settings.max_state_age} s)", log=False)
            return None
        images = {}
        for index, (view, frame, topic) in enumerate(zip(self._view_names, observation.frames,
                                                         settings.camera_topics)):
            decoder_messages: list[str] = []
            try:
                images[view] = to_rgb(frame.payload, decoder_messages)
            except ImageConversionError as error:
                self._report_decoding(index, f"{topic}: {error}")
                self._reject("bad_image", f"{topic}: {error}")
                return None
            self._report_decoding(index, None)
            for line in decoder_messages:      # libjpeg's warnings about a frame it still decoded
                self._log.warning(f"decoder:{topic}", f"{topic}: {line}")
        job = InferenceJob(observation, images, prompt, state, taken_ns=now_ns)
        calibration = self._calibration
        if calibration is not None and not calibration.publishing:
            if calibration.state is CalibrationState.COLLECTING:
                self._calibrate_live(job)
            return None                         # calibrating (or failed): nothing inferred, nothing published
        return job

    def _report_decoding(self, index: int, error: str | None) -> None:
        watchdog = self._watchdog
        if watchdog is not None:
            watchdog.frame_decoded(index, self._clock_s(), None if error is None else bounded(error))

    def _on_pending_actions(self, msg: ActionChunk) -> None:
        rtc = self._rtc
        if rtc is not None:
            rtc.on_pending(Time.from_msg(msg.header.stamp).nanoseconds * 1e-9, msg.dt, msg.horizon, msg.action_dim,
                           msg.actions, msg.sequence)

    def _predict(self, job: InferenceJob) -> np.ndarray:
        state = job.state.values if job.state is not None else None
        noise = None
        if self._settings.noise_seed != NO_SEED:       # (horizon, 32) pinned to the observation stamp
            noise = observation_noise(self._settings.noise_seed, job.observation.stamp_ns, self._policy.horizon)
        rtc = self._rtc
        request = None
        if rtc is not None:      # conditioned on what the executor will still execute (flashrt_ros/rtc_sharing.py)
            request = rtc.request(job.observation.stamp_ns * 1e-9, job.taken_ns * 1e-9, self._settings.action_dt,
                                  self._policy.horizon, self._policy.action_dim)
        if request is not None:
            actions = self._policy.predict(job.images, job.prompt, state=state, noise=noise, rtc=request)
        else:
            actions = self._policy.predict(job.images, job.prompt, state=state, noise=noise)   # (horizon, action_dim)
        return finite_chunk(actions)

    def _publish_result(self, result: InferenceResult[InferenceJob]) -> None:
        """Runs on the inference thread under the worker's delivery lock (see InferenceWorker.disable)."""
        settings, job = self._settings, result.job
        actions = np.ascontiguousarray(result.actions, dtype=np.float32)    # (horizon, action_dim)
        horizon, action_dim = actions.shape
        observation_stamp = Time(nanoseconds=job.observation.stamp_ns).to_msg()
        msg = ActionChunk()
        msg.header.stamp = observation_stamp
        msg.header.frame_id = settings.frame_id
        msg.view_names = list(self._view_names)
        msg.view_stamps = [Time(nanoseconds=ns).to_msg() for ns in job.observation.view_stamps_ns]
        if job.state is not None:
            msg.state_stamp = Time(nanoseconds=job.state.stamp_ns).to_msg()
        msg.sequence = self._sequence
        msg.horizon, msg.action_dim = horizon, action_dim
        msg.dt = settings.action_dt
        msg.action_names = list(settings.action_names)
        msg.actions = actions.reshape(-1)
        msg.inference_time = result.inference_time_s
        msg.model_id = str(self._policy.model_id)
        msg.config_id = self._config_id
        if self._trajectory_publisher is not None:
            self._trajectory_publisher.publish(self._trajectory(msg.header, actions, settings))
        staleness_ns = self.get_clock().now().nanoseconds - job.observation.stamp_ns
        msg.staleness = staleness_ns * 1e-9
        build_time_s = time.perf_counter() - result.finished_at
        self._chunk_publisher.publish(msg)
        if self._rtc is not None:        # the time from taking the observation to its chunk going out
            self._rtc.latency.record((self.get_clock().now().nanoseconds - job.taken_ns) * 1e-9)
            self._rtc.on_published(job.observation.stamp_ns * 1e-9, msg.dt, actions, msg.sequence)
        self._sequence += 1
        self._statistics.record_chunk(msg.inference_time, msg.staleness,
                                      (job.taken_ns - job.observation.completed_ns) * 1e-9,
                                      result.prepare_time_s + build_time_s,
                                      (job.observation.completed_ns - job.observation.stamp_ns) * 1e-9)
        self._publish_status()

    @staticmethod
    def _trajectory(header, actions: np.ndarray, settings: NodeSettings) -> JointTrajectory:
        trajectory = JointTrajectory()
        trajectory.header = header
        trajectory.joint_names = list(settings.action_names)
        for step, row in enumerate(actions.astype(np.float64)):
            seconds = step * settings.action_dt
            point = JointTrajectoryPoint(positions=row.tolist())
            point.time_from_start = DurationMsg(sec=int(seconds), nanosec=int(round((seconds % 1.0) * 1e9)))
            trajectory.points.append(point)
        return trajectory

    def _on_inference_error(self, what: str, error: BaseException) -> None:
        message = bounded(f"{what}: {type(error).__name__}: {error}")
        self._statistics.record_inference_error(message)
        self._log.error(f"error:{what}", message)
        self._publish_status()

    # -- diagnostics -------------------------------------------------------------------------------------
    def _diagnostics_context(self) -> DiagnosticsContext:
        settings, buffer, policy, calibration = self._settings, self._buffer, self._policy, self._calibration
        threshold = settings.staleness_warn_threshold if settings else self.get_parameter(
            "staleness_warn_threshold").value
        return DiagnosticsContext(
            node_name=self.get_fully_qualified_name(), lifecycle_state=self.lifecycle_state(),
            model_id=str(policy.model_id) if policy is not None else "", config_id=self._config_id,
            device=str(policy.device) if policy is not None else None, staleness_warn_threshold=threshold,
            buffer=buffer.counters() if buffer is not None else BufferCounters(),
            has_instruction=bool(self._instruction or (settings and settings.default_instruction)),
            instruction=self._instruction or (settings.default_instruction if settings else ""),
            faults=self._faults,
            max_future_stamp=settings.max_future_stamp if settings else 0.0,
            heap_reuse=self._heap_reuse,
            handover_timeouts=self._worker.handover_timeouts if self._worker is not None else 0,
            fp8_calibration=self._calibration_status,
            calibration_state=calibration.state.value if calibration is not None else "",
            executor=str(getattr(getattr(policy, "executor", None), "name", "")) if policy is not None else "",
            decoded_tokens=_decoded_tokens(policy))

    def _publish_diagnostics(self) -> None:
        try:
            snapshot, context = self._statistics.snapshot(), self._diagnostics_context()
            self._diagnostics_publisher.publish(diagnostic_array(snapshot, context, self.get_clock().now().to_msg()))
            self._publish_status(snapshot, context)
        except Exception:
            if self.context.ok():
                raise
            # SIGINT shut the context down during this tick: the publishers are invalid and nobody listens.

    def _publish_status(self, snapshot=None, context=None) -> None:
        snapshot = self._statistics.snapshot() if snapshot is None else snapshot
        context = self._diagnostics_context() if context is None else context
        msg = PolicyStatus(**status_fields(snapshot, context))
        msg.header.stamp = self.get_clock().now().to_msg()
        self._status_publisher.publish(msg)

    # -- parameters and helpers --------------------------------------------------------------------------
    def _on_parameters_set(self, parameters) -> None:
        """Apply runtime-changeable parameters (already validated by on_set_parameters)."""
        settings = self._settings
        if settings is None:
            return
        values = {p.name: p.value for p in parameters if p.name in RUNTIME_PARAMETERS}
        if not values:
            return
        self._settings = settings = settings.with_runtime_values(values)
        if self._buffer is not None:
            self._buffer.set_limits(seconds_to_ns(settings.sync_slop), seconds_to_ns(settings.max_observation_age))
        self.get_logger().info(f"parameters changed: {values}")

    def _clock_s(self) -> float:
        """The node clock [s] (sim time under use_sim_time)."""
        return self.get_clock().now().nanoseconds * 1e-9

    def _reject(self, reason: str, message: str, log: bool = True) -> None:
        message = bounded(message)
        self._statistics.record_rejection(reason, message)
        if log:
            self._log.warning(f"reject:{reason}", message)

    # -- input watchdog (timer while active) -------------------------------------------------------------
    def _watch_inputs(self) -> None:
        """Check the inputs; a fault that appears is logged (throttled) and counted, one that clears is logged;
        any change publishes /diagnostics at once."""
        settings, watchdog = self._settings, self._watchdog
        if settings is None or watchdog is None:
            return
        state, state_age_s = self._state, None
        if state is not None:
            state_age_s = (self.get_clock().now().nanoseconds - state.stamp_ns) * 1e-9
        limits = WatchLimits(settings.camera_timeout, settings.pairing_timeout, settings.max_state_age,
                             settings.sync_slop)
        faults = watchdog.check(self._clock_s(), limits, settings.state_topic, state_age_s)
        before = {fault.key for fault in self._faults}
        after = {fault.key for fault in faults}
        for fault in faults:
            if fault.key not in before:
                self._statistics.record_fault(fault.kind.value, fault.message)
                self._log.warning(f"fault:{fault.key}", fault.message)
        for fault in self._faults:
            if fault.key not in after:
                self._log.info(f"recovered:{fault.key}",
                               f"recovered: {fault.subject}: {fault.kind.value.replace('_', ' ')} over")
        self._faults = faults
        if before != after:
            self._publish_diagnostics()

    def _autostart(self) -> None:
        """autostart: configure, then activate, once (a failed transition leaves the node where it stopped)."""
        self.destroy_timer(self._autostart_timer)
        self._autostart_timer = None
        self.get_logger().info("autostart: configuring")
        if self.trigger_configure() != TransitionCallbackReturn.SUCCESS or self._shutting_down:
            return
        self.get_logger().info("autostart: activating")
        self.trigger_activate()


def main(args: list[str] | None = None) -> int:
    """Run the node with the executor its ``executor`` parameter names until SIGINT, SIGTERM or shutdown; returns
    the exit code. Both signals shut rclpy's context down (rclpy's handlers); the spin loop then ends quietly, also
    when the shutdown lands while the executor builds its next wait set (rclpy raises an RCLError there)."""
    try:
        with sigint_shuts_down_quietly(), rclpy.init(args=args):
            node = PolicyNode()
            executor = make_executor(node.get_parameter("executor").value)
            executor.add_node(node)
            try:
                spin_until_shutdown(executor, node.context, timeout_sec=None)
            finally:
                node.release()
                executor.shutdown(timeout_sec=1.0)
                node.destroy_node()
    except (KeyboardInterrupt, ShuttingDown):
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def _decoded_tokens(policy) -> int | None:
    """pi0-FAST: how many tokens the last predict decoded (0 before the first); None for other policies."""
    if policy is None or not hasattr(policy, "codec"):
        return None
    tokens = getattr(policy, "last_tokens", None)
    return 0 if tokens is None else len(tokens)
