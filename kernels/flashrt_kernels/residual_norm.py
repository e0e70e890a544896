"""Residual add + RMSNorm / LayerNorm, one pass over the row.

    h = residual + x                (skipped when x is None: the first norm of a stack;
                                     x may be split-K partials (S, M, D) fp32, summed here)
    residual <- h                   (the fp32 residual stream is updated in place)
    RMSNorm:   y = h * rsqrt(mean(h^2) + eps)                  [* w]
    LayerNorm: y = (h - mean(h)) * rsqrt(var(h) + eps)         [* w + b]
    out <- y                        (bf16, or FP8 E4M3 as y * inv_scale when out is an FP8 tensor)

Statistics in fp32. The engine folds Gemma's (1 + w) and SigLIP's LayerNorm affine into the next GEMM, so the
weightless form is the hot one. Provenance: FlashRT's fused residual+RMSNorm(+FP8 quant) boundary kernel; this is an
independent Triton implementation.
"""

from __future__ import annotations

import torch

from ._triton import launch_options, release_dependents, tl, triton, wait_for_inputs

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


def residual_norm_reference(x: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor | None = None,
                            bias: torch.Tensor | None = None, eps: float = 1e-6, layer_norm: bool = False,
                            inv_scale: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain PyTorch. x, residual: (M, D). Returns (out (M, D) out_dtype, new residual (M, D) residual.dtype)."""
    if x is not None and x.dim() == 3:                                                # split-K partials
        x = x.float().sum(0)
    h = residual.float() if x is None else residual.float() + x.float()              # (M, D) fp32
    if layer_norm:
        mean = h.mean(-1, keepdim=True)
        y = (h - mean) * torch.rsqrt((h - mean).pow(2).mean(-1, keepdim=True) + eps)
    else:
        y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    if bias is not None:
        y = y + bias.float()
    if inv_scale is not None:  # FP8 quantization scale (an fp32 out_dtype gives the unrounded values)
        fmax = torch.finfo(torch.float8_e4m3fn if out_dtype not in FP8_DTYPES else out_dtype).max
        y = (y * inv_scale.float()).clamp(-fmax, fmax)
    return y.to(out_dtype), h.to(residual.dtype)


@triton.jit
def _residual_norm_kernel(x_ptr, res_ptr, w_ptr, b_ptr, out_ptr, inv_scale_ptr, D, eps,
                          stride_x, stride_res, stride_out, split_stride,
                          HAS_X: tl.constexpr, X_SPLITS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                          LAYER_NORM: tl.constexpr, OUT_FP8: tl.constexpr, FP8_MAX: tl.constexpr,
                          BLOCK: tl.constexpr, PDL: tl.constexpr):
    release_dependents(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    wait_for_inputs(PDL)
    h = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_X:
        for sp in tl.static_range(X_SPLITS):
            h += tl.load(x_ptr + sp * split_stride + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(res_ptr + row * stride_res + cols, h.to(res_ptr.dtype.element_ty), mask=mask)
    if LAYER_NORM:
        mean = tl.sum(h, axis=0) / D
        c = tl.where(mask, h - mean, 0.0)
        y = c * tl.rsqrt(tl.sum(c * c, axis=0) / D + eps)
    else:
        y = h * tl.rsqrt(tl.sum(h * h, axis=0) / D + eps)
    if HAS_W:
        y = y * tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_B:
        y = y + tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if OUT_FP8:
        y = tl.clamp(y * tl.load(inv_scale_ptr), -FP8_MAX, FP8_MAX)
    tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def residual_norm(x: torch.Tensor | None, residual: torch.Tensor, out: torch.Tensor,
                  weight: torch.Tensor | None = None, bias: torch.Tensor | None = None, eps: float = 1e-6,
                  layer_norm: bool = False, inv_scale: torch.Tensor | None = None, pdl: bool = False) -> torch.Tensor:
    """Triton launcher. x (M, D), (S, M, D) partials or None; residual (M, D) updated in place; out (M, D)."""
    M, D = residual.shape
    splits, split_stride = (x.shape[0], x.stride(0)) if x is not None and x.dim() == 3 else (1, 0)
    x2 = x[0] if splits > 1 else x
    for name, t in (("x", x2), ("out", out)):
        if t is not None and (t.shape != residual.shape or t.stride(1) != 1):
            raise ValueError(f"residual_norm: {name} must be ({M}, {D}) with unit column stride, got "
                             f"{tuple(t.shape)} stride {t.stride()}")
    out_fp8 = out.dtype in FP8_DTYPES
    if out_fp8 and inv_scale is None:
        raise ValueError("residual_norm: an FP8 output needs inv_scale")
    block = triton.next_power_of_2(D)
    _residual_norm_kernel[(M,)](
        x if x is not None else residual, residual, weight if weight is not None else residual,
        bias if bias is not None else residual, out, inv_scale if inv_scale is not None else residual,
        D, eps, x2.stride(0) if x is not None else 0, residual.stride(0), out.stride(0), split_stride,
        HAS_X=x is not None, X_SPLITS=splits, HAS_W=weight is not None, HAS_B=bias is not None, LAYER_NORM=layer_norm,
        OUT_FP8=out_fp8, FP8_MAX=float(torch.finfo(out.dtype).max) if out_fp8 else 0.0,
        BLOCK=block, PDL=pdl, num_warps=4 if block <= 1024 else 8, **launch_options(pdl))
    return out
