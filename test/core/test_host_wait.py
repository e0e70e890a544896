"""engine/host_wait.py: the two ways predict waits for the GPU. The polling loop is checked here with real threads
(it must return once its condition holds and let other Python threads run meanwhile); the GPU test of both modes
(bitwise-equal actions) is in test/gpu/test_policy_gpu.py."""

from __future__ import annotations

import sys
import threading
import time

import pytest
import torch

from flashrt_core.engine.options import HOST_WAITS, EngineOptions
from flashrt_core.engine.host_wait import HostWait, poll_until


def test_poll_until_returns_once_its_condition_holds_and_lets_other_threads_run():
    # with a 2 s switch interval, a loop that kept the GIL would hold the other thread off for 2 s
    interval = sys.getswitchinterval()
    sys.setswitchinterval(2.0)
    go, done = threading.Event(), threading.Event()
    progress = []

    def other_thread():          # pure Python: it advances only while the polling thread gives up the GIL
        go.wait()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.05:
            progress.append(1)
        done.set()

    try:
        t0 = time.perf_counter()
        worker = threading.Thread(target=other_thread)
        worker.start()
        go.set()
        polls = poll_until(done.is_set)
        waited = time.perf_counter() - t0
        worker.join()
    finally:
        sys.setswitchinterval(interval)
    assert done.is_set() and polls > 1 and len(progress) > 1000
    assert waited < 1.0, waited            # the other thread had the GIL whenever the poll did not need it


def test_poll_until_with_a_condition_already_true_calls_it_once():
    assert poll_until(lambda: True) == 1


@pytest.mark.parametrize("mode", HOST_WAITS)
def test_no_wait_on_a_cpu_device(mode):
    wait = HostWait(mode, torch.device("cpu"))
    t0 = time.perf_counter()
    wait()
    assert time.perf_counter() - t0 < 0.1 and wait.mode == mode


def test_unknown_modes_are_refused_by_name():
    with pytest.raises(ValueError, match="host_wait must be one of"):
        HostWait("spin", torch.device("cpu"))
    with pytest.raises(ValueError, match="host_wait must be one of"):
        EngineOptions(host_wait="spin")
    with pytest.raises(ValueError, match="host_wait must be one of"):
        EngineOptions.from_env(env={"FLASHRT_HOST_WAIT": "busy"})


def test_the_environment_picks_the_mode_and_sync_is_the_default():
    assert EngineOptions().host_wait == "sync"
    assert EngineOptions.from_env(env={"FLASHRT_HOST_WAIT": "poll"}).host_wait == "poll"
    assert EngineOptions.from_env(env={"FLASHRT_HOST_WAIT": "warm"}).host_wait == "warm"
    assert EngineOptions.from_env(EngineOptions(host_wait="poll"), env={}).host_wait == "poll"


def test_the_wait_is_not_part_of_the_tuning_key(tmp_path):
    """An engine that polls reads the tuning cache entry of one that synchronizes: the wait changes nothing the
    load-time tuning measures."""
    from flashrt_core.checkpoint import load_model_weights
    from flashrt_core.config import get_config
    from flashrt_core.engine import detect_hardware, resolve
    from flashrt_core.engine.graph_executor import EngineExecutor
    from flashrt_core.fixtures import write_random_checkpoint

    cfg = get_config("pi05_tiny")
    model = load_model_weights(write_random_checkpoint(tmp_path / "ckpt", "pi05_tiny"), cfg, torch.device("cpu"),
                               torch.float32)
    hw = detect_hardware("cpu")
    keys = []
    for mode in HOST_WAITS:
        engine = EngineExecutor(model, cfg, torch.device("cpu"), resolve(hw, EngineOptions(host_wait=mode)))
        assert engine._host_wait.mode == mode
        keys.append(engine.tuning_key(torch.float32))
    assert keys[0] == keys[1] == keys[2] and "host_wait" not in keys[0]["options"]


def test_the_warm_poll_runs_its_rehearsal_once_per_interval_until_done():
    """poll_until with a rehearsal (the "warm" wait): it runs between the queries, at most once per interval and
    not before the first interval has passed, and the wait still ends as soon as its condition holds."""
    runs = []
    end = time.perf_counter() + 0.02
    calls = poll_until(lambda: time.perf_counter() >= end, lambda: runs.append(time.perf_counter()), 0.002)
    assert calls > len(runs) >= 5 and len(runs) <= 10
    assert all(b - a >= 0.002 for a, b in zip(runs, runs[1:]))
    assert poll_until(lambda: True, lambda: runs.append(0.0), 0.0) == 1 and runs[-1] != 0.0   # done: none ran


def test_a_failing_rehearsal_is_dropped_and_never_fails_the_wait(caplog):
    wait = HostWait("warm", torch.device("cpu"))
    assert wait.rehearsal is None
    wait()                                                   # a CPU device: nothing to wait for, nothing run
    seen = []

    def broken():
        seen.append(1)
        raise RuntimeError("stale frame")

    wait.rehearsal = broken
    wait._guarded_rehearsal()
    wait._guarded_rehearsal()                                # dropped after the first failure: not called again
    assert seen == [1] and wait.rehearsal is None
    assert "host rehearsal failed" in caplog.text
