"""The README's main job (python -m flashrt_ros.demo_main) runs end to end and prints chunks and staleness."""

from __future__ import annotations

import os
import re
import sys

import pytest

from ros_processes import REPO_ROOT
from checked_run import run_checked

pytestmark = pytest.mark.ros

DEMO_TIMEOUT_S = 300.0


def test_demo_prints_chunks_and_a_staleness_summary(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    result = run_checked([sys.executable, "-m", "flashrt_ros.demo_main", "--duration", "3", "--workdir",
                          str(tmp_path)], cwd=REPO_ROOT, env=env, timeout=DEMO_TIMEOUT_S)
    chunk_lines = re.findall(r"^chunk +(\d+) +stamp (\d+)\.(\d{9}) +shape \((\d+), (\d+)\) +first row \[.*\] .*"
                             r"inference +([\d.]+) ms +staleness +([\d.]+) ms$", result.stdout, re.M)
    assert len(chunk_lines) >= 2, result.stdout
    assert [int(line[0]) for line in chunk_lines] == list(range(len(chunk_lines)))
    assert all(float(line[6]) >= float(line[5]) for line in chunk_lines)     # staleness includes inference
    assert re.search(r"^\d+ chunks \(sequence 0\.\.\d+\)$", result.stdout, re.M)
    assert re.search(r"staleness +median +[\d.]+ ms +p99 +[\d.]+ ms +max +[\d.]+ ms", result.stdout)
    assert "node state: finalized" in result.stdout
    assert "Traceback" not in result.stderr
    assert (tmp_path / "ros_home").is_dir()                                 # ROS logs stayed in the workdir
