"""Euler step of the flow-matching integrator, fused with the output projection's bias.

    x <- x + dt * (v + b)         x: (M, A) fp32 state, v: (M, A) = action_out_proj GEMM without bias, b: (A,)

t runs from 1 (noise) to 0 (data) in 10 steps, dt = -1/10 (lerobot/openpi convention).
Provenance: FlashRT folds this step into the output projection plus an in-place add.
"""

from __future__ import annotations

import torch

from ._triton import launch_options, release_dependents, tl, triton, wait_for_inputs


def euler_reference(x: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, dt: float) -> torch.Tensor:
    """Plain PyTorch, in place on x (M, A). Returns x."""
    vb = v.float() if bias is None else v.float() + bias.float()
    x.add_((dt * vb).to(x.dtype))
    return x


@triton.jit
def _euler_kernel(x_ptr, v_ptr, b_ptr, N, A, dt, HAS_B: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    release_dependents(PDL)
    wait_for_inputs(PDL)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    v = tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_B:
        v += tl.load(b_ptr + offs % A, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(x_ptr + offs, (x + dt * v).to(x_ptr.dtype.element_ty), mask=mask)


def euler(x: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, dt: float, block: int = 1024,
          pdl: bool = False) -> torch.Tensor:
    """Triton launcher, in place on x. x and v contiguous (M, A), bias (A,). Returns x."""
    if x.shape != v.shape or x.dim() != 2 or not (x.is_contiguous() and v.is_contiguous()):
        raise ValueError(f"euler: x and v must be contiguous (M, A), got {tuple(x.shape)} and {tuple(v.shape)}")
    n, a = x.numel(), x.shape[1]
    _euler_kernel[(triton.cdiv(n, block),)](x, v, bias if bias is not None else v, n, a, float(dt),
                                           HAS_B=bias is not None, BLOCK=block, PDL=pdl, num_warps=4,
                                           **launch_options(pdl))
    return x
