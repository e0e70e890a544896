"""The README's main job: the policy node on the embedded default, fed by a generated stream, in one process.

    python -m flashrt_ros.demo_main [--duration 5] [--device auto] [--params config/demo_two_cameras.yaml]

1. Confines DDS to loopback (flashrt_ros.loopback_dds) BEFORE rclpy starts.
2. Starts the policy node (its parameters from the params file, as ``ros2 launch`` would pass them) and a
   feeder node publishing two generated 640x480 rgb8 camera streams at 30 Hz, an instruction (latched) and
   joint states.
3. Drives the node's lifecycle over its services like ``ros2 lifecycle set``: configure -> activate, and at the
   end deactivate -> cleanup -> shutdown.
4. Prints every chunk received (sequence, observation stamp, shape, first action row, staleness) and a
   staleness / inference-time summary.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from flashrt_ros.loopback_dds import apply_loopback_dds

REPO_ROOT = Path(__file__).resolve().parents[1]
PARAMS_FILE_NAME = "demo_two_cameras.yaml"
DEMO_INSTRUCTION = "pick up the red cube and place it in the bowl"
SERVICE_TIMEOUT_S = 120.0        # configure loads (and on first use generates) the demo checkpoint
FIRST_ANSWER_RETRY_S = 2.0       # get_state is asked again this often until the node first answers
PRINTED_ACTIONS = 6               # values of the first action row printed per chunk

_LOG = logging.getLogger("flashrt_demo")


@dataclasses.dataclass(frozen=True)
class StreamSpec:
    camera_topics: tuple[str, ...]
    width: int = 640
    height: int = 480
    rate_hz: float = 30.0
    instruction_topic: str = "instruction"
    instruction: str = DEMO_INSTRUCTION
    state_topic: str = ""
    state_names: tuple[str, ...] = ()
    pattern_frames: int = 30          # distinct generated frames per camera, cycled


def generated_frames(spec: StreamSpec, camera: int) -> list[np.ndarray]:
    """``pattern_frames`` HxWx3 uint8 RGB frames: a colour gradient scrolling sideways with a bright square."""
    ys, xs = np.mgrid[0:spec.height, 0:spec.width]                    # (H, W)
    base = np.empty((spec.height, spec.width, 3), np.uint8)
    base[..., 0] = (127 + 120 * np.sin(xs / 40.0)).astype(np.uint8)
    base[..., 1] = (127 + 120 * np.cos(ys / 30.0 + camera)).astype(np.uint8)
    base[..., 2] = 64 * camera
    frames = []
    for k in range(spec.pattern_frames):
        shift = k * spec.width // spec.pattern_frames
        frame = np.roll(base, shift, axis=1)                           # (H, W, 3) copy
        frame[spec.height // 2 - 40:spec.height // 2 + 40, shift // 2:shift // 2 + 80] = 255
        frames.append(frame)
    return frames


def make_feeder_node(spec: StreamSpec, context=None):
    """A node publishing the generated camera streams (one stamp per tick, shared by all cameras)."""
    from rclpy.node import Node
    from sensor_msgs.msg import Image, JointState
    from std_msgs.msg import String

    from flashrt_ros import qos_profiles
    from flashrt_ros.image_conversion import rgb_to_image_fields

    class StreamFeeder(Node):
        def __init__(self):
            super().__init__("demo_stream_feeder", context=context)
            self.frames_published = 0
            self._images = [[Image(**rgb_to_image_fields(f)) for f in generated_frames(spec, camera)]
                            for camera in range(len(spec.camera_topics))]
            self._camera_publishers = [self.create_publisher(Image, topic, qos_profiles.camera_qos())
                                       for topic in spec.camera_topics]
            self._instruction_publisher = self.create_publisher(String, spec.instruction_topic,
                                                                qos_profiles.instruction_qos())
            self._instruction_publisher.publish(String(data=spec.instruction))
            self._state_publisher = (self.create_publisher(JointState, spec.state_topic, qos_profiles.state_qos())
                                     if spec.state_topic else None)
            self._tick = 0
            self.create_timer(1.0 / spec.rate_hz, self._publish)

        def _publish(self):
            stamp = self.get_clock().now().to_msg()
            for publisher, images in zip(self._camera_publishers, self._images):
                image = images[self._tick % spec.pattern_frames]
                image.header.stamp = stamp
                image.header.frame_id = "camera"
                publisher.publish(image)
            if self._state_publisher is not None:
                t = self._tick / spec.rate_hz
                state = JointState(name=list(spec.state_names),
                                   position=[0.1 * np.sin(t + i) for i in range(len(spec.state_names))])
                state.header.stamp = stamp
                self._state_publisher.publish(state)
            self._tick += 1
            self.frames_published += len(self._camera_publishers)

    return StreamFeeder()


class LifecycleClient:
    """Drives a lifecycle node over its services (what ``ros2 lifecycle set`` does)."""

    def __init__(self, node, target: str):
        from lifecycle_msgs.srv import ChangeState, GetState
        self._node = node
        self._change = node.create_client(ChangeState, f"{target}/change_state")
        self._get = node.create_client(GetState, f"{target}/get_state")

    def wait_for_services(self, timeout_s: float = 30.0) -> bool:
        """True once both services are discovered and the node has answered a get_state, within timeout_s.

        Discovery is not enough: a server that has not yet matched this client's response reader drops its
        reply ("failed to send response (timeout): client will not receive response", rmw_fastrtps waits only
        100 ms), so a first request sent right after discovery can stay unanswered forever (seen on a loaded
        2-core machine). get_state is idempotent, so it is asked again until an answer arrives; by then the node
        has matched this client's endpoints, change_state's included (announced before get_state's), and
        change(), which must not be repeated, is safe."""
        from lifecycle_msgs.srv import GetState
        deadline = time.monotonic() + timeout_s
        if not (self._change.wait_for_service(timeout_s)
                and self._get.wait_for_service(max(deadline - time.monotonic(), 0.0))):
            return False
        answered = threading.Event()
        while (remaining := deadline - time.monotonic()) > 0:
            self._get.call_async(GetState.Request()).add_done_callback(lambda _: answered.set())
            if answered.wait(min(FIRST_ANSWER_RETRY_S, remaining)):
                return True
        return answered.is_set()

    def change(self, label: str, timeout_s: float = SERVICE_TIMEOUT_S) -> bool:
        """Request transition ``label`` (configure, activate, deactivate, cleanup, shutdown); True on success."""
        from lifecycle_msgs.msg import Transition
        from lifecycle_msgs.srv import ChangeState
        ids = {"configure": Transition.TRANSITION_CONFIGURE, "activate": Transition.TRANSITION_ACTIVATE,
               "deactivate": Transition.TRANSITION_DEACTIVATE, "cleanup": Transition.TRANSITION_CLEANUP}
        request = ChangeState.Request()
        if label == "shutdown":
            request.transition.label = "shutdown"      # the shutdown id depends on the current state
        else:
            request.transition.id = ids[label]
        response = self._wait(self._change.call_async(request), timeout_s)
        return bool(response.success)

    def state(self, timeout_s: float = 10.0) -> str:
        from lifecycle_msgs.srv import GetState
        return self._wait(self._get.call_async(GetState.Request()), timeout_s).current_state.label

    @staticmethod
    def _wait(future, timeout_s: float):
        done = threading.Event()
        future.add_done_callback(lambda _: done.set())
        if not done.wait(timeout_s):
            raise TimeoutError(f"lifecycle service gave no answer within {timeout_s} s")
        return future.result()


class ChunkPrinter:
    """Subscribes to the chunks, prints each one, keeps figures for the summary."""

    def __init__(self, node, topic: str, quiet: bool = False):
        from flashrt_ros import qos_profiles
        from flashrt_ros.msg import ActionChunk
        self.staleness: list[float] = []
        self.inference_time: list[float] = []
        self.sequences: list[int] = []
        self._quiet = quiet
        node.create_subscription(ActionChunk, topic, self._on_chunk, qos_profiles.output_qos())

    def _on_chunk(self, msg) -> None:
        self.staleness.append(msg.staleness)
        self.inference_time.append(msg.inference_time)
        self.sequences.append(msg.sequence)
        if self._quiet:
            return
        first = np.asarray(msg.actions[:min(msg.action_dim, PRINTED_ACTIONS)], dtype=np.float32)
        more = " ..." if msg.action_dim > PRINTED_ACTIONS else ""
        print(f"chunk {msg.sequence:4d}  stamp {msg.header.stamp.sec}.{msg.header.stamp.nanosec:09d}  "
              f"shape ({msg.horizon}, {msg.action_dim})  first row {np.array2string(first, precision=3)}{more}  "
              f"inference {msg.inference_time * 1e3:7.1f} ms  staleness {msg.staleness * 1e3:7.1f} ms", flush=True)

    def summary(self) -> str:
        if not self.staleness:
            return "no chunks received"
        staleness, inference = np.asarray(self.staleness), np.asarray(self.inference_time)
        overhead = staleness - inference
        ms = lambda values, q: np.percentile(values, q) * 1e3  # noqa: E731
        return (f"{len(staleness)} chunks (sequence {self.sequences[0]}..{self.sequences[-1]})\n"
                f"  staleness  median {ms(staleness, 50):7.1f} ms  p99 {ms(staleness, 99):7.1f} ms  "
                f"max {staleness.max() * 1e3:7.1f} ms\n"
                f"  inference  median {ms(inference, 50):7.1f} ms  p99 {ms(inference, 99):7.1f} ms\n"
                f"  overhead (staleness - inference)  median {ms(overhead, 50):6.2f} ms  "
                f"p99 {ms(overhead, 99):6.2f} ms")


def default_params_file() -> Path:
    """config/demo_two_cameras.yaml of the source checkout, else of the installed package: share/flashrt_ros of
    the ROS install (ament index), else of the Python prefix (`pip install .` puts it there)."""
    in_checkout = REPO_ROOT / "config" / PARAMS_FILE_NAME
    if in_checkout.is_file():
        return in_checkout
    try:
        from ament_index_python.packages import get_package_share_directory
        return Path(get_package_share_directory("flashrt_ros")) / "config" / PARAMS_FILE_NAME
    except (ImportError, LookupError):
        return Path(sys.prefix) / "share" / "flashrt_ros" / "config" / PARAMS_FILE_NAME


def default_workdir() -> Path:
    """test_output/demo in a source checkout (git-ignored), else a folder in the system temp directory."""
    if (REPO_ROOT / "config").is_dir():
        return REPO_ROOT / "test_output" / "demo"
    return Path(tempfile.gettempdir()) / "flashrt_demo"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of streaming after activation")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--checkpoint", default="", help="checkpoint directory; empty = embedded demo checkpoint")
    parser.add_argument("--params", type=Path, default=default_params_file(), help="node parameter file (YAML)")
    parser.add_argument("--rate", type=float, default=30.0, help="camera rate [Hz]")
    parser.add_argument("--quiet", action="store_true", help="print only the summary")
    parser.add_argument("--workdir", type=Path, default=default_workdir(),
                        help="where DDS profile and ROS logs go")
    args = parser.parse_args(argv)
    if args.duration <= 0:
        parser.error(f"--duration must be > 0, got {args.duration}")
    if args.rate <= 0:
        parser.error(f"--rate must be > 0, got {args.rate}")
    if not args.params.is_file():
        parser.error(f"--params: no such file {args.params}; pass --params PATH to a node parameter file "
                     f"(the source's config/{PARAMS_FILE_NAME} is the demo's)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    apply_loopback_dds(args.workdir)        # before rclpy is imported or initialised
    import rclpy
    from rclpy.parameter import Parameter

    from flashrt_ros.node_executor import make_executor
    from flashrt_ros.policy_node import PolicyNode

    context = rclpy.Context()
    rclpy.init(args=["--ros-args", "--params-file", str(args.params)], context=context,
               signal_handler_options=rclpy.signals.SignalHandlerOptions.NO)
    nodes, executor, spinner = [], None, None
    try:
        policy_node = PolicyNode(context=context, parameter_overrides=[
            Parameter("device", value=args.device), Parameter("checkpoint", value=args.checkpoint)])
        nodes.append(policy_node)
        executor = make_executor(policy_node.get_parameter("executor").value, context=context)
        spinner = threading.Thread(target=executor.spin, daemon=True)
        settings = {name: policy_node.get_parameter(name).value
                    for name in ("camera_topics", "instruction_topic", "state_topic", "output_topic")}
        driver = rclpy.create_node("demo_driver", context=context)
        nodes.append(driver)
        printer = ChunkPrinter(driver, settings["output_topic"], quiet=args.quiet)
        lifecycle = LifecycleClient(driver, f"/{policy_node.get_name()}")
        for node in nodes:
            executor.add_node(node)
        spinner.start()
        if not lifecycle.wait_for_services():
            _LOG.error("lifecycle services of the policy node did not appear")
            return 1
        _LOG.info("configuring the policy node (loads the demo checkpoint, warms up)")
        if not lifecycle.change("configure"):
            _LOG.error("configure failed (see the node's log above)")
            return 1
        state_dim = policy_node.policy.state_dim if settings["state_topic"] else 0
        spec = StreamSpec(camera_topics=tuple(settings["camera_topics"]), rate_hz=args.rate,
                          instruction_topic=settings["instruction_topic"], state_topic=settings["state_topic"],
                          state_names=tuple(f"joint_{i}" for i in range(state_dim)))
        feeder = make_feeder_node(spec, context=context)
        nodes.append(feeder)
        executor.add_node(feeder)
        if not lifecycle.change("activate"):
            _LOG.error("activate failed")
            return 1
        _LOG.info(f"streaming {len(spec.camera_topics)} cameras {spec.width}x{spec.height} at {spec.rate_hz} Hz "
                  f"for {args.duration} s")
        time.sleep(args.duration)
        for label in ("deactivate", "cleanup", "shutdown"):
            if not lifecycle.change(label):
                _LOG.error(f"{label} failed")
                return 1
        print(f"frames published: {feeder.frames_published}; node state: {policy_node.lifecycle_state()}")
        print(printer.summary(), flush=True)
        return 0 if printer.staleness else 1
    except KeyboardInterrupt:
        return 130
    finally:
        if executor is not None:
            executor.shutdown(timeout_sec=5.0)
        if spinner is not None and spinner.is_alive():
            spinner.join(timeout=5.0)         # spin() returns after shutdown; then the context can go
        for node in nodes:
            if isinstance(node, PolicyNode):
                node.release()
            node.destroy_node()
        rclpy.try_shutdown(context=context)


if __name__ == "__main__":
    raise SystemExit(main())
