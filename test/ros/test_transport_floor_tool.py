"""tools/benchmark_node_overhead.py --transport-only: the transport floor four ways (plain / raw-CDR subscriber,
glibc / heap reuse) over real loopback DDS from a real feeder process, and the feeder's publish() time."""

from __future__ import annotations

import os
import re
import sys

import pytest

from ros_processes import REPO_ROOT
from checked_run import run_checked

pytestmark = pytest.mark.ros


@pytest.mark.parametrize("serialized", [False, True], ids=["messages", "serialized"])
def test_transport_only_reports_every_floor_and_the_publish_time(tmp_path, serialized):
    """Both feeder modes: rclpy Image messages, and CDR serialized once with the stamp patched per publish (the
    subscribers read the stamps from the frames: a wrong patch would put the floors far outside real time)."""
    report = tmp_path / "floor.md"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    run_checked([sys.executable, "tools/benchmark_node_overhead.py", "--transport-only", "--baseline", "2",
                 "--width", "320", "--height", "240", "--output", str(report)]
                + (["--feeder-serialized"] if serialized else []), cwd=REPO_ROOT, env=env, timeout=240)
    rows = dict(re.findall(r"^\| ([^|]+?) \| ([\d.]+) \| [\d.]+ \| [\d.]+ \|$", report.read_text(), re.M))
    floors = {name: float(v) for name, v in rows.items() if "subscriber" in name}
    assert set(floors) == {"plain subscriber, glibc", "raw CDR (rosbags) subscriber, glibc",
                           "plain subscriber, heap reuse", "raw CDR (rosbags) subscriber, heap reuse"}, rows
    assert all(0.0 < ms < 1000.0 for ms in floors.values()), floors        # frames arrived, in real time
    assert 0.0 < float(rows["the feeder's publish() of one frame (glibc rows)"]) < 1000.0
    assert 0.0 < float(rows["the same publish() to a topic no one reads (glibc rows)"]) < 1000.0
    assert ("CDR serialized once" in report.read_text()) == serialized


def test_cdr_header_stamp_is_written_where_the_image_header_is():
    """write_cdr_header_stamp against rclpy's own serialization: the patched bytes deserialize to the new stamp,
    and nothing else changes."""
    sys.path.insert(0, str(REPO_ROOT / "tools"))
    from benchmark_node_overhead import write_cdr_header_stamp
    from rclpy.serialization import deserialize_message, serialize_message
    from sensor_msgs.msg import Image
    msg = Image(height=2, width=3, encoding="rgb8", step=9, data=bytes(range(18)))
    msg.header.frame_id = "camera"
    msg.header.stamp.sec, msg.header.stamp.nanosec = 1, 2
    cdr = bytearray(serialize_message(msg))
    write_cdr_header_stamp(cdr, 1_764_480_000, 999_999_999)
    out = deserialize_message(bytes(cdr), Image)
    assert (out.header.stamp.sec, out.header.stamp.nanosec) == (1_764_480_000, 999_999_999)
    assert out.header.frame_id == "camera" and bytes(out.data) == bytes(range(18)) and out.width == 3
    with pytest.raises(ValueError, match="little-endian"):
        write_cdr_header_stamp(bytearray(b"\x00\x00" + bytes(cdr[2:])), 0, 0)
