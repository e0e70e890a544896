"""GeGLU (Gemma) and SwiGLU (Qwen3) on the merged gate/up GEMM output.

    gu = x @ [W_gate; W_up]^T          (M, 2F): gate in columns [0, F), up in [F, 2F)
    out = gelu_tanh(gate) * up          (M, F)            geglu
    out = silu(gate) * up = gate * sigmoid(gate) * up     swiglu
    gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) = g * sigmoid(2 sqrt(2/pi) (g + 0.044715 g^3))

The sigmoid form avoids a tanh intrinsic, so the kernel is the same on CUDA and ROCm. Math in fp32.
With an FP8 `out` (the input of a per-tensor FP8 down GEMM) the kernel also quantizes, as kernels/flashrt_kernels/fp8_quant.py
does, from the fp32 product (no bf16 rounding in between):
    out = clamp(gelu_tanh(gate) * up * inv_scale, -fmax, fmax) cast to E4M3
Provenance: Gemma MLP (down(gelu_tanh(gate(x)) * up(x))); FlashRT merges gate/up into one GEMM the same way.
"""

from __future__ import annotations

import math

import torch

from ._triton import launch_options, release_dependents, tl, triton, wait_for_inputs
from .fp8_quant import fp8_quant_reference

_K = 2.0 * math.sqrt(2.0 / math.pi)


def geglu_reference(gu: torch.Tensor, inv_scale: torch.Tensor | None = None,
                    dtype: torch.dtype | None = None) -> torch.Tensor:
    """Plain PyTorch. gu: (M, 2F) -> (M, F) in gu's dtype; with inv_scale (1-element fp32) and an FP8 dtype, the
    product quantized to that dtype (per-tensor static scale)."""
    gate, up = gu.float().chunk(2, dim=-1)
    y = torch.nn.functional.gelu(gate, approximate="tanh") * up
    return y.to(gu.dtype) if inv_scale is None else fp8_quant_reference(y, inv_scale, dtype)


def swiglu_reference(gu: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch. gu: (M, 2F) -> silu(gate) * up (M, F) in gu's dtype, computed in fp32."""
    gate, up = gu.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(gu.dtype)


@triton.jit
def gelu_tanh_times(g, u, K: tl.constexpr):
    """gelu_tanh(g) * u in fp32 (the sigmoid form above; K = 2 sqrt(2/pi)): the GeGLU of one tile, for the kernels
    that compute their gate and up columns themselves."""
    return g * tl.sigmoid(K * (g + 0.044715 * g * g * g)) * u


@triton.jit
def _geglu_kernel(gu_ptr, out_ptr, inv_ptr, F, stride_gu, stride_out, K: tl.constexpr, BLOCK: tl.constexpr,
                  PDL: tl.constexpr, QUANT: tl.constexpr = False, FMAX: tl.constexpr = 448.0,
                  SILU: tl.constexpr = False):
    release_dependents(PDL)
    if QUANT:
        inv = tl.load(inv_ptr)                 # calibrated at load: read before the wait
    wait_for_inputs(PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < F
    g = tl.load(gu_ptr + row * stride_gu + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * stride_gu + F + cols, mask=mask, other=0.0).to(tl.float32)
    if SILU:
        y = g * tl.sigmoid(g) * u
    else:
        y = gelu_tanh_times(g, u, K)
    if QUANT:
        y = tl.clamp(y * inv, -FMAX, FMAX)
    tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _check_shapes(name: str, gu: torch.Tensor, out: torch.Tensor) -> None:
    M, two_f = gu.shape
    if two_f % 2 or out.shape != (M, two_f // 2) or gu.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError(f"{name}: expected gu (M, 2F) and out (M, F), got {tuple(gu.shape)} and {tuple(out.shape)}")


def swiglu(gu: torch.Tensor, out: torch.Tensor, block: int = 1024, pdl: bool = False) -> torch.Tensor:
    """Triton launcher of silu(gate) * up (geglu's kernel with SILU). gu (M, 2F) with unit column stride, out (M, F).
    Returns out."""
    _check_shapes("swiglu", gu, out)
    M, F = out.shape
    _geglu_kernel[(M, triton.cdiv(F, block))](gu, out, gu, F, gu.stride(0), out.stride(0), K=_K, BLOCK=block,
                                             PDL=pdl, SILU=True, num_warps=4, **launch_options(pdl))
    return out


def geglu(gu: torch.Tensor, out: torch.Tensor, block: int = 1024, pdl: bool = False,
          inv_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Triton launcher. gu (M, 2F) with unit column stride, out (M, F). Returns out. An FP8 out needs inv_scale,
    the 1-element fp32 device tensor 1 / scale of the per-tensor quantization (and only an FP8 out takes one)."""
    _check_shapes("geglu", gu, out)
    M, two_f = gu.shape
    quant = out.element_size() == 1
    if quant != (inv_scale is not None) or (quant and (inv_scale.numel() != 1 or inv_scale.dtype != torch.float32)):
        got = None if inv_scale is None else (tuple(inv_scale.shape), inv_scale.dtype)
        raise ValueError(f"geglu: an FP8 out needs inv_scale, a 1-element fp32 tensor, and only it takes one; got "
                         f"out {out.dtype}, inv_scale {got}")
    F = two_f // 2
    _geglu_kernel[(M, triton.cdiv(F, block))](gu, out, inv_scale if quant else gu, F, gu.stride(0), out.stride(0),
                                             K=_K, BLOCK=block, PDL=pdl, QUANT=quant,
                                             FMAX=float(torch.finfo(out.dtype).max) if quant else 448.0,
                                             num_warps=4, **launch_options(pdl))
    return out
