"""Statistics of the policy node and their two outputs: /diagnostics and ~/status.

``NodeStatistics`` is thread-safe (callbacks, the inference thread and the diagnostics timer all touch it);
``diagnostic_array`` turns a ``StatisticsSnapshot`` into the /diagnostics message and ``status_fields`` into
the fields of flashrt_ros/PolicyStatus. Windowed figures (median / p99 / max, input rates) cover the last
``window_s`` seconds of time.monotonic (wall time), so they stay meaningful while sim time is paused; the
values themselves (staleness) are in the node clock.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Deque, Mapping

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

from flashrt_ros.gc_pauses import GcPauses
from flashrt_ros.input_watchdog import Fault
from flashrt_ros.node_logging import quoted
from flashrt_ros.observation_buffer import BufferCounters

HARDWARE_ID = "flashrt_policy"
# last_error prefixes of failed transitions: shown as ERROR while the node is not active
TRANSITION_FAILURE_PREFIXES = ("configure failed", "activate failed")


class WindowedSamples:
    """Values with their arrival time (monotonic seconds); statistics over the last ``window_s``."""

    def __init__(self, window_s: float):
        self.window_s = float(window_s)
        self._samples: Deque[tuple[float, float]] = collections.deque()

    def add(self, value: float, now_s: float) -> None:
        self._samples.append((now_s, float(value)))
        self._trim(now_s)

    def values(self, now_s: float) -> np.ndarray:
        self._trim(now_s)
        return np.fromiter((v for _, v in self._samples), dtype=np.float64, count=len(self._samples))

    def count(self, now_s: float) -> int:
        self._trim(now_s)
        return len(self._samples)

    def clear(self) -> None:
        self._samples.clear()

    def _trim(self, now_s: float) -> None:
        while self._samples and self._samples[0][0] < now_s - self.window_s:
            self._samples.popleft()


@dataclasses.dataclass(frozen=True)
class Summary:
    """median / p99 / max of a window (NaN when empty)."""

    median: float = float("nan")
    p99: float = float("nan")
    max: float = float("nan")
    count: int = 0

    @staticmethod
    def of(values: np.ndarray) -> "Summary":
        if values.size == 0:
            return Summary()
        return Summary(float(np.median(values)), float(np.percentile(values, 99)), float(values.max()),
                       int(values.size))


@dataclasses.dataclass(frozen=True)
class StatisticsSnapshot:
    inference_time: Summary
    staleness: Summary
    overhead: Summary                       # staleness - inference_time
    queue_wait: Summary                     # observation complete -> inference thread took it
    handling: Summary                       # overhead - queue_wait: transport, conversion, copies, publishing
    node_code: Summary                      # inference thread outside predict: conversion + message build
    input_latency: Summary                  # capture stamp -> observation complete in the node (transport)
    in_node: Summary                        # overhead - input_latency: what the node adds after the last frame
    gc_full_pauses: Summary                 # full Python garbage collections (GIL held throughout)
    input_rates_hz: dict[str, float]        # camera topic -> frames/s over the window
    chunks_published: int
    chunks_discarded: int                   # computed but dropped by a deactivation
    inference_errors: int
    rejected: dict[str, int]                # reason -> count (bad frames, NaN state, ...)
    last_error: str
    window_s: float
    future_stamps: Summary = Summary()      # how far ahead [s] the frames rejected for future stamps were
    faults: dict[str, int] = dataclasses.field(default_factory=dict)   # input fault kind -> times it appeared
    instruction_changes: int = 0

    @property
    def inputs_rejected(self) -> int:
        return sum(self.rejected.values())


class NodeStatistics:
    """Counters and windows of one activation (``reset`` at activation)."""

    def __init__(self, camera_topics: tuple[str, ...], window_s: float, gc_pauses: GcPauses | None = None):
        self.camera_topics = camera_topics
        self.window_s = float(window_s)
        self.gc_pauses = gc_pauses
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._inference = WindowedSamples(self.window_s)
            self._staleness = WindowedSamples(self.window_s)
            self._overhead = WindowedSamples(self.window_s)
            self._queue_wait = WindowedSamples(self.window_s)
            self._handling = WindowedSamples(self.window_s)
            self._node_code = WindowedSamples(self.window_s)
            self._input_latency = WindowedSamples(self.window_s)
            self._in_node = WindowedSamples(self.window_s)
            self._frames = {topic: WindowedSamples(self.window_s) for topic in self.camera_topics}
            self._future = WindowedSamples(self.window_s)
            self._faults: collections.Counter = collections.Counter()
            self._counts: collections.Counter = collections.Counter()
            self._rejected: collections.Counter = collections.Counter()
            self._last_error = ""
            self._since = time.monotonic()

    def record_frame(self, topic: str) -> None:
        with self._lock:
            self._frames[topic].add(1.0, time.monotonic())

    def record_chunk(self, inference_time_s: float, staleness_s: float, queue_wait_s: float,
                     node_code_s: float, input_latency_s: float = float("nan")) -> None:
        """A chunk was published. ``queue_wait_s``: observation complete -> its inference thread pass started;
        ``node_code_s``: that pass outside predict (input conversion before, message build after);
        ``input_latency_s``: capture stamp -> the frame that completed the observation was handled (the
        transport of the frames to the node, on the node clock)."""
        now = time.monotonic()
        with self._lock:
            self._counts["chunks_published"] += 1
            self._inference.add(inference_time_s, now)
            self._staleness.add(staleness_s, now)
            self._overhead.add(staleness_s - inference_time_s, now)
            self._queue_wait.add(queue_wait_s, now)
            self._handling.add(staleness_s - inference_time_s - queue_wait_s, now)
            self._node_code.add(node_code_s, now)
            if input_latency_s == input_latency_s:       # not NaN
                self._input_latency.add(input_latency_s, now)
                self._in_node.add(staleness_s - inference_time_s - input_latency_s, now)

    def record_discarded(self) -> None:
        with self._lock:
            self._counts["chunks_discarded"] += 1

    def record_rejection(self, reason: str, message: str) -> None:
        """An input was rejected; ``reason`` is a short key (e.g. 'bad_image'), ``message`` the detail."""
        with self._lock:
            self._rejected[reason] += 1
            self._last_error = message

    def record_future_stamp(self, ahead_s: float) -> None:
        """A frame stamped ``ahead_s`` seconds in the future was rejected (record_rejection counts it too)."""
        with self._lock:
            self._future.add(ahead_s, time.monotonic())

    def record_fault(self, kind: str, message: str) -> None:
        """An input fault (flashrt_ros.input_watchdog.FaultKind value) appeared."""
        with self._lock:
            self._faults[kind] += 1
            self._last_error = message

    def record_instruction_change(self) -> None:
        with self._lock:
            self._counts["instruction_changes"] += 1

    def set_last_error(self, message: str) -> None:
        """An error outside inference (e.g. a failed configure), shown as last_error."""
        with self._lock:
            self._last_error = message

    def record_inference_error(self, message: str) -> None:
        with self._lock:
            self._counts["inference_errors"] += 1
            self._last_error = message

    def snapshot(self) -> StatisticsSnapshot:
        now = time.monotonic()
        with self._lock:
            span = min(self.window_s, max(now - self._since, 1e-3))
            rates = {topic: samples.count(now) / span for topic, samples in self._frames.items()}
            return StatisticsSnapshot(
                inference_time=Summary.of(self._inference.values(now)),
                staleness=Summary.of(self._staleness.values(now)),
                overhead=Summary.of(self._overhead.values(now)),
                queue_wait=Summary.of(self._queue_wait.values(now)),
                handling=Summary.of(self._handling.values(now)),
                node_code=Summary.of(self._node_code.values(now)),
                input_latency=Summary.of(self._input_latency.values(now)),
                in_node=Summary.of(self._in_node.values(now)),
                gc_full_pauses=Summary.of(self.gc_pauses.full_pauses()) if self.gc_pauses else Summary(),
                input_rates_hz=rates,
                chunks_published=self._counts["chunks_published"],
                chunks_discarded=self._counts["chunks_discarded"],
                inference_errors=self._counts["inference_errors"],
                rejected=dict(self._rejected),
                last_error=self._last_error,
                window_s=self.window_s,
                future_stamps=Summary.of(self._future.values(now)),
                faults=dict(self._faults),
                instruction_changes=self._counts["instruction_changes"],
            )


def gpu_memory_text(device: str | None) -> str:
    """'allocated X MiB / reserved Y MiB' for a CUDA device, else 'n/a'."""
    if not device or not str(device).startswith("cuda"):
        return "n/a"
    import torch   # only reached when a CUDA model is loaded
    if not torch.cuda.is_available():
        return "n/a"
    mib = 1024 * 1024
    return (f"allocated {torch.cuda.memory_allocated(device) / mib:.0f} MiB / "
            f"reserved {torch.cuda.memory_reserved(device) / mib:.0f} MiB")


@dataclasses.dataclass(frozen=True)
class DiagnosticsContext:
    """Everything besides the statistics that the diagnostics entry shows."""

    node_name: str
    lifecycle_state: str
    model_id: str
    config_id: str
    device: str | None
    staleness_warn_threshold: float
    buffer: BufferCounters
    has_instruction: bool
    heap_reuse: str = ""                    # flashrt_ros.heap_reuse state ("" before the first configure)
    handover_timeouts: int = 0              # InferenceWorker hand-over waits that ended at their timeout
    instruction: str = ""                   # the current instruction (shown cut to a bounded length)
    faults: tuple[Fault, ...] = ()          # input faults that hold now (flashrt_ros.input_watchdog)
    max_future_stamp: float = 0.0           # [s] the parameter, quoted by the future-stamp warning
    fp8_calibration: str = ""               # an FP8 policy's calibration progress or outcome (node_calibration)
    calibration_state: str = ""             # live calibration: "collecting", "done", "failed" ("" = none)
    executor: str = ""                      # the policy's executor (e.g. engine-graph-bf16, reference)
    decoded_tokens: int | None = None       # pi0-FAST: tokens decoded for the last chunk (None: not pi0-FAST)


def diagnostic_status(snapshot: StatisticsSnapshot, context: DiagnosticsContext) -> DiagnosticStatus:
    """One DiagnosticStatus: level from lifecycle state, errors and the staleness threshold."""
    level, message = _level(snapshot, context)
    values = {
        "lifecycle_state": context.lifecycle_state,
        "model_id": context.model_id,
        "config_id": context.config_id,
        "inference_time_median_s": _fmt(snapshot.inference_time.median),
        "inference_time_p99_s": _fmt(snapshot.inference_time.p99),
        "inference_time_max_s": _fmt(snapshot.inference_time.max),
        "staleness_median_s": _fmt(snapshot.staleness.median),
        "staleness_p99_s": _fmt(snapshot.staleness.p99),
        "staleness_max_s": _fmt(snapshot.staleness.max),
        "overhead_median_s": _fmt(snapshot.overhead.median),
        "overhead_p99_s": _fmt(snapshot.overhead.p99),
        "queue_wait_median_s": _fmt(snapshot.queue_wait.median),
        "queue_wait_p99_s": _fmt(snapshot.queue_wait.p99),
        "handling_median_s": _fmt(snapshot.handling.median),
        "handling_p99_s": _fmt(snapshot.handling.p99),
        "node_code_median_s": _fmt(snapshot.node_code.median),
        "node_code_p99_s": _fmt(snapshot.node_code.p99),
        "input_latency_median_s": _fmt(snapshot.input_latency.median),
        "input_latency_p99_s": _fmt(snapshot.input_latency.p99),
        "in_node_median_s": _fmt(snapshot.in_node.median),
        "in_node_p99_s": _fmt(snapshot.in_node.p99),
        "gc_full_collections": str(snapshot.gc_full_pauses.count),
        "gc_full_pause_max_s": _fmt(snapshot.gc_full_pauses.max),
        "staleness_warn_threshold_s": _fmt(context.staleness_warn_threshold),
        "chunks_published": str(snapshot.chunks_published),
        "chunks_discarded": str(snapshot.chunks_discarded),
        "inference_errors": str(snapshot.inference_errors),
        "observations_completed": str(context.buffer.completed),
        "observations_replaced": str(context.buffer.replaced),
        "frames_stale": str(context.buffer.stale),
        "frames_out_of_order": str(context.buffer.out_of_order),
        "time_resets": str(context.buffer.time_resets),
        "observations_dropped_by_reset": str(context.buffer.dropped_by_reset),
        "inference_handover_timeouts": str(context.handover_timeouts),
        "inputs_rejected": str(rejected_total(snapshot, context.buffer)),
        "has_instruction": str(context.has_instruction).lower(),
        "instruction": quoted(context.instruction) if context.instruction else "",
        "instruction_changes": str(snapshot.instruction_changes),
        "input_faults": "; ".join(fault.message for fault in context.faults),
        "frames_future_stamped_in_window": str(snapshot.future_stamps.count),
        "gpu_memory": gpu_memory_text(context.device),
        "heap_reuse": context.heap_reuse or "not configured",
        "fp8_calibration": context.fp8_calibration or "none",
        "executor": context.executor or "none",
        "last_error": snapshot.last_error,
    }
    if context.decoded_tokens is not None:
        values["decoded_tokens"] = str(context.decoded_tokens)
    for reason, count in sorted(snapshot.rejected.items()):
        values[f"rejected_{reason}"] = str(count)
    for kind, count in sorted(snapshot.faults.items()):
        values[f"faults_{kind}"] = str(count)
    for topic, rate in snapshot.input_rates_hz.items():
        values[f"input_rate_hz[{topic}]"] = f"{rate:.2f}"
    return DiagnosticStatus(level=level, name=f"{context.node_name}: policy", message=message,
                            hardware_id=HARDWARE_ID,
                            values=[KeyValue(key=key, value=value) for key, value in values.items()])


def diagnostic_array(snapshot: StatisticsSnapshot, context: DiagnosticsContext, stamp) -> DiagnosticArray:
    array = DiagnosticArray()
    array.header.stamp = stamp
    array.status = [diagnostic_status(snapshot, context)]
    return array


def _level(snapshot: StatisticsSnapshot, context: DiagnosticsContext) -> tuple[bytes, str]:
    if context.lifecycle_state != "active":
        if snapshot.last_error.startswith(TRANSITION_FAILURE_PREFIXES):
            return DiagnosticStatus.ERROR, f"{context.lifecycle_state}: {snapshot.last_error}"
        return DiagnosticStatus.OK, f"{context.lifecycle_state}: not publishing"
    if context.faults:         # each fault stops the chunks
        return DiagnosticStatus.ERROR, "; ".join(fault.message for fault in context.faults)
    if context.calibration_state == "failed":          # publishes nothing until configured again
        return DiagnosticStatus.ERROR, f"FP8 calibration {context.fp8_calibration}"
    if context.calibration_state == "collecting":
        return DiagnosticStatus.WARN, f"FP8 calibration: {context.fp8_calibration}; not publishing yet"
    if snapshot.staleness.count and snapshot.staleness.p99 > context.staleness_warn_threshold:
        return DiagnosticStatus.WARN, (f"staleness p99 {snapshot.staleness.p99 * 1e3:.1f} ms > threshold "
                                       f"{context.staleness_warn_threshold * 1e3:.1f} ms")
    if not context.has_instruction:
        return DiagnosticStatus.WARN, "no instruction yet"
    if snapshot.future_stamps.count:
        return DiagnosticStatus.WARN, (f"{snapshot.future_stamps.count} frames stamped up to "
                                       f"{snapshot.future_stamps.max:.3f} s in the future rejected in the last "
                                       f"{snapshot.window_s:.0f} s (max_future_stamp {context.max_future_stamp} s)")
    if snapshot.inference_errors:
        return DiagnosticStatus.WARN, f"{snapshot.inference_errors} inference errors: {snapshot.last_error}"
    return DiagnosticStatus.OK, f"active: {snapshot.chunks_published} chunks"


def _fmt(value: float) -> str:
    return "nan" if value != value else f"{value:.6f}"


def rejected_total(snapshot: StatisticsSnapshot, buffer: BufferCounters) -> int:
    return snapshot.inputs_rejected + buffer.stale + buffer.out_of_order


def status_fields(snapshot: StatisticsSnapshot, context: DiagnosticsContext) -> Mapping[str, object]:
    """Field values of flashrt_ros/PolicyStatus (the caller builds the message, it owns the type)."""
    return {
        "lifecycle_state": context.lifecycle_state,
        "chunks_published": snapshot.chunks_published,
        "observations_replaced": context.buffer.replaced,
        "inputs_rejected": rejected_total(snapshot, context.buffer),
        "inference_errors": snapshot.inference_errors,
        "inference_time_median": snapshot.inference_time.median,
        "inference_time_p99": snapshot.inference_time.p99,
        "staleness_median": snapshot.staleness.median,
        "staleness_p99": snapshot.staleness.p99,
        "staleness_max": snapshot.staleness.max,
        "last_error": snapshot.last_error,
    }


__all__ = ["DiagnosticsContext", "NodeStatistics", "StatisticsSnapshot", "Summary", "WindowedSamples",
           "diagnostic_array", "diagnostic_status", "gpu_memory_text", "rejected_total", "status_fields"]
