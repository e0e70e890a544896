"""GEMM for hundreds of rows (the vision tower's 256-768-row GEMMs), tiled, with the bias and an optional tanh GELU
in its epilogue.

    y = x @ W^T + b                      x (M, K), W (N, K), b (N,) or none; M in the hundreds
    GELU epilogue (the vision MLP's fc1):  y = gelu_tanh(x @ W^T + b)
    gelu_tanh(z) = z * sigmoid(2 sqrt(2/pi) (z + 0.044715 z^3))      (as kernels/geglu.py: no tanh intrinsic)

Each program owns one BLOCK_M x BLOCK_N tile of y and walks K in BLOCK_K steps (tl.dot: wgmma on sm90, mma on
sm80, MFMA on gfx9), fp32 accumulation; programs are ordered in groups of GROUP_M tile rows so that programs running
together share W tiles in L2. Bias and GELU are applied to the fp32 tile before the one store.
K is a compile-time constant (one compile per K: the vision tower has two, 1152 and 4304), which also gives the
K loop a fixed trip count.
Why: at 512 rows cuBLAS runs the vision GEMMs as one wave of small tiles at ~10 us each whatever their FLOPs
(session 7's timeline of a replay on the H200: 1.4-5 GFLOP per GEMM); the load-time tuning (ops.tune_wide) weighs
these tilings against the library GEMM per GEMM kind and keeps whichever is faster.
Provenance: Triton's matmul tutorial (grouped program order); the epilogue is what ops.linear_gelu asks of cuBLASLt.
"""

from __future__ import annotations

import math

import torch

from ._triton import launch_options, release_dependents, tl, triton, wait_for_inputs

_K_GELU = 2.0 * math.sqrt(2.0 / math.pi)


def wide_gemm_reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                        gelu: bool = False) -> torch.Tensor:
    """Plain PyTorch, fp32 math: (M, N) in x.dtype."""
    y = x.float() @ w.float().t()
    if bias is not None:
        y = y + bias.float()
    if gelu:
        y = torch.nn.functional.gelu(y, approximate="tanh")
    return y.to(x.dtype)


@triton.jit
def _wide_gemm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, stride_x, stride_w, stride_y, K: tl.constexpr,
                      HAS_BIAS: tl.constexpr, GELU: tl.constexpr, KG: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                      PDL: tl.constexpr):
    release_dependents(PDL)
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    col_ok = cols < N
    x_ptrs = x_ptr + rows[:, None] * stride_x + ks[None, :]
    w_ptrs = w_ptr + cols[:, None] * stride_w + ks[None, :]
    bias = tl.zeros([BLOCK_N], tl.float32)
    if HAS_BIAS:
        bias = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)     # a weight: before the wait
    wait_for_inputs(PDL)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k in range(0, K, BLOCK_K):
        k_ok = ks < K - k
        a = tl.load(x_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(w_ptrs, mask=col_ok[:, None] & k_ok[None, :], other=0.0)
        acc = tl.dot(a, tl.trans(b), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    acc += bias[None, :]
    if GELU:
        acc = acc * tl.sigmoid(KG * (acc + 0.044715 * acc * acc * acc))
    tl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


def wide_gemm(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, gelu: bool = False,
              block_m: int = 128, block_n: int = 128, block_k: int = 64, group_m: int = 8, stages: int = 3,
              warps: int = 4, pdl: bool | int = False) -> torch.Tensor:
    """Triton launcher; the contract of wide_gemm_reference. x (M, K) and w (N, K) with unit column stride, bias
    (N,) or None; the tiling (block_m x block_n tiles, block_k per step, group_m tile rows per program group,
    pipeline stages, warps) as ops.WideConfig holds it. Returns a new (M, N) tensor in x.dtype."""
    M, K = x.shape
    N = w.shape[0]
    if w.shape[1] != K or x.stride(1) != 1 or w.stride(1) != 1 or (bias is not None and bias.shape != (N,)):
        raise ValueError(f"wide_gemm: expected x (M, K), w (N, K) with unit column strides and bias (N,); got x "
                         f"{tuple(x.shape)}, w {tuple(w.shape)}, bias {None if bias is None else tuple(bias.shape)}")
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    grid = (triton.cdiv(M, block_m) * triton.cdiv(N, block_n),)
    _wide_gemm_kernel[grid](x, w, bias if bias is not None else w, y, M, N, x.stride(0), w.stride(0), y.stride(0),
                            K=K, HAS_BIAS=bias is not None, GELU=gelu, KG=_K_GELU, BLOCK_M=block_m, BLOCK_N=block_n,
                            BLOCK_K=block_k, GROUP_M=group_m, PDL=pdl, num_warps=warps, num_stages=stages,
                            **launch_options(pdl))
    return y
