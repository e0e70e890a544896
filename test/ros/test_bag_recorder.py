"""The bag recorder writes ActionChunk / PolicyStatus bags that rosbags reads back with every field intact."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from rosbags.rosbag2 import Reader

from flashrt_ros.bag_common import ACTION_CHUNK_TYPE, POLICY_STATUS_TYPE, BagError, bag_typestore
from flashrt_ros.bag_recorder import BagRecorder, RecorderConfig
from flashrt_ros.waiting import wait_until
from bag_testing import RosHarness

pytestmark = pytest.mark.ros

CHUNKS = 5
RECEIVE_TIMEOUT_S = 15.0
SIM_TIME_NS = 1_767_225_601_250_000_000
SIGINT_GRACE_S = 2.0  # after publishing, before interrupting the recorder


def _chunk(i: int):
    from builtin_interfaces.msg import Time

    from flashrt_ros.msg import ActionChunk

    msg = ActionChunk()
    msg.header.frame_id = "base_link"
    msg.header.stamp = Time(sec=1_767_225_600 + i, nanosec=123_456_789)
    msg.view_names = ["base_0_rgb", "left_wrist_0_rgb"]
    msg.view_stamps = [Time(sec=1_767_225_600 + i, nanosec=123_456_789),
                       Time(sec=1_767_225_600 + i, nanosec=130_000_001)]
    msg.state_stamp = Time(sec=1_767_225_600 + i, nanosec=120_000_000)
    msg.sequence = 2**33 + i
    msg.horizon, msg.action_dim = 10, 7
    msg.dt = 0.02
    msg.action_names = [f"joint_{j}" for j in range(7)]
    msg.actions = np.random.default_rng(i).standard_normal(70).astype(np.float32)
    msg.inference_time = 0.0123 + i
    msg.staleness = 0.0456 + i
    msg.model_id, msg.config_id = "pi05_tiny:demo", f"cfg{i:04d}"
    return msg


def _status(i: int):
    from flashrt_ros.msg import PolicyStatus

    msg = PolicyStatus()
    msg.header.frame_id = "policy"
    msg.header.stamp.sec, msg.header.stamp.nanosec = 1_767_225_600 + i, 7
    msg.lifecycle_state = "active"
    msg.chunks_published, msg.observations_replaced, msg.inputs_rejected, msg.inference_errors = i, 2 * i, 3, 1
    msg.inference_time_median, msg.inference_time_p99 = 0.01, 0.02
    msg.staleness_median, msg.staleness_p99, msg.staleness_max = 0.03, 0.04, 0.05
    msg.last_error = f"corrupt jpeg on /camera/wrist ({i})"
    return msg


def _assert_same(sent, read) -> None:
    """Every field of an rclpy message equals the rosbags-deserialized one (recursing into sub-messages)."""
    for name in sent.get_fields_and_field_types():
        a, b = getattr(sent, name), getattr(read, name)
        if hasattr(a, "get_fields_and_field_types"):
            _assert_same(a, b)
        elif name == "view_stamps":
            assert [(t.sec, t.nanosec) for t in a] == [(t.sec, t.nanosec) for t in b]
        elif name == "actions":
            np.testing.assert_array_equal(np.asarray(a, dtype=np.float32), np.asarray(b))
        else:
            assert (list(a) if isinstance(a, list) else a) == (list(b) if isinstance(b, (list, np.ndarray)) else b), \
                name


@pytest.mark.parametrize("storage", ["sqlite3", "mcap"])
def test_recorded_chunks_read_back_intact(tmp_path, storage):
    from rclpy.parameter import Parameter
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from rosgraph_msgs.msg import Clock

    from flashrt_ros.msg import ActionChunk, PolicyStatus

    out = tmp_path / "chunks"
    chunks, statuses = [_chunk(i) for i in range(CHUNKS)], [_status(i) for i in range(CHUNKS)]
    with RosHarness() as ros:
        source = ros.node("policy_stand_in")
        chunk_pub = source.create_publisher(ActionChunk, "/action_chunk", QoSProfile(
            depth=10, reliability=ReliabilityPolicy.RELIABLE))
        status_pub = source.create_publisher(PolicyStatus, "/policy_node/status", 10)
        clock_pub = source.create_publisher(Clock, "/clock", 10)
        recorder_node = ros.node("recorder", parameter_overrides=[
            Parameter("use_sim_time", Parameter.Type.BOOL, True)])
        recorder = BagRecorder(recorder_node, RecorderConfig(out=out, storage=storage))
        assert wait_until(lambda: len(recorder.subscribed_topics) == 2 and chunk_pub.get_subscription_count() > 0
                          and status_pub.get_subscription_count() > 0, RECEIVE_TIMEOUT_S)
        clock_msg = Clock()
        clock_msg.clock.sec, clock_msg.clock.nanosec = divmod(SIM_TIME_NS, 10**9)
        assert wait_until(lambda: (clock_pub.publish(clock_msg) or True)
                          and recorder_node.get_clock().now().nanoseconds == SIM_TIME_NS, RECEIVE_TIMEOUT_S)
        for chunk, status in zip(chunks, statuses):
            chunk_pub.publish(chunk)
            status_pub.publish(status)
        assert wait_until(lambda: sum(recorder.recorded.values()) == 2 * CHUNKS, RECEIVE_TIMEOUT_S), recorder.recorded
        recorder.close()

    info = yaml.safe_load((out / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    assert info["storage_identifier"] == storage and info["message_count"] == 2 * CHUNKS
    store = bag_typestore()
    read: dict[str, list] = {}
    with Reader(out) as reader:
        types = {c.topic: c.msgtype for c in reader.connections}
        reliabilities = {c.topic: [q.reliability.name for q in c.ext.offered_qos_profiles] for c in reader.connections}
        for conn, timestamp, raw in reader.messages():
            assert timestamp == SIM_TIME_NS, "receive stamps come from the recorder's (sim) clock"
            read.setdefault(conn.topic, []).append(store.deserialize_cdr(raw, conn.msgtype))
    assert types == {"/action_chunk": ACTION_CHUNK_TYPE, "/policy_node/status": POLICY_STATUS_TYPE}
    assert reliabilities["/action_chunk"] == ["RELIABLE"]
    for sent, got in zip(chunks, read["/action_chunk"], strict=True):
        _assert_same(sent, got)
    for sent, got in zip(statuses, read["/policy_node/status"], strict=True):
        _assert_same(sent, got)


def test_recorder_rejects_bad_config(tmp_path):
    with pytest.raises(ValueError, match="absolute"):
        RecorderConfig(out=tmp_path / "a", topics=("action_chunk",))
    with pytest.raises(ValueError, match="storage must be one of"):
        RecorderConfig(out=tmp_path / "a", storage="bag")
    (tmp_path / "exists").mkdir()
    with pytest.raises(BagError, match="exists already"):
        RecorderConfig(out=tmp_path / "exists")


def test_cli_records_until_sigint(tmp_path):
    """``python -m flashrt_ros.bag_recorder OUT --topics ...`` (the README command) stops cleanly on SIGINT."""
    import signal
    import time

    from flashrt_ros.msg import ActionChunk
    from ros_processes import start_python

    out = tmp_path / "cli"
    recorder = start_python("from flashrt_ros.bag_recorder import main; raise SystemExit(main())", str(out),
                            "--topics", "/cli/action_chunk", "--storage", "mcap", "--duration", "120")
    try:
        with RosHarness() as ros:
            publisher = ros.node("chunk_source").create_publisher(ActionChunk, "/cli/action_chunk", 10)
            assert wait_until(lambda: publisher.get_subscription_count() > 0, RECEIVE_TIMEOUT_S)
            for i in range(CHUNKS):
                publisher.publish(_chunk(i))
            time.sleep(SIGINT_GRACE_S)  # reliable delivery to the recorder's subscription
            recorder.send_signal(signal.SIGINT)
            stdout, stderr = recorder.communicate(timeout=60)
    finally:
        if recorder.poll() is None:
            recorder.kill()
    assert recorder.returncode == 0, stderr
    assert f"'/cli/action_chunk': {CHUNKS}" in stdout, stdout + stderr
    store = bag_typestore()
    with Reader(out) as reader:
        read = [store.deserialize_cdr(raw, c.msgtype) for c, _, raw in reader.messages()]
    assert [m.sequence for m in read] == [2**33 + i for i in range(CHUNKS)]
