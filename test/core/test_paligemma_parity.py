"""Independent check: our vision tower + projector + Gemma prefix against Hugging Face transformers'
PaliGemmaForConditionalGeneration built with the same weights (fp32, CPU, tiny config).

The lerobot / openpi checkpoint layout mirrors HF's names below `paligemma_with_expert.paligemma.`, so the
weights map by stripping that prefix. HF's own image/text merging is bypassed: we feed `inputs_embeds`
([projected image tokens; HF's scaled text embeddings]), openpi's prefix-LM mask (bidirectional over valid
tokens) as a 4D additive mask, and positions cumsum(valid) - 1.
"""

import pytest
import torch

from flashrt_core.checkpoint import load_model_weights
from flashrt_core.config import get_config
from flashrt_core.fixtures import write_random_checkpoint
from flashrt_core.model.pi_model import make_attention_mask

transformers = pytest.importorskip("transformers")
from paligemma_testing import paligemma_from_checkpoint  # noqa: E402  (needs transformers)

# fp32 on both sides; different op order (einsum vs matmul, fp32 RoPE) only.
PARITY_REL_TOL = 1e-4


def rel_err(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours - theirs).abs().max() / theirs.abs().max())


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    cfg = get_config("pi05_tiny")
    path = write_random_checkpoint(tmp_path_factory.mktemp("parity"), "pi05_tiny", seed=11, dtype=torch.float32,
                                   prefix_model=False)
    ours = load_model_weights(path, cfg, "cpu", torch.float32)
    hf = paligemma_from_checkpoint(cfg, path / "model.safetensors")
    return cfg, ours, hf


def inputs(cfg):
    gen = torch.Generator().manual_seed(0)
    size = cfg.vision.image_size
    pixels = torch.rand(2, 2, 3, size, size, generator=gen) * 2 - 1  # [B, V, 3, H, W]
    image_masks = torch.tensor([[True, True], [True, False]])
    tokens = torch.randint(3, cfg.paligemma.vocab_size, (2, 24), generator=gen)
    token_masks = torch.zeros(2, 24, dtype=torch.bool)
    token_masks[0, :20] = True
    token_masks[1, :11] = True
    return pixels, image_masks, tokens, token_masks


def test_vision_tower_and_projector_match(models):
    cfg, ours, hf = models
    pixels = inputs(cfg)[0].flatten(0, 1)
    with torch.no_grad():
        theirs = hf.model.multi_modal_projector(hf.model.vision_tower(pixel_values=pixels).last_hidden_state)
        mine = ours.vision(pixels)
    assert mine.shape == theirs.shape == (4, cfg.vision.num_patches, cfg.paligemma.width)
    assert rel_err(mine, theirs) <= PARITY_REL_TOL


def test_prefix_hidden_states_and_kv_cache_match(models):
    cfg, ours, hf = models
    pixels, image_masks, tokens, token_masks = inputs(cfg)
    with torch.no_grad():
        embs, valid = ours.embed_prefix(pixels, image_masks, tokens, token_masks)
        cache, hidden = ours.fill_prefix_cache(embs, valid)

        lm = hf.model.language_model
        features = hf.model.vision_tower(pixel_values=pixels.flatten(0, 1)).last_hidden_state
        images = hf.model.multi_modal_projector(features)
        hf_embs = torch.cat([images.reshape(2, -1, cfg.paligemma.width), lm.embed_tokens(tokens)], dim=1)
        allowed = make_attention_mask(valid, torch.zeros_like(valid))  # [B, P, P]
        additive = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)[:, None]  # [B, 1, P, P]
        positions = torch.cumsum(valid.long(), dim=1) - 1
        out = lm(inputs_embeds=hf_embs, attention_mask=additive, position_ids=positions, use_cache=True)
    hf_cache = getattr(out, "cache", None) or out.past_key_values

    rel = rel_err(embs[valid], hf_embs[valid])
    assert rel <= PARITY_REL_TOL, f"prefix embeddings rel err {rel:.2e}"
    rel = rel_err(hidden[valid], out.last_hidden_state[valid])
    assert rel <= PARITY_REL_TOL, f"prefix hidden states rel err {rel:.2e}"
    for i, (k, v) in enumerate(cache.kv):
        layer = hf_cache.layers[i]
        hf_k, hf_v = layer.keys.transpose(1, 2), layer.values.transpose(1, 2)  # [B, P, KV, D]
        assert rel_err(k[valid], hf_k[valid]) <= PARITY_REL_TOL, f"layer {i} K"
        assert rel_err(v[valid], hf_v[valid]) <= PARITY_REL_TOL, f"layer {i} V"
    # the check has teeth: a shifted position changes K well beyond the tolerance
    with torch.no_grad():
        shifted = lm(inputs_embeds=hf_embs, attention_mask=additive, position_ids=positions + 1, use_cache=True)
    shifted_cache = getattr(shifted, "cache", None) or shifted.past_key_values
    assert rel_err(cache.kv[0][0][valid], shifted_cache.layers[0].keys.transpose(1, 2)[valid]) > 100 * PARITY_REL_TOL
