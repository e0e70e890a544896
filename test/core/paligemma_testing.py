"""transformers' PaliGemma on a flashrt checkpoint's backbone weights: the independent implementation the parity
tests (test_paligemma_parity.py, test_pi0_fast_parity.py) compare the reference path with."""

from __future__ import annotations

from pathlib import Path

import transformers
from safetensors.torch import load_file

HF_PREFIX = "paligemma_with_expert.paligemma."     # the backbone's names in a flashrt / openpi checkpoint


def paligemma_from_checkpoint(cfg, weights_path: str | Path) -> transformers.PaliGemmaForConditionalGeneration:
    """PaliGemmaForConditionalGeneration of cfg's vision tower and backbone (eager attention, fp32), loaded strictly
    with the checkpoint's tensors under HF_PREFIX; the LM head is the token embedding (tied, as PaliGemma's).
    image_token_index is the vocabulary size: no prompt id is taken for an image slot."""
    v, g = cfg.vision, cfg.paligemma
    hf_cfg = transformers.PaliGemmaConfig(
        vision_config=dict(hidden_size=v.width, num_hidden_layers=v.depth, num_attention_heads=v.num_heads,
                           intermediate_size=v.mlp_dim, image_size=v.image_size, patch_size=v.patch_size,
                           layer_norm_eps=v.eps, hidden_act="gelu_pytorch_tanh", projection_dim=g.width,
                           vision_use_head=False),
        text_config=dict(hidden_size=g.width, num_hidden_layers=g.depth, num_attention_heads=g.num_heads,
                         num_key_value_heads=g.num_kv_heads, head_dim=g.head_dim, intermediate_size=g.mlp_dim,
                         vocab_size=g.vocab_size, rms_norm_eps=g.eps, hidden_act="gelu_pytorch_tanh",
                         hidden_activation="gelu_pytorch_tanh"),
        projection_dim=g.width, vocab_size=g.vocab_size, image_token_index=g.vocab_size)
    hf_cfg._attn_implementation = "eager"
    hf = transformers.PaliGemmaForConditionalGeneration(hf_cfg).eval()
    weights = {k[len(HF_PREFIX):]: t for k, t in load_file(str(weights_path)).items() if k.startswith(HF_PREFIX)}
    hf_state = hf.state_dict()
    if not any("vision_tower.vision_model." in k for k in hf_state):  # transformers 5 drops this level
        weights = {k.replace("vision_tower.vision_model.", "vision_tower."): t for k, t in weights.items()}
    weights["lm_head.weight"] = weights["model.language_model.embed_tokens.weight"]  # tied
    assert set(hf_state) == set(weights), set(hf_state) ^ set(weights)
    hf.load_state_dict(weights, strict=True)
    return hf
