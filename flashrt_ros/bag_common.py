"""Shared glue between rosbag2 files (the ``rosbags`` library) and rclpy: message types and QoS.

Used by the bag player, the bag recorder, the demo bag generator and the offline evaluator.

- :func:`bag_typestore`: a rosbags typestore for ROS 2 Kilted plus this package's messages
  (``flashrt_ros/msg/ActionChunk``, ``PolicyStatus``), registered from the ``msg/*.msg`` text.
- :func:`rclpy_message_class`: the generated rclpy class for a type name such as ``sensor_msgs/msg/Image``.
- :func:`qos_from_bag` / :func:`qos_to_bag`: QoS between rosbags' ``Qos`` records and rclpy ``QoSProfile``,
  and :func:`playback_qos`, the rule ``ros2 bag play`` uses to pick a publisher QoS from the recorded offers.

This module does not import rclpy at import time (the demo bag generator and the evaluator run without DDS).
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rosbags.interfaces import Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime
from rosbags.typesys import Stores, get_types_from_msg, get_typestore

if TYPE_CHECKING:
    from rclpy.qos import QoSProfile
    from rosbags.typesys.store import Typestore

LOGGER = logging.getLogger(__name__)

PACKAGE_NAME = "flashrt_ros"
# Source checkout layout: <repo>/flashrt_ros/bag_common.py and <repo>/msg/*.msg.
SOURCE_MSG_DIR = Path(__file__).resolve().parent.parent / "msg"
# Depth a player/recorder endpoint gets when the bag holds no recorded QoS (rosbag2's default).
DEFAULT_QOS_DEPTH = 10
ACTION_CHUNK_TYPE = f"{PACKAGE_NAME}/msg/ActionChunk"
POLICY_STATUS_TYPE = f"{PACKAGE_NAME}/msg/PolicyStatus"


class BagError(ValueError):
    """A bag, topic or type problem, with a message naming it."""


def package_msg_dir() -> Path:
    """Directory holding this package's ``.msg`` files.

    Looked up in order: the source tree beside this module, the ament index (AMENT_PREFIX_PATH), and the
    ``share/`` of the running Python prefix (a venv the package was installed into without sourcing a setup file).
    """
    candidates = [SOURCE_MSG_DIR]
    try:
        from ament_index_python.packages import get_package_share_directory

        candidates.append(Path(get_package_share_directory(PACKAGE_NAME)) / "msg")
    except (ImportError, LookupError, OSError):  # not installed, or AMENT_PREFIX_PATH unset
        pass
    candidates.append(Path(sys.prefix) / "share" / PACKAGE_NAME / "msg")
    for candidate in candidates:
        if any(candidate.glob("*.msg")):
            return candidate
    raise BagError(f"no {PACKAGE_NAME} .msg files found; looked in {[str(c) for c in candidates]}")


@lru_cache(maxsize=1)
def bag_typestore() -> Typestore:
    """ROS 2 Kilted typestore with this package's custom messages registered from their ``.msg`` text."""
    store = get_typestore(Stores.ROS2_KILTED)
    types: dict[str, Any] = {}
    for msg_file in sorted(package_msg_dir().glob("*.msg")):
        types.update(get_types_from_msg(msg_file.read_text(), f"{PACKAGE_NAME}/msg/{msg_file.stem}"))
    store.register(types)
    return store


def rclpy_message_class(msgtype: str) -> type:
    """The rclpy message class for ``pkg/msg/Name``; raises :class:`BagError` naming the type if not importable."""
    parts = msgtype.split("/")
    if len(parts) != 3 or parts[1] != "msg":
        raise BagError(f"message type {msgtype!r} is not of the form 'pkg/msg/Name'")
    package, _, name = parts
    try:
        module = importlib.import_module(f"{package}.msg")
        return getattr(module, name)
    except (ImportError, AttributeError) as exc:
        raise BagError(f"message type {msgtype!r} is not installed for rclpy ({exc})") from exc


# ---------------------------------------------------------------------------------------------- QoS
_RELIABILITY_TO_BAG = {"RELIABLE": QosReliability.RELIABLE, "BEST_EFFORT": QosReliability.BEST_EFFORT}
_DURABILITY_TO_BAG = {"VOLATILE": QosDurability.VOLATILE, "TRANSIENT_LOCAL": QosDurability.TRANSIENT_LOCAL}
_HISTORY_TO_BAG = {"KEEP_LAST": QosHistory.KEEP_LAST, "KEEP_ALL": QosHistory.KEEP_ALL}
_ZERO_TIME = QosTime(sec=0, nsec=0)
# rosbag2 writes this "infinite" duration for deadline/lifespan/lease when they are unset.
_INFINITE_TIME = QosTime(sec=2147483647, nsec=4294967295)


def bag_qos(
    reliable: bool = True, transient_local: bool = False, depth: int = DEFAULT_QOS_DEPTH
) -> Qos:
    """A rosbags ``Qos`` record (what a bag stores as a connection's offered QoS)."""
    return Qos(
        history=QosHistory.KEEP_LAST,
        depth=depth,
        reliability=QosReliability.RELIABLE if reliable else QosReliability.BEST_EFFORT,
        durability=QosDurability.TRANSIENT_LOCAL if transient_local else QosDurability.VOLATILE,
        deadline=_INFINITE_TIME,
        lifespan=_INFINITE_TIME,
        liveliness=QosLiveliness.AUTOMATIC,
        liveliness_lease_duration=_INFINITE_TIME,
        avoid_ros_namespace_conventions=False,
    )


def qos_to_bag(profile: QoSProfile) -> Qos:
    """Convert an rclpy ``QoSProfile`` (e.g. a discovered publisher's) into a rosbags ``Qos`` record."""
    return Qos(
        history=_HISTORY_TO_BAG.get(profile.history.name, QosHistory.UNKNOWN),
        depth=int(profile.depth),
        reliability=_RELIABILITY_TO_BAG.get(profile.reliability.name, QosReliability.UNKNOWN),
        durability=_DURABILITY_TO_BAG.get(profile.durability.name, QosDurability.UNKNOWN),
        deadline=_INFINITE_TIME,
        lifespan=_INFINITE_TIME,
        liveliness=QosLiveliness.AUTOMATIC,
        liveliness_lease_duration=_INFINITE_TIME,
        avoid_ros_namespace_conventions=bool(profile.avoid_ros_namespace_conventions),
    )


def playback_qos(offered: Sequence[Qos]) -> QoSProfile:
    """Publisher QoS for replaying a topic, from the QoS its publishers offered when it was recorded.

    The rule of ``ros2 bag play``: reliable only if every recorded publisher was reliable (a reliable publisher
    also serves best-effort subscribers, so reliable is the compatible choice), transient-local only if every
    one was (a transient-local publisher serves volatile subscribers too), keep-last with the largest recorded
    depth (at least :data:`DEFAULT_QOS_DEPTH`). With no recorded offers: reliable, volatile, keep-last 10.
    """
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

    reliable = all(q.reliability != QosReliability.BEST_EFFORT for q in offered)
    transient_local = bool(offered) and all(q.durability == QosDurability.TRANSIENT_LOCAL for q in offered)
    depth = max([DEFAULT_QOS_DEPTH, *(q.depth for q in offered if q.history == QosHistory.KEEP_LAST)])
    return QoSProfile(
        history=HistoryPolicy.KEEP_LAST,
        depth=depth,
        reliability=ReliabilityPolicy.RELIABLE if reliable else ReliabilityPolicy.BEST_EFFORT,
        durability=DurabilityPolicy.TRANSIENT_LOCAL if transient_local else DurabilityPolicy.VOLATILE,
    )


def recording_qos(offered: Sequence[QoSProfile]) -> QoSProfile:
    """Subscription QoS for recording a topic from the QoS its live publishers offer (``ros2 bag record``'s rule).

    Reliable only if every publisher is reliable (a reliable subscription would not match a best-effort
    publisher), transient-local only if every publisher is (so latched messages are received too).
    """
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

    reliable = all(p.reliability == ReliabilityPolicy.RELIABLE for p in offered)
    transient_local = bool(offered) and all(p.durability == DurabilityPolicy.TRANSIENT_LOCAL for p in offered)
    return QoSProfile(
        history=HistoryPolicy.KEEP_LAST,
        depth=100,
        reliability=ReliabilityPolicy.RELIABLE if reliable else ReliabilityPolicy.BEST_EFFORT,
        durability=DurabilityPolicy.TRANSIENT_LOCAL if transient_local else DurabilityPolicy.VOLATILE,
    )


def parse_remaps(remaps: Sequence[str]) -> dict[str, str]:
    """Parse ``old:=new`` topic remappings (the ``--remap`` syntax of ``ros2 bag play``)."""
    mapping: dict[str, str] = {}
    for item in remaps:
        old, sep, new = item.partition(":=")
        if not sep or not old.strip() or not new.strip():
            raise BagError(f"remapping {item!r} is not of the form 'old_topic:=new_topic'")
        mapping[old.strip()] = new.strip()
    return mapping


def split_ros_args(argv: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """Split a command line at ``--ros-args``: (this tool's arguments, the ROS arguments for rclpy.init)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--ros-args" in argv:
        index = argv.index("--ros-args")
        return argv[:index], argv[index:]
    return argv, []
