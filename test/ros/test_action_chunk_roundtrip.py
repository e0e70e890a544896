"""ActionChunk crosses process boundaries over real DDS (loopback) with every field intact."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from ros_processes import start_python

pytestmark = pytest.mark.ros

RECEIVE_TIMEOUT_S = 30.0

EXPECTED = {
    "frame_id": "base_link",
    "stamp": [1700000123, 456789012],
    "view_names": ["base_0_rgb", "left_wrist_0_rgb"],
    "view_stamps": [[1700000123, 456789012], [1700000123, 460000000]],
    "state_stamp": [1700000123, 450000000],
    "sequence": 2**40 + 7,
    "horizon": 10,
    "action_dim": 7,
    "dt": 0.02,
    "action_names": [f"joint_{i}" for i in range(7)],
    "actions_seed": 1234,
    "inference_time": 0.0071,
    "staleness": 0.0123,
    "model_id": "pi05_tiny:demo",
    "config_id": "3f2a9c1b",
}

PUBLISHER = r"""
import json, sys, time
import numpy as np
import rclpy
from rclpy.qos import QoSProfile, ReliabilityPolicy, DurabilityPolicy, HistoryPolicy
from builtin_interfaces.msg import Time
from flashrt_ros.msg import ActionChunk

spec = json.loads(sys.argv[1])
rclpy.init()
node = rclpy.create_node("chunk_publisher")
qos = QoSProfile(depth=1, history=HistoryPolicy.KEEP_LAST, reliability=ReliabilityPolicy.RELIABLE,
                 durability=DurabilityPolicy.TRANSIENT_LOCAL)
pub = node.create_publisher(ActionChunk, "roundtrip/action_chunk", qos)
msg = ActionChunk()
msg.header.frame_id = spec["frame_id"]
msg.header.stamp = Time(sec=spec["stamp"][0], nanosec=spec["stamp"][1])
msg.view_names = spec["view_names"]
msg.view_stamps = [Time(sec=s, nanosec=n) for s, n in spec["view_stamps"]]
msg.state_stamp = Time(sec=spec["state_stamp"][0], nanosec=spec["state_stamp"][1])
msg.sequence = spec["sequence"]
msg.horizon = spec["horizon"]
msg.action_dim = spec["action_dim"]
msg.dt = spec["dt"]
msg.action_names = spec["action_names"]
rng = np.random.default_rng(spec["actions_seed"])
msg.actions = rng.standard_normal(spec["horizon"] * spec["action_dim"]).astype(np.float32)
msg.inference_time = spec["inference_time"]
msg.staleness = spec["staleness"]
msg.model_id = spec["model_id"]
msg.config_id = spec["config_id"]
deadline = time.monotonic() + 30.0
while pub.get_subscription_count() == 0 and time.monotonic() < deadline:
    time.sleep(0.05)
pub.publish(msg)
print("published", flush=True)
while time.monotonic() < deadline:
    rclpy.spin_once(node, timeout_sec=0.1)
"""


def test_action_chunk_roundtrip_across_processes():
    import rclpy
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

    from flashrt_ros.msg import ActionChunk

    publisher = start_python(PUBLISHER, json.dumps(EXPECTED))
    context = rclpy.Context()
    rclpy.init(context=context)
    received: list[ActionChunk] = []
    try:
        node = rclpy.create_node("chunk_subscriber", context=context)
        qos = QoSProfile(depth=1, history=HistoryPolicy.KEEP_LAST, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL)
        node.create_subscription(ActionChunk, "roundtrip/action_chunk", received.append, qos)
        executor = rclpy.executors.SingleThreadedExecutor(context=context)
        executor.add_node(node)
        deadline = time.monotonic() + RECEIVE_TIMEOUT_S
        while not received and time.monotonic() < deadline and publisher.poll() is None:
            executor.spin_once(timeout_sec=0.1)
        node.destroy_node()
    finally:
        rclpy.shutdown(context=context)
        publisher.terminate()
        out, err = publisher.communicate(timeout=10)

    assert received, f"no ActionChunk arrived within {RECEIVE_TIMEOUT_S} s; publisher said:\n{out}\n{err}"
    msg = received[0]
    assert msg.header.frame_id == EXPECTED["frame_id"]
    assert [msg.header.stamp.sec, msg.header.stamp.nanosec] == EXPECTED["stamp"]
    assert list(msg.view_names) == EXPECTED["view_names"]
    assert [[t.sec, t.nanosec] for t in msg.view_stamps] == EXPECTED["view_stamps"]
    assert [msg.state_stamp.sec, msg.state_stamp.nanosec] == EXPECTED["state_stamp"]
    assert msg.sequence == EXPECTED["sequence"]
    assert (msg.horizon, msg.action_dim) == (EXPECTED["horizon"], EXPECTED["action_dim"])
    assert msg.dt == EXPECTED["dt"]
    assert list(msg.action_names) == EXPECTED["action_names"]
    expected_actions = np.random.default_rng(EXPECTED["actions_seed"]).standard_normal(
        EXPECTED["horizon"] * EXPECTED["action_dim"]).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(msg.actions, dtype=np.float32), expected_actions)
    assert msg.inference_time == EXPECTED["inference_time"]
    assert msg.staleness == EXPECTED["staleness"]
    assert (msg.model_id, msg.config_id) == (EXPECTED["model_id"], EXPECTED["config_id"])
