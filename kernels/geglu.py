"""GeGLU on the merged gate/up GEMM output.

    gu = x @ [W_gate; W_up]^T          (M, 2F): gate in columns [0, F), up in [F, 2F)
    out = gelu_tanh(gate) * up          (M, F)
    gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) = g * sigmoid(2 sqrt(2/pi) (g + 0.044715 g^3))

The sigmoid form avoids a tanh intrinsic, so the kernel is the same on CUDA and ROCm. Math in fp32.
Provenance: Gemma MLP (down(gelu_tanh(gate(x)) * up(x))); FlashRT merges gate/up into one GEMM the same way.
"""

from __future__ import annotations

import math

import torch

from ._triton import launch_options, release_dependents, tl, triton, wait_for_inputs

_K = 2.0 * math.sqrt(2.0 / math.pi)


def geglu_reference(gu: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch. gu: (M, 2F) -> (M, F) in gu's dtype."""
    gate, up = gu.float().chunk(2, dim=-1)
    return (torch.nn.functional.gelu(gate, approximate="tanh") * up).to(gu.dtype)


@triton.jit
def _geglu_kernel(gu_ptr, out_ptr, F, stride_gu, stride_out, K: tl.constexpr, BLOCK: tl.constexpr,
                  PDL: tl.constexpr):
    release_dependents(PDL)
    wait_for_inputs(PDL)
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < F
    g = tl.load(gu_ptr + row * stride_gu + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * stride_gu + F + cols, mask=mask, other=0.0).to(tl.float32)
    y = g * tl.sigmoid(K * (g + 0.044715 * g * g * g)) * u
    tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def geglu(gu: torch.Tensor, out: torch.Tensor, block: int = 1024, pdl: bool = False) -> torch.Tensor:
    """Triton launcher. gu (M, 2F) with unit column stride, out (M, F). Returns out."""
    M, two_f = gu.shape
    if two_f % 2 or out.shape != (M, two_f // 2) or gu.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError(f"geglu: expected gu (M, 2F) and out (M, F), got {tuple(gu.shape)} and {tuple(out.shape)}")
    F = two_f // 2
    _geglu_kernel[(M, triton.cdiv(F, block))](gu, out, F, gu.stride(0), out.stride(0), K=_K, BLOCK=block,
                                             PDL=pdl, num_warps=4, **launch_options(pdl))
    return out
