"""flashrt_core.host_threads: the CPUs a process may use (its affinity bounded by its cgroup's CPU quota, read
from cgroup v2 and v1 files laid out in a temporary folder), and the warning load_model gives when torch's host
threads outnumber them."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from flashrt_core import host_threads


def _cgroup(tmp_path, v2=None, v1=None):
    if v2 is not None:
        (tmp_path / "cpu.max").write_text(v2 + "\n")
    if v1 is not None:
        (tmp_path / "cpu").mkdir()
        (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text(f"{v1[0]}\n")
        (tmp_path / "cpu" / "cpu.cfs_period_us").write_text(f"{v1[1]}\n")
    return tmp_path


@pytest.mark.parametrize("v2, v1, quota", [("200000 100000", None, 2.0), ("max 100000", None, None),
                                          (None, (150000, 100000), 1.5), (None, (-1, 100000), None),
                                          (None, None, None), ("garbled", None, None)])
def test_cpu_quota_reads_cgroup_v2_and_v1(tmp_path, v2, v1, quota):
    assert host_threads.cpu_quota(_cgroup(tmp_path, v2, v1)) == quota


@pytest.mark.parametrize("v2, usable", [(None, 64), ("50000 100000", 1), ("1600000 100000", 16),
                                        ("12800000 100000", 64)], ids=["no-quota", "half-a-cpu", "16", "above"])
def test_usable_cpus_is_the_affinity_bounded_by_the_quota(tmp_path, monkeypatch, v2, usable):
    """64 CPUs in the affinity mask: no quota leaves 64; half a CPU's quota rounds up to 1; a quota above the
    affinity leaves the affinity."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    assert host_threads.usable_cpus(_cgroup(tmp_path, v2=v2)) == usable


def test_the_warning_names_the_threads_the_cpus_and_the_fix(tmp_path, monkeypatch, caplog):
    log = logging.getLogger("flashrt_core.api")
    root = _cgroup(tmp_path, v2="200000 100000")                                               # 2 CPUs
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 32)
    with caplog.at_level(logging.WARNING, logger="flashrt_core.api"):
        assert host_threads.warn_if_oversubscribed(log, root)
    assert "32 host threads on 2 usable CPUs" in caplog.text and "torch.set_num_threads(2)" in caplog.text
    caplog.clear()
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    with caplog.at_level(logging.WARNING, logger="flashrt_core.api"):
        assert not host_threads.warn_if_oversubscribed(log, root)
    assert caplog.text == ""
