"""PiModel (pi0 / pi0.5) structure: prefix KV cache vs joint pass, masking, positions, conditioning."""

import math

import pytest
import torch

from flashrt_core.config import get_config
from flashrt_core.model import PiModel

# Cached-prefix and joint passes do the same fp32 math in a different grouping.
CACHE_VS_JOINT_TOL = 1e-5
# Removing masked tokens changes only summation order over zero-weight keys.
MASK_EQUIVALENCE_TOL = 1e-5
# "Does affect" threshold: a real dependence moves the velocity by far more than fp32 noise.
MIN_EFFECT = 1e-3


def random_model(name: str, seed: int = 0) -> PiModel:
    torch.manual_seed(seed)
    model = PiModel(get_config(name)).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            fan_in = math.prod(p.shape[1:]) if p.ndim > 1 else 1
            p.normal_(0.0, fan_in**-0.5 if p.ndim > 1 else 0.1)
            if pname.endswith("dense.bias"):  # adaRMS gate ~ 1 so gated residuals pass signal
                p[2 * p.shape[0] // 3:] += 1.0
    return model


def inputs(model: PiModel, batch: int = 2, views: int = 3, seed: int = 1):
    cfg = model.config
    gen = torch.Generator().manual_seed(seed)
    size = cfg.vision.image_size
    pixels = torch.rand(batch, views, 3, size, size, generator=gen) * 2 - 1
    image_masks = torch.ones(batch, views, dtype=torch.bool)
    if views > 1:
        image_masks[0, -1] = False
    tokens = torch.randint(3, cfg.paligemma.vocab_size, (batch, cfg.max_token_len), generator=gen)
    token_masks = torch.zeros(batch, cfg.max_token_len, dtype=torch.bool)
    token_masks[0, :9] = True
    token_masks[1:, :5] = True
    state = torch.randn(batch, cfg.max_action_dim, generator=gen)
    x_t = torch.randn(batch, cfg.action_horizon, cfg.max_action_dim, generator=gen)
    t = torch.tensor([0.7, 0.3])[:batch]
    return pixels, image_masks, tokens, token_masks, state, x_t, t


def velocity(model, pixels, image_masks, tokens, token_masks, state, x_t, t):
    with torch.no_grad():
        embs, valid = model.embed_prefix(pixels, image_masks, tokens, token_masks)
        cache, _ = model.fill_prefix_cache(embs, valid)
        return model.denoise_step(cache, state, x_t, t)


@pytest.fixture(scope="module", params=["pi05_tiny", "pi0_tiny"])
def model(request):
    return random_model(request.param)


def test_cached_prefix_equals_joint_pass_and_cache_is_unchanged(model):
    pixels, image_masks, tokens, token_masks, state, x_t, t = inputs(model)
    with torch.no_grad():
        embs, valid = model.embed_prefix(pixels, image_masks, tokens, token_masks)
        cache, _ = model.fill_prefix_cache(embs, valid)
        before = [(k.clone(), v.clone()) for k, v in cache.kv]
        cached = model.denoise_step(cache, state, x_t, t)
        model.denoise_step(cache, state, x_t * 2, t * 0.5)
        joint = model.velocity_joint(embs, valid, state, x_t, t)
    assert cached.shape == (2, model.config.action_horizon, model.config.max_action_dim)
    assert cached.dtype == torch.float32
    torch.testing.assert_close(cached, joint, atol=CACHE_VS_JOINT_TOL, rtol=CACHE_VS_JOINT_TOL)
    for (k0, v0), (k1, v1) in zip(before, cache.kv):
        assert torch.equal(k0, k1) and torch.equal(v0, v1)


def test_masked_view_and_padding_tokens_have_no_effect(model):
    pixels, image_masks, tokens, token_masks, state, x_t, t = inputs(model)
    ref = velocity(model, pixels, image_masks, tokens, token_masks, state, x_t, t)
    changed_pixels = pixels.clone()
    changed_pixels[0, -1] = -changed_pixels[0, -1]  # sample 0's last view is masked
    changed_tokens = tokens.clone()
    changed_tokens[~token_masks] = 7  # padding positions
    out = velocity(model, changed_pixels, image_masks, changed_tokens, token_masks, state, x_t, t)
    torch.testing.assert_close(out, ref, atol=0, rtol=0)
    # the same change to a valid view does move the output
    changed_pixels[1, -1] = -changed_pixels[1, -1]
    out = velocity(model, changed_pixels, image_masks, tokens, token_masks, state, x_t, t)
    assert (out[1] - ref[1]).abs().max() > MIN_EFFECT


def test_masked_tokens_do_not_advance_positions(model):
    # A masked trailing view must be exactly equivalent to not having that view at all.
    pixels, image_masks, tokens, token_masks, state, x_t, t = inputs(model, batch=1, views=2)
    image_masks[0] = torch.tensor([True, False])
    with_masked = velocity(model, pixels, image_masks, tokens, token_masks, state, x_t, t)
    without = velocity(model, pixels[:, :1], image_masks[:, :1], tokens, token_masks, state, x_t, t)
    torch.testing.assert_close(with_masked, without, atol=MASK_EQUIVALENCE_TOL, rtol=MASK_EQUIVALENCE_TOL)
    # A masked LEADING view too: positions of the remaining tokens shift back to 0.
    swapped = velocity(model, pixels.flip(1), image_masks.flip(1), tokens, token_masks, state, x_t, t)
    torch.testing.assert_close(swapped, without, atol=MASK_EQUIVALENCE_TOL, rtol=MASK_EQUIVALENCE_TOL)


def test_time_and_noise_and_state_dependence(model):
    pixels, image_masks, tokens, token_masks, state, x_t, t = inputs(model)
    ref = velocity(model, pixels, image_masks, tokens, token_masks, state, x_t, t)
    later = velocity(model, pixels, image_masks, tokens, token_masks, state, x_t, t * 0.5)
    assert (later - ref).abs().max() > MIN_EFFECT
    moved = velocity(model, pixels, image_masks, tokens, token_masks, state, x_t + 1, t)
    assert (moved - ref).abs().max() > MIN_EFFECT
    other_state = velocity(model, pixels, image_masks, tokens, token_masks, state + 1, x_t, t)
    if model.is_pi05:  # pi0.5 carries the state in the prompt only
        torch.testing.assert_close(other_state, ref, atol=0, rtol=0)
    else:
        assert (other_state - ref).abs().max() > MIN_EFFECT


def test_batch_rows_are_independent(model):
    pixels, image_masks, tokens, token_masks, state, x_t, t = inputs(model)
    both = velocity(model, pixels, image_masks, tokens, token_masks, state, x_t, t)
    one = velocity(model, pixels[1:], image_masks[1:], tokens[1:], token_masks[1:], state[1:], x_t[1:], t[1:])
    torch.testing.assert_close(both[1:], one, atol=MASK_EQUIVALENCE_TOL, rtol=MASK_EQUIVALENCE_TOL)


def test_pi0_requires_state():
    model = random_model("pi0_tiny")
    pixels, image_masks, tokens, token_masks, _, x_t, t = inputs(model)
    with pytest.raises(ValueError, match="state"):
        velocity(model, pixels, image_masks, tokens, token_masks, None, x_t, t)
