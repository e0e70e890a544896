"""Replay a rosbag2 (sqlite3 or MCAP) into live topics with its recorded timing, and publish /clock from it.

The semantics of ``ros2 bag play --clock`` for machines without the ros2 CLI:

- messages are published when the playback clock reaches their recorded receive time; the playback clock
  runs at ``rate`` x wall time from ``bag start + start_offset``;
- ``/clock`` (rosgraph_msgs/Clock) carries the playback clock at ``clock_hz`` (wall), so nodes with
  ``use_sim_time:=true`` run on the bag's time; with ``loop`` the clock jumps back to the start each pass;
- the recorded CDR bytes are published as they are (``Publisher.publish(bytes)``): no deserialization, exact
  payloads, custom types included (the rclpy class is only needed to create the publisher);
- per-topic QoS follows the recorded offers (:func:`flashrt_ros.bag_common.playback_qos`): reliable unless some
  recorded publisher was best-effort (a reliable publisher also serves best-effort subscribers such as camera
  subscriptions with sensor-data QoS), transient-local when every recorded publisher was (latched topics);
- ``--remap old:=new`` renames topics; ``--topics`` plays a subset; ``--wait-for TOPIC`` holds playback until
  that topic (or /clock) has a subscriber (so a just-started node misses nothing).

    python -m flashrt_ros.bag_player BAG [--rate 0.5] [--loop] [--start-offset 1.0] [--remap /a:=/b] [--clock-hz 100]
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rosbags.rosbag2 import Reader

from flashrt_ros.bag_common import BagError, parse_remaps, playback_qos, rclpy_message_class, split_ros_args

LOGGER = logging.getLogger(__name__)

CLOCK_TOPIC = "/clock"
DEFAULT_CLOCK_HZ = 40.0  # ros2 bag play --clock's default
CLOCK_DEPTH = 10
SUBSCRIBER_POLL_S = 0.02


@dataclass(frozen=True)
class PlayerConfig:
    """How to replay a bag."""

    bag: Path
    rate: float = 1.0
    loop: bool = False
    start_offset_s: float = 0.0
    remaps: dict[str, str] = field(default_factory=dict)
    topics: tuple[str, ...] = ()  # recorded topic names to play; empty = all
    clock_hz: float = DEFAULT_CLOCK_HZ  # 0 = do not publish /clock
    wait_for: tuple[str, ...] = ()  # output topics (or /clock) that must have a subscriber before playback starts
    wait_timeout_s: float = 30.0
    delay_s: float = 0.0  # wall seconds to sleep after publishers are created, before playback
    ack_timeout_s: float = 5.0  # after the last message: wait up to this long for reliable subscribers' acks (0: no)

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError(f"rate must be > 0, got {self.rate}")
        if self.start_offset_s < 0:
            raise ValueError(f"start_offset_s must be >= 0, got {self.start_offset_s}")
        if self.clock_hz < 0:
            raise ValueError(f"clock_hz must be >= 0 (0 disables /clock), got {self.clock_hz}")
        if self.delay_s < 0 or self.wait_timeout_s <= 0:
            raise ValueError(f"delay_s must be >= 0 and wait_timeout_s > 0, got {self.delay_s}, {self.wait_timeout_s}")
        if self.ack_timeout_s < 0:
            raise ValueError(f"ack_timeout_s must be >= 0 (0: do not wait), got {self.ack_timeout_s}")
        if not Path(self.bag).exists():
            raise BagError(f"bag {self.bag} does not exist")


@dataclass
class PlaybackStats:
    """What a playback did."""

    published: Counter = field(default_factory=Counter)  # output topic -> messages
    clock_messages: int = 0
    passes: int = 0
    max_lateness_s: float = 0.0  # worst wall delay of a publish behind its scheduled time
    wall_duration_s: float = 0.0
    skipped_topics: dict[str, str] = field(default_factory=dict)  # recorded topic -> reason
    unacknowledged: list[str] = field(default_factory=list)  # reliable topics not fully acked within ack_timeout_s


class BagPlayer:
    """Replays one bag through publishers of ``node``; :meth:`play` blocks until done or stopped."""

    def __init__(self, node, config: PlayerConfig) -> None:
        self._node = node
        self._config = config
        self._stop = threading.Event()
        self._clock_pub = None
        self._clock_cls = None

    def stop(self) -> None:
        """Ask a running :meth:`play` to return after the current message."""
        self._stop.set()

    def play(self) -> PlaybackStats:
        """Replay the bag (once, or until stopped with ``loop``); returns the statistics."""
        cfg = self._config
        stats = PlaybackStats()
        with Reader(cfg.bag) as reader:
            publishers = self._create_publishers(reader, stats)
            if not publishers:
                raise BagError(f"nothing to play in {cfg.bag}: no topic selected has an installed message type")
            start_ns = reader.start_time + int(round(cfg.start_offset_s * 1e9))
            if start_ns > reader.end_time:
                raise BagError(f"start offset {cfg.start_offset_s} s is past the end of the bag "
                               f"({reader.duration / 1e9:.3f} s)")
            if cfg.clock_hz > 0 and self._clock_pub is None:
                from rclpy.qos import QoSProfile, ReliabilityPolicy
                from rosgraph_msgs.msg import Clock

                self._clock_cls = Clock
                # Reliable (serves best-effort and reliable time sources), a small history so that a tick is not
                # overwritten before a slow subscriber acknowledged it.
                self._clock_pub = self._node.create_publisher(
                    Clock, CLOCK_TOPIC, QoSProfile(depth=CLOCK_DEPTH, reliability=ReliabilityPolicy.RELIABLE))
            waitable = {p.topic_name: p for p in publishers.values()}
            if self._clock_pub is not None:
                waitable[CLOCK_TOPIC] = self._clock_pub
            self._wait_for_subscribers(waitable)
            if cfg.delay_s:
                self._stop.wait(cfg.delay_s)
            connections = [c for c in reader.connections if c.id in publishers]
            wall_start = time.perf_counter()
            while not self._stop.is_set():
                self._play_once(reader, connections, publishers, start_ns, stats)
                stats.passes += 1
                if not cfg.loop:
                    break
            stats.wall_duration_s = time.perf_counter() - wall_start
            self._wait_for_acknowledgements(waitable, stats)
        LOGGER.info("played %s: %d pass(es), %s, %d clock messages, max lateness %.1f ms", cfg.bag, stats.passes,
                    dict(stats.published), stats.clock_messages, stats.max_lateness_s * 1e3)
        return stats

    # ------------------------------------------------------------------------------------------ internals
    def _create_publishers(self, reader: Reader, stats: PlaybackStats) -> dict[int, object]:
        """One publisher per output topic; returns connection id -> publisher."""
        cfg = self._config
        known = {c.topic for c in reader.connections}
        missing = [t for t in cfg.topics if t not in known]
        if missing:
            raise BagError(f"topics {missing} are not in {cfg.bag} (it has {sorted(known)})")
        unused = [t for t in cfg.remaps if t not in known]
        if unused:
            LOGGER.warning("remappings for topics not in the bag are ignored: %s", unused)
        by_topic: dict[str, object] = {}
        by_connection: dict[int, object] = {}
        for conn in reader.connections:
            if cfg.topics and conn.topic not in cfg.topics:
                continue
            try:
                msg_cls = rclpy_message_class(conn.msgtype)
            except BagError as exc:
                stats.skipped_topics[conn.topic] = str(exc)
                LOGGER.warning("not playing %s: %s", conn.topic, exc)
                continue
            out_topic = cfg.remaps.get(conn.topic, conn.topic)
            if out_topic not in by_topic:
                offers = [c.ext.offered_qos_profiles for c in reader.connections if c.topic == conn.topic]
                qos = playback_qos([q for qs in offers for q in qs])
                by_topic[out_topic] = self._node.create_publisher(msg_cls, out_topic, qos)
                LOGGER.debug("publishing %s as %s (%s, %s)", conn.topic, out_topic, conn.msgtype, qos)
            by_connection[conn.id] = by_topic[out_topic]
        return by_connection

    def _wait_for_subscribers(self, publishers: dict[str, object]) -> None:
        cfg = self._config
        unknown = [t for t in cfg.wait_for if t not in publishers]
        if unknown:
            raise BagError(f"--wait-for topics {unknown} are not played (played: {sorted(publishers)})")
        deadline = time.monotonic() + cfg.wait_timeout_s
        for topic in cfg.wait_for:
            while publishers[topic].get_subscription_count() == 0:
                if self._stop.is_set():
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no subscriber on {topic} after {cfg.wait_timeout_s} s")
                time.sleep(SUBSCRIBER_POLL_S)

    def _wait_for_acknowledgements(self, publishers: dict[str, object], stats: PlaybackStats) -> None:
        """Hold until every reliable subscriber acknowledged every message (ack_timeout_s at most per topic): a
        player that exits right after its last publish would otherwise take the tail with it (a reliable writer
        destroyed before the acks arrive drops what is unacknowledged). Best-effort topics return at once."""
        if self._config.ack_timeout_s <= 0 or self._stop.is_set():
            return
        from rclpy.duration import Duration
        timeout = Duration(nanoseconds=int(self._config.ack_timeout_s * 1e9))
        for topic, publisher in publishers.items():
            if not publisher.wait_for_all_acked(timeout):
                stats.unacknowledged.append(topic)
        if stats.unacknowledged:
            LOGGER.warning("not every message was acknowledged within %.1f s on %s", self._config.ack_timeout_s,
                           stats.unacknowledged)

    def _publish_clock(self, bag_ns: int, stats: PlaybackStats) -> None:
        msg = self._clock_cls()
        msg.clock.sec, msg.clock.nanosec = divmod(int(bag_ns), 10**9)
        self._clock_pub.publish(msg)
        stats.clock_messages += 1

    def _play_once(self, reader: Reader, connections, publishers, start_ns: int, stats: PlaybackStats) -> None:
        """One pass over the bag from ``start_ns``: wall time maps to bag time as start + (wall - wall0) * rate."""
        rate = self._config.rate
        clock_period = 1.0 / self._config.clock_hz if self._clock_pub else None
        wall0 = time.perf_counter()
        next_clock = wall0
        if self._clock_pub:
            self._publish_clock(start_ns, stats)
            next_clock += clock_period

        def bag_now() -> int:
            return start_ns + int((time.perf_counter() - wall0) * rate * 1e9)

        for conn, timestamp, raw in reader.messages(connections=connections, start=start_ns):
            target = wall0 + (timestamp - start_ns) / 1e9 / rate
            while not self._stop.is_set():
                now = time.perf_counter()
                if clock_period is not None and next_clock <= now:
                    self._publish_clock(bag_now(), stats)
                    next_clock = max(next_clock + clock_period, now)
                    continue
                if now >= target:
                    break
                wake = target if clock_period is None else min(target, next_clock)
                time.sleep(max(wake - now, 0.0))
            if self._stop.is_set():
                return
            publisher = publishers[conn.id]
            publisher.publish(bytes(raw))
            stats.published[publisher.topic_name] += 1
            stats.max_lateness_s = max(stats.max_lateness_s, time.perf_counter() - target)


def _parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m flashrt_ros.bag_player", description=__doc__.split("\n")[0])
    parser.add_argument("bag", type=Path, help="rosbag2 directory (sqlite3 or MCAP)")
    parser.add_argument("-r", "--rate", type=float, default=1.0, help="playback speed factor (0.5 = half speed)")
    parser.add_argument("-l", "--loop", action="store_true", help="replay until interrupted")
    parser.add_argument("--start-offset", type=float, default=0.0, help="start this many seconds into the bag")
    parser.add_argument("--remap", "-m", action="append", default=[], metavar="OLD:=NEW", help="rename a topic")
    parser.add_argument("--topics", nargs="+", default=[], help="play only these recorded topics")
    parser.add_argument("--clock-hz", type=float, default=DEFAULT_CLOCK_HZ,
                        help="publish /clock at this wall rate from the bag's time (0: no /clock)")
    parser.add_argument("--wait-for", action="append", default=[], metavar="TOPIC",
                        help="hold playback until this (output) topic, or /clock, has a subscriber")
    parser.add_argument("--wait-timeout", type=float, default=30.0)
    parser.add_argument("-d", "--delay", type=float, default=0.0, help="wall seconds to wait before playing")
    parser.add_argument("--ack-timeout", type=float, default=5.0,
                        help="after the last message, wait up to this many seconds for reliable subscribers to "
                             "acknowledge everything (0: exit at once)")
    parser.add_argument("--log-level", default="INFO")
    own, ros_args = split_ros_args(argv)
    return parser.parse_args(own), ros_args


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point: ``flashrt_bag_player`` / ``python -m flashrt_ros.bag_player``."""
    args, ros_args = _parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    config = PlayerConfig(bag=args.bag, rate=args.rate, loop=args.loop, start_offset_s=args.start_offset,
                          remaps=parse_remaps(args.remap), topics=tuple(args.topics), clock_hz=args.clock_hz,
                          wait_for=tuple(args.wait_for), wait_timeout_s=args.wait_timeout, delay_s=args.delay,
                          ack_timeout_s=args.ack_timeout)
    import rclpy
    from rclpy.executors import ExternalShutdownException

    with rclpy.init(args=["flashrt_bag_player", *ros_args]):
        node = rclpy.create_node("flashrt_bag_player")
        player = BagPlayer(node, config)
        try:
            stats = player.play()
        except (KeyboardInterrupt, ExternalShutdownException):
            player.stop()
            return 130
        finally:
            node.destroy_node()
    print(f"published {sum(stats.published.values())} messages in {stats.passes} pass(es) over "
          f"{stats.wall_duration_s:.2f} s: {dict(stats.published)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
