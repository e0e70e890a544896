"""GR00T N1.6's vision tower on the engine's ops (EngineOptions.groot_engine_vision): SigLIP2's patch embedding,
encoder layers and post-LayerNorm, and Eagle's 2 x 2 pixel-unshuffle projector (model/groot/backbone.py), with the
pi engine's SigLIP encoder (forward.vision_encoder over weights.vision_layers): per layer the residual add and
LayerNorm in one norm kernel over an fp32 residual stream, Q/K/V in one GEMM (LayerNorm scale and shift folded
into it and into fc1), the unmasked attention by Ops.attention, fc1's bias and tanh GELU in the GEMM's epilogue on
the GPU, and the MLP's width padded (EngineOptions.vision_mlp_pad). GEMM inputs are in the model's dtype.

Row order. The patch rows of each view are laid out in 2 x 2 blocks, (block row, block column, i, j) with the patch
at (2 * block row + i, 2 * block column + j), instead of the reference's raster order: the encoder does not see
the order (the position embedding rides on each row, every row attends to every row of its image), and then the
four rows of one block, contiguous, are one (4 * C) row of the pixel unshuffle with no copy. That row lists the
channels as (i, j, c); pixel_unshuffle lists them as (c, i, j), so the projector's LayerNorm weight and bias and the
first Linear's input columns are permuted to match once here (a LayerNorm does not see the order of its features).
The image tokens come out in the reference's order (block row, block column).

Per predict and view size (views of one size run as one batch, as the reference does): one copy per view of its
pixels into the patch rows (model dtype, the rows padded with zero columns to a multiple of 8: 16-byte rows for
cuBLAS), the patch GEMM, one add of the position embedding plus the patch bias (per size, fp32, made with the
signature's tables), the encoder, the post-LayerNorm written in fp32, the projector's LayerNorm (its affine folded
into the first Linear when `fold`), the Linear, exact (erf) GELU (nn.GELU(), so not the tanh epilogue), the Linear.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from flashrt_core.model.groot.model import GrootModel

from .forward import vision_encoder
from .ops import Ops
from .weights import Linear, VisionLayer, _f32, _fold, _linear, vision_layers

PATCH_ROW_ALIGN = 8        # patch rows padded to a multiple of this many columns (16-byte bf16 rows for cuBLAS)


@dataclass
class GrootVision:
    """The vision tower's weights as the engine reads them, and the Ops it runs them with (made once per
    executor: prepare_groot_vision)."""

    ops: Ops
    patch_w: torch.Tensor                          # (Wv, Kp) model dtype: the patch Linear, zero columns past p*p*3
    patch_b: torch.Tensor                          # (Wv,) fp32
    layers: list[VisionLayer]
    post_ln: tuple[torch.Tensor, torch.Tensor]     # fp32 (not folded: the projector's LayerNorm follows it)
    proj_ln: tuple[torch.Tensor, torch.Tensor] | None   # LN(4C) weight, bias fp32 in block order; None: folded
    proj_in: Linear                                # mlp1[1], its input columns in block order (+ LN(4C)'s affine)
    proj_out: Linear                               # mlp1[3]
    patch: int
    heads: int
    head_dim: int
    eps: float                                     # SigLIP2's LayerNorms
    proj_eps: float                                # the projector's LayerNorm
    dtype: torch.dtype


def block_columns(width: int) -> torch.Tensor:
    """(4 * width,) int64: for each column of a block-order row ((i, j, c): the 2 x 2 block's four rows side by
    side), the column of pixel_unshuffle's row ((c, i, j)) that holds the same value."""
    k = torch.arange(4)[:, None]
    c = torch.arange(width)[None, :]
    return (c * 4 + k).reshape(-1)


@torch.no_grad()
def prepare_groot_vision(model: GrootModel, ops: Ops, fold: bool = True, mlp_pad: int = 0) -> GrootVision:
    """The vision tower's weights from a loaded GrootModel: the encoder layers by weights.vision_layers (folded and
    merged when `fold`, fc1 / fc2 padded to a multiple of `mlp_pad`), the patch Linear padded to PATCH_ROW_ALIGN
    columns, the projector's input in block order (its LayerNorm folded into the first Linear when `fold`)."""
    eagle = model.backbone.model
    vm = eagle.vision_model.vision_model
    v = model.cfg.vision
    pe = vm.embeddings.patch_embedding
    dtype = pe.weight.dtype
    k = pe.weight.shape[1]
    patch_w = torch.zeros(pe.weight.shape[0], -(-k // PATCH_ROW_ALIGN) * PATCH_ROW_ALIGN, device=pe.weight.device,
                          dtype=dtype)
    patch_w[:, :k] = pe.weight
    ln, lin1, act, lin2 = eagle.mlp1
    if not isinstance(act, torch.nn.GELU) or act.approximate != "none":
        raise ValueError(f"the projector's activation is {act!r}; the engine's vision runs nn.GELU() (erf)")
    cols = block_columns(v.width).to(lin1.weight.device)
    ln_w, ln_b = _f32(ln.weight)[cols], _f32(ln.bias)[cols]
    proj_in = _fold([lin1.weight[:, cols]], [lin1.bias], *((ln_w, ln_b) if fold else (None, None)), dtype,
                    merge=True)
    post = vm.post_layernorm
    return GrootVision(ops=ops, patch_w=patch_w.contiguous(), patch_b=_f32(pe.bias),
                       layers=vision_layers(vm.encoder.layers, dtype, fold, mlp_pad),
                       post_ln=(_f32(post.weight), _f32(post.bias)),
                       proj_ln=None if fold else (ln_w.contiguous(), ln_b.contiguous()), proj_in=proj_in,
                       proj_out=_linear(lin2, dtype), patch=v.patch_size, heads=v.num_heads,
                       head_dim=v.width // v.num_heads, eps=v.eps, proj_eps=ln.eps, dtype=dtype)


def block_order(gh: int, gw: int) -> torch.Tensor:
    """(gh * gw,) int64: the raster index (row * gw + column) of each patch in block order."""
    rows = torch.arange(gh).view(gh // 2, 1, 2, 1)                   # 2 * block row + i
    cols = torch.arange(gw).view(1, gw // 2, 1, 2)                   # 2 * block column + j
    return (rows * gw + cols).reshape(-1)


def position_table(vision: GrootVision, pos: torch.Tensor, gh: int, gw: int) -> torch.Tensor:
    """One view size's position embeddings (resized by the HF embedding: StaticTables.vision_pos, [n, gh*gw, C])
    plus the patch bias, in block order: the fp32 (gh*gw, C) addend of the patch GEMM."""
    order = block_order(gh, gw).to(pos.device)
    return (_f32(pos[0])[order] + vision.patch_b).contiguous()


def image_tokens(vision: GrootVision, groups: dict, positions: dict, views: list[torch.Tensor]) -> torch.Tensor:
    """views [3, H_i, W_i] -> projected image tokens of all views in view order [sum of tokens, llm width] in the
    model's dtype. groups: {(H, W): view indices} (StaticTables.groups), positions: {(H, W): position_table}."""
    ops, p = vision.ops, vision.patch
    out = []
    for (h, w), idxs in groups.items():
        a, b = h // (2 * p), w // (2 * p)                    # 2 x 2 blocks per column and row
        n = 4 * a * b                                        # patches per view
        c = views[idxs[0]].shape[0]
        rows = torch.empty(len(idxs) * n, vision.patch_w.shape[1], device=views[idxs[0]].device, dtype=vision.dtype)
        k = p * p * c
        if rows.shape[1] > k:
            rows[:, k:].zero_()
        for slot, i in enumerate(idxs):                     # (a, b, i, j, row, column, channel) per patch row
            rows[slot * n:(slot + 1) * n, :k].view(a, b, 2, 2, p, p, c).copy_(
                views[i].view(c, a, 2, p, b, 2, p).permute(1, 4, 2, 5, 3, 6, 0))
        emb = torch.mm(rows, vision.patch_w.t()).view(len(idxs), n, -1)             # (V, N, Wv) model dtype
        residual = torch.add(positions[(h, w)], emb).view(len(idxs) * n, -1)        # (V*N, Wv) fp32
        hidden = vision_encoder(ops, vision.layers, vision.post_ln, residual, len(idxs), vision.heads,
                                vision.head_dim, vision.eps, vision.dtype, out_dtype=torch.float32)
        unshuffled = hidden.view(len(idxs) * a * b, -1)                              # (V*N/4, 4 Wv) fp32
        y = torch.empty(unshuffled.shape, device=unshuffled.device, dtype=vision.dtype)
        ln = vision.proj_ln or (None, None)
        ops.norm(None, unshuffled, y, ln[0], ln[1], vision.proj_eps, layer_norm=True)
        tokens = ops.linear(F.gelu(ops.linear(y, vision.proj_in)), vision.proj_out)  # (V*N/4, llm width)
        out.append((idxs, tokens.view(len(idxs), a * b, -1)))
    if len(out) == 1 and out[0][0] == list(range(len(views))):
        return out[0][1].view(-1, out[0][1].shape[-1])
    per_view: list[torch.Tensor | None] = [None] * len(views)
    for idxs, tokens in out:
        for slot, i in enumerate(idxs):
            per_view[i] = tokens[slot]
    return torch.cat(per_view, dim=0)
