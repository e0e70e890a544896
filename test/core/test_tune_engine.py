"""tools/tune_engine.py (the best of several measured loads stored in the tuning cache) refuses what it cannot do
by name: fewer than two loads to choose from, and a machine without a CUDA GPU, where nothing is tuned and no graph
exists (its GPU run: the `tune` part of tools/device_engine_checks.sh)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from checked_run import failure_report

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "tune_engine.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, cwd=REPO, timeout=300)


def test_one_load_is_refused_by_name(tmp_path):
    done = _run("--checkpoint", str(tmp_path), "--tuning-cache", str(tmp_path / "cache"), "--loads", "1")
    assert done.returncode == 2 and "--loads must be at least 2" in done.stderr, failure_report(done)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a CUDA GPU")
def test_without_a_gpu_it_says_so_and_writes_nothing(tmp_path):
    cache = tmp_path / "cache"
    done = _run("--checkpoint", str(tmp_path), "--tuning-cache", str(cache), "--out", str(tmp_path / "out.json"))
    assert done.returncode == 2 and "needs a CUDA GPU" in done.stderr, failure_report(done)
    assert not cache.exists() and not (tmp_path / "out.json").exists()
