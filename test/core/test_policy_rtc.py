"""Policy.predict(rtc=RtcRequest): the previous chunk in robot units, normalized like the actions are unnormalized;
disabled it is plain predict; the frozen prefix is reproduced and guided RTC continues the previous chunk (CPU, tiny
checkpoints with random norm stats)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import flashrt_core
from flashrt_core.api import Policy
from flashrt_core.errors import InputError
from flashrt_core.fixtures import write_random_checkpoint
from flashrt_core.normalization import Normalizer, random_norm_stats
from flashrt_core.rtc_request import RtcRequest

PROMPT = "pick up the red block"


@pytest.fixture(scope="module", params=["pi05_tiny", "pi0_tiny"])
def policy(request, tmp_path_factory):
    path = write_random_checkpoint(tmp_path_factory.mktemp(request.param), request.param, seed=2)
    pol = flashrt_core.load_model(path, device="cpu")
    yield pol
    pol.close()


def _observation(pol: Policy, seed: int):
    rng = np.random.default_rng(seed)
    images = [rng.integers(0, 256, (96, 128, 3), dtype=np.uint8) for _ in pol.view_names]
    state = rng.uniform(-1, 1, pol.state_dim).astype(np.float32)
    noises = rng.standard_normal((2, pol.horizon, pol.config.max_action_dim)).astype(np.float32)
    return images, state, noises


@pytest.mark.parametrize("mode", ["zscore", "quantile"])
def test_normalize_actions_inverts_unnormalize_actions(mode):
    normalizer = Normalizer(random_norm_stats(5, 6, seed=1), mode)
    x = np.random.default_rng(0).standard_normal((4, 8))            # wider than the stats: the padded affine
    back = normalizer.normalize_actions(normalizer.unnormalize_actions(x))
    np.testing.assert_allclose(back, x, rtol=1e-5, atol=1e-5)
    robot = normalizer.unnormalize_actions(x)
    assert np.abs(robot - x).max() > 1e-2                            # the stats are not the identity


def test_disabled_is_plain_predict_bit_for_bit(policy):
    assert flashrt_core.RtcRequest is RtcRequest                      # exported beside load_model
    images, state, noises = _observation(policy, 0)
    plain = policy.predict(images, PROMPT, state, noises[0])
    np.testing.assert_array_equal(policy.predict(images, PROMPT, state, noises[0], rtc=None), plain)
    prev = policy.predict(images, PROMPT, state, noises[1])
    nothing_frozen = policy.predict(images, PROMPT, state, noises[0], rtc=RtcRequest(prev, 0, "hard_prefix"))
    np.testing.assert_array_equal(nothing_frozen, plain)


@pytest.mark.parametrize("mode", ["hard_prefix", "training_time", "guided"])
def test_the_frozen_prefix_is_the_previous_chunk_in_robot_units(policy, mode):
    images, state, noises = _observation(policy, 1)
    prev = policy.predict(images, PROMPT, state, noises[0])
    plain = policy.predict(images, PROMPT, state, noises[1])
    delay = 4
    got = policy.predict(images, PROMPT, state, noises[1], rtc=RtcRequest(prev, delay, mode, execution_horizon=8))
    plain_gap = np.abs(plain[:delay] - prev[:delay]).max()
    gap = np.abs(got[:delay] - prev[:delay]).max()
    scale = np.abs(prev).max()
    if mode == "guided":
        assert gap < 0.05 * plain_gap, (gap, plain_gap)             # soft: close, not exact
    else:
        assert gap <= 1e-5 * scale, gap                              # normalize -> unnormalize round trip


def test_guided_rtc_continues_the_previous_chunk(policy):
    """Same observation, another noise: without RTC the new chunk jumps away from the previous one where the
    executor switches (step d); guided RTC pulls the overlap toward the previous chunk, so the jump shrinks."""
    images, state, noises = _observation(policy, 2)
    prev = policy.predict(images, PROMPT, state, noises[0])
    plain = policy.predict(images, PROMPT, state, noises[1])
    delay = 3
    guided = policy.predict(images, PROMPT, state, noises[1], rtc=RtcRequest(prev, delay, "guided",
                                                                             execution_horizon=10))
    seam_plain = np.abs(plain[delay] - prev[delay]).max()
    seam_guided = np.abs(guided[delay] - prev[delay]).max()
    assert seam_guided < 0.25 * seam_plain, (seam_guided, seam_plain)
    # past the execution horizon the chunk is free: guidance does not copy the previous chunk there
    assert np.abs(guided[-1] - prev[-1]).max() > seam_guided


def test_a_shorter_previous_chunk_is_enough_when_it_covers_the_delay(policy):
    images, state, noises = _observation(policy, 3)
    prev = policy.predict(images, PROMPT, state, noises[0])[:5]
    got = policy.predict(images, PROMPT, state, noises[1], rtc=RtcRequest(prev, 5, "hard_prefix"))
    np.testing.assert_allclose(got[:5], prev, rtol=0, atol=1e-5 * np.abs(prev).max())


@pytest.mark.parametrize("change,message", [
    (dict(mode="soft"), "rtc mode"),
    (dict(schedule="cosine"), "schedule"),
    (dict(delay_steps=-1), "delay_steps"),
    (dict(delay_steps=True), "delay_steps"),
    (dict(delay_steps=6), "exceeds the previous chunk"),
    (dict(previous_chunk=lambda dim: np.zeros((5, dim + 1))), "shape"),
    (dict(previous_chunk=lambda dim: np.zeros((0, dim))), "shape"),
    (dict(previous_chunk=lambda dim: "abc"), "numeric"),
    (dict(previous_chunk=lambda dim: np.full((5, dim), np.nan)), "non-finite"),
    (dict(max_guidance_weight=0.0), "max_guidance_weight"),
    (dict(execution_horizon=-2), "execution_horizon"),
])
def test_bad_requests_are_named(policy, change, message):
    images, state, noises = _observation(policy, 4)
    fields = dict(previous_chunk=np.zeros((5, policy.action_dim)), delay_steps=2, mode="guided")
    fields.update({k: v(policy.action_dim) if callable(v) else v for k, v in change.items()})
    with pytest.raises(InputError, match=message):
        policy.predict(images, PROMPT, state, noises[0], rtc=RtcRequest(**fields))
    with pytest.raises(InputError, match="RtcRequest"):
        policy.predict(images, PROMPT, state, noises[0], rtc={"delay_steps": 2})
    with pytest.raises(InputError, match="delay_steps"):
        policy.predict(images, PROMPT, state, noises[0], rtc=RtcRequest(np.zeros((80, policy.action_dim)),
                                                                        policy.horizon))


def test_the_engine_runs_the_hard_prefix_in_its_forward(policy):
    """Policy over the graph engine's executor (eager on the CPU): the hard prefix through predict_observation
    equals the reference path, and so do guided RTC (the denoiser differentiated on the engine's plain ops) and
    training-time RTC (per-row modulation): every RTC mode runs on the engine."""
    from flashrt_core.engine.dispatch import EngineOptions, eager_cpu_dispatch
    from flashrt_core.engine.graph_executor import EngineExecutor

    engine = EngineExecutor(policy.model, policy.config, torch.device("cpu"),
                            eager_cpu_dispatch(EngineOptions(text_buckets=(64, 128))), dtype=torch.float32)
    on_engine = Policy(policy.model, policy.config, engine, policy.tokenizer, policy.normalizer, policy.device,
                       policy.model_id)
    assert on_engine.gpu_preprocess
    size = policy.config.vision.image_size
    rng = np.random.default_rng(5)
    images = [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in policy.view_names]
    _, state, noises = _observation(policy, 5)
    prev = policy.predict(images, PROMPT, state, noises[0])
    request = RtcRequest(prev, 3, "hard_prefix")
    want = policy.predict(images, PROMPT, state, noises[1], rtc=request)
    got = on_engine.predict(images, PROMPT, state, noises[1], rtc=request)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * np.abs(want).max())
    for mode in ("guided", "training_time"):
        conditioned = RtcRequest(prev, 3, mode)
        want = policy.predict(images, PROMPT, state, noises[1], rtc=conditioned)
        np.testing.assert_allclose(on_engine.predict(images, PROMPT, state, noises[1], rtc=conditioned), want,
                                   rtol=0, atol=1e-4 * np.abs(want).max())


def test_warm_up_prepares_the_rtc_workspace_of_every_text_bucket(policy):
    """warm_up_text_buckets(..., rtc=...) also runs a pass with RTC per bucket: the engine's RTC workspaces (on a GPU,
    its RTC graphs) exist for every reachable bucket, and no later conditioned prediction makes another."""
    from flashrt_core.engine.dispatch import EngineOptions, eager_cpu_dispatch
    from flashrt_core.engine.graph_executor import EngineExecutor

    engine = EngineExecutor(policy.model, policy.config, torch.device("cpu"),
                            eager_cpu_dispatch(EngineOptions(text_buckets=(16, 64))), dtype=torch.float32)
    on_engine = Policy(policy.model, policy.config, engine, policy.tokenizer, policy.normalizer, policy.device,
                       policy.model_id)
    size = policy.config.vision.image_size
    images = [np.full((size, size, 3), 128, np.uint8) for _ in policy.view_names]
    _, state, noises = _observation(policy, 6)
    request = RtcRequest(np.zeros((policy.horizon, policy.action_dim)), 1, "hard_prefix")
    warmed = on_engine.warm_up_text_buckets(images, "pick", state, rtc=request)
    assert warmed and sorted(k[3] for k in engine._entries if isinstance(k[-1], tuple)) == sorted(warmed)
    assert sorted(k[3] for k in engine._entries if not isinstance(k[-1], tuple)) == sorted(warmed)
    entries = set(engine._entries)
    prev = policy.predict(images, PROMPT, state, noises[0])
    on_engine.predict(images, PROMPT, state, noises[1], rtc=RtcRequest(prev, 2, "hard_prefix"))
    assert set(engine._entries) == entries
