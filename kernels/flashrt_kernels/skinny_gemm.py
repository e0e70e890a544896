"""GEMM for few rows (the 10-51-token denoising steps): weight streaming, optional GeGLU epilogue, split-K.

    y = x @ W^T                          x (M, K), W (N, K), M <= 64: memory-bound on reading W once
    GeGLU epilogue (W = [W_gate; W_up], N = 2F):  y = gelu_tanh(x @ W_gate^T) * (x @ W_up^T)     (M, F)
    FP8 weights (W_q, scale (N,)):  W = W_q * scale[:, None], each tile converted in registers, the scale applied to
             the fp32 products (before the GeGLU) -- weight-only FP8: half the bytes of a weight-streaming GEMM
    bias (N,):  y = x @ W^T + b, added to the fp32 products (after the scale, before an activation); with split-K
             to partial 0 alone, so the partials still sum to y
    GELU epilogue (gelu=True, no GeGLU, no split):  y = gelu_tanh(x @ W^T [+ b])  (GR00T's DiT MLP, engine/groot_dit_gemms.py)
    split-K: program k of SPLIT_K writes the fp32 partial x[:, Kk] @ W[:, Kk]^T into part[k] (SPLIT_K, M, N);
             the consumer (the residual norm kernels) sums the partials, so no reduction kernel runs.

Each program owns BLOCK_N output columns (both gate and up columns with the epilogue) for all M rows, so every
weight byte is read once.
Provenance: FlashRT AMD's packed small-M BF16 kernel for QKV, O and merged gate/up.
"""

from __future__ import annotations

import torch

from ._triton import launch_options, release_dependents, tl, triton, wait_for_inputs
from .geglu import _K as _K_GELU  # noqa: N811  the tanh GELU's constant
from .geglu import geglu_reference, gelu_tanh_times


def row_tile(M: int) -> int:
    """The rows a program of the few-row GEMMs (this one, kernels/flashrt_kernels/qkv_gemm_rope.py) covers for M <= 64 rows: 16,
    32 or 64, the smallest that holds them."""
    return 16 if M <= 16 else (32 if M <= 32 else 64)


def skinny_gemm_reference(x: torch.Tensor, w: torch.Tensor, geglu: bool = False, split_k: int = 1,
                          scale: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                          gelu: bool = False) -> torch.Tensor:
    """Plain PyTorch. (M, N) in x.dtype; (M, N/2) with geglu; (split_k, M, N) fp32 partials with split_k > 1.
    scale (N,) fp32: W's rows are w[n] * scale[n] (FP8 weights with a scale per output channel).
    bias (N,): added to the fp32 product (to partial 0 with split_k > 1); gelu: the tanh GELU of the result."""
    if scale is not None:
        w = w.float() * scale.float()[:, None]
    if split_k > 1:
        K = x.shape[1]
        xs = x.float().view(x.shape[0], split_k, K // split_k).transpose(0, 1)        # (S, M, K/S)
        ws = w.float().view(w.shape[0], split_k, K // split_k).transpose(0, 1)        # (S, N, K/S)
        parts = xs @ ws.transpose(1, 2)                                               # (S, M, N)
        if bias is not None:
            parts[0] += bias.float()
        return parts
    y = x.float() @ w.float().T
    if bias is not None:
        y = y + bias.float()
    if gelu:
        y = torch.nn.functional.gelu(y, approximate="tanh")
    return (geglu_reference(y) if geglu else y).to(x.dtype)


@triton.jit
def _skinny_kernel(x_ptr, w_ptr, y_ptr, scale_ptr, bias_ptr, M, N, F, stride_x, stride_w, stride_y, split_stride,
                   K_PER_SPLIT: tl.constexpr, GEGLU: tl.constexpr, SPLIT_K: tl.constexpr, KGELU: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
                   HAS_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr = False, GELU: tl.constexpr = False):
    release_dependents(PDL)
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_out = F if GEGLU else N
    n_ok = rn < n_out
    k0 = pid_k * K_PER_SPLIT
    if BLOCK_K == K_PER_SPLIT:
        # One shot: the program's whole weight slice is loaded before waiting for x, so with PDL the weight stream
        # overlaps the end of the kernel ahead (the weights are the only bytes that matter at this size).
        w = tl.load(w_ptr + rn[:, None] * stride_w + (k0 + rk)[None, :], mask=n_ok[:, None], other=0.0)
        if GEGLU:
            wu = tl.load(w_ptr + (rn + F)[:, None] * stride_w + (k0 + rk)[None, :], mask=n_ok[:, None], other=0.0)
        wait_for_inputs(PDL)
        x = tl.load(x_ptr + rm[:, None] * stride_x + (k0 + rk)[None, :], mask=m_ok[:, None], other=0.0)
        acc = tl.dot(x, tl.trans(w.to(x.dtype)))
        if GEGLU:
            acc_up = tl.dot(x, tl.trans(wu.to(x.dtype)))
    else:
        wait_for_inputs(PDL)
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        if GEGLU:
            acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for kk in range(0, K_PER_SPLIT, BLOCK_K):
            k = k0 + kk
            x = tl.load(x_ptr + rm[:, None] * stride_x + (k + rk)[None, :], mask=m_ok[:, None], other=0.0)
            w = tl.load(w_ptr + rn[:, None] * stride_w + (k + rk)[None, :], mask=n_ok[:, None], other=0.0)
            acc += tl.dot(x, tl.trans(w.to(x.dtype)))
            if GEGLU:
                wu = tl.load(w_ptr + (rn + F)[:, None] * stride_w + (k + rk)[None, :], mask=n_ok[:, None],
                             other=0.0)
                acc_up += tl.dot(x, tl.trans(wu.to(x.dtype)))
    mask = m_ok[:, None] & n_ok[None, :]
    if HAS_SCALE:        # FP8 weights: the per-output-channel scale, on the fp32 products
        acc = acc * tl.load(scale_ptr + rn, mask=n_ok, other=0.0)[None, :]
        if GEGLU:
            acc_up = acc_up * tl.load(scale_ptr + rn + F, mask=n_ok, other=0.0)[None, :]
    if HAS_BIAS:         # partial 0 alone carries the bias (the others load zeros), so the partials sum to y
        first = n_ok & (pid_k == 0)
        acc = acc + tl.load(bias_ptr + rn, mask=first, other=0.0).to(tl.float32)[None, :]
        if GEGLU:
            acc_up = acc_up + tl.load(bias_ptr + rn + F, mask=first, other=0.0).to(tl.float32)[None, :]
    if GEGLU:
        acc = gelu_tanh_times(acc, acc_up, KGELU)
    if GELU:
        acc = gelu_tanh_times(acc, 1.0, KGELU)
    if SPLIT_K > 1:
        tl.store(y_ptr + pid_k * split_stride + rm[:, None] * N + rn[None, :], acc, mask=mask)
    else:
        tl.store(y_ptr + rm[:, None] * stride_y + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


def skinny_gemm(x: torch.Tensor, w: torch.Tensor, geglu: bool = False, split_k: int = 1, block_n: int = 16,
                block_k: int = 256, num_stages: int = 4, num_warps: int = 4, pdl: bool = False,
                out: torch.Tensor | None = None, scale: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                gelu: bool = False) -> torch.Tensor:
    """Triton launcher; contract of skinny_gemm_reference. x (M, K) with M <= 64 and unit column stride.
    W may be FP8 (each tile converted to x's dtype in registers) with `scale` (N,) fp32 per output channel.
    bias (N,) contiguous, any float dtype: added in the epilogue (partial 0 with split-K); gelu: the tanh GELU in the
    epilogue (not with geglu or split-K).
    block_k == K / split_k: one-shot programs (the weight slice is loaded at once, before the wait for x).
    pdl: launch with programmatic dependent launch (sm90+; see _triton.wait_for_inputs).
    out: optional preallocated result of the shape and dtype described above."""
    M, K = x.shape
    N = w.shape[0]
    if M > 64 or w.shape[1] != K or x.stride(1) != 1 or not w.is_contiguous():
        raise ValueError(f"skinny_gemm: x (M<=64, K) and contiguous W (N, K); got {tuple(x.shape)}, {tuple(w.shape)}")
    if scale is not None and (scale.shape != (N,) or scale.dtype != torch.float32):
        raise ValueError(f"skinny_gemm: scale must be ({N},) float32, got {tuple(scale.shape)} {scale.dtype}")
    if K % (split_k * block_k) or (geglu and (N % 2 or split_k > 1)):
        raise ValueError(f"skinny_gemm: K={K} must divide into split_k={split_k} x block_k={block_k}; GeGLU needs "
                         "an even N and no split")
    if bias is not None and (bias.shape != (N,) or not bias.is_contiguous()):
        raise ValueError(f"skinny_gemm: bias must be a contiguous ({N},) tensor, got {tuple(bias.shape)}")
    if gelu and (geglu or split_k > 1):
        raise ValueError("skinny_gemm: the GELU epilogue needs the whole product: no GeGLU, no split-K")
    F = N // 2 if geglu else N
    shape, dtype = ((split_k, M, N), torch.float32) if split_k > 1 else ((M, F), x.dtype)
    if out is None:
        out = torch.empty(shape, device=x.device, dtype=dtype)
    elif out.shape != shape or out.dtype != dtype or not out.is_contiguous():
        raise ValueError(f"skinny_gemm: out must be a contiguous {shape} {dtype} tensor, got {tuple(out.shape)} "
                         f"{out.dtype}")
    block_m = row_tile(M)
    grid = (triton.cdiv(F, block_n), split_k)
    _skinny_kernel[grid](x, w, out, scale if scale is not None else out, bias if bias is not None else out, M, N, F,
                         x.stride(0), w.stride(0), out.stride(-2), M * N,
                         K_PER_SPLIT=K // split_k, GEGLU=geglu, SPLIT_K=split_k, KGELU=_K_GELU,
                         BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, PDL=pdl, HAS_SCALE=scale is not None,
                         HAS_BIAS=bias is not None, GELU=gelu,
                         num_warps=num_warps, num_stages=num_stages, **launch_options(pdl))
    return out
