"""The generated demo bag: readable by rosbags in both storages, realistic rates and stamps, faults as declared."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from rosbags.rosbag2 import Reader

from flashrt_ros.bag_common import BagError, bag_typestore
from flashrt_ros.demo_bag import (BASE_CAMERA_TOPIC, INSTRUCTION_TOPIC, JOINT_STATE_TOPIC, WRIST_CAMERA_TOPIC,
                                  DemoBagConfig, main, read_manifest, write_demo_bag)
from flashrt_ros.image_conversion import ImageConversionError, to_rgb

DURATION_S = 2.5
RATE_TOLERANCE = 0.1  # relative, on the mean message rate
MAX_CAMERA_OFFSET_S = 0.02  # base vs wrist stamps of the same frame index (phase + jitter)


def _read(bag_dir):
    store = bag_typestore()
    messages: dict[str, list] = {}
    storage = yaml.safe_load((bag_dir / "metadata.yaml").read_text())["rosbag2_bagfile_information"][
        "storage_identifier"]
    with Reader(bag_dir) as reader:
        for conn, timestamp, raw in reader.messages():
            messages.setdefault(conn.topic, []).append((timestamp, store.deserialize_cdr(raw, conn.msgtype)))
    return storage, messages


def _stamp_ns(msg) -> int:
    return msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec


@pytest.mark.parametrize("storage", ["sqlite3", "mcap"])
def test_clean_demo_bag_content(tmp_path, storage):
    cfg = DemoBagConfig(duration_s=DURATION_S)
    manifest = write_demo_bag(tmp_path / "bag", cfg, storage=storage)
    found_storage, messages = _read(tmp_path / "bag")
    assert found_storage == storage
    assert {t: len(m) for t, m in messages.items()} == manifest.counts
    assert manifest.faults == {}

    for topic, hz in ((BASE_CAMERA_TOPIC, cfg.camera_hz), (WRIST_CAMERA_TOPIC, cfg.camera_hz),
                      (JOINT_STATE_TOPIC, cfg.joint_state_hz)):
        stamps = np.array([_stamp_ns(m) for _, m in messages[topic]], dtype=np.int64)
        assert np.all(np.diff(stamps) > 0), f"{topic}: stamps not increasing in a clean bag"
        mean_period = np.diff(stamps).mean() / 1e9
        assert mean_period == pytest.approx(1.0 / hz, rel=RATE_TOLERANCE), topic
        # Receive time is capture time plus a positive transport latency.
        latencies = np.array([t - _stamp_ns(m) for t, m in messages[topic]]) / 1e9
        assert latencies.min() > 0 and latencies.max() < 0.02, topic
    base = np.array([_stamp_ns(m) for _, m in messages[BASE_CAMERA_TOPIC]])
    wrist = np.array([_stamp_ns(m) for _, m in messages[WRIST_CAMERA_TOPIC]])
    offsets = (wrist - base) / 1e9
    assert np.all(np.abs(offsets) < MAX_CAMERA_OFFSET_S) and np.ptp(offsets) > 0, "stamps should jitter, paired"

    _, first_base = messages[BASE_CAMERA_TOPIC][0]
    assert (first_base.height, first_base.width, first_base.encoding) == (480, 640, "rgb8")
    base_rgb = to_rgb(first_base)
    wrist_rgb = to_rgb(messages[WRIST_CAMERA_TOPIC][0][1])
    assert base_rgb.shape == wrist_rgb.shape == (480, 640, 3)
    assert len(np.unique(base_rgb.reshape(-1, 3), axis=0)) > 50, "the scene should have shapes and shading"
    later = to_rgb(messages[BASE_CAMERA_TOPIC][-1][1])
    assert np.abs(later.astype(int) - base_rgb.astype(int)).sum() > 0, "the scene should move"
    assert [m.data for _, m in messages[INSTRUCTION_TOPIC]] == [cfg.instruction]
    joints = messages[JOINT_STATE_TOPIC][0][1]
    assert len(joints.name) == len(joints.position) == 8


def test_fault_bag_matches_its_manifest(tmp_path):
    manifest = write_demo_bag(tmp_path / "bag", DemoBagConfig(duration_s=DURATION_S, faults=True))
    assert read_manifest(tmp_path / "bag").faults == manifest.faults
    _, messages = _read(tmp_path / "bag")

    base_stamps = np.array([_stamp_ns(m) for _, m in messages[BASE_CAMERA_TOPIC]])
    backwards = np.flatnonzero(np.diff(base_stamps) <= 0) + 1
    assert backwards.tolist() == manifest.faults["out_of_order_stamps"]["frames"]
    assert len(backwards) == manifest.faults["out_of_order_stamps"]["count"] == 2

    failures = 0
    for _, msg in messages[WRIST_CAMERA_TOPIC]:
        try:
            to_rgb(msg)
        except ImageConversionError:
            failures += 1
    assert failures == manifest.faults["corrupt_frames"]["count"] == 1

    dropout = manifest.faults["dropout"]
    wrist_stamps = np.array([_stamp_ns(m) for _, m in messages[WRIST_CAMERA_TOPIC]]) / 1e9
    gap = np.diff(wrist_stamps).max()
    assert gap >= (dropout["end_s"] - dropout["start_s"]) - 1.0 / 30.0
    assert dropout["frames_dropped"] > 10
    assert len(messages[WRIST_CAMERA_TOPIC]) + dropout["frames_dropped"] == len(messages[BASE_CAMERA_TOPIC])


def test_cli_and_bad_input(tmp_path, capsys):
    assert main([str(tmp_path / "cli"), "--storage", "mcap", "--duration", "0.5"]) == 0
    assert '"counts"' in capsys.readouterr().out
    assert read_manifest(tmp_path / "cli").counts[BASE_CAMERA_TOPIC] == 15
    with pytest.raises(BagError, match="exists already"):
        write_demo_bag(tmp_path / "cli", DemoBagConfig(duration_s=0.5))
    with pytest.raises(BagError, match="storage must be one of"):
        write_demo_bag(tmp_path / "x", DemoBagConfig(duration_s=0.5), storage="rosbag1")
    with pytest.raises(ValueError, match="duration_s must be > 0"):
        DemoBagConfig(duration_s=0)
