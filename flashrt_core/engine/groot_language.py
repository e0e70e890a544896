"""GR00T N1.6's language model (Qwen3, truncated after select_layer layers) on the engine's ops
(EngineOptions.groot_engine_language).

The reference layer (transformers' Qwen3DecoderLayer; RMSNorm without the Gemma offset, eps from the config):

    h   = x + o(attn(rope(q_norm(q(n))), rope(k_norm(k(n))), v(n)))      n = rms(x) * w_in, causal GQA attention
    out = h + down(silu(gate(m)) * up(m))                                  m = rms(h) * w_post

and the model's output is the final norm's, rms(x) * w_final. Here, per layer:

    norm      Ops.norm: the previous layer's MLP output added to the fp32 residual stream (B * L, D) in place and
              RMS-normalized with w_in, one kernel
    Q/K/V     one GEMM over the merged [W_q; W_k; W_v]
    heads     Ops.qkv_rope with head_norm: q_norm / k_norm, RoPE (Qwen3's rope_theta) and the split in one kernel,
              q scaled by 1/sqrt(Dh), written as [B, L, heads, Dh] memory (the flash kernel's own layout), viewed
              as [B, heads, L, Dh] for the attention with no copy
    attention Ops.causal_attention (SDPA's causal GQA kernel, given no mask where the prompt has none or all its
              padding at its end: groot_static.language_features; else its mask, made additive once per predict, on
              the masked kernel), its output viewed as the O projection's input rows
    O, norm   the O GEMM; Ops.norm adds it to the stream and normalizes with w_post
    MLP       one GEMM over the merged [W_gate; W_up], Ops.swiglu (GeGLU's kernel with SiLU), the down GEMM
and after the last layer Ops.norm with w_final. The merged weights are made once per executor, and the model's own
q/k/v and gate/up weights become views into them (the merged tensors are the only copy in memory), so the
transformers path, the reference executor and this one read the same storage.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashrt_core.model.groot.model import GrootModel

from .groot_fused_dit import additive_mask
from .kernel_import import load_kernels
from .ops import Ops
from .weights import Linear, _f32, merge_in_place


@dataclass
class LanguageLayer:
    qkv: Linear                  # [W_q; W_k; W_v], no bias
    o: Linear
    gate_up: Linear              # [W_gate; W_up]
    down: Linear
    norm_in: torch.Tensor        # (D,) fp32: input_layernorm's weight
    norm_post: torch.Tensor      # (D,) fp32: post_attention_layernorm's weight
    head_norm: torch.Tensor      # (2, Dh) fp32: q_norm's and k_norm's weights


@dataclass
class EngineLanguage:
    """The language model's weights as the engine reads them, and the Ops it runs them with."""

    ops: Ops
    layers: list[LanguageLayer]
    final_norm: torch.Tensor     # (D,) fp32
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    rope_theta: float

    def rope(self, batch: int, length: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        """(positions (batch * length,) int32, cos, sin (length, Dh / 2) fp32): positions 0..L-1 of every prompt,
        as the reference's position_ids, and Qwen3's rotation tables (made in float64, as rope_tables does)."""
        cos, sin = load_kernels().rope_tables(length, self.head_dim, self.rope_theta, device)
        pos = torch.arange(length, device=device, dtype=torch.int32).repeat(batch)
        return pos, cos, sin


@torch.no_grad()
def prepare_language(model: GrootModel, ops: Ops) -> EngineLanguage:
    """The kept Qwen3 layers' weights: Q/K/V and gate/up merged (the model's weights become views into them), the
    norms' weights in fp32. Refuses a checkpoint whose layers carry biases (Qwen3 has none)."""
    lm = model.backbone.model.language_model.model
    cfg = model.cfg.llm
    layers = []
    for layer in lm.layers[: lm.config.num_hidden_layers]:
        att, mlp = layer.self_attn, layer.mlp
        linears = (att.q_proj, att.k_proj, att.v_proj, att.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        if any(m.bias is not None for m in linears):
            raise ValueError("the engine's Qwen3 layers take no biases (attention_bias is off in Qwen3); turn "
                             "groot_engine_language off for this checkpoint")
        layers.append(LanguageLayer(
            qkv=merge_in_place([att.q_proj, att.k_proj, att.v_proj]), o=Linear([(att.o_proj.weight.detach(), None)]),
            gate_up=merge_in_place([mlp.gate_proj, mlp.up_proj]), down=Linear([(mlp.down_proj.weight.detach(), None)]),
            norm_in=_f32(layer.input_layernorm.weight), norm_post=_f32(layer.post_attention_layernorm.weight),
            head_norm=torch.stack([_f32(att.q_norm.weight), _f32(att.k_norm.weight)]).contiguous()))
    return EngineLanguage(ops, layers, _f32(lm.norm.weight), cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.eps,
                          cfg.rope_theta)


def language_model(lang: EngineLanguage, rope: tuple[torch.Tensor, ...], embeds: torch.Tensor,
                   mask: torch.Tensor | None) -> torch.Tensor:
    """embeds [B, L, D] (image tokens in their slots) -> the final norm's output [B, L, D] in embeds' dtype.
    rope: EngineLanguage.rope's tables for (B, L); mask: None (causal alone) or the (B, 1, L, L) boolean mask of a
    padded prompt."""
    ops, heads, groups, dh = lang.ops, lang.heads, lang.kv_heads, lang.head_dim
    b, length, d = embeds.shape
    rows = b * length
    dtype, dev = embeds.dtype, embeds.device
    residual = embeds.reshape(rows, d).to(torch.float32, copy=True)
    y = torch.empty(rows, d, device=dev, dtype=dtype)
    q = torch.empty(b, length, heads, dh, device=dev, dtype=dtype)          # [B, L, H, Dh] memory
    k = torch.empty(b, length, groups, dh, device=dev, dtype=dtype)
    v = torch.empty_like(k)
    k_rows, v_rows = (t.view(rows, groups, dh).transpose(0, 1) for t in (k, v))   # (G, B * L, Dh) views
    pos, cos, sin = rope
    if mask is not None:
        mask = additive_mask(mask, dtype)
    x = None
    for layer in lang.layers:
        ops.norm(x, residual, y, layer.norm_in, None, lang.eps)
        qkv = ops.linear(y, layer.qkv)                                       # (B * L, (H + 2G) Dh)
        ops.qkv_rope(qkv, pos, cos, sin, q.view(rows, heads, dh), k_rows, v_rows, 0, heads, groups, dh ** -0.5,
                     head_norm=layer.head_norm, norm_eps=lang.eps)
        attn = ops.causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask)   # (B, H, L, Dh)
        o = ops.linear(attn.transpose(1, 2).reshape(rows, heads * dh), layer.o)
        ops.norm(o, residual, y, layer.norm_post, None, lang.eps)
        x = ops.linear(ops.swiglu(ops.linear(y, layer.gate_up)), layer.down)
    out = torch.empty(rows, d, device=dev, dtype=dtype)
    ops.norm(x, residual, out, lang.final_norm, None, lang.eps)
    return out.view(b, length, d)
