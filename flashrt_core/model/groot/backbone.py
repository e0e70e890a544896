"""GR00T N1.6's Eagle backbone: SigLIP2 vision encoder, pixel-unshuffle MLP projector, Qwen3 truncated.

Built from transformers' Siglip2VisionModel and Qwen3Model (transformers >= 5 has both); the module tree matches
the checkpoints' names under `backbone.model.`:
  vision_model.vision_model.{embeddings,encoder,post_layernorm}.*   SigLIP2 (the pooling head is not built)
  mlp1.{0,1,3}.*                                                   LN(4C) -> Linear -> GELU -> Linear
  language_model.model.{embed_tokens,layers.<select_layer,norm}.*  Qwen3, its layers past select_layer dropped

Forward (the reference's EagleBackbone + Eagle3_VL with flash-attention packing):
  each image attends to itself only; SigLIP2's post-LayerNorm output is unshuffled 2 x 2 (C, h, w) ->
  (4C, h/2, w/2) in pixel_unshuffle's channel order, projected by mlp1, and written into the prompt's
  image-token slots of the token embeddings; the LLM runs causally and its final RMSNorm output (the last
  entry of the reference's hidden_states) is the backbone feature [B, L, 2048].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Qwen3Config as HFQwen3Config
from transformers import Qwen3Model, Siglip2VisionConfig, Siglip2VisionModel

from flashrt_core.model.groot.config import GrootConfig


def patchify(pixels: torch.Tensor, patch: int) -> torch.Tensor:
    """[N, C, H, W] -> [N, (H/p)(W/p), p*p*C], each patch flattened (row, column, channel) like the reference."""
    n, c, h, w = pixels.shape
    x = pixels.reshape(n, c, h // patch, patch, w // patch, patch).permute(0, 2, 4, 3, 5, 1)
    return x.reshape(n, (h // patch) * (w // patch), patch * patch * c)


def views_by_size(sizes) -> dict[tuple[int, int], list[int]]:
    """(H, W) per view -> {size: the views of that size}, sizes in order of first appearance: the batches the
    vision encoder runs."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, size in enumerate(sizes):
        groups.setdefault(tuple(size), []).append(i)
    return groups


class _Holder(nn.Module):
    """A named level of the checkpoint's module tree."""


class EagleModel(nn.Module):
    def __init__(self, cfg: GrootConfig, attn_implementation: str = "sdpa"):
        super().__init__()
        v, q = cfg.vision, cfg.llm
        vcfg = Siglip2VisionConfig(hidden_size=v.width, intermediate_size=v.mlp_dim, num_hidden_layers=v.depth,
                                   num_attention_heads=v.num_heads, num_channels=3, num_patches=v.num_positions,
                                   patch_size=v.patch_size, hidden_act="gelu_pytorch_tanh", layer_norm_eps=v.eps,
                                   vision_use_head=False)
        vcfg._attn_implementation = attn_implementation
        self.vision_model = _Holder()
        self.vision_model.vision_model = Siglip2VisionModel(vcfg)
        qcfg = HFQwen3Config(vocab_size=q.vocab_size, hidden_size=q.width, intermediate_size=q.mlp_dim,
                             num_hidden_layers=q.num_layers, num_attention_heads=q.num_heads,
                             num_key_value_heads=q.num_kv_heads, head_dim=q.head_dim, rms_norm_eps=q.eps,
                             rope_theta=q.rope_theta, max_position_embeddings=40960, tie_word_embeddings=True,
                             attention_bias=False, use_cache=False)
        qcfg._attn_implementation = attn_implementation
        self.language_model = _Holder()
        self.language_model.model = Qwen3Model(qcfg)
        c4 = v.width * 4
        self.mlp1 = nn.Sequential(nn.LayerNorm(c4), nn.Linear(c4, q.width), nn.GELU(), nn.Linear(q.width, q.width))
        self.cfg = cfg

    def materialize_buffers(self, device: torch.device) -> None:
        """Recompute the non-persistent buffers (Qwen3's RoPE frequencies) of a model built on the meta device
        and then given its checkpoint tensors (load_state_dict(assign=True) does not touch them)."""
        lm = self.language_model.model
        with torch.device(device):
            lm.rotary_emb = type(lm.rotary_emb)(lm.config)

    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [N, 3, H, W] normalized -> projected image tokens [N, (H/2p)(W/2p), llm width]."""
        v = self.cfg.vision
        n, _, h, w = pixels.shape
        gh, gw = h // v.patch_size, w // v.patch_size
        patches = patchify(pixels, v.patch_size)
        shapes = torch.tensor([[gh, gw]] * n, dtype=torch.long, device=pixels.device)
        mask = torch.ones(n, gh * gw, dtype=torch.long, device=pixels.device)
        out = self.vision_model.vision_model(pixel_values=patches, pixel_attention_mask=mask,
                                             spatial_shapes=shapes).last_hidden_state      # [N, gh*gw, C]
        return self.project_vision(out, gh, gw)

    def project_vision(self, out: torch.Tensor, gh: int, gw: int) -> torch.Tensor:
        """SigLIP2 output [N, gh*gw, C] -> 2 x 2 pixel-unshuffled and projected [N, gh*gw/4, llm width]."""
        grid = out.transpose(1, 2).reshape(out.shape[0], -1, gh, gw)
        down = F.pixel_unshuffle(grid, 2).flatten(2).transpose(1, 2)                        # [N, gh*gw/4, 4C]
        return self.mlp1(down)

    def all_image_tokens(self, views, dtype: torch.dtype) -> torch.Tensor:
        """views: [N, 3, H, W] or a list of [3, H_i, W_i] (sizes may differ) -> [sum of tokens, llm width] in
        view order; images of one size run as one batch."""
        if torch.is_tensor(views):
            views = list(views)
        out: list[torch.Tensor | None] = [None] * len(views)
        for idxs in views_by_size([tuple(v.shape[-2:]) for v in views]).values():
            feats = self.image_features(torch.stack([views[i] for i in idxs]).to(dtype))
            for i, f in zip(idxs, feats):
                out[i] = f
        return torch.cat(out, dim=0)

    def forward(self, views, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """views: every image of the batch in prompt order ([N, 3, H, W] or a list of [3, H_i, W_i]),
        input_ids / attention_mask [B, L] -> backbone features [B, L, llm width]"""
        embeds = self.language_model.model.embed_tokens(input_ids)
        vit = self.all_image_tokens(views, embeds.dtype)
        selected = input_ids == self.cfg.image_token_index
        if int(selected.sum()) != vit.shape[0]:
            raise ValueError(f"the prompt has {int(selected.sum())} image-token slots for {vit.shape[0]} image "
                             "tokens")
        embeds = embeds.masked_scatter(selected.unsqueeze(-1), vit.to(embeds.dtype))
        out = self.language_model.model(inputs_embeds=embeds, attention_mask=attention_mask.long(),
                                        use_cache=False)
        return out.last_hidden_state


class EagleBackbone(nn.Module):
    """The checkpoint's `backbone` module: `model` is the Eagle model."""

    def __init__(self, cfg: GrootConfig, attn_implementation: str = "sdpa"):
        super().__init__()
        self.model = EagleModel(cfg, attn_implementation)
        self.cfg = cfg

    def forward(self, views, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """-> (features [B, L, D], attention_mask [B, L] bool, image_mask [B, L] bool)"""
        feats = self.model(views, input_ids, attention_mask)
        return feats, attention_mask.bool(), input_ids == self.cfg.image_token_index
