"""Gemma building blocks and the joint two-expert layer stack used by pi0 / pi0.5.

Formulas (openpi / big_vision Gemma, see REFERENCE.md section 1):
  RMSNorm     y = x * rsqrt(mean(x^2) + eps) * (1 + w)          variance in fp32
  adaRMSNorm  scale, shift, gate = split(Dense(cond), 3);  y = rms(x) * (1 + scale) + shift
  MLP         down(gelu_tanh(gate(x)) * up(x))
  RoPE        split-half (rotate_half) form, max wavelength 10000, computed in fp32
  attention   MQA; q scaled by head_dim^-0.5; logits and softmax in fp32; boolean masks
Joint attention: each expert normalizes and projects its own tokens; q/k/v of all experts are concatenated
along the sequence, attended once, split back, and finished (o_proj, residual, MLP) by each expert.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from flashrt_core.config import GemmaConfig

# Large negative logit for masked keys (openpi's value); finite so an all-masked row cannot produce NaN.
MASKED_LOGIT = -2.3819763e38

KVCache = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (k [B, T, KV, D] after RoPE, v [B, T, KV, D])


def rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps), in fp32.  x: [..., W] -> fp32 [..., W]"""
    x32 = x.float()
    return x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    """Gemma RMSNorm with a zero-centred weight: rms(x) * (1 + w)."""

    def __init__(self, width: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(width))

    def forward(self, x: torch.Tensor, cond: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        # x: [B, S, W] -> (y [B, S, W] in x.dtype, no gate)
        return (rms(x, self.eps) * (1.0 + self.weight.float())).to(x.dtype), None


class AdaRMSNorm(nn.Module):
    """pi0.5 adaptive RMSNorm: the time conditioning produces scale, shift and a residual gate."""

    def __init__(self, width: int, cond_dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.dense = nn.Linear(cond_dim, 3 * width)

    def forward(self, x: torch.Tensor, cond: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        # x: [B, S, W], cond: [B, C] or per token [B, S, C] -> (y [B, S, W], gate [B, 1 or S, W]) in x.dtype
        if cond is None:
            raise ValueError("AdaRMSNorm needs the time conditioning `cond`")
        modulation = self.dense(cond.to(self.dense.weight.dtype))  # [B, 3W] or [B, S, 3W]
        if modulation.dim() == 2:
            modulation = modulation[:, None, :]
        scale, shift, gate = modulation.float().chunk(3, dim=-1)  # each [B, 1 or S, W]
        y = rms(x, self.eps) * (1.0 + scale) + shift
        return y.to(x.dtype), gate.to(x.dtype)


def gated_residual(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    """x + y * gate (plain residual when gate is None)."""
    return x + y if gate is None else x + y * gate


def rope(x: torch.Tensor, positions: torch.Tensor, max_wavelength: float) -> torch.Tensor:
    """Split-half rotary embedding.  x: [B, S, N, D], positions: [B, S] int -> [B, S, N, D] in x.dtype"""
    head_dim = x.shape[-1]
    exponent = torch.arange(0, head_dim, 2, device=x.device, dtype=torch.float32) / head_dim  # [D/2]
    inv_freq = 1.0 / (max_wavelength ** exponent)
    angles = positions.float()[..., None] * inv_freq  # [B, S, D/2]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)[:, :, None, :]  # [B, S, 1, D]
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1)[:, :, None, :]
    x32 = x.float()
    x1, x2 = x32.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x32 * cos + rotated * sin).to(x.dtype)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Multi-query attention with a boolean mask (True = may attend).

    q: [B, S, H, D], k/v: [B, T, KV, D], mask: [B, S, T] bool -> [B, S, H*D] in v.dtype
    """
    batch, seq, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    q = q.reshape(batch, seq, kv_heads, heads // kv_heads, head_dim)  # [B, S, KV, G, D]
    logits = torch.einsum("bskgd,btkd->bkgst", q.float(), k.float()) * head_dim**-0.5  # [B, KV, G, S, T]
    logits = torch.where(mask[:, None, None, :, :], logits, MASKED_LOGIT)
    probs = torch.softmax(logits, dim=-1).to(v.dtype)
    out = torch.einsum("bkgst,btkd->bskgd", probs, v)  # [B, S, KV, G, D]
    return out.reshape(batch, seq, heads * head_dim)


class GemmaLayer(nn.Module):
    """One decoder block, split into the part before joint attention (qkv) and after it (finish)."""

    def __init__(self, cfg: GemmaConfig, cond_dim: int | None = None):
        super().__init__()
        self.cfg = cfg
        width, heads, kv, head_dim = cfg.width, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        norm = (lambda: RMSNorm(width, cfg.eps)) if cond_dim is None else (lambda: AdaRMSNorm(width, cond_dim, cfg.eps))
        self.input_layernorm = norm()
        self.q_proj = nn.Linear(width, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(width, kv * head_dim, bias=False)
        self.v_proj = nn.Linear(width, kv * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, width, bias=False)
        self.post_attention_layernorm = norm()
        self.gate_proj = nn.Linear(width, cfg.mlp_dim, bias=False)
        self.up_proj = nn.Linear(width, cfg.mlp_dim, bias=False)
        self.down_proj = nn.Linear(cfg.mlp_dim, width, bias=False)

    def qkv(self, x: torch.Tensor, positions: torch.Tensor, cond: torch.Tensor | None = None):
        """x: [B, S, W], positions: [B, S] -> q [B, S, H, D], k/v [B, S, KV, D] (RoPE on q, k), attn gate"""
        cfg = self.cfg
        batch, seq, _ = x.shape
        y, gate = self.input_layernorm(x, cond)
        q = self.q_proj(y).view(batch, seq, cfg.num_heads, cfg.head_dim)
        k = self.k_proj(y).view(batch, seq, cfg.num_kv_heads, cfg.head_dim)
        v = self.v_proj(y).view(batch, seq, cfg.num_kv_heads, cfg.head_dim)
        q = rope(q, positions, cfg.rope_max_wavelength)
        k = rope(k, positions, cfg.rope_max_wavelength)
        return q, k, v, gate

    def finish(self, x: torch.Tensor, attn_out: torch.Tensor, attn_gate: torch.Tensor | None,
               cond: torch.Tensor | None = None) -> torch.Tensor:
        """x: [B, S, W] residual stream, attn_out: [B, S, H*D] -> [B, S, W]"""
        x = gated_residual(x, self.o_proj(attn_out), attn_gate)
        y, gate = self.post_attention_layernorm(x, cond)
        mlp = self.down_proj(F.gelu(self.gate_proj(y), approximate="tanh") * self.up_proj(y))
        return gated_residual(x, mlp, gate)


class GemmaStack(nn.Module):
    """The layers and final norm of one expert (no embedding; pi0 feeds embeddings in directly)."""

    def __init__(self, cfg: GemmaConfig, cond_dim: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(GemmaLayer(cfg, cond_dim) for _ in range(cfg.depth))
        self.norm = RMSNorm(cfg.width, cfg.eps) if cond_dim is None else AdaRMSNorm(cfg.width, cond_dim, cfg.eps)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                past_kv: KVCache | None = None, cond: torch.Tensor | None = None,
                return_kv: bool = False) -> tuple[torch.Tensor, KVCache]:
        """Run this expert alone over its tokens, optionally attending to cached keys/values in front.

        x: [B, S, W], positions: [B, S], mask: [B, S, T + S] bool (T = cached length, 0 without cache),
        past_kv: per layer (k [B, T, KV, D], v [B, T, KV, D]) -> (normed out [B, S, W], this run's KV if asked)
        """
        new_kv: KVCache = []
        for i, layer in enumerate(self.layers):
            q, k, v, gate = layer.qkv(x, positions, cond)
            if return_kv:
                new_kv.append((k, v))
            if past_kv is not None:
                k = torch.cat([past_kv[i][0], k], dim=1)  # [B, T + S, KV, D]
                v = torch.cat([past_kv[i][1], v], dim=1)
            x = layer.finish(x, attention(q, k, v, mask), gate, cond)
        return self.norm(x, cond)[0], new_kv


def joint_forward(stacks: tuple[GemmaStack, GemmaStack], xs: tuple[torch.Tensor, torch.Tensor],
                  positions: torch.Tensor, mask: torch.Tensor,
                  conds: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)):
    """Both experts in one pass over the joint sequence [x0; x1] (the training-time form).

    xs: ([B, S0, W0], [B, S1, W1]), positions: [B, S0 + S1], mask: [B, S0 + S1, S0 + S1]
    -> ([B, S0, W0], [B, S1, W1]) after each expert's final norm
    """
    split = xs[0].shape[1]
    pos = (positions[:, :split], positions[:, split:])
    xs = list(xs)
    for layer_pair in zip(stacks[0].layers, stacks[1].layers):
        parts = [layer.qkv(x, p, c) for layer, x, p, c in zip(layer_pair, xs, pos, conds)]
        q = torch.cat([part[0] for part in parts], dim=1)  # [B, S0 + S1, H, D]
        k = torch.cat([part[1] for part in parts], dim=1)
        v = torch.cat([part[2] for part in parts], dim=1)
        out = attention(q, k, v, mask)  # [B, S0 + S1, H*D]
        outs = (out[:, :split], out[:, split:])
        xs = [layer.finish(x, o, part[3], c) for layer, x, o, part, c in zip(layer_pair, xs, outs, parts, conds)]
    return tuple(stack.norm(x, c)[0] for stack, x, c in zip(stacks, xs, conds))
