"""GR00T N1.6's DiT on the engine's fused ops (EngineOptions.groot_fused_dit, on top of groot_step_tables).

The reference block (model/groot/dit.py TransformerBlock) is pre-norm with plain (ungated) residual adds:

    x = x + attn1(LN(x) (1 + scale) + shift)          AdaLayerNorm, scale / shift from the step's timestep
    x = x + ff(LN(x))                                  norm3 without an affine, GELU-tanh MLP

and the DiT ends with LN(x) (1 + scale) + shift (proj_out_1's modulation), then proj_out_2. Here the residual
stream x is one fp32 (B * T, D) buffer, and each residual add runs inside the norm that follows it
(Ops.norm: residual += x in place, out = LayerNorm(residual) * weight + bias, one kernel), with weight = 1 + scale
and bias = shift from the step tables (groot_dit.StepTables; the timestep is the same for every batch row, so one
(D,) row serves the whole batch). Per block:

    norm(pending, residual) -> AdaLN          the previous block's MLP output added (before block 0: nothing, or
                                              with the step ends the action encoder's W3 output,
                                              engine/groot_step_ends.py)
    Q/K/V: one merged GEMM (self-attention blocks) or Q alone (cross-attention blocks: K / V of the backbone
           features once per predict, every cross block's in one GEMM over their merged [W_k; W_v]
           (context_projections; the model's to_k / to_v weights become views into the merged tensor), with the
           block's text-only / image-only mask)
    attention: Ops.head_attention (flashrt_kernels/head_attention.py: Q, K, V read in place from the GEMM's output,
           the result written as the O projection's input rows; EngineOptions.groot_head_attention), else torch
           SDPA and a transpose copy; the cross masks additive and aligned, made once per predict; the output
           projection
    norm(attention output, residual) -> norm3, linear_gelu (GELU in the GEMM's epilogue on the GPU), linear
and after the last block norm(pending, residual) with the output modulation, then proj_out_2. GEMM inputs are in
the model's dtype (bf16 on the GPU), so the chunk differs from the reference's by rounding alone
(test/core/test_groot_fused_dit.py compares them with the plain-PyTorch ops on the CPU). With groot_few_row_gemms
or FP8 (engine/groot_dit_gemms.py) the blocks' GEMMs run on the few-row GEMM (FusedDit.few_row), bias and GELU in its
epilogue; with FP8 they read weight-only E4M3 copies of the weights.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from flashrt_core.model.groot.action_head import GrootActionHead

from .groot_dit import StepTables, _heads, context_kv, euler_steps
from .groot_step_ends import EmbodimentWeights, sample_steps
from .ops import Ops
from .weights import Linear, _fold, merge_in_place

FINAL_NORM_EPS = 1e-6          # the DiT's final LayerNorm (dit.DiT.forward)
MASK_ALIGN = 16                # key-mask rows padded to this many elements (SDPA's memory-efficient kernel's need)


@dataclass
class FusedBlock:
    cross: bool
    qkv: Linear                # self-attention: [Q; K; V] merged; cross-attention: Q alone
    out: Linear
    ff1: Linear                # GELU-tanh after it
    ff2: Linear
    ada_eps: float
    ff_eps: float


@dataclass
class FusedDit:
    """The DiT's weights as the fused path reads them, and the Ops it runs them with (made once per executor)."""

    ops: Ops
    blocks: list[FusedBlock]
    proj_out: Linear
    heads: int
    inner: int                 # heads * head_dim
    dtype: torch.dtype
    context: Linear | None = None   # every cross-attention block's [W_k; W_v], merged: one GEMM per predict
    context_offsets: dict = field(default_factory=dict)   # block index -> its K columns' start in the merged output
    few_row: dict = field(default_factory=dict)   # id(Linear) -> its few-row GEMM's config (engine/groot_dit_gemms.py)
    head_attention: bool = True   # attention by Ops.head_attention (EngineOptions.groot_head_attention), else SDPA


def _single(module: torch.nn.Linear) -> Linear:
    """The module's own weight and bias (no copy: the fused path shares the model's tensors)."""
    return Linear([(module.weight.detach(), None if module.bias is None else module.bias.detach())])


@torch.no_grad()
def prepare_fused_dit(head: GrootActionHead, ops: Ops) -> FusedDit:
    """The DiT's GEMMs as Linears: Q/K/V of each self-attention block merged into one block (a copy), K/V of every
    cross-attention block merged into one (merge_in_place: the model's weights become views into it), the others
    the model's tensors as they are."""
    dit = head.model
    dtype = dit.proj_out_2.weight.dtype
    blocks = []
    for block in dit.transformer_blocks:
        attn = block.attn1
        if block.is_cross:
            qkv = _single(attn.to_q)
        else:
            mods = (attn.to_q, attn.to_k, attn.to_v)
            qkv = _fold([m.weight for m in mods], [m.bias for m in mods], None, None, dtype, merge=True)
        blocks.append(FusedBlock(block.is_cross, qkv, _single(attn.to_out[0]), _single(block.ff.net[0].proj),
                                 _single(block.ff.net[2]), block.norm1.eps, block.eps))
    inner = dit.cfg.num_heads * dit.cfg.head_dim
    cross = [(idx, block.attn1) for idx, block in enumerate(dit.transformer_blocks) if block.is_cross]
    context = merge_in_place([m for _, attn in cross for m in (attn.to_k, attn.to_v)]) if cross else None
    return FusedDit(ops, blocks, _single(dit.proj_out_2), dit.cfg.num_heads, inner, dtype, context,
                    {idx: 2 * inner * i for i, (idx, _) in enumerate(cross)})


def context_projections(fused: FusedDit, context: torch.Tensor) -> dict | None:
    """Every cross-attention block's (K, V) [B, L, inner] of the backbone features from one GEMM over the merged
    weights (strided column views of its output, which the attention reads in place); None without cross blocks."""
    if fused.context is None:
        return None
    b, length, d = context.shape
    kv = fused.ops.linear(context.reshape(b * length, d), fused.context).view(b, length, -1)
    inner = fused.inner
    return {idx: (kv[..., off:off + inner], kv[..., off + inner:off + 2 * inner])
            for idx, off in fused.context_offsets.items()}


class FusedStepTables:
    """StepTables' modulations as the norm kernel's (D,) fp32 weight / bias rows: [step][block] (1 + scale, shift)
    and [step] the output modulation's. Every batch row has the step's timestep, so row 0 serves them all."""

    def __init__(self, steps: StepTables):
        row = lambda t: t[0, 0].float().contiguous()  # noqa: E731
        self.ada = [[(row(s), row(b)) for s, b in step] for step in steps.ada]
        self.out_mod = [(row(s), row(b)) for s, b in steps.out_mod]

    def to(self, device: torch.device | str) -> FusedStepTables:
        self.ada = [[(s.to(device), b.to(device)) for s, b in step] for step in self.ada]
        self.out_mod = [(s.to(device), b.to(device)) for s, b in self.out_mod]
        return self


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (..., L) -> 0 where seen, -inf elsewhere, in dtype, its rows views into a buffer padded to
    MASK_ALIGN elements (SDPA's memory-efficient kernel reads aligned rows; an unaligned mask it pads per call)."""
    keys = mask.shape[-1]
    buf = torch.full((*mask.shape[:-1], -(-keys // MASK_ALIGN) * MASK_ALIGN), float("-inf"), dtype=dtype,
                     device=mask.device)
    return buf[..., :keys].masked_fill_(mask, 0.0)


def additive_masks(kv: dict) -> dict:
    """context_kv's (K, V, bool key mask) -> (K, V, additive mask): 0 where a key is seen, -inf elsewhere, in K's
    dtype, each row a view into a buffer padded to MASK_ALIGN elements. SDPA converts a bool mask to exactly this
    (where(~mask, -inf, 0)) and pads an unaligned one, in every call; here both happen once per predict and mask
    kind (the blocks of one kind share their mask)."""
    converted: dict[int, torch.Tensor] = {}
    out = {}
    for idx, (key, value, mask) in kv.items():
        if mask is not None and id(mask) not in converted:
            converted[id(mask)] = additive_mask(mask, key.dtype)
        out[idx] = (key, value, None if mask is None else converted[id(mask)])
    return out


def _gemm(fused: FusedDit, x: torch.Tensor, lin: Linear, gelu: bool = False) -> torch.Tensor:
    """x @ W^T + b (gelu: its tanh GELU): on the few-row GEMM where engine/groot_dit_gemms.py gave the layer a launch
    configuration (its weight-only FP8 weights when it has them; the output projection and the MLP's down GEMM may
    return split-K partials, which the norm after them sums), else the library GEMM (the GELU in cuBLASLt's
    epilogue)."""
    cfg = fused.few_row.get(id(lin))
    if cfg is not None:
        return fused.ops.few_row_linear(x, lin, cfg, gelu=gelu)
    return fused.ops.linear_gelu(x, lin) if gelu else fused.ops.linear(x, lin)


def _dit(fused: FusedDit, mods: FusedStepTables, k: int, kv: dict, residual: torch.Tensor,
         pending: torch.Tensor | None = None) -> torch.Tensor:
    """The DiT's blocks, final modulated LayerNorm and proj_out_2 at step k: the tokens [B, T, D] as the fp32
    residual stream (updated in place; pending: what the first norm adds to it first, or None) -> [B, T, out]."""
    ops, heads, inner = fused.ops, fused.heads, fused.inner
    b, t, d = residual.shape
    residual = residual.view(b * t, d)
    normed = torch.empty(b * t, d, device=residual.device, dtype=fused.dtype)
    for idx, block in enumerate(fused.blocks):
        scale1, shift = mods.ada[k][idx]
        ops.norm(pending, residual, normed, scale1, shift, block.ada_eps, layer_norm=True)
        proj = _gemm(fused, normed, block.qkv).view(b, t, -1)
        q = _heads(proj[..., :inner], heads)
        if block.cross:
            key, value, mask = kv[idx]
        else:
            key, value, mask = _heads(proj[..., inner:2 * inner], heads), _heads(proj[..., 2 * inner:], heads), None
        if fused.head_attention:      # from the Q/K/V GEMM's output in place to the O projection's input rows
            attn = ops.head_attention(q, key, value, None if mask is None else mask[:, 0, 0, :], q.shape[-1] ** -0.5)
        else:
            attn = F.scaled_dot_product_attention(q, key, value, attn_mask=mask).transpose(1, 2).reshape(b * t, inner)
        attn = _gemm(fused, attn, block.out)
        ops.norm(attn, residual, normed, None, None, block.ff_eps, layer_norm=True)
        pending = _gemm(fused, _gemm(fused, normed, block.ff1, gelu=True), block.ff2)
    scale1, shift = mods.out_mod[k]
    ops.norm(pending, residual, normed, scale1, shift, FINAL_NORM_EPS, layer_norm=True)
    return _gemm(fused, normed, fused.proj_out).view(b, t, -1)


def sample_actions_fused(head: GrootActionHead, tables: StepTables, mods: FusedStepTables, fused: FusedDit,
                         backbone_features: torch.Tensor, backbone_mask: torch.Tensor, image_mask: torch.Tensor,
                         state: torch.Tensor, embodiment_id: torch.Tensor, noise: torch.Tensor,
                         embodiment: EmbodimentWeights | None = None) -> torch.Tensor:
    """groot_dit.sample_actions_tabled with the DiT on the fused ops -> normalized actions [B, horizon, A].
    embodiment: the signature's one embodiment's weights and step bias rows (engine/groot_step_ends.py, made once
    outside the graph; embodiment_id is then not read), else each row's weights gathered here and the reference's
    step ops (groot_dit.euler_steps)."""
    if embodiment is None:
        vl_embeds, state_features = head.encode(backbone_features, state, embodiment_id)
    else:
        vl_embeds, state_features = head.vlln(backbone_features), embodiment.state_features(state)
    kv = additive_masks(context_kv(head.model, vl_embeds, image_mask, backbone_mask,
                                   context_projections(fused, vl_embeds)))
    actions = noise.to(vl_embeds.dtype)
    if embodiment is None:
        return euler_steps(head, tables, state_features, actions, embodiment_id,
                           lambda k, tokens: _dit(fused, mods, k, kv, tokens.to(torch.float32, copy=True)))
    return sample_steps(embodiment, fused.ops,
                        lambda k, residual, pending: _dit(fused, mods, k, kv, residual, pending),
                        state_features, actions)
