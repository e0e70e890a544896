"""Real-time chunking's math (flashrt_core/rtc.py) and the reference sampler conditioned on a previous chunk,
against straightforward implementations written here: the paper's formulas in its own time convention (tau = 1 - t),
explicit per-step loops, and the guidance's vector-Jacobian product as an explicit Jacobian matrix. CPU, tiny
models, fp32."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from flashrt_core.checkpoint import load_model_weights
from flashrt_core.config import get_config
from flashrt_core.executor import ReferenceExecutor
from flashrt_core.fixtures import write_random_checkpoint
from flashrt_core.flow import time_schedule
from flashrt_core.rtc import RtcPlan, guidance_weight, guided_velocity, prefix_weights

FP32_ATOL = 2e-5     # the same math in fp32 in another order (matrix product vs autograd, where vs explicit rows)
BETA = 10.0


def paper_weights(d: int, end: int, horizon: int) -> list[float]:
    """The paper's soft mask W_i: 1 for i < d, c_i (e^c_i - 1) / (e - 1) for d <= i < end, 0 after;
    c_i = (end - i) / (end - d + 1)."""
    out = []
    for i in range(horizon):
        if i < d:
            out.append(1.0)
        elif i < end:
            c = (end - i) / (end - d + 1)
            out.append(c * (math.exp(c) - 1) / (math.e - 1))
        else:
            out.append(0.0)
    return out


def paper_guidance_weight(t: float, beta: float) -> float:
    """min(beta, (1 - tau) / (tau * r^2)), r^2 = (1 - tau)^2 / (tau^2 + (1 - tau)^2), tau = 1 - t (tau = 0: noise)."""
    tau = 1.0 - t
    if tau == 0.0:
        return beta
    r2 = (1 - tau) ** 2 / (tau ** 2 + (1 - tau) ** 2)
    return min(beta, (1 - tau) / (tau * r2))


@pytest.mark.parametrize("d,end,horizon", [(3, 10, 10), (0, 8, 50), (5, 12, 50), (4, 5, 10), (2, 2, 10)])
def test_prefix_weights_follow_the_papers_exponential_schedule(d, end, horizon):
    got = prefix_weights(d, end, horizon, "exp")
    np.testing.assert_allclose(got.numpy(), paper_weights(d, end, horizon), rtol=1e-6, atol=1e-7)
    assert got[:d].eq(1).all() and got[end:].eq(0).all()
    assert (got[d:end] > 0).all() and (got[d:end] < 1).all() and (got[d:end].diff() < 0).all()


def test_other_schedules_and_an_end_before_the_delay():
    linear = prefix_weights(2, 6, 8, "linear")
    np.testing.assert_allclose(linear.numpy(), [1, 1, 0.8, 0.6, 0.4, 0.2, 0, 0], atol=1e-7)   # (6 - i) / 5
    assert prefix_weights(2, 6, 8, "ones").tolist() == [1] * 6 + [0] * 2
    assert prefix_weights(2, 6, 8, "zeros").tolist() == [1] * 2 + [0] * 6
    assert prefix_weights(4, 1, 8, "exp").tolist() == [1] * 4 + [0] * 4       # end < delay: the prefix alone
    with pytest.raises(ValueError, match="schedule"):
        prefix_weights(2, 6, 8, "cosine")


def test_guidance_weight_is_the_papers_clipped_weight():
    for t in time_schedule(10) + [0.999, 0.5, 0.25, 0.01]:
        assert guidance_weight(t, BETA) == pytest.approx(paper_guidance_weight(t, BETA), rel=1e-12)
    assert guidance_weight(1.0, BETA) == BETA and guidance_weight(0.0, BETA) == 0.0
    assert guidance_weight(0.5, 1.5) == 1.5 and guidance_weight(0.5, BETA) == pytest.approx(2.0)   # 0.5 / 0.25
    with pytest.raises(ValueError, match="positive"):
        guidance_weight(0.5, 0.0)


def test_guided_velocity_on_a_linear_field_is_the_closed_form():
    """v(x) = x M^T + b: x0 = x - t v, d x0 / d x = I - t M (per row), so J^T e = e - t e M."""
    gen = torch.Generator().manual_seed(0)
    horizon, width, t = 6, 4, 0.6
    m = torch.randn(width, width, generator=gen, dtype=torch.float64)
    b = torch.randn(width, generator=gen, dtype=torch.float64)
    x = torch.randn(1, horizon, width, generator=gen, dtype=torch.float64)
    target = torch.randn(1, horizon, width, generator=gen, dtype=torch.float64)
    weights = prefix_weights(2, 5, horizon).double()

    def field(z):
        return z @ m.T + b

    got = guided_velocity(field, x, t, target, weights, BETA)
    v = field(x)
    err = (target - (x - t * v)) * weights[None, :, None]
    want = v - paper_guidance_weight(t, BETA) * (err - t * err @ m)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------------- tiny models
@pytest.fixture(scope="module", params=["pi05_tiny", "pi0_tiny"])
def model(request, tmp_path_factory):
    ckpt = tmp_path_factory.mktemp(request.param)
    write_random_checkpoint(ckpt, request.param, seed=5)
    return load_model_weights(ckpt, get_config(request.param), "cpu", torch.float32)


def _inputs(cfg, seed: int):
    gen = torch.Generator().manual_seed(seed)
    views, size, text = len(cfg.view_names), cfg.vision.image_size, 9
    pixels = torch.rand(1, views, 3, size, size, generator=gen) * 2 - 1
    masks = torch.ones(1, views, dtype=torch.bool)
    tokens = torch.zeros(1, cfg.max_token_len, dtype=torch.int64)
    tokens[0, :text] = torch.randint(1, cfg.paligemma.vocab_size, (text,), generator=gen)
    token_masks = torch.arange(cfg.max_token_len)[None] < text
    state = torch.randn(1, cfg.max_action_dim, generator=gen)
    noise = torch.randn(1, cfg.action_horizon, cfg.max_action_dim, generator=gen)
    return pixels, masks, tokens, token_masks, state, noise


def _cache(model, inputs):
    pixels, masks, tokens, token_masks = inputs[:4]
    with torch.no_grad():
        embs, valid = model.embed_prefix(pixels, masks, tokens, token_masks)
        return model.fill_prefix_cache(embs, valid)[0]


def _plan(model, mode: str, delay: int, seed: int = 11, end: int | None = None) -> RtcPlan:
    cfg = model.config
    gen = torch.Generator().manual_seed(seed)
    target = torch.randn(1, cfg.action_horizon, cfg.max_action_dim, generator=gen)
    if mode == "guided":
        weights = prefix_weights(delay, end if end is not None else cfg.action_horizon, cfg.action_horizon)
    else:
        weights = (torch.arange(cfg.action_horizon) < delay).float()
    return RtcPlan(mode, target, weights, delay, BETA)


def test_a_per_token_time_equal_to_the_step_time_is_the_step_time(model):
    """The per-token time path (training-time RTC) reads one time per action token: all equal to t it is the
    scalar path; a clean prefix (time 0) changes the velocity."""
    inputs = _inputs(model.config, 1)
    cache, state, x = _cache(model, inputs), inputs[4], inputs[5]
    horizon = model.config.action_horizon
    with torch.no_grad():
        scalar = model.denoise_step(cache, state, x, torch.full((1,), 0.7))
        per_token = model.denoise_step(cache, state, x, torch.full((1, horizon), 0.7))
        clean_prefix = model.denoise_step(cache, state, x, torch.where(torch.arange(horizon) < 3, 0.0, 0.7)[None])
    np.testing.assert_allclose(per_token.numpy(), scalar.numpy(), atol=1e-6, rtol=0)
    assert (clean_prefix - scalar).abs().max() > 1e-3


def test_nothing_frozen_is_the_plain_sampler_bit_for_bit(model):
    inputs = _inputs(model.config, 2)
    ref = ReferenceExecutor(model, model.config, torch.device("cpu"))
    plain = ref.sample_actions(*inputs)
    got = ref.sample_actions_rtc(*inputs, _plan(model, "hard_prefix", 0))
    assert torch.equal(got, plain)


def test_hard_prefix_matches_an_explicit_loop(model):
    cfg, delay = model.config, 4
    inputs = _inputs(cfg, 3)
    plan = _plan(model, "hard_prefix", delay)
    got = ReferenceExecutor(model, cfg, torch.device("cpu")).sample_actions_rtc(*inputs, plan)
    cache, state, noise = _cache(model, inputs), inputs[4], inputs[5]
    target = plan.target
    x = noise.clone()
    with torch.no_grad():
        for t in time_schedule(cfg.num_steps):
            for i in range(delay):             # the frozen rows: the previous chunk noised to time t
                x[0, i] = t * noise[0, i] + (1 - t) * target[0, i]
            x = x + (-1.0 / cfg.num_steps) * model.denoise_step(cache, state, x, torch.full((1,), t))
        x[0, :delay] = target[0, :delay]
    np.testing.assert_allclose(got.numpy(), x.numpy(), atol=FP32_ATOL, rtol=0)
    assert torch.equal(got[0, :delay], target[0, :delay])                          # frozen exactly
    plain = ReferenceExecutor(model, cfg, torch.device("cpu")).sample_actions(*inputs)
    assert (got[0, delay:] - plain[0, delay:]).abs().max() > 1e-3                 # the prefix conditions the rest


def test_training_time_matches_an_explicit_loop(model):
    cfg, delay = model.config, 3
    inputs = _inputs(cfg, 4)
    plan = _plan(model, "training_time", delay)
    got = ReferenceExecutor(model, cfg, torch.device("cpu")).sample_actions_rtc(*inputs, plan)
    cache, state, noise = _cache(model, inputs), inputs[4], inputs[5]
    x = noise.clone()
    with torch.no_grad():
        for t in time_schedule(cfg.num_steps):
            x[0, :delay] = plan.target[0, :delay]                                  # clean prefix ...
            token_time = torch.tensor([[0.0 if i < delay else t for i in range(cfg.action_horizon)]])  # ... at time 0
            x = x + (-1.0 / cfg.num_steps) * model.denoise_step(cache, state, x, token_time)
        x[0, :delay] = plan.target[0, :delay]
    np.testing.assert_allclose(got.numpy(), x.numpy(), atol=FP32_ATOL, rtol=0)
    assert torch.equal(got[0, :delay], plan.target[0, :delay])


@pytest.fixture(scope="module")
def pi05_model(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("pi05_guided")
    write_random_checkpoint(ckpt, "pi05_tiny", seed=7)
    return load_model_weights(ckpt, get_config("pi05_tiny"), "cpu", torch.float32)


def test_guided_matches_an_explicit_jacobian_loop(pi05_model):
    """Guided RTC on pi0.5 tiny: every step's correction as the full Jacobian matrix of the clean estimate
    (torch.autograd.functional.jacobian) applied to the weighted error, against the sampler's VJP."""
    ckpt_model = pi05_model
    cfg, delay, end = ckpt_model.config, 3, 8
    inputs = _inputs(cfg, 6)
    plan = _plan(ckpt_model, "guided", delay, end=end)
    got = ReferenceExecutor(ckpt_model, cfg, torch.device("cpu")).sample_actions_rtc(*inputs, plan)
    cache, state, noise = _cache(ckpt_model, inputs), inputs[4], inputs[5]
    weights = torch.tensor(paper_weights(delay, end, cfg.action_horizon))[None, :, None]
    n = cfg.action_horizon * cfg.max_action_dim
    x = noise.clone()
    for t in time_schedule(cfg.num_steps):
        def clean(z, t=t):
            return z - t * ckpt_model.denoise_step(cache, state, z, torch.full((1,), t))
        with torch.no_grad():
            v = ckpt_model.denoise_step(cache, state, x, torch.full((1,), t))
        jac = torch.autograd.functional.jacobian(clean, x, vectorize=True).reshape(n, n)   # d x0 / d x
        err = ((plan.target - (x - t * v)) * weights).reshape(n)
        correction = (jac.T @ err).reshape(x.shape)
        x = x + (-1.0 / cfg.num_steps) * (v - paper_guidance_weight(t, BETA) * correction)
    np.testing.assert_allclose(got.numpy(), x.numpy(), atol=1e-4, rtol=0)



def test_identity_guidance_is_the_guided_step_with_an_identity_jacobian():
    """guided_identity steps with v - w(t) * W * (target - x0): an explicit Euler loop gives the same chunk; on a
    linear denoiser, whose Jacobian d x0 / d x_t = I - t * mix^T is not the identity, it differs from the
    full-Jacobian "guided": an approximation, named as one."""
    from flashrt_core.rtc import RtcPlan, guidance_weight, prefix_weights, rtc_euler_integrate
    from flashrt_core.flow import time_schedule
    g = torch.Generator().manual_seed(0)
    a = torch.randn(1, 10, 4, generator=g)
    mix = torch.randn(4, 4, generator=g) * 0.3

    def velocity(x, time):
        return x @ mix - a                       # a linear denoiser: its Jacobian is not the identity

    noise = torch.randn(1, 10, 4, generator=g)
    target = torch.randn(1, 10, 4, generator=g)
    weights = prefix_weights(3, 7, 10, "exp")
    plan = RtcPlan("guided_identity", target, weights, 3, 4.0)
    got = rtc_euler_integrate(velocity, noise, 5, plan)
    x = noise.clone()
    for t in time_schedule(5):
        v = velocity(x, None)
        v = v - guidance_weight(t, 4.0) * weights[None, :, None] * (target - (x - t * v))
        x = x - v / 5
    torch.testing.assert_close(got, x)
    full = rtc_euler_integrate(velocity, noise, 5, RtcPlan("guided", target, weights, 3, 4.0))
    assert (full - got).abs().max() > 1e-3
