"""Explicit QoS for every endpoint of the policy node (one place, so tests and users can see them).

- cameras: sensor data (best effort, volatile, keep last ``CAMERA_DEPTH``): a late frame is useless,
  and a small depth means no backlog builds up in the middleware.
- instruction: two subscriptions on the one topic, both reliable, depth 1: transient local, so a node started
  later still receives the current task from a latched publisher; and volatile, because a transient-local
  subscription does not match a volatile publisher (e.g. ``ros2 topic pub`` without ``--qos-durability
  transient_local``), whose messages would otherwise never arrive. A latched publisher matches both; the node
  handles each message once (flashrt_ros.policy_node deduplicates by publisher and sequence number).
- robot state: sensor data, like the cameras.
- outputs (action chunks, joint trajectory, status): reliable, volatile, keep last ``OUTPUT_DEPTH``.
- diagnostics: reliable, keep last, like diagnostic_updater does.
"""

from __future__ import annotations

from rclpy.qos import (DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy)

CAMERA_DEPTH = 2
STATE_DEPTH = 5
OUTPUT_DEPTH = 10
DIAGNOSTICS_DEPTH = 10


def camera_qos() -> QoSProfile:
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=CAMERA_DEPTH,
                      reliability=ReliabilityPolicy.BEST_EFFORT, durability=DurabilityPolicy.VOLATILE)


def instruction_qos() -> QoSProfile:
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                      reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)


def instruction_volatile_qos() -> QoSProfile:
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1,
                      reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.VOLATILE)


def state_qos() -> QoSProfile:
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=STATE_DEPTH,
                      reliability=ReliabilityPolicy.BEST_EFFORT, durability=DurabilityPolicy.VOLATILE)


def output_qos() -> QoSProfile:
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=OUTPUT_DEPTH,
                      reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.VOLATILE)


def diagnostics_qos() -> QoSProfile:
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=DIAGNOSTICS_DEPTH,
                      reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.VOLATILE)


__all__ = ["camera_qos", "instruction_qos", "instruction_volatile_qos", "state_qos", "output_qos",
           "diagnostics_qos",
           "CAMERA_DEPTH", "STATE_DEPTH", "OUTPUT_DEPTH", "DIAGNOSTICS_DEPTH"]
