"""The GR00T N1.6 flow-matching DiT (diffusers-style blocks), with the parameter names of the checkpoints.

  timestep_encoder.timestep_embedder.linear_{1,2}   sinusoidal(256, cos first, shift 1) -> MLP(SiLU)
  transformer_blocks.{i}.norm1.linear               AdaLayerNorm: LN(x) (1 + scale) + shift, [scale; shift]
  transformer_blocks.{i}.attn1.to_{q,k,v}, to_out.0 cross-attention to the backbone features (even i)
                                                    or self-attention (odd i, interleave_self_attention)
  transformer_blocks.{i}.ff.net.0.proj, ff.net.2    GELU(tanh) MLP, 4 x width; norm3 has no parameters
  proj_out_1, proj_out_2                            final LN modulated by the timestep embedding, [shift; scale]
AlternateVLDiT: cross-attention blocks with i % (2 * attend_text_every_n_blocks) == 0 see the text tokens only,
the other cross-attention blocks the image tokens only (both within the backbone's attention mask).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from flashrt_core.model.groot.config import DiTConfig

TIME_PROJ_CHANNELS = 256


def timestep_projection(timesteps: torch.Tensor, channels: int = TIME_PROJ_CHANNELS) -> torch.Tensor:
    """diffusers Timesteps(channels, flip_sin_to_cos=True, downscale_freq_shift=1): [cos, sin] of t f_i,
    f_i = exp(-ln(10000) i / (channels/2 - 1)). timesteps [B] -> [B, channels] fp32."""
    half = channels // 2
    exponent = -math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=timesteps.device) / (half - 1)
    emb = timesteps.float()[:, None] * torch.exp(exponent)[None]
    return torch.cat([torch.cos(emb), torch.sin(emb)], dim=-1)


class TimestepEmbedding(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.linear_1 = nn.Linear(TIME_PROJ_CHANNELS, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


class TimestepEncoder(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.timestep_embedder = TimestepEmbedding(dim)

    def forward(self, timesteps: torch.Tensor) -> torch.Tensor:
        dtype = self.timestep_embedder.linear_1.weight.dtype
        return self.timestep_embedder(timestep_projection(timesteps).to(dtype))


class AdaLayerNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.linear = nn.Linear(dim, 2 * dim)
        self.eps = eps

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        scale, shift = self.linear(F.silu(temb)).chunk(2, dim=1)
        return F.layer_norm(x, x.shape[-1:], eps=self.eps) * (1 + scale[:, None]) + shift[:, None]


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, head_dim: int, kv_dim: int | None):
        super().__init__()
        inner = heads * head_dim
        self.heads = heads
        self.to_q = nn.Linear(dim, inner)
        self.to_k = nn.Linear(kv_dim or dim, inner)
        self.to_v = nn.Linear(kv_dim or dim, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim)])

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """x [B, T, D], context [B, S, Dc] or None (self-attention), mask [B, S] bool (True: attend)."""
        src = x if context is None else context
        b = x.shape[0]
        q = self.to_q(x).view(b, x.shape[1], self.heads, -1).transpose(1, 2)
        k = self.to_k(src).view(b, src.shape[1], self.heads, -1).transpose(1, 2)
        v = self.to_v(src).view(b, src.shape[1], self.heads, -1).transpose(1, 2)
        attn_mask = None if mask is None else mask[:, None, None, :]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.to_out[0](out.transpose(1, 2).reshape(b, x.shape[1], -1))


class FeedForward(nn.Module):
    """diffusers FeedForward(activation_fn="gelu-approximate"): net.0.proj -> tanh-GELU -> net.2."""

    def __init__(self, dim: int, mult: int = 4):
        super().__init__()
        proj = nn.Module()
        proj.proj = nn.Linear(dim, mult * dim)
        self.net = nn.ModuleList([proj, nn.Identity(), nn.Linear(mult * dim, dim)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net[2](F.gelu(self.net[0].proj(x), approximate="tanh"))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, heads: int, head_dim: int, cross_attention_dim: int | None, eps: float):
        super().__init__()
        self.norm1 = AdaLayerNorm(dim)
        self.attn1 = Attention(dim, heads, head_dim, cross_attention_dim)
        self.ff = FeedForward(dim)
        self.eps = eps
        self.is_cross = cross_attention_dim is not None

    def forward(self, x: torch.Tensor, temb: torch.Tensor, context: torch.Tensor | None,
                mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.attn1(self.norm1(x, temb), context, mask)
        return x + self.ff(F.layer_norm(x, x.shape[-1:], eps=self.eps))


class DiT(nn.Module):
    def __init__(self, cfg: DiTConfig, cross_attention_dim: int):
        super().__init__()
        self.cfg = cfg
        dim = cfg.inner_dim
        self.timestep_encoder = TimestepEncoder(dim)
        self.transformer_blocks = nn.ModuleList(
            TransformerBlock(dim, cfg.num_heads, cfg.head_dim,
                             None if self.is_self_attention(i) else cross_attention_dim, cfg.eps)
            for i in range(cfg.num_layers))
        self.proj_out_1 = nn.Linear(dim, 2 * dim)
        self.proj_out_2 = nn.Linear(dim, cfg.output_dim)

    def is_self_attention(self, idx: int) -> bool:
        return self.cfg.interleave_self_attention and idx % 2 == 1

    def cross_mask(self, idx: int, image_mask: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor | None:
        """Which backbone tokens cross-attention block `idx` sees: all valid ones (DiT), or alternately the text
        and the image tokens (AlternateVLDiT). The plain DiT of the reference passes no mask at all."""
        if not self.cfg.alternate_vl:
            return None
        if idx % (2 * self.cfg.attend_text_every_n_blocks) == 0:
            return ~image_mask & attention_mask
        return image_mask & attention_mask

    def forward(self, hidden: torch.Tensor, context: torch.Tensor, timesteps: torch.Tensor,
                image_mask: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """hidden [B, T, inner], context [B, S, Dc], timesteps [B] discrete buckets, masks [B, S] bool
        -> [B, T, output_dim]"""
        temb = self.timestep_encoder(timesteps)
        for idx, block in enumerate(self.transformer_blocks):
            if block.is_cross:
                hidden = block(hidden, temb, context, self.cross_mask(idx, image_mask, attention_mask))
            else:
                hidden = block(hidden, temb, None, None)
        shift, scale = self.proj_out_1(F.silu(temb)).chunk(2, dim=1)
        hidden = F.layer_norm(hidden, hidden.shape[-1:], eps=1e-6) * (1 + scale[:, None]) + shift[:, None]
        return self.proj_out_2(hidden)
