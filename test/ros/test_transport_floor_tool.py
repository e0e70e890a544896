"""tools/benchmark_node_overhead.py --transport-only: the transport floor four ways (plain / raw-CDR subscriber,
glibc / heap reuse) over real loopback DDS from a real feeder process, and the feeder's publish() time."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from test.ros.ros_processes import REPO_ROOT

pytestmark = pytest.mark.ros


def test_transport_only_reports_every_floor_and_the_publish_time(tmp_path):
    report = tmp_path / "floor.md"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "tools/benchmark_node_overhead.py", "--transport-only", "--baseline",
                             "2", "--width", "320", "--height", "240", "--output", str(report)],
                            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, f"{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    rows = dict(re.findall(r"^\| ([^|]+?) \| ([\d.]+) \| [\d.]+ \| [\d.]+ \|$", report.read_text(), re.M))
    floors = {name: float(v) for name, v in rows.items() if "subscriber" in name}
    assert set(floors) == {"plain subscriber, glibc", "raw CDR (rosbags) subscriber, glibc",
                           "plain subscriber, heap reuse", "raw CDR (rosbags) subscriber, heap reuse"}, rows
    assert all(0.0 < ms < 1000.0 for ms in floors.values()), floors        # frames arrived, in real time
    assert 0.0 < float(rows["the feeder's publish() of one frame (glibc rows)"]) < 1000.0
