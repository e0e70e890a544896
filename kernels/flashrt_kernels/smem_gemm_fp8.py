"""Few-row GEMM in FP8 on wgmma, its E4M3 weight slice in shared memory before the PDL wait (NVIDIA sm90, Gluon).

The FP8 form of kernels/flashrt_kernels/smem_gemm.py's 16-row kernel, for the action expert's decoder GEMMs with
EngineOptions.fp8_decoder_weights (weights quantized once at load, one scale per output row:
flashrt_core/engine/fp8.py quantize_rows):

    W ~= W_q * s_w[:, None]                      W_q (N, K) E4M3, s_w (N,) fp32
    per row m of x and K split k (the program's K slice):
        a[m] = max over the slice of |x[m, :]|,   x_q[m, :] = E4M3(x[m, :] * FMAX / a[m])      (in the kernel)
        y[m, n] (or split k's partial) = (x_q[m] . W_q[n]) * s_w[n] * a[m] / FMAX
    GeGLU (W = [W_gate; W_up], N = 2F):  y = gelu_tanh(gate) * up of the two scaled halves      (M, F)
    split-K: program k writes its fp32 partial into part[k] (SPLIT_K, M, N); the norm after it sums them.

Why: the bf16 kernel streams 34.6 MB of expert weights per layer; E4M3 halves that, and a program's slice takes
half the shared memory (gate/up: 64 instead of 128 KB), which leaves room on the SM for the next kernel's
programs to stage their weights during this one (the PDL overlap that session 22's fused MLP lost,
docs/benchmarks/engine_h200_2026-11-29_notes.md). The activations are quantized in the kernel, per row of the
program's K slice with the slice's exact maximum (no calibration): wgmma multiplies E4M3 by E4M3 only, and
widening the weights to bf16 in registers instead (the weight-only form, kernels/flashrt_kernels/skinny_gemm.py's w_scale) costs
~1.5 instructions per weight element after the wait, which session 6 measured slower. After the wait each
program takes its x slice by TMA (as the bf16 kernel does) and reads it twice from shared memory: once for the
rows' maxima, once to write the E4M3 rows that wgmma reads; every program quantizes the same rows (16 x K slice
values, against its 64 x K slice weights).

Differences from the bf16 kernel: the weight boxes are 64 rows x 64 E4M3 columns (64-byte swizzle), the product
runs on wgmma's m64n16k32 E4M3 form, and there are no folded-norm epilogues (NormIn / NormOut) and no 17-64-row
form. Provenance: per-row (token) activation and per-channel weight scales are the usual FP8 inference GEMM
scaling (as torch._scaled_mm's rowwise mode); the kernel structure is kernels/flashrt_kernels/smem_gemm.py's. Written without a GPU
at hand (session 23): compiled for sm90 ahead of time (tools/kernel_resources.py); its GPU test compares it with
smem_gemm_fp8_reference. Its first form read x twice from global memory (the maxima, then the quantization) and
measured slower than the bf16 kernel at K slices of 512-1024 on the H200 (session 23: QKV 4.50 against 2.59 us per
call); x now comes by TMA as in the bf16 kernel, and both passes read it from shared memory.
"""

from __future__ import annotations

import functools

import torch

from ._gluon import (HAVE_GLUON, TensorDescriptor, fence_async_shared, gl, gluon, mbarrier, tma, warpgroup_mma,
                     warpgroup_mma_wait)
from ._triton import INTERPRETED, launch_options
from .geglu import _K as _K_GELU  # noqa: N811  the tanh GELU's constant
from .geglu import geglu_reference
from .smem_gemm import BOX_K, ROWS, SMEM_BUDGET, X_ROWS, _layout

E4M3_MAX = 448.0                  # the largest finite E4M3 (OCP e4m3fn) value: x rows are scaled onto it
SMEM_GEMM_FP8_MAX_ROWS = X_ROWS   # the 16-row kernel only


def smem_gemm_fp8_supported(M: int, N: int, K: int, geglu: bool, split_k: int) -> bool:
    """Shapes this kernel serves: 1-16 rows, whole 64-row (32 with GeGLU) weight tiles, K slices of whole 64-column
    boxes, no split-K with GeGLU, and the program's E4M3 weight slice, its x slice in bf16 and in E4M3 and the
    GeGLU scratch within SMEM_BUDGET."""
    rows = ROWS // 2 if geglu else ROWS
    if not 1 <= M <= SMEM_GEMM_FP8_MAX_ROWS or split_k < 1 or K % (split_k * BOX_K):
        return False
    if geglu and (N % 2 or split_k > 1):
        return False
    F = N // 2 if geglu else N
    if F % rows:
        return False
    k_slice = K // split_k
    return (ROWS + 3 * X_ROWS) * k_slice + 4 * ROWS * X_ROWS <= SMEM_BUDGET    # E4M3 W, bf16 and E4M3 x


def smem_gemm_fp8_reference(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, geglu: bool = False,
                            split_k: int = 1) -> torch.Tensor:
    """Plain PyTorch of the kernel's arithmetic: x rows quantized per K slice of K / split_k columns with the
    slice's maximum, E4M3 products summed in fp32, scaled per row and weight row. (M, N) fp32 partials summed over
    the splits, or GeGLU's (M, N / 2); in x.dtype."""
    M, K = x.shape
    ks = K // split_k
    xs = x.float().view(M, split_k, ks)
    amax = xs.abs().amax(dim=2, keepdim=True).clamp(min=1e-12)                      # (M, split_k, 1)
    xq = (xs * (E4M3_MAX / amax)).to(w_q.dtype).float()
    wq = w_q.float().view(w_q.shape[0], split_k, ks)
    y = torch.einsum("msk,nsk->msn", xq, wq) * (amax / E4M3_MAX)                    # (M, split_k, N)
    y = y.sum(dim=1) * w_scale.float()[None, :]
    return (geglu_reference(y) if geglu else y).to(x.dtype)


if HAVE_GLUON:
    from .smem_gemm import _gate_and_up, _program_slice, _tanh_geglu, _weight_slice_then_wait

    @gluon.jit
    def _smem_gemm_fp8_kernel(w_desc, x_desc, y_ptr, ws_ptr, M, F, stride_y, split_stride,
                              K_PER_SPLIT: gl.constexpr, GEGLU: gl.constexpr, KGELU: gl.constexpr,
                              FMAX: gl.constexpr, PDL: gl.constexpr, X8_LAYOUT: gl.constexpr):
        BLOCK_W: gl.constexpr = w_desc.block_type.shape[0]         # weight rows per TMA box: 64, or 32 with GeGLU
        NK: gl.constexpr = K_PER_SPLIT // 64
        pid_n, pid_k, n0, k0 = _program_slice(BLOCK_W, K_PER_SPLIT, PDL)
        w_smem = gl.allocate_shared_memory(w_desc.dtype, [NK, 64, 64], w_desc.layout)
        x_smem = gl.allocate_shared_memory(x_desc.dtype, [NK, 16, 64], x_desc.layout)      # bf16, as it comes
        x8_smem = gl.allocate_shared_memory(gl.float8e4nv, [NK, 16, 64], X8_LAYOUT)         # E4M3, wgmma's B
        bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(bars.index(0), count=1)
        mbarrier.init(bars.index(1), count=1)
        # y[m, n0 + r] = acc[r, m]: threads along r, the contiguous axis of y
        out_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1], threads_per_warp=[32, 1],
                                                    warps_per_cta=[1, 4], order=[0, 1])
        r = gl.arange(0, BLOCK_W, layout=gl.SliceLayout(1, out_layout))
        m = gl.arange(0, 16, layout=gl.SliceLayout(0, out_layout))
        s_lo = gl.load(ws_ptr + n0 + r)                             # weight row scales: load-time, before the wait
        if GEGLU:
            s_hi = gl.load(ws_ptr + F + n0 + r)
        _weight_slice_then_wait(w_desc, w_smem, bars.index(0), n0, k0, F, NK, GEGLU, PDL, W_BYTES=1)
        # x's slice by TMA (rows past M zero-filled), then from shared memory (16 x 64 per box, 8 bf16 per thread):
        # the rows' maxima over the slice, then each box scaled onto FMAX in E4M3 into x8_smem
        mbarrier.expect(bars.index(1), NK * 16 * 64 * 2)
        for i in gl.static_range(NK):
            tma.async_copy_global_to_shared(x_desc, [0, k0 + i * 64], bars.index(1), x_smem.index(i))
        x_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[4, 8],
                                                  warps_per_cta=[4, 1], order=[1, 0])
        big = gl.zeros([16, 64], x_desc.dtype, layout=x_layout)     # elementwise maxima (exact in bf16), reduced after
        mbarrier.wait(bars.index(1), phase=0)
        for i in gl.static_range(NK):
            big = gl.maximum(big, gl.abs(x_smem.index(i).load(x_layout)))
        amax = gl.maximum(gl.max(big.to(gl.float32), axis=1), 1e-12)    # a zero row: zeros, not NaN
        inv = FMAX / amax
        for i in gl.static_range(NK):
            t = x_smem.index(i).load(x_layout).to(gl.float32)
            x8_smem.index(i).store((t * inv[:, None]).to(gl.float8e4nv))
        fence_async_shared()                 # the threads' x stores visible to the async proxy (wgmma) ...
        gl.thread_barrier()                  # ... from every warp before any warp's wgmma reads them
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                             instr_shape=[16, 16, 32])
        acc = gl.zeros((64, 16), dtype=gl.float32, layout=acc_layout)        # (weight rows, x rows) = y^T
        mbarrier.wait(bars.index(0), phase=0)
        for i in gl.static_range(NK):
            acc = warpgroup_mma(w_smem.index(i), x8_smem.index(i).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.invalidate(bars.index(0))
        mbarrier.invalidate(bars.index(1))
        sx = gl.convert_layout(amax / FMAX, gl.SliceLayout(0, out_layout))     # the x rows' scales
        if GEGLU:
            g, u = _gate_and_up(acc, out_layout, BLOCK_W, 16)
            y = _tanh_geglu(g * s_lo[:, None] * sx[None, :], u * s_hi[:, None] * sx[None, :], KGELU)
        else:
            y = gl.convert_layout(acc, out_layout) * s_lo[:, None] * sx[None, :]
        cols = n0 + r
        ptrs = y_ptr + pid_k * split_stride + m[None, :] * stride_y + cols[:, None]
        gl.store(ptrs, y.to(y_ptr.dtype.element_ty), mask=(m < M)[None, :] & (cols < F)[:, None])


@functools.lru_cache(maxsize=None)
def _layout_e4m3(rows: int):
    """The NVMMA shared layout of an E4M3 box (rows, 64): 64 bytes per row, the 64-byte swizzle."""
    return gl.NVMMASharedLayout.get_default_for([rows, BOX_K], gl.float8e4nv)


def smem_gemm_fp8(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, geglu: bool = False, split_k: int = 1,
                  pdl: bool | int = False, out: torch.Tensor | None = None) -> torch.Tensor:
    """Gluon launcher; the contract of smem_gemm_fp8_reference: bf16 x (M <= 16, K), E4M3 (float8_e4m3fn) W_q
    (N, K) and its fp32 row scales (N,). Returns (M, N) or GeGLU's (M, N / 2) in bf16, or with split_k > 1 the
    (split_k, M, N) fp32 partials. pdl: False, True or EARLY_TRIGGER (kernels/flashrt_kernels/_triton.py). out: optional
    preallocated result."""
    if not HAVE_GLUON or INTERPRETED:
        raise RuntimeError("smem_gemm_fp8 needs Triton's Gluon and a Hopper GPU (no interpreter)")
    M, K = x.shape
    N = w_q.shape[0]
    if x.dtype != torch.bfloat16 or w_q.dtype != torch.float8_e4m3fn or not x.is_contiguous() \
            or not w_q.is_contiguous() or w_q.shape[1] != K or not smem_gemm_fp8_supported(M, N, K, geglu, split_k):
        raise ValueError(f"smem_gemm_fp8: contiguous bf16 x (M<=16, K) and float8_e4m3fn W (N, K) with whole 64-row "
                         f"tiles and K slices of 64; got {tuple(x.shape)} {x.dtype}, {tuple(w_q.shape)} {w_q.dtype}, "
                         f"geglu={geglu}, split_k={split_k}")
    if w_scale.shape != (N,) or w_scale.dtype != torch.float32 or not w_scale.is_contiguous():
        raise ValueError(f"smem_gemm_fp8: w_scale must be a contiguous ({N},) fp32 tensor, got "
                         f"{tuple(w_scale.shape)} {w_scale.dtype}")
    F = N // 2 if geglu else N
    shape, dtype = ((split_k, M, N), torch.float32) if split_k > 1 else ((M, F), x.dtype)
    if out is None:
        out = torch.empty(shape, device=x.device, dtype=dtype)
    elif out.shape != shape or out.dtype != dtype or not out.is_contiguous():
        raise ValueError(f"smem_gemm_fp8: out must be a contiguous {shape} {dtype} tensor")
    rows = ROWS // 2 if geglu else ROWS
    w_desc = TensorDescriptor.from_tensor(w_q, [rows, BOX_K], _layout_e4m3(rows))
    x_desc = TensorDescriptor.from_tensor(x, [X_ROWS, BOX_K], _layout(X_ROWS))        # rows past M read as zeros
    _smem_gemm_fp8_kernel[(F // rows, split_k)](
        w_desc, x_desc, out, w_scale, M, F, out.stride(-2), M * N, K_PER_SPLIT=K // split_k, GEGLU=geglu,
        KGELU=_K_GELU, FMAX=E4M3_MAX, PDL=int(pdl), X8_LAYOUT=_layout_e4m3(X_ROWS), num_warps=4,
        **launch_options(pdl))
    return out


__all__ = ["E4M3_MAX", "SMEM_GEMM_FP8_MAX_ROWS", "smem_gemm_fp8", "smem_gemm_fp8_reference",
           "smem_gemm_fp8_supported"]
