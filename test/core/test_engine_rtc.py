"""Real-time chunking in the engine's forward (rtc_blend: the hard prefix, a masked blend per denoise step, and the
guidance with the Jacobian as identity, a correction of each step's update; both from static buffers) against the
reference sampler, on the CPU with the plain-PyTorch ops, tiny configs, fp32.

The capture itself needs a GPU (test/gpu/test_engine_rtc_gpu.py::test_rtc_in_the_graph); everything it captures is
checked here.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from flashrt_core.checkpoint import load_model_weights
from flashrt_core.config import get_config
from flashrt_core.engine.dispatch import EngineOptions, eager_cpu_dispatch
from flashrt_core.engine.graph_executor import EngineExecutor
from flashrt_core.errors import InputError
from flashrt_core.executor import ReferenceExecutor
from flashrt_core.fixtures import write_random_checkpoint
from flashrt_core.rtc import RtcPlan, prefix_weights

FP32_ATOL = 2e-5  # test_engine_forward's: the same math in fp32, another op order


@pytest.fixture(scope="module", params=["pi05_tiny", "pi0_tiny"])
def model(request, tmp_path_factory):
    ckpt = tmp_path_factory.mktemp(request.param)
    write_random_checkpoint(ckpt, request.param, seed=3)
    return load_model_weights(ckpt, get_config(request.param), "cpu", torch.float32)


def _engine(model, fused: bool = True, overlap: bool = True) -> EngineExecutor:
    engine = EngineExecutor(model, model.config, torch.device("cpu"),
                            eager_cpu_dispatch(EngineOptions(fused_weights=fused, text_buckets=(16, 32))),
                            dtype=torch.float32)
    engine.ops.overlap_first_step = overlap
    return engine


def _inputs(cfg, seed: int):
    rng = np.random.default_rng(seed)
    size = cfg.vision.image_size
    images = [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in cfg.view_names]
    tokens = np.zeros(cfg.max_token_len, dtype=np.int64)
    tokens[:7] = rng.integers(1, cfg.paligemma.vocab_size, 7)
    mask = np.arange(cfg.max_token_len) < 7
    state = rng.standard_normal(cfg.max_action_dim).astype(np.float32)
    noise = rng.standard_normal((cfg.action_horizon, cfg.max_action_dim)).astype(np.float32)
    return images, tokens, mask, state, noise


def _tensors(images, tokens, mask, state, noise):
    pixels = torch.stack([torch.from_numpy(img).permute(2, 0, 1).float() / 255 * 2 - 1 for img in images])
    return (pixels[None], torch.ones(1, len(images), dtype=torch.bool), torch.from_numpy(tokens)[None],
            torch.from_numpy(mask)[None], torch.from_numpy(state)[None], torch.from_numpy(noise)[None])


def _plan(cfg, mode: str, delay: int, seed: int, beta: float = 10.0) -> RtcPlan:
    target = torch.from_numpy(np.random.default_rng(seed).standard_normal(
        (1, cfg.action_horizon, cfg.max_action_dim)).astype(np.float32))
    soft = mode in ("guided", "guided_identity")
    weights = prefix_weights(delay, min(cfg.action_horizon, delay + 6) if soft else delay, cfg.action_horizon,
                             "exp" if soft else "zeros")
    return RtcPlan(mode, target, weights, delay, beta)


def _both_paths(engine, ref, inputs, plan: RtcPlan, atol: float) -> np.ndarray:
    """The engine's conditioned chunk from uint8 images (predict_observation) and from pixels (sample_actions_rtc),
    each against the reference sampler's within atol; -> the first, (horizon, A)."""
    with torch.no_grad():          # as the policy calls it (guided enables grad inside for its VJP)
        want = ref.sample_actions_rtc(*_tensors(*inputs), plan)[0]
    got = engine.predict_observation(*inputs, rtc=plan)
    np.testing.assert_allclose(got, want.numpy(), atol=atol, rtol=0)
    torch.testing.assert_close(engine.sample_actions_rtc(*_tensors(*inputs), plan)[0], want, atol=atol, rtol=0)
    return got


@pytest.mark.parametrize("fused,overlap", [(True, True), (False, False)])
def test_hard_prefix_in_the_forward_matches_the_reference(model, fused, overlap):
    cfg = model.config
    engine = _engine(model, fused, overlap)
    ref = ReferenceExecutor(model, cfg, torch.device("cpu"))
    for seed, delay in ((1, 3), (2, 0), (3, cfg.action_horizon - 1)):    # one RTC workspace serves every delay
        inputs = _inputs(cfg, seed)
        plan = _plan(cfg, "hard_prefix", delay, seed)
        got = _both_paths(engine, ref, inputs, plan, FP32_ATOL)
        np.testing.assert_array_equal(got[:delay], plan.target[0, :delay].numpy())     # frozen exactly
    assert sum(isinstance(key[-1], tuple) for key in engine._entries) == 2      # uint8 and pixel inputs, one each


def test_rtc_workspaces_leave_the_plain_forward_alone(model):
    """A call with RTC runs in a workspace (a graph) of its own: the plain forward's actions do not change."""
    cfg = model.config
    engine = _engine(model)
    inputs = _inputs(cfg, 4)
    before = engine.predict_observation(*inputs)
    engine.predict_observation(*inputs, rtc=_plan(cfg, "hard_prefix", 4, 4))
    after = engine.predict_observation(*inputs)
    np.testing.assert_array_equal(after, before)
    plain_keys = [key for key in engine._entries if not isinstance(key[-1], tuple)]
    assert len(plain_keys) == 1 and "rtc" not in engine._entries[plain_keys[0]].ws.extras


@pytest.mark.parametrize("fused,overlap", [(True, True), (False, False)])
def test_identity_guidance_in_the_forward_matches_the_reference(model, fused, overlap):
    """guided_identity: the velocity recovered from each step's Euler update (fused into its last kernel) and the
    update corrected in place equals stepping the reference sampler with rtc.identity_guided_velocity; one graph
    (workspace) serves every delay and guidance clip."""
    cfg = model.config
    engine = _engine(model, fused, overlap)
    ref = ReferenceExecutor(model, cfg, torch.device("cpu"))
    for seed, delay, beta in ((1, 3, 10.0), (2, 0, 10.0), (3, cfg.action_horizon - 1, 2.0)):
        inputs = _inputs(cfg, seed)
        got = _both_paths(engine, ref, inputs, _plan(cfg, "guided_identity", delay, seed, beta), 10 * FP32_ATOL)
        plain = engine.predict_observation(*inputs)
        assert np.abs(got - plain).max() > 1e-2                       # the guidance moved the chunk
    modes = sorted(key[-1][1] for key in engine._entries if isinstance(key[-1], tuple))
    assert modes == ["guided_identity", "guided_identity"]           # uint8 and pixel inputs, one each


@pytest.mark.parametrize("fused,overlap", [(True, True), (False, False)])
def test_guidance_through_the_jacobian_in_the_forward_matches_the_reference(model, fused, overlap):
    """guided: each denoise step run under autograd on the plain-PyTorch ops, its update corrected by the
    vector-Jacobian product of the clean estimate, equals the reference sampler's guided steps (the reference
    model's own denoiser differentiated); it differs from the identity form, and one workspace serves every delay
    and guidance clip. The overlap switch is on in the first case: a guided workspace runs without it."""
    cfg = model.config
    engine = _engine(model, fused, overlap)
    ref = ReferenceExecutor(model, cfg, torch.device("cpu"))
    for seed, delay, beta in ((1, 3, 10.0), (2, 0, 10.0), (3, cfg.action_horizon - 1, 2.0)):
        inputs = _inputs(cfg, seed)
        got = _both_paths(engine, ref, inputs, _plan(cfg, "guided", delay, seed, beta), 10 * FP32_ATOL)
        identity = engine.predict_observation(*inputs, rtc=_plan(cfg, "guided_identity", delay, seed, beta))
        assert np.abs(got - identity).max() > 1e-3                    # the Jacobian is not the identity
    entry = next(e for key, e in engine._entries.items() if key[-1] == ("rtc", "guided"))
    assert not entry.ws.k_cache.requires_grad                          # no autograd history left on the caches
    before = engine.predict_observation(*_inputs(cfg, 4))
    np.testing.assert_array_equal(engine.predict_observation(*_inputs(cfg, 4)), before)


@pytest.mark.parametrize("fused,overlap", [(True, True), (False, False)])
def test_training_time_rtc_in_the_forward_matches_the_reference(model, fused, overlap):
    """training_time: the frozen prefix rows are the previous chunk, clean, before every step, and their tokens get
    the time of clean data (pi0.5: per-row adaRMS modulation; pi0: a per-row time bias); one workspace serves every
    delay, and the plain workspace beside it keeps its actions."""
    cfg = model.config
    engine = _engine(model, fused, overlap)
    ref = ReferenceExecutor(model, cfg, torch.device("cpu"))
    plain_inputs = _inputs(cfg, 9)
    plain_before = engine.predict_observation(*plain_inputs)
    for seed, delay in ((1, 3), (2, 0), (3, cfg.action_horizon - 1)):
        inputs = _inputs(cfg, seed)
        plan = _plan(cfg, "training_time", delay, seed)
        got = _both_paths(engine, ref, inputs, plan, FP32_ATOL)
        np.testing.assert_array_equal(got[:delay], plan.target[0, :delay].numpy())     # frozen exactly
        if delay:   # the clean time reaches the free rows: another chunk than the hard prefix's there
            hard = ref.sample_actions_rtc(*_tensors(*inputs), _plan(cfg, "hard_prefix", delay, seed))[0]
            assert np.abs(got[delay:] - hard[delay:].numpy()).max() > 1e-3
    modes = sorted(key[-1][1] for key in engine._entries if isinstance(key[-1], tuple))
    assert modes == ["training_time", "training_time"]               # uint8 and pixel inputs, one each
    np.testing.assert_array_equal(engine.predict_observation(*plain_inputs), plain_before)


def test_guided_rtc_refuses_fp8_denoiser_gemms_by_name(model):
    """FP8 GEMMs have no backward: an engine whose denoiser reads FP8 weights refuses guided RTC, naming the way out."""
    cfg = model.config
    engine = _engine(model)
    layer = engine.weights.expert[0].gate_up
    layer.w8 = (layer.parts[0][0].to(torch.float8_e4m3fn), torch.ones(layer.out_features))
    with pytest.raises(InputError, match="FP8 GEMMs have no backward.*guided_identity"):
        engine.predict_observation(*_inputs(cfg, 6), rtc=_plan(cfg, "guided", 2, 6))


def test_an_unknown_mode_is_refused_by_name(model):
    cfg = model.config
    engine = _engine(model)
    inputs = _inputs(cfg, 5)
    bogus = dataclasses.replace(_plan(cfg, "hard_prefix", 2, 5), mode="bogus")
    with pytest.raises(InputError, match="'bogus'"):
        engine.predict_observation(*inputs, rtc=bogus)
    with pytest.raises(InputError, match="'bogus'"):
        engine.sample_actions_rtc(*_tensors(*inputs), bogus)
