"""Gated residual + adaptive RMSNorm (pi0.5 action expert), one pass over the row.

    h = residual + x * gate         (skipped when x is None: the first norm of the expert stack;
                                     x may be split-K partials (S, M, D) fp32, summed here)
    residual <- h                   (fp32 residual stream, in place)
    out <- rms(h) * scale1p + shift,   rms(h) = h * rsqrt(mean(h^2) + eps)

gate, scale1p (= 1 + scale) and shift are (D,) vectors: pi0.5 derives them from the time conditioning, which takes
10 known values, so the engine precomputes them at load and points this kernel at the step's row.
With row_variant (M,) int32, each row picks its own row of (V, D) vectors instead: training-time RTC gives the
frozen prefix rows the modulation of clean data (variant 1) and the others the step's (variant 0). Each vector may
come from another table, so each keeps its own variant stride (vector.stride(0)).
Provenance: FlashRT's adaRMSNorm + gated-residual boundary kernel; independent Triton implementation.
"""

from __future__ import annotations

import torch

from ._triton import launch_options, release_dependents, tl, triton, wait_for_inputs


def ada_rms_norm_reference(x: torch.Tensor | None, residual: torch.Tensor, gate: torch.Tensor | None,
                           scale1p: torch.Tensor, shift: torch.Tensor, eps: float = 1e-6,
                           out_dtype: torch.dtype = torch.bfloat16,
                           row_variant: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain PyTorch. x, residual: (M, D); gate, scale1p, shift: (D,), or (V, D) with row_variant (M,) int
    picking each row's vector. Returns (out, new residual)."""
    if x is not None and x.dim() == 3:                                                    # split-K partials
        x = x.float().sum(0)
    if row_variant is not None:                                                           # (V, D) -> (M, D)
        rows = row_variant.long()
        gate, scale1p, shift = (v[rows] if v is not None else None for v in (gate, scale1p, shift))
    h = residual.float() if x is None else residual.float() + x.float() * gate.float()   # (M, D) fp32
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * scale1p.float() + shift.float()
    return y.to(out_dtype), h.to(residual.dtype)


@triton.jit
def _ada_rms_norm_kernel(x_ptr, res_ptr, gate_ptr, scale_ptr, shift_ptr, out_ptr, variant_ptr, D, eps,
                         stride_x, stride_res, stride_out, split_stride, gate_vs, scale_vs, shift_vs,
                         HAS_X: tl.constexpr, X_SPLITS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
                         ROW_VARIANT: tl.constexpr):
    release_dependents(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    if ROW_VARIANT:
        # the row variants are written during the forward: read after the wait, the vectors with them
        wait_for_inputs(PDL)
        var = tl.load(variant_ptr + row)
        scale1p = tl.load(scale_ptr + var * scale_vs + cols, mask=mask, other=0.0).to(tl.float32)
        shift = tl.load(shift_ptr + var * shift_vs + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_X:
            g = tl.load(gate_ptr + var * gate_vs + cols, mask=mask, other=0.0).to(tl.float32)
    else:
        scale1p = tl.load(scale_ptr + cols, mask=mask, other=0.0).to(tl.float32)   # load-time tables: before the wait
        shift = tl.load(shift_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_X:
            g = tl.load(gate_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        wait_for_inputs(PDL)
    h = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_X:
        x = tl.zeros([BLOCK], tl.float32)
        for sp in tl.static_range(X_SPLITS):
            x += tl.load(x_ptr + sp * split_stride + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        h += x * g
        tl.store(res_ptr + row * stride_res + cols, h.to(res_ptr.dtype.element_ty), mask=mask)
    y = h * tl.rsqrt(tl.sum(h * h, axis=0) / D + eps)
    y = y * scale1p + shift
    tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def ada_rms_norm(x: torch.Tensor | None, residual: torch.Tensor, gate: torch.Tensor | None, scale1p: torch.Tensor,
                 shift: torch.Tensor, out: torch.Tensor, eps: float = 1e-6, pdl: bool = False,
                 row_variant: torch.Tensor | None = None) -> torch.Tensor:
    """Triton launcher. x (M, D), (S, M, D) split-K partials or None; residual (M, D) updated in place;
    vectors (D,) contiguous (tables fixed at load: read before the PDL wait), or with row_variant (M,) int32
    (values in [0, V)) (V, D) with unit column stride, any row stride. Returns out."""
    M, D = residual.shape
    splits, split_stride = (x.shape[0], x.stride(0)) if x is not None and x.dim() == 3 else (1, 0)
    x2 = x[0] if splits > 1 else x
    if x is not None and (x2.shape != residual.shape or x2.stride(1) != 1 or gate is None):
        raise ValueError(f"ada_rms_norm: x must be ({M}, {D}) or (S, {M}, {D}) with a gate, got {tuple(x.shape)}")
    for name, v in (("scale1p", scale1p), ("shift", shift), ("gate", gate)):
        if v is None:
            continue
        if row_variant is None and (v.shape != (D,) or not v.is_contiguous()):
            raise ValueError(f"ada_rms_norm: {name} must be a contiguous ({D},) vector, got {tuple(v.shape)}")
        if row_variant is not None and (v.dim() != 2 or v.shape[1] != D or v.stride(1) != 1):
            raise ValueError(f"ada_rms_norm: with row_variant, {name} must be (V, {D}) with unit column stride, "
                             f"got {tuple(v.shape)} strides {v.stride()}")
    if row_variant is not None and (row_variant.shape != (M,) or row_variant.dtype != torch.int32):
        raise ValueError(f"ada_rms_norm: row_variant must be ({M},) int32, got {tuple(row_variant.shape)} "
                         f"{row_variant.dtype}")
    vs = lambda v: v.stride(0) if row_variant is not None and v is not None else 0  # noqa: E731
    block = triton.next_power_of_2(D)
    _ada_rms_norm_kernel[(M,)](
        x if x is not None else residual, residual, gate if gate is not None else scale1p, scale1p, shift, out,
        row_variant if row_variant is not None else residual, D, eps, x2.stride(0) if x is not None else 0,
        residual.stride(0), out.stride(0), split_stride, vs(gate), vs(scale1p), vs(shift),
        HAS_X=x is not None, X_SPLITS=splits, BLOCK=block, PDL=pdl, ROW_VARIANT=row_variant is not None,
        num_warps=4 if block <= 1024 else 8, **launch_options(pdl))
    return out
