"""Record live topics (by default the policy node's ActionChunk and PolicyStatus) into a rosbag2.

The semantics of ``ros2 bag record TOPIC...`` for machines without the ros2 CLI, through ``rosbags``' writer:

- topic types are discovered from the graph (topics that appear later are picked up while recording);
- messages are stored as received, serialized CDR (``raw=True`` subscriptions): nothing is re-encoded;
- the receive timestamp is the recorder's node clock, so with ``--use-sim-time`` (a bag replayed with /clock)
  the recorded chunks line up with the replayed bag's time;
- the subscription QoS adapts to the publishers' offers (:func:`flashrt_ros.bag_common.recording_qos`) and the
  offers are stored in the bag's metadata, as rosbag2 does;
- custom types (flashrt_ros/msg/ActionChunk, PolicyStatus) are registered from the package's .msg text, so the
  bag carries full message definitions and any rosbag2 reader (``ros2 bag``, rosbags, Foxglove) can decode it.

Stops on SIGINT or after ``--duration`` seconds.

    python -m flashrt_ros.bag_recorder OUT_BAG [--topics /action_chunk /policy_node/status /diagnostics] \\
        [--storage mcap] [--use-sim-time] [--duration S]
"""

from __future__ import annotations

import argparse
import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rosbags.rosbag2 import StoragePlugin, Writer

from flashrt_ros.bag_common import (BagError, bag_typestore, qos_to_bag, rclpy_message_class, recording_qos,
                                    split_ros_args)

LOGGER = logging.getLogger(__name__)

# The policy node's outputs under its default name and parameters (output_topic, ~/status).
DEFAULT_TOPICS = ("/action_chunk", "/policy_node/status")
DISCOVERY_PERIOD_S = 0.1
SPIN_PERIOD_S = 0.1
STORAGE_PLUGINS = {"sqlite3": StoragePlugin.SQLITE3, "mcap": StoragePlugin.MCAP}


@dataclass(frozen=True)
class RecorderConfig:
    """What and where to record."""

    out: Path
    topics: tuple[str, ...] = DEFAULT_TOPICS
    storage: str = "sqlite3"

    def __post_init__(self) -> None:
        if not self.topics:
            raise ValueError("at least one topic to record is needed")
        if any(not t.startswith("/") for t in self.topics):
            raise ValueError(f"topics must be absolute names (start with '/'), got {list(self.topics)}")
        if self.storage not in STORAGE_PLUGINS:
            raise ValueError(f"storage must be one of {sorted(STORAGE_PLUGINS)}, got {self.storage!r}")
        if Path(self.out).exists():
            raise BagError(f"{self.out} exists already; a recording goes into a new directory")


class BagRecorder:
    """Records ``config.topics`` seen by ``node`` into a new bag; spin the node's executor while recording.

    Callbacks only queue the received bytes; one writer thread owns the bag (SQLite connections are bound to
    the thread that opened them, and disk writes never stall the executor). Call :meth:`close` (or use as a
    context manager) to finish the bag: only a closed bag has its metadata.
    """

    def __init__(self, node, config: RecorderConfig) -> None:
        self._node = node
        self._config = config
        self._store = bag_typestore()
        self._queue: queue.Queue = queue.Queue()
        self._subscriptions: dict[str, object] = {}
        self._writer_error: BaseException | None = None
        self._closed = False
        self.recorded: Counter = Counter()
        self._writer_thread = threading.Thread(target=self._write_loop, name="bag-recorder-writer", daemon=True)
        self._writer_thread.start()
        self._discover()
        self._timer = node.create_timer(DISCOVERY_PERIOD_S, self._discover)

    @property
    def subscribed_topics(self) -> tuple[str, ...]:
        return tuple(self._subscriptions)

    def _discover(self) -> None:
        """Subscribe to every requested topic that now has a publisher with a known type."""
        wanted = [t for t in self._config.topics if t not in self._subscriptions]
        if not wanted or self._closed:
            return
        types = dict(self._node.get_topic_names_and_types())
        for topic in wanted:
            msgtypes = types.get(topic)
            if not msgtypes:
                continue
            if len(msgtypes) > 1:
                LOGGER.error("not recording %s: it has several types %s", topic, msgtypes)
                continue
            self._subscribe(topic, msgtypes[0])

    def _subscribe(self, topic: str, msgtype: str) -> None:
        msg_cls = rclpy_message_class(msgtype)
        if msgtype not in self._store.fielddefs:
            raise BagError(f"cannot record {topic}: type {msgtype} is unknown to the bag typestore")
        offers = [info.qos_profile for info in self._node.get_publishers_info_by_topic(topic)]
        # The connection is queued before the subscription exists, so it reaches the writer before any message.
        self._queue.put(("connection", topic, msgtype, [qos_to_bag(q) for q in offers]))
        self._subscriptions[topic] = self._node.create_subscription(
            msg_cls, topic, lambda data, topic=topic: self._on_message(topic, data), recording_qos(offers), raw=True)
        LOGGER.info("recording %s (%s)", topic, msgtype)

    def _on_message(self, topic: str, data: bytes) -> None:
        self._queue.put(("message", topic, self._node.get_clock().now().nanoseconds, data))

    def _write_loop(self) -> None:
        """Writer thread: owns the bag from open to close."""
        connections: dict[str, object] = {}
        try:
            with Writer(self._config.out, version=Writer.VERSION_LATEST,
                        storage_plugin=STORAGE_PLUGINS[self._config.storage]) as writer:
                while (item := self._queue.get()) is not None:
                    if item[0] == "connection":
                        _, topic, msgtype, offers = item
                        connections[topic] = writer.add_connection(topic, msgtype, typestore=self._store,
                                                                   offered_qos_profiles=offers)
                    else:
                        _, topic, stamp_ns, data = item
                        writer.write(connections[topic], stamp_ns, data)
                        self.recorded[topic] += 1
        except BaseException as exc:  # noqa: BLE001  (reported by close())
            self._writer_error = exc
            LOGGER.error("recording into %s failed: %s", self._config.out, exc)

    def close(self) -> None:
        """Stop recording and finish the bag (writes metadata.yaml). Safe to call twice.

        Raises the writer's error, if writing failed.
        """
        if self._closed:
            return
        self._closed = True
        self._node.destroy_timer(self._timer)
        for subscription in self._subscriptions.values():
            self._node.destroy_subscription(subscription)
        self._queue.put(None)
        self._writer_thread.join()
        if self._writer_error is not None:
            raise BagError(f"recording into {self._config.out} failed: {self._writer_error}") from self._writer_error
        LOGGER.info("closed %s: %s", self._config.out, dict(self.recorded))
        missing = [t for t in self._config.topics if t not in self._subscriptions]
        if missing:
            LOGGER.warning("never saw a publisher on %s", missing)

    def __enter__(self) -> BagRecorder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point: ``python -m flashrt_ros.bag_recorder OUT --topics ...``."""
    parser = argparse.ArgumentParser(prog="python -m flashrt_ros.bag_recorder", description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="bag directory to create (must not exist)")
    parser.add_argument("--topics", nargs="+", default=list(DEFAULT_TOPICS), help="absolute topic names")
    parser.add_argument("--storage", choices=sorted(STORAGE_PLUGINS), default="sqlite3")
    parser.add_argument("--duration", type=float, default=0.0, help="stop after this many wall seconds (0: SIGINT)")
    parser.add_argument("--use-sim-time", action="store_true", help="timestamp messages with /clock time")
    parser.add_argument("--log-level", default="INFO")
    own, ros_args = split_ros_args(argv)
    args = parser.parse_args(own)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if args.duration < 0:
        parser.error(f"--duration must be >= 0, got {args.duration}")
    config = RecorderConfig(out=args.out, topics=tuple(args.topics), storage=args.storage)

    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.parameter import Parameter

    from flashrt_ros.node_executor import spin_until_shutdown

    with rclpy.init(args=["flashrt_bag_recorder", *ros_args]):
        node = rclpy.create_node("flashrt_bag_recorder", parameter_overrides=[
            Parameter("use_sim_time", Parameter.Type.BOOL, args.use_sim_time)])
        recorder = BagRecorder(node, config)
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        deadline = time.monotonic() + args.duration if args.duration > 0 else None
        try:
            spin_until_shutdown(executor, node.context, SPIN_PERIOD_S, until=deadline)
        except KeyboardInterrupt:
            pass
        finally:
            recorder.close()
            node.destroy_node()
    print(f"recorded {dict(recorder.recorded)} into {config.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
