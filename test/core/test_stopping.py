"""Stopping a long load between its steps (flashrt_core.stopping): raise_if_stopped consults the conditions of the
stop_when blocks around it on its own thread, and the core's long loops (the checkpoint's tensors, the tuning's
candidates, the FP8 calibration's observations, the warm-up of the text buckets) call it once per step, so a
caller that is shutting down waits for one step, not for the whole load. On the CPU, with real checkpoints."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import flashrt_core
from flashrt_core.checkpoint import weight_entries
from flashrt_core.engine import tuning
from flashrt_core.engine.load_tuning import keep_fastest_in_chain
from flashrt_core.fixtures import write_random_checkpoint
from flashrt_core.stopping import Stopped, raise_if_stopped, stop_when
from fp8_testing import cpu_engine_policy


class StopAfter:
    """A stop condition that holds from its `calls`-th consultation on; counts them."""

    def __init__(self, calls: int):
        self.calls, self.consulted = calls, 0

    def __call__(self) -> bool:
        self.consulted += 1
        return self.consulted >= self.calls


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "pi05"
    write_random_checkpoint(path, "pi05_tiny", seed=0)
    return path


def test_raise_if_stopped_names_the_step_and_only_inside_a_stop_when_whose_condition_holds():
    raise_if_stopped("outside any block")                     # no condition installed: nothing happens
    with stop_when(lambda: False):
        raise_if_stopped("a condition that does not hold")
    with stop_when(lambda: True):
        with pytest.raises(Stopped, match="^stopped at reading tensor 3 of 9$"):
            raise_if_stopped("reading tensor 3 of 9")
    raise_if_stopped("after the block: its condition is gone")


def test_an_enclosing_condition_holds_inside_a_nested_block():
    outer = threading.Event()
    with stop_when(outer.is_set):
        with stop_when(lambda: False):
            raise_if_stopped("neither holds")
            outer.set()
            with pytest.raises(Stopped):
                raise_if_stopped("the outer one holds")
        with pytest.raises(Stopped):
            raise_if_stopped("still inside the outer block")


def test_a_thread_sees_only_the_blocks_it_entered_itself():
    seen = {}

    def other_thread():
        try:
            raise_if_stopped("on another thread")
            seen["other"] = "ran on"
        except Stopped:
            seen["other"] = "stopped"
        with stop_when(lambda: True):
            try:
                raise_if_stopped("its own block")
            except Stopped:
                seen["own"] = "stopped"
    with stop_when(lambda: True):
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert seen == {"other": "ran on", "own": "stopped"}


def test_a_stop_passes_through_the_handlers_of_failing_candidates():
    """Stopped is a BaseException: the tuning's handler of a candidate that cannot run (which catches Exception and
    records the failure) lets it through, and the stopped candidate is neither measured nor recorded as failed."""
    assert issubclass(Stopped, BaseException) and not issubclass(Stopped, Exception)
    ops = type("OpsState", (), {"decoder_failures": {}})()
    measured = []
    with stop_when(lambda: True), pytest.raises(Stopped, match="timing down candidate library"):
        tuning.time_candidate(ops, "down", "library", lambda: measured.append(1) or 1.0)
    assert measured == [] and ops.decoder_failures == {}


def test_load_model_stops_between_checkpoint_tensors_and_a_load_after_it_is_whole(ckpt):
    tensors = len(weight_entries(flashrt_core.get_config("pi05_tiny")))
    condition = StopAfter(4)
    with stop_when(condition), pytest.raises(Stopped, match=f"reading tensor 4 of {tensors} of {ckpt}"):
        flashrt_core.load_model(ckpt, device="cpu")
    assert condition.consulted == 4                              # once per tensor read, stopped at the fourth
    condition = StopAfter(tensors + 1)                           # never holds during the load
    with stop_when(condition):
        policy = flashrt_core.load_model(ckpt, device="cpu")
    assert condition.consulted == tensors
    size = policy.config.vision.image_size
    images = {view: np.full((size, size, 3), 100, np.uint8) for view in policy.view_names[:2]}
    actions = policy.predict(images, "pick up the cube", state=np.zeros(policy.state_dim, np.float32))
    assert np.isfinite(actions).all()


def test_the_chain_tuning_stops_before_capturing_its_next_candidate():
    applied, captured = [], []
    with stop_when(StopAfter(3)), pytest.raises(Stopped, match="capturing the denoiser with c"):
        keep_fastest_in_chain(["a", "b", "c", "d"], applied.append, lambda cand: captured.append(cand) or cand,
                              lambda graphs: {cand: 1.0 for cand in graphs})
    assert captured == ["a", "b"] and applied == ["a", "b"]     # no timing, no pick applied


def _observation(policy, seed: int):
    rng = np.random.default_rng(seed)
    size = policy.config.vision.image_size
    images = {view: rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for view in policy.view_names[:2]}
    return images, "pick up the cube", rng.uniform(-1, 1, policy.state_dim).astype(np.float32)


def test_the_fp8_calibration_stops_between_observations_and_leaves_the_policy_uncalibrated(ckpt):
    base = flashrt_core.load_model(ckpt, device="cpu")
    policy = cpu_engine_policy(base)
    observations = [_observation(base, seed) for seed in range(3)]
    with stop_when(StopAfter(2)), pytest.raises(Stopped, match="FP8 calibration: observation 2"):
        policy.calibrate(observations)
    assert not policy.fp8_calibrated
    assert policy.calibrate(observations).observations == 3     # a later calibration runs whole


def test_the_warm_up_of_the_text_buckets_stops_between_buckets(ckpt):
    policy = cpu_engine_policy(flashrt_core.load_model(ckpt, device="cpu"), fp8=False)
    images, prompt, state = _observation(policy, 0)
    buckets = policy.reachable_text_buckets(state)
    assert len(buckets) >= 2
    with stop_when(StopAfter(2)), pytest.raises(Stopped, match=f"warming up text bucket {buckets[1]} "):
        policy.warm_up_text_buckets(images, prompt, state)
    assert sorted(key[3] for key in policy.executor.entries) == [buckets[0]]   # one bucket warmed, then stopped
