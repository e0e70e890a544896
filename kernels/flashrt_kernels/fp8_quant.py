"""Static per-tensor FP8 E4M3 quantization of an activation, one pass.

    q = clamp(x * inv_scale, -fmax, fmax) cast to E4M3      inv_scale = 1 / scale, scale = calibrated amax / fmax

fmax = 448 (OCP e4m3fn) or 240 (e4m3fnuz, MI300X). The scale is a device tensor calibrated once on a real
observation, so the graph never reads it back to the host. Provenance: FlashRT FP8 prefix path (static scales).
"""

from __future__ import annotations

import torch

from ._triton import tl, triton


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
