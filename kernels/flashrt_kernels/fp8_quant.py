"""FP8 E4M3 quantization of an activation, one pass: per tensor with a static scale, or per row with its own.

    per tensor:  q = clamp(x * inv_scale, -fmax, fmax) cast to E4M3      inv_scale = 1 / scale,
                 scale = calibrated amax / fmax
    per row:     scale[m] = max(amax(x[m, :]), tiny) / fmax              q[m, :] = x[m, :] / scale[m]

fmax = 448 (OCP e4m3fn) or 240 (e4m3fnuz, MI300X). The static scale is a device tensor calibrated once on a real
observation, so the graph never reads it back to the host. The row scales need no calibration: each row is scaled
at run time by its own amax, so one outlier token costs no other token its precision (the FP8 backbone attention
projections, engine/fp8.py). Provenance: FlashRT FP8 prefix path (static scales).
"""

from __future__ import annotations

import torch

from ._triton import launch_options, release_dependents, tl, triton, wait_for_inputs


def fp8_quant_reference(x: torch.Tensor, inv_scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    fmax = torch.finfo(dtype).max
    return (x.float() * inv_scale.float()).clamp(-fmax, fmax).to(dtype)


@triton.jit
def _fp8_quant_kernel(x_ptr, inv_ptr, q_ptr, n, FMAX: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = tl.clamp(x * tl.load(inv_ptr), -FMAX, FMAX)
    tl.store(q_ptr + offs, y.to(q_ptr.dtype.element_ty), mask=mask)


def fp8_quant(x: torch.Tensor, inv_scale: torch.Tensor, dtype: torch.dtype, block: int = 2048) -> torch.Tensor:
    """Triton launcher. x contiguous, inv_scale a 1-element fp32 device tensor -> FP8 tensor of x's shape."""
    if not x.is_contiguous():
        raise ValueError("fp8_quant: x must be contiguous")
    q = torch.empty(x.shape, device=x.device, dtype=dtype)
    n = x.numel()
    _fp8_quant_kernel[(triton.cdiv(n, block),)](x, inv_scale, q, n, FMAX=float(torch.finfo(dtype).max),
                                               BLOCK=block, num_warps=8)
    return q


def fp8_quant_rows_reference(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain PyTorch. x (M, K) -> (q (M, K) dtype, scale (M, 1) fp32) with x ~ q * scale."""
    fmax = torch.finfo(dtype).max
    scale = x.float().abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / fmax
    return (x.float() / scale).clamp(-fmax, fmax).to(dtype), scale


@triton.jit
def _fp8_quant_rows_kernel(x_ptr, q_ptr, scale_ptr, K, stride_x, stride_q, FMAX: tl.constexpr,
                           BLOCK: tl.constexpr, PDL: tl.constexpr):
    release_dependents(PDL)
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < K
    wait_for_inputs(PDL)
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-12) / FMAX
    tl.store(scale_ptr + row, scale)
    tl.store(q_ptr + row * stride_q + cols, tl.clamp(x / scale, -FMAX, FMAX).to(q_ptr.dtype.element_ty), mask=mask)


def fp8_quant_rows(x: torch.Tensor, dtype: torch.dtype, q: torch.Tensor | None = None,
                   scale: torch.Tensor | None = None, pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton launcher. x (M, K) with unit column stride -> (q (M, K) FP8, scale (M, 1) fp32), into q / scale
    where given."""
    M, K = x.shape
    if x.stride(1) != 1:
        raise ValueError(f"fp8_quant_rows: x must have unit column stride, got stride {x.stride()}")
    q = torch.empty(M, K, device=x.device, dtype=dtype) if q is None else q
    scale = torch.empty(M, 1, device=x.device, dtype=torch.float32) if scale is None else scale
    if q.shape != (M, K) or q.stride(1) != 1 or q.dtype != dtype:
        raise ValueError(f"fp8_quant_rows: q must be ({M}, {K}) {dtype} with unit column stride, got "
                         f"{tuple(q.shape)} {q.dtype}")
    if scale.shape != (M, 1) or scale.dtype != torch.float32 or not scale.is_contiguous():
        raise ValueError(f"fp8_quant_rows: scale must be a contiguous ({M}, 1) fp32 tensor, got "
                         f"{tuple(scale.shape)} {scale.dtype}")
    block = triton.next_power_of_2(K)
    _fp8_quant_rows_kernel[(M,)](x, q, scale, K, x.stride(0), q.stride(0), FMAX=float(torch.finfo(dtype).max),
                                 BLOCK=block, PDL=pdl, num_warps=8 if block >= 2048 else 4, **launch_options(pdl))
    return q, scale
