#!/usr/bin/env python3
"""Benchmark: policy node overhead = staleness - inference time, two 640x480 cameras at 30 Hz.

    .venv/bin/python tools/benchmark_node_overhead.py [--duration 30] [--device auto] [--encoding rgb8]
        [--output docs/benchmarks/node_overhead_<date>.md]

Two processes over loopback DDS, as on a robot: this one runs the policy node (embedded demo checkpoint,
parameters from config/demo_two_cameras.yaml); a child process (``--feeder``) is the camera driver: it
publishes two generated 640x480 streams, an instruction and joint states, and records every ActionChunk
(staleness and inference time as the node measured them).

Reported per chunk (median / p99 / max):
- staleness: node clock at publish minus the observation's capture stamp;
- inference time: the policy's forward pass;
- overhead = staleness - inference (what the node adds: transport, pairing, conversion, copies, publishing,
  and the wait for the inference thread when inference is slower than the camera);
- queue wait: observation complete -> taken by the inference thread (0 when inference keeps up);
- handling = overhead - queue wait (transport, conversion, copies and publishing only);
- node code: the inference thread's work outside predict (image conversion before, ActionChunk build and
  stamping after), i.e. the part of handling that is the node's own code rather than the middleware.
The first ``--skip`` chunks (cold start) are left out.

Before the node starts, a plain rclpy subscriber measures the transport floor on the same machine: capture
stamp -> callback of the later frame of each camera pair (what pairing has to wait for at least), so
handling minus that floor is what the node's own code costs. It runs first with glibc's default allocator
thresholds, then (unless --no-heap-reuse) again after flashrt_ros.heap_reuse.keep_large_buffers_on_heap, which
the node would apply at configure anyway: the A/B of the allocator step without a node, in one process.

``--transport-only`` measures only where the frames' trip goes, no node: the floor with a plain subscriber and
with a raw one (``raw=True``: the serialized CDR in Python bytes, parsed by rosbags, the image a view into them),
each with glibc's defaults and with heap reuse, beside the feeder's own ``publish()`` time per frame.

``--feeder-serialized``: the feeder serializes each generated frame once at start and per publish only writes the
capture stamp into the header bytes and hands rclpy the bytes (one copy into the middleware), as a C++ camera
driver that fills its message and publishes would. The default feeder publishes rclpy Image messages, which rclpy
converts from Python and serializes on every publish. Measured on the development machine, both cost the same
~1.1 ms per 640x480 frame, about half of it only once a subscriber is matched (the report's last row: the same
publish() to a topic no one reads): the transport floor report of 2026-11-30 in docs/benchmarks/.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import resource
import shlex
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from flashrt_ros.heap_reuse import heap_reuse_state, keep_large_buffers_on_heap  # noqa: E402
from flashrt_ros.inference_worker import DEFAULT_HANDOVER_TIMEOUT_S  # noqa: E402
from flashrt_ros.loopback_dds import apply_loopback_dds  # noqa: E402
from flashrt_ros.node_executor import DEFAULT_EXECUTOR, EXECUTORS  # noqa: E402
from tools.machine_trace import cpu_seconds  # noqa: E402

PARAMS_FILE = REPO_ROOT / "config" / "demo_two_cameras.yaml"
FEEDER_SETTLE_S = 2.0           # after discovery, before recording starts
_LOG = logging.getLogger("benchmark_node_overhead")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of streaming measured")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--rate", type=float, default=30.0, help="camera rate [Hz]")
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--encoding", choices=("rgb8", "bgr8"), default="rgb8")
    parser.add_argument("--skip", type=int, default=5, help="first chunks left out (cold start)")
    parser.add_argument("--baseline", type=float, default=5.0, help="seconds of transport-floor measurement")
    parser.add_argument("--output", type=Path, default=None, help="write a markdown report here")
    parser.add_argument("--raw-output", type=Path, default=None,
                        help="write every chunk (sequence, staleness, inference, capture stamp, arrival at the "
                             "feeder) and the transport-floor samples as JSON here")
    parser.add_argument("--executor", choices=EXECUTORS, default=DEFAULT_EXECUTOR,
                        help="the node's executor parameter (flashrt_ros.node_executor)")
    parser.add_argument("--no-yield", action="store_true",
                        help="run the node with yield_to_inference_thread=false (A/B of the GIL hand-over)")
    parser.add_argument("--handover-timeout", type=float, default=DEFAULT_HANDOVER_TIMEOUT_S,
                        help="the node's inference_handover_timeout [s] (default: the node's; 0: off, the A/B of "
                             "the wait for the inference thread to take an observation)")
    parser.add_argument("--no-heap-reuse", action="store_true",
                        help="run the node with keep_large_buffers_on_heap=false (A/B of the mallopt step)")
    parser.add_argument("--no-gc-freeze", action="store_true",
                        help="run the node with freeze_gc_after_configure=false (A/B of the gc.freeze step)")
    parser.add_argument("--transport-only", action="store_true",
                        help="measure the transport floor (plain and raw subscriber, with and without heap reuse) "
                             "and the feeder's publish time, then stop: no policy node")
    parser.add_argument("--feeder-serialized", action="store_true",
                        help="the feeder publishes each frame as CDR serialized once at start, with the capture "
                             "stamp written into its header bytes (rclpy publishes bytes with one copy into the "
                             "middleware), as a C++ camera driver that fills a message and publishes would; "
                             "default: rclpy Image messages, converted from Python on every publish")
    parser.add_argument("--feeder", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--state-dim", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)     # the report names the command as run
    return args


class StallWatch(threading.Thread):
    """Finds process-wide stalls: a thread that sleeps SLEEP_S in a loop and records every wake-up later than
    LATE_S. Per stall: when, how late, the process's CPU time during it (busy: a thread held the GIL or computed;
    ~0: the process was not running at all), and the innermost frame of every other thread right after it."""

    SLEEP_S, LATE_S = 0.005, 0.05

    def __init__(self) -> None:
        super().__init__(name="stall_watch", daemon=True)
        self.events: list[dict] = []
        self._halt = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        while not self._halt.is_set():
            t0, use0, steal0 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF), _machine_steal_s()
            time.sleep(self.SLEEP_S)
            late = time.monotonic() - t0 - self.SLEEP_S
            if late > self.LATE_S:
                use1, steal1 = resource.getrusage(resource.RUSAGE_SELF), _machine_steal_s()
                frames = {f"{th.name} [{th.native_id}]":
                          f"{Path(f.f_code.co_filename).name}:{f.f_lineno} {f.f_code.co_name}"
                          for th in threading.enumerate() if (f := sys._current_frames().get(th.ident)) is not None
                          and th is not self}
                self.events.append({
                    "at_s": round(t0 - start, 3), "late_s": round(late, 4),
                    "cpu_s": round(use1.ru_utime + use1.ru_stime - use0.ru_utime - use0.ru_stime, 4),
                    "system_cpu_s": round(use1.ru_stime - use0.ru_stime, 4),
                    "minor_faults": use1.ru_minflt - use0.ru_minflt, "major_faults": use1.ru_majflt - use0.ru_majflt,
                    "involuntary_switches": use1.ru_nivcsw - use0.ru_nivcsw,
                    "machine_steal_s": round(steal1 - steal0, 3), "threads": frames})

    def stop(self) -> list[dict]:
        self._halt.set()
        self.join(timeout=1.0)
        return self.events


def _machine_steal_s() -> float:
    try:
        return cpu_seconds()["steal"]
    except OSError:          # no /proc/stat (not Linux): no steal figure
        return 0.0


def stall_line(who: str, events: list[dict]) -> str:
    if not events:
        return f"- {who} process: no stall (a {StallWatch.SLEEP_S * 1e3:g} ms sleeper never woke " \
               f"{StallWatch.LATE_S * 1e3:g} ms late)."
    late = [e["late_s"] for e in events]
    return (f"- {who} process: {len(events)} stalls (a {StallWatch.SLEEP_S * 1e3:g} ms sleeper woke > "
            f"{StallWatch.LATE_S * 1e3:g} ms late), {sum(late):.2f} s in all, longest {max(late) * 1e3:.0f} ms; "
            f"process CPU time during them {sum(e['cpu_s'] for e in events):.2f} s "
            f"({sum(e.get('system_cpu_s', 0.0) for e in events):.2f} s in the kernel), "
            f"{sum(e.get('minor_faults', 0) for e in events)} minor / {sum(e.get('major_faults', 0) for e in events)} "
            f"major page faults, machine-wide steal {sum(e.get('machine_steal_s', 0.0) for e in events):.2f} s.")


# -- child process: camera driver + chunk recorder ---------------------------------------------------------
UNMATCHED_PUBLISHES = 40      # feeder publishes to a topic without subscribers, before the measured stream
FEEDER_MODES = {False: "rclpy Image messages", True: "CDR serialized once, stamp patched per publish"}


def run_feeder(args: argparse.Namespace) -> int:
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from sensor_msgs.msg import Image, JointState
    from std_msgs.msg import String

    from flashrt_ros import qos_profiles
    from flashrt_ros.demo_main import StreamSpec, generated_frames
    from flashrt_ros.image_conversion import rgb_to_image_fields
    from flashrt_ros.msg import ActionChunk

    spec = StreamSpec(camera_topics=("camera_0/image_raw", "camera_1/image_raw"), width=args.width,
                      height=args.height, rate_hz=args.rate)
    rclpy.init()
    node = rclpy.create_node("benchmark_feeder")
    images = [[Image(**rgb_to_image_fields(f, args.encoding)) for f in generated_frames(spec, c)] for c in range(2)]
    cameras = [node.create_publisher(Image, t, qos_profiles.camera_qos()) for t in spec.camera_topics]
    instruction = node.create_publisher(String, "instruction", qos_profiles.instruction_qos())
    instruction.publish(String(data=spec.instruction))
    state = node.create_publisher(JointState, "joint_states", qos_profiles.state_qos())
    records = []
    node.create_subscription(
        ActionChunk, "action_chunk",
        lambda m: records.append((m.sequence, m.staleness, m.inference_time,
                                  m.header.stamp.sec * 1_000_000_000 + m.header.stamp.nanosec,
                                  node.get_clock().now().nanoseconds)),
        qos_profiles.output_qos())
    tick = [0]
    publish_ms: list[float] = []
    serialized = None
    if args.feeder_serialized:        # per camera and frame: the CDR bytes, the stamp patched in per publish
        from rclpy.serialization import serialize_message
        serialized = [[bytearray(serialize_message(m)) for m in frames] for frames in images]

    def stamped_frame(camera: int, index: int, stamp):
        """What publish() hands rclpy for a camera's frame: the message, or its CDR bytes, with the stamp set."""
        index %= len(images[camera])
        if serialized is not None:
            write_cdr_header_stamp(serialized[camera][index], stamp.sec, stamp.nanosec)
            return bytes(serialized[camera][index])
        msg = images[camera][index]
        msg.header.stamp = stamp
        return msg

    # The same publish() to a topic no one subscribes to, while the subscribers are discovered: what the sender
    # pays before any delivery (conversion, serialization) against the full figure with a subscriber
    unmatched = node.create_publisher(Image, "camera_unmatched/image_raw", qos_profiles.camera_qos())
    unmatched_ms: list[float] = []
    for i in range(UNMATCHED_PUBLISHES):
        stamp = node.get_clock().now().to_msg()
        t0 = time.perf_counter()
        unmatched.publish(stamped_frame(0, i, stamp))
        unmatched_ms.append(round((time.perf_counter() - t0) * 1e3, 3))
        time.sleep(0.005)
    deadline = time.monotonic() + 60.0
    while any(p.get_subscription_count() == 0 for p in cameras) and time.monotonic() < deadline:
        time.sleep(0.05)

    def publish():
        stamp = node.get_clock().now().to_msg()
        for c, publisher in enumerate(cameras):
            t0 = time.perf_counter()
            publisher.publish(stamped_frame(c, tick[0], stamp))
            publish_ms.append(round((time.perf_counter() - t0) * 1e3, 3))
        joints = JointState(name=[f"joint_{i}" for i in range(args.state_dim)],
                            position=[0.1 * np.sin(tick[0] / 30 + i) for i in range(args.state_dim)])
        joints.header.stamp = stamp
        state.publish(joints)
        tick[0] += 1

    node.create_timer(1.0 / args.rate, publish)
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    watch = StallWatch()
    watch.start()
    end = time.monotonic() + FEEDER_SETTLE_S + args.duration
    while time.monotonic() < end:
        executor.spin_once(timeout_sec=0.01)
    print(json.dumps({"frames": tick[0] * 2, "chunks": records, "stalls": watch.stop(), "publish_ms": publish_ms,
                      "unmatched_publish_ms": unmatched_ms}), flush=True)
    node.destroy_node()
    rclpy.try_shutdown()
    return 0


def write_cdr_header_stamp(cdr: bytearray, sec: int, nanosec: int) -> None:
    """Write header.stamp into a serialized message whose first field is a std_msgs/Header (sensor_msgs/Image):
    after the 4-byte CDR encapsulation header come stamp.sec (int32) and stamp.nanosec (uint32), little-endian
    when the encapsulation says so (0x0001: CDR_LE, what Fast DDS writes here)."""
    if cdr[0:2] != b"\x00\x01":
        raise ValueError(f"expected little-endian CDR (encapsulation 00 01), got {bytes(cdr[0:2]).hex()}")
    struct.pack_into("<iI", cdr, 4, sec, nanosec)


# -- parent process: the policy node -----------------------------------------------------------------------
def start_feeder(args: argparse.Namespace, duration_s: float, state_dim: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, __file__, "--feeder", "--duration", str(duration_s), "--rate", str(args.rate),
         "--width", str(args.width), "--height", str(args.height), "--encoding", args.encoding,
         "--state-dim", str(state_dim)] + (["--feeder-serialized"] if args.feeder_serialized else []),
        stdout=subprocess.PIPE, text=True, env=dict(os.environ))


def measure_transport_floor(args: argparse.Namespace, raw: bool = False,
                            publish_ms: dict[str, list[float]] | None = None) -> np.ndarray:
    """Capture stamp -> arrival of the later camera of each pair [s], plain rclpy subscriber, no policy node.
    raw: the subscription takes the serialized CDR (raw=True) and rosbags parses it (the pixels stay a view into
    the received bytes). publish_ms: the feeder's publish() times per frame are appended here, under
    "publish_ms" (to the subscribed camera topics) and "unmatched_publish_ms" (to a topic without subscribers)."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from sensor_msgs.msg import Image

    from flashrt_ros import qos_profiles

    node = rclpy.create_node("benchmark_transport_floor")
    latest: dict[int, list[float]] = {}
    store = None
    if raw:
        from rosbags.typesys import Stores, get_typestore
        store = get_typestore(Stores.ROS2_KILTED)

    def on_image(msg):
        if store is not None:
            msg = store.deserialize_cdr(msg, "sensor_msgs/msg/Image")
        np.frombuffer(msg.data, dtype=np.uint8)                   # the pixels, as the node's conversion takes them
        stamp = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec
        latest.setdefault(stamp, []).append((node.get_clock().now().nanoseconds - stamp) * 1e-9)

    for topic in ("camera_0/image_raw", "camera_1/image_raw"):
        node.create_subscription(Image, topic, on_image, qos_profiles.camera_qos(), raw=raw)
    feeder = start_feeder(args, args.baseline, 0)
    executor = SingleThreadedExecutor()
    executor.add_node(node)
    while feeder.poll() is None:
        executor.spin_once(timeout_sec=0.05)
    executor.shutdown()
    node.destroy_node()
    if publish_ms is not None:
        lines = feeder.stdout.read().strip().splitlines()
        result = json.loads(lines[-1]) if lines else {}
        for key in ("publish_ms", "unmatched_publish_ms"):
            publish_ms.setdefault(key, []).extend(result.get(key, []))
    pairs = [max(v) for _, v in sorted(latest.items()) if len(v) == 2]
    return np.asarray(pairs[int(args.rate):] or pairs, dtype=np.float64)   # first second left out


def run_transport_only(args: argparse.Namespace) -> int:
    """The transport floor four ways (plain / raw subscriber, glibc defaults / heap reuse) and the feeder's
    publish() time per frame; prints a markdown table (and writes it to --output)."""
    apply_loopback_dds(REPO_ROOT / "test_output" / "benchmark_node_overhead")
    import rclpy
    rclpy.init()
    rows: dict[str, dict[str, float]] = {}
    publish: dict[str, list[float]] = {}
    try:
        for heap in (False, True):
            if heap:
                keep_large_buffers_on_heap()      # one-way for the process: the plain rows run first
            for raw in (False, True):
                name = f"{'raw CDR (rosbags)' if raw else 'plain'} subscriber, {'heap reuse' if heap else 'glibc'}"
                rows[name] = summarize(measure_transport_floor(args, raw, publish if not heap else None))
    finally:
        rclpy.try_shutdown()
    ms = lambda v: f"{v * 1e3:.2f}"  # noqa: E731
    lines = [f"# Transport floor ({datetime.date.today().isoformat()})", "",
             f"Command: `python tools/benchmark_node_overhead.py {' '.join(shlex.quote(a) for a in args.argv)}`; "
             f"{cpu_name()}, {os.cpu_count()} cores; Python {platform.python_version()}; 2 cameras "
             f"{args.width}x{args.height} {args.encoding} at {args.rate:g} Hz from a separate process "
             f"({FEEDER_MODES[args.feeder_serialized]}), "
             f"{args.baseline:g} s per row.", "",
             "| capture stamp -> later frame of a pair [ms] | median | p99 | max |", "|---|---|---|---|"]
    lines += [f"| {name} | {ms(r['median'])} | {ms(r['p99'])} | {ms(r['max'])} |" for name, r in rows.items()]
    for key, name in (("publish_ms", "the feeder's publish() of one frame (glibc rows)"),
                      ("unmatched_publish_ms", "the same publish() to a topic no one reads (glibc rows)")):
        pub = np.asarray(publish.get(key, []), dtype=np.float64) * 1e-3
        if pub.size:
            r = summarize(pub)
            lines.append(f"| {name} | {ms(r['median'])} | {ms(r['p99'])} | {ms(r['max'])} |")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(report)
    return 0


def summarize(values: np.ndarray) -> dict[str, float]:
    return {"median": float(np.median(values)), "p99": float(np.percentile(values, 99)),
            "max": float(values.max())}


def run_benchmark(args: argparse.Namespace) -> int:
    apply_loopback_dds(REPO_ROOT / "test_output" / "benchmark_node_overhead")
    import rclpy
    import torch
    from rclpy.lifecycle import TransitionCallbackReturn
    from rclpy.parameter import Parameter

    from flashrt_ros.node_diagnostics import Summary
    from flashrt_ros.node_executor import make_executor, spin_until_shutdown
    from flashrt_ros.policy_node import PolicyNode

    rclpy.init(args=["--ros-args", "--params-file", str(PARAMS_FILE)])
    floor = measure_transport_floor(args)
    floor_heap_reuse = np.zeros(0)
    if not args.no_heap_reuse:          # one-way for the process: the node's configure would apply it anyway
        keep_large_buffers_on_heap()
        floor_heap_reuse = measure_transport_floor(args)
    node = PolicyNode(parameter_overrides=[
        Parameter("device", value=args.device),
        Parameter("freeze_gc_after_configure", value=not args.no_gc_freeze),
        Parameter("executor", value=args.executor),
        Parameter("yield_to_inference_thread", value=not args.no_yield),
        Parameter("inference_handover_timeout", value=float(args.handover_timeout)),
        Parameter("keep_large_buffers_on_heap", value=not args.no_heap_reuse),
        Parameter("diagnostics_window", value=min(600.0, args.duration + FEEDER_SETTLE_S + 30.0))])
    executor = make_executor(args.executor)          # as policy_node.main() makes it
    executor.add_node(node)
    stop_spinning = threading.Event()
    spinner = threading.Thread(target=spin_until_shutdown, args=(executor, node.context, 0.05, stop_spinning),
                               name="benchmark-executor", daemon=True)
    spinner.start()
    feeder = None
    try:
        if node.trigger_configure() != TransitionCallbackReturn.SUCCESS:
            _LOG.error("configure failed")
            return 1
        policy = node.policy
        state_dim = policy.state_dim
        node.trigger_activate()
        watch = StallWatch()
        watch.start()
        feeder = start_feeder(args, args.duration, state_dim)
        out, _ = feeder.communicate(timeout=args.duration + 120)
        node_stalls = watch.stop()
        result = json.loads(out.strip().splitlines()[-1])
        snapshot = node._statistics.snapshot()
        buffer = node._buffer.counters()
        handover_timeouts = node._worker.handover_timeouts
        device, model_id = str(policy.device), policy.model_id
        node.trigger_deactivate()
        node.trigger_cleanup()
    finally:
        if feeder is not None and feeder.poll() is None:
            feeder.kill()
        stop_spinning.set()                   # the spin loop ends within one turn (0.05 s)
        spinner.join(timeout=5.0)
        executor.shutdown(timeout_sec=5.0)
        node.release()
        node.destroy_node()
        rclpy.try_shutdown()

    if args.raw_output:
        args.raw_output.parent.mkdir(parents=True, exist_ok=True)
        args.raw_output.write_text(json.dumps({
            "columns": ["sequence", "staleness_s", "inference_s", "capture_stamp_ns", "feeder_arrival_ns"],
            "chunks": result["chunks"], "skip": args.skip, "frames": result["frames"],
            "transport_floor_s": floor.tolist(), "transport_floor_heap_reuse_s": floor_heap_reuse.tolist(),
            "device": str(device), "duration_s": args.duration,
            "stalls": {"node": node_stalls, "feeder": result.get("stalls", [])}}))
    # (n, 5): sequence, staleness, inference, capture stamp, arrival at the feeder
    chunks = np.asarray(result["chunks"], dtype=np.float64)[args.skip:]
    if len(chunks) < 3:
        _LOG.error(f"only {len(chunks)} chunks after skipping {args.skip}")
        return 1
    staleness, inference = chunks[:, 1], chunks[:, 2]
    rows = {"staleness": summarize(staleness), "inference time": summarize(inference),
            "overhead = staleness - inference": summarize(staleness - inference)}
    node_rows = {"queue wait (node statistics)": snapshot.queue_wait,
                 "handling = overhead - queue wait (node statistics)": snapshot.handling,
                 "node code: conversion + message build (node statistics)": snapshot.node_code,
                 "input latency: capture -> observation complete in the node (node statistics)":
                     snapshot.input_latency,
                 "in node = overhead - input latency (node statistics)": snapshot.in_node,
                 "full Python garbage collections, pause (node statistics)": snapshot.gc_full_pauses}
    if floor.size:
        node_rows["transport floor: capture -> later frame of a pair, plain subscriber, no node"] = \
            Summary.of(floor)
    if floor_heap_reuse.size:
        node_rows["transport floor, frame buffers kept on the heap (keep_large_buffers_on_heap)"] = \
            Summary.of(floor_heap_reuse)
    report = format_report(args, rows, node_rows, len(chunks), result["frames"], buffer, device, model_id,
                           torch.__version__)
    report += "\n".join([stall_line("Node", node_stalls), stall_line("Feeder", result.get("stalls", []))]) + "\n"
    if args.handover_timeout > 0:
        report += f"- Hand-over waits that ended at their timeout: {handover_timeouts}.\n"
    print(report)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(report)
        print(f"written to {args.output}")
    return 0


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def format_report(args, rows, node_rows, chunk_count, frames, buffer, device, model_id, torch_version) -> str:
    ms = lambda v: f"{v * 1e3:.2f}"  # noqa: E731
    lines = [
        f"# Policy node overhead ({datetime.date.today().isoformat()})",
        "",
        f"Command: `python tools/benchmark_node_overhead.py {' '.join(shlex.quote(a) for a in args.argv)}` "
        f"(duration {args.duration:g} s, device {args.device}, encoding {args.encoding})",
        "",
        f"- Machine: {cpu_name()}, {os.cpu_count()} cores; device `{device}`; torch {torch_version}; "
        f"Python {platform.python_version()}; ROS 2 Kilted wheels, Fast DDS over loopback (shared memory).",
        f"- Model: `{model_id}` (embedded demo checkpoint), config/demo_two_cameras.yaml.",
        f"- Input: 2 cameras {args.width}x{args.height} {args.encoding} at {args.rate:g} Hz from a separate "
        f"process ({FEEDER_MODES[args.feeder_serialized]}), plus joint states; {frames} frames published, "
        f"{chunk_count} chunks measured (first {args.skip} skipped).",
        f"- Node: executor {args.executor}, yield_to_inference_thread {str(not args.no_yield).lower()}, "
        f"inference_handover_timeout {args.handover_timeout:g} s, "
        f"keep_large_buffers_on_heap {str(not args.no_heap_reuse).lower()} ({heap_reuse_state() or 'not applied'}), "
        f"freeze_gc_after_configure {str(not args.no_gc_freeze).lower()}.",
        f"- Observation buffer: {buffer.completed} observations completed, {buffer.replaced} replaced while "
        f"inference was busy, {buffer.stale} stale.",
        "",
        "| per chunk [ms] | median | p99 | max |",
        "|---|---|---|---|",
    ]
    for name, row in rows.items():
        lines.append(f"| {name} | {ms(row['median'])} | {ms(row['p99'])} | {ms(row['max'])} |")
    for name, summary in node_rows.items():
        lines.append(f"| {name} | {ms(summary.median)} | {ms(summary.p99)} | {ms(summary.max)} |")
    lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.feeder:
        return run_feeder(args)
    if args.transport_only:
        return run_transport_only(args)
    return run_benchmark(args)


if __name__ == "__main__":
    raise SystemExit(main())
