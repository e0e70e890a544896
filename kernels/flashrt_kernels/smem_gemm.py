"""Few-row GEMM whose weight slice is in shared memory before the PDL wait (NVIDIA sm90, Gluon: TMA + wgmma).

    y = x @ W^T                 x (M, K) with M <= 64, W (N, K); each program owns 64 weight rows (N) for all M
    GeGLU (W = [W_gate; W_up], N = 2F):  y = gelu_tanh(x @ W_gate^T) * (x @ W_up^T)     (M, F); a program owns
                                32 gate rows and the 32 up rows of the same columns, stacked in one 64-row tile
    split-K: program k of SPLIT_K writes the fp32 partial of its K slice into part[k] (SPLIT_K, M, N), as
             kernels/flashrt_kernels/skinny_gemm.py does; the norm after it sums them.
    bias (N,):  y = x @ W^T + b, added to the fp32 products (to partial 0 alone with split-K); gelu (no GeGLU, no
             split-K): y = gelu_tanh(x @ W^T [+ b]) -- GR00T's DiT GEMMs (engine/groot_dit_gemms.py), as the
             few-row Triton GEMM's epilogues
    norm_in (AdaNormIn, up to 16 rows, no split-K): x is the adaRMSNorm of the fp32 residual stream,
             rms(residual) * scale1p + shift, which every program computes itself from the whole residual rows
             (the pi0.5 expert's norm before QKV and gate/up, without a norm kernel)
    residual_out (ResidualOut, up to 16 rows, no GeGLU): residual += gate * (x @ W^T) in place, every K slice
             adding its share with fp32 atomics (the gated residual after O and down, without a norm kernel to
             sum the partials; the order of the additions varies, so the last bits of a result vary between runs)

Why: in a denoising step each decoder GEMM (kernels/flashrt_kernels/skinny_gemm.py) starts streaming its weights only after its PDL
wait, so HBM idles while the norms and the attention run (tools/profile_engine_timeline.py, 2026-11-30: the
four GEMMs move 34.6 MB per layer at 1.7 TB/s). The one-shot Triton configurations that load their
slice before the wait hold it in registers, which caps the slice at ~32 KB per program; the gate/up GEMM needs
128 KB. Here every program issues its whole weight slice to shared memory with TMA (cp.async.bulk.tensor, one
mbarrier) before griddepcontrol.wait, then loads x (TMA, rows past M zero-filled), and runs the products on the
tensor cores swapped (the weight rows are wgmma's 64-row M side, the x rows its N = 16 side), so only x's few rows
and the 64 x 16 accumulator sit in registers.

17-64 rows (a horizon-50 step: 50 or 51 rows; `_smem_gemm_rows_kernel`): the same weight slice before the wait,
but x in 32- or 64-row boxes does not fit beside a 128 KB slice, so it streams through a ring of 64-column boxes
(x_ring_stages: as many as fit, at most 8) after the wait, each box multiplied as it lands. Measured on the H200
at horizon 50: pi0.5 12.42 -> 12.16 ms per predict, pi0 12.82 -> 12.34 ms (EngineOptions.smem_gemm_rows).

Provenance: the swap-AB skinny GEMM is the usual small-batch decode layout (the weights as the MMA's M operand);
the Gluon structure follows Triton's Gluon tutorials (TMA, mbarrier, warpgroup_mma). Its GPU test compares it with
skinny_gemm_reference.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from ._gluon import (HAVE_GLUON, TensorDescriptor, fence_async_shared, gl, gluon, griddep, mbarrier, tma,
                     warpgroup_mma, warpgroup_mma_wait)
from ._triton import INTERPRETED, launch_options
from .ada_rms_norm import ada_rms_norm_reference
from .geglu import _K as _K_GELU  # noqa: N811  the tanh GELU's constant
from .skinny_gemm import skinny_gemm_reference

ROWS = 64            # weight rows per program: wgmma's M
X_ROWS = 16          # x rows per program (M <= 16): wgmma's N
SMEM_GEMM_MAX_ROWS = 64              # 17-64 rows: _smem_gemm_rows_kernel (x tiles of 32 or 64 rows, a ring)
BOX_K = 64           # K per TMA box: 128 bytes of bf16, the 128-byte swizzle
SMEM_BUDGET = 220 * 1024             # of the 227 KB of shared memory a Hopper SM gives one program
MAX_X_STAGES = 8     # x boxes in flight in the 17-64-row kernel's ring


def x_tile_rows(M: int) -> int:
    """x rows per program (wgmma's N): 16 up to 16 rows, then 32 or 64."""
    return X_ROWS if M <= X_ROWS else 32 if M <= 32 else 64


def x_ring_stages(M: int, k_slice: int, geglu: bool) -> int:
    """17-64 rows: how many x boxes (x_tile_rows(M) x 64) the ring holds beside the program's whole weight slice
    (64 x k_slice) and the GeGLU scratch (64 x x rows, fp32) in SMEM_BUDGET; at most MAX_X_STAGES and no more than
    the slice has boxes; 0 where not even two fit (one where the slice is one box)."""
    xr = x_tile_rows(M)
    free = SMEM_BUDGET - ROWS * k_slice * 2 - (4 * ROWS * xr if geglu else 0)
    stages = min(free // (xr * BOX_K * 2), MAX_X_STAGES, k_slice // BOX_K)
    return stages if stages >= min(2, k_slice // BOX_K) else 0


def smem_gemm_supported(M: int, N: int, K: int, geglu: bool, split_k: int) -> bool:
    """Shapes this kernel serves: at most 64 rows, whole 64-row (32 with GeGLU) weight tiles, K slices of whole
    64-column boxes, and a weight slice that fits the 227 KB of shared memory of a Hopper SM beside x: with at
    most 16 rows the whole x slice, with 17-64 rows a ring of at least two x boxes (x_ring_stages)."""
    rows = ROWS // 2 if geglu else ROWS
    if not 1 <= M <= SMEM_GEMM_MAX_ROWS or K % (split_k * BOX_K) or (geglu and (N % 2 or split_k > 1)):
        return False
    F = N // 2 if geglu else N
    k_slice = K // split_k
    if F % rows:
        return False
    if M > X_ROWS:
        return x_ring_stages(M, k_slice, geglu) > 0
    return (ROWS + X_ROWS) * k_slice * 2 + 4 * ROWS * X_ROWS <= SMEM_BUDGET


if HAVE_GLUON:
    @gluon.jit
    def _weight_slice_then_wait(w_desc, w_smem, bar, n0, k0, F, NK: gl.constexpr, GEGLU: gl.constexpr,
                                PDL: gl.constexpr):
        """Both kernels' start: the program's whole weight slice (NK boxes of 64 rows x 64 columns, or of 32 gate + 32 up rows with GeGLU) issued to shared memory on
        one mbarrier, then the PDL wait (the slice depends on no earlier kernel, so it streams during the kernel
        ahead's tail)."""
        BLOCK_W: gl.constexpr = w_desc.block_type.shape[0]
        mbarrier.expect(bar, NK * 64 * 64 * 2)
        for i in gl.static_range(NK):
            if GEGLU:
                tma.async_copy_global_to_shared(w_desc, [n0, k0 + i * 64], bar, w_smem.index(i).slice(0, BLOCK_W))
                tma.async_copy_global_to_shared(w_desc, [F + n0, k0 + i * 64], bar,
                                                w_smem.index(i).slice(BLOCK_W, BLOCK_W))
            else:
                tma.async_copy_global_to_shared(w_desc, [n0, k0 + i * 64], bar, w_smem.index(i))
        if PDL:
            griddep("griddepcontrol.wait; // dummy $0")
            if PDL == 1:
                griddep("griddepcontrol.launch_dependents; // dummy $0")

    @gluon.jit
    def _program_slice(BLOCK_W: gl.constexpr, K_PER_SPLIT: gl.constexpr, PDL: gl.constexpr):
        """Both kernels' first steps: the early release of the next kernel where asked (PDL == 2,
        kernels/flashrt_kernels/_triton.py EARLY_TRIGGER), then this program's (pid_n, pid_k) and its first weight row and K
        column."""
        if PDL == 2:
            griddep("griddepcontrol.launch_dependents; // dummy $0")
        pid_n = gl.program_id(0)
        pid_k = gl.program_id(1)
        return pid_n, pid_k, pid_n * BLOCK_W, pid_k * K_PER_SPLIT

    @gluon.jit
    def _gate_and_up(acc, out_layout: gl.constexpr, BLOCK_W: gl.constexpr, XR: gl.constexpr):
        """GeGLU's two halves of the accumulator (weight rows, x rows) in out_layout: the gate rows 0..BLOCK_W-1
        and the up rows after them sit in different warps, so they meet in shared memory."""
        scratch = gl.allocate_shared_memory(gl.float32, [2 * BLOCK_W, XR],
                                            gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0]))
        scratch.store(acc)
        gl.thread_barrier()
        return scratch.slice(0, BLOCK_W).load(out_layout), scratch.slice(BLOCK_W, BLOCK_W).load(out_layout)

    @gluon.jit
    def _tanh_geglu(g, u, KGELU: gl.constexpr):
        """gelu_tanh(g) * u, with tanh(z) = 2 / (1 + e^(-2z)) - 1 folded: gelu_tanh(g) = g / (1 + e^(-KGELU (g +
        0.044715 g^3)))."""
        return g / (1.0 + gl.exp(-KGELU * (g + 0.044715 * g * g * g))) * u

    @gluon.jit
    def _bias_and_gelu(y, bias_ptr, cols, pid_k, F, HAS_BIAS: gl.constexpr, GELU: gl.constexpr,
                       KGELU: gl.constexpr):
        """The epilogues on y (weight rows = output columns `cols`, x rows) in fp32: the bias (partial 0 alone, so
        the partials still sum to the biased product), then the tanh GELU."""
        if HAS_BIAS:
            b = gl.load(bias_ptr + cols, mask=(cols < F) & (pid_k == 0), other=0.0).to(gl.float32)
            y = y + b[:, None]
        if GELU:
            y = y / (1.0 + gl.exp(-KGELU * (y + 0.044715 * y * y * y)))
        return y

    @gluon.jit
    def _x_ring_products(w_smem, x_smem, x_desc, bars, X_BAR: gl.constexpr, k0, NK: gl.constexpr,
                         X_STAGES: gl.constexpr, XR: gl.constexpr):
        """The products of a weight slice already on its way to w_smem (NK 64 x 64 boxes, on mbarrier bars[0]) with
        x streamed through a ring of X_STAGES boxes of XR rows (mbarriers bars[X_BAR:]) from column k0, each box
        multiplied on wgmma as it lands (the weight rows its 64-row M side, the x rows its N side): the (64, XR)
        fp32 accumulator, every product done. Used after the PDL wait by _smem_gemm_rows_kernel."""
        for j in gl.static_range(X_STAGES):                        # the ring's first X_STAGES boxes
            mbarrier.expect(bars.index(X_BAR + j), XR * 64 * 2)
            tma.async_copy_global_to_shared(x_desc, [0, k0 + j * 64], bars.index(X_BAR + j), x_smem.index(j))
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                             instr_shape=[16, XR, 16])
        acc = gl.zeros((64, XR), dtype=gl.float32, layout=acc_layout)        # (weight rows, x rows) = y^T
        mbarrier.wait(bars.index(0), phase=0)
        for i in gl.static_range(NK):
            # box i sits in stage i % X_STAGES, its (i // X_STAGES)-th fill
            mbarrier.wait(bars.index(X_BAR + i % X_STAGES), phase=(i // X_STAGES) & 1)
            acc = warpgroup_mma(w_smem.index(i), x_smem.index(i % X_STAGES).permute((1, 0)), acc, is_async=True)
            if i + X_STAGES < NK:              # this stage's next box: only after the product that reads it
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
                mbarrier.expect(bars.index(X_BAR + i % X_STAGES), XR * 64 * 2)
                tma.async_copy_global_to_shared(x_desc, [0, k0 + (i + X_STAGES) * 64],
                                                bars.index(X_BAR + i % X_STAGES), x_smem.index(i % X_STAGES))
        return warpgroup_mma_wait(num_outstanding=0, deps=(acc,))

    @gluon.jit
    def _normed_x_to_smem(x_smem, res_ptr, scale_ptr, shift_ptr, M, stride_res, eps, K: gl.constexpr):
        """NORM_IN's x: the adaRMSNorm of the fp32 residual (M, K), rms(h) * scale1p + shift, as bf16 into x_smem's
        K / 64 boxes (rows past M zero). Two passes over the residual (the row sums of squares, then the scaled
        values), each 16 x 64 fp32 box in 16-byte loads; the second pass finds it in L1."""
        xl: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[2, 16], warps_per_cta=[4, 1],
                                            order=[1, 0])
        rows = gl.arange(0, 16, layout=gl.SliceLayout(1, xl))
        cols = gl.arange(0, 64, layout=gl.SliceLayout(0, xl))
        row_ok = (rows < M)[:, None] & (cols < 64)[None, :]
        base = res_ptr + rows[:, None] * stride_res + cols[None, :]
        ss = gl.zeros([16], gl.float32, layout=gl.SliceLayout(1, xl))
        for i in gl.static_range(K // 64):
            h = gl.load(base + i * 64, mask=row_ok, other=0.0)
            ss += gl.sum(h * h, axis=1)
        inv = gl.rsqrt(ss / K + eps)
        for i in gl.static_range(K // 64):
            h = gl.load(base + i * 64, mask=row_ok, other=0.0)
            s1p = gl.load(scale_ptr + i * 64 + cols)
            sh = gl.load(shift_ptr + i * 64 + cols)
            y = gl.where(row_ok, h * inv[:, None] * s1p[None, :] + sh[None, :], 0.0)
            x_smem.index(i).store(y.to(gl.bfloat16))
        fence_async_shared()          # the generic-proxy stores, seen by wgmma (the async proxy)
        gl.thread_barrier()

    @gluon.jit
    def _smem_gemm_kernel(w_desc, x_desc, y_ptr, bias_ptr, M, F, stride_y, split_stride,
                          K_PER_SPLIT: gl.constexpr, GEGLU: gl.constexpr, KGELU: gl.constexpr, PDL: gl.constexpr,
                          HAS_BIAS: gl.constexpr = False, GELU: gl.constexpr = False,
                          res_ptr=None, scale_ptr=None, shift_ptr=None, gate_ptr=None, stride_res=0, eps=0.0,
                          NORM_IN: gl.constexpr = False, RESIDUAL_OUT: gl.constexpr = False):
        BLOCK_W: gl.constexpr = w_desc.block_type.shape[0]         # weight rows per TMA box: 64, or 32 with GeGLU
        NK: gl.constexpr = K_PER_SPLIT // 64
        _, pid_k, n0, k0 = _program_slice(BLOCK_W, K_PER_SPLIT, PDL)
        w_smem = gl.allocate_shared_memory(w_desc.dtype, [NK, 64, 64], w_desc.layout)
        x_smem = gl.allocate_shared_memory(x_desc.dtype, [NK, 16, 64], x_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(bars.index(0), count=1)
        mbarrier.init(bars.index(1), count=1)
        # the whole weight slice in flight before the wait: it depends on no earlier kernel
        # y[m, n0 + r] = acc[r, m]: threads along r, the contiguous axis of y
        out_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1], threads_per_warp=[32, 1],
                                                    warps_per_cta=[1, 4], order=[0, 1])
        r = gl.arange(0, BLOCK_W, layout=gl.SliceLayout(1, out_layout))
        m = gl.arange(0, 16, layout=gl.SliceLayout(0, out_layout))
        _weight_slice_then_wait(w_desc, w_smem, bars.index(0), n0, k0, F, NK, GEGLU, PDL)
        if NORM_IN:
            _normed_x_to_smem(x_smem, res_ptr, scale_ptr, shift_ptr, M, stride_res, eps, K_PER_SPLIT)
        else:
            mbarrier.expect(bars.index(1), NK * 16 * 64 * 2)
            for i in gl.static_range(NK):
                tma.async_copy_global_to_shared(x_desc, [0, k0 + i * 64], bars.index(1), x_smem.index(i))
        mbarrier.wait(bars.index(0), phase=0)
        if not NORM_IN:
            mbarrier.wait(bars.index(1), phase=0)
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                             instr_shape=[16, 16, 16])
        acc = gl.zeros((64, 16), dtype=gl.float32, layout=acc_layout)        # (weight rows, x rows) = y^T
        for i in gl.static_range(NK):
            acc = warpgroup_mma(w_smem.index(i), x_smem.index(i).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.invalidate(bars.index(0))
        mbarrier.invalidate(bars.index(1))
        if GEGLU:
            g, u = _gate_and_up(acc, out_layout, BLOCK_W, 16)
            y = _tanh_geglu(g, u, KGELU)
        else:
            y = gl.convert_layout(acc, out_layout)
        cols = n0 + r
        y = _bias_and_gelu(y, bias_ptr, cols, pid_k, F, HAS_BIAS, GELU, KGELU)
        mask = (m < M)[None, :] & (cols < F)[:, None]
        if RESIDUAL_OUT:     # residual += gate * y: every K slice adds its share in place (y_ptr is not written)
            g = gl.load(gate_ptr + cols, mask=cols < F, other=0.0)
            gl.atomic_add(res_ptr + m[None, :] * stride_res + cols[:, None], y * g[:, None], mask=mask,
                          sem="relaxed")
        else:
            ptrs = y_ptr + pid_k * split_stride + m[None, :] * stride_y + cols[:, None]
            gl.store(ptrs, y.to(y_ptr.dtype.element_ty), mask=mask)


    @gluon.jit
    def _smem_gemm_rows_kernel(w_desc, x_desc, y_ptr, bias_ptr, M, F, stride_y, split_stride,
                               K_PER_SPLIT: gl.constexpr, GEGLU: gl.constexpr, KGELU: gl.constexpr,
                               PDL: gl.constexpr, X_STAGES: gl.constexpr, HAS_BIAS: gl.constexpr = False,
                               GELU: gl.constexpr = False):
        """17-64 rows (a horizon-50 denoising step): the weight slice as above, in shared memory before the PDL
        wait; x, 32 or 64 rows per box, too large beside it at these rows, streams through a ring of X_STAGES boxes
        (one mbarrier each) after the wait, and each box's product runs on wgmma as it lands (the weight rows its
        64-row M side, the x rows its N side, as above)."""
        BLOCK_W: gl.constexpr = w_desc.block_type.shape[0]         # weight rows per TMA box: 64, or 32 with GeGLU
        XR: gl.constexpr = x_desc.block_type.shape[0]              # x rows per box: 32 or 64
        NK: gl.constexpr = K_PER_SPLIT // 64
        pid_n, pid_k, n0, k0 = _program_slice(BLOCK_W, K_PER_SPLIT, PDL)
        w_smem = gl.allocate_shared_memory(w_desc.dtype, [NK, 64, 64], w_desc.layout)
        x_smem = gl.allocate_shared_memory(x_desc.dtype, [X_STAGES, XR, 64], x_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [X_STAGES + 1, 1], mbarrier.MBarrierLayout())  # w, x stages
        for i in gl.static_range(X_STAGES + 1):
            mbarrier.init(bars.index(i), count=1)
        _weight_slice_then_wait(w_desc, w_smem, bars.index(0), n0, k0, F, NK, GEGLU, PDL)
        acc = _x_ring_products(w_smem, x_smem, x_desc, bars, 1, k0, NK, X_STAGES, XR)
        for i in gl.static_range(X_STAGES + 1):
            mbarrier.invalidate(bars.index(i))
        out_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1], threads_per_warp=[32, 1],
                                                    warps_per_cta=[1, 4], order=[0, 1])
        r = gl.arange(0, BLOCK_W, layout=gl.SliceLayout(1, out_layout))
        m = gl.arange(0, XR, layout=gl.SliceLayout(0, out_layout))
        if GEGLU:
            g, u = _gate_and_up(acc, out_layout, BLOCK_W, XR)
            y = _tanh_geglu(g, u, KGELU)
        else:
            y = gl.convert_layout(acc, out_layout)
        cols = n0 + r
        y = _bias_and_gelu(y, bias_ptr, cols, pid_k, F, HAS_BIAS, GELU, KGELU)
        ptrs = y_ptr + pid_k * split_stride + m[None, :] * stride_y + cols[:, None]
        gl.store(ptrs, y.to(y_ptr.dtype.element_ty), mask=(m < M)[None, :] & (cols < F)[:, None])


class AdaNormIn(NamedTuple):
    """x of a norm_in launch: the GEMM multiplies rms(residual) * scale1p + shift (ada_rms_norm_reference with no
    x), computed from residual by every program."""
    residual: torch.Tensor       # (M, K) fp32, contiguous
    scale1p: torch.Tensor        # (K,) fp32, contiguous: 1 + the adaRMSNorm's scale
    shift: torch.Tensor          # (K,) fp32, contiguous
    eps: float


class ResidualOut(NamedTuple):
    """Where a residual_out launch adds its product: residual += gate * (x @ W^T), in place."""
    residual: torch.Tensor       # (M, N) fp32, contiguous
    gate: torch.Tensor           # (N,) fp32, contiguous


def smem_gemm_norm_in_reference(norm_in: AdaNormIn, w: torch.Tensor, geglu: bool = False) -> torch.Tensor:
    """Plain PyTorch of a norm_in launch: the bf16 adaRMSNorm of the residual, then skinny_gemm_reference."""
    x, _ = ada_rms_norm_reference(None, norm_in.residual, None, norm_in.scale1p, norm_in.shift, norm_in.eps,
                                  out_dtype=w.dtype)
    return skinny_gemm_reference(x, w, geglu=geglu)


def smem_gemm_residual_out_reference(x: torch.Tensor, w: torch.Tensor, residual_out: ResidualOut) -> torch.Tensor:
    """Plain PyTorch of a residual_out launch: the new residual, residual + gate * (x @ W^T) in fp32."""
    return residual_out.residual.float() + residual_out.gate.float() * (x.float() @ w.float().T)


def _check_fused(x: torch.Tensor | None, w: torch.Tensor, geglu: bool, split_k: int, bias, gelu: bool,
                 norm_in: AdaNormIn | None, residual_out: ResidualOut | None) -> tuple[int, int]:
    """(M, K) of a norm_in / residual_out launch; ValueError naming what does not fit."""
    if norm_in is not None and residual_out is not None:
        raise ValueError("smem_gemm: norm_in and residual_out are for different GEMMs (before / after the norm)")
    if bias is not None or gelu:
        raise ValueError("smem_gemm: norm_in / residual_out take no bias and no GELU")
    N, K = w.shape
    if norm_in is not None:
        res = norm_in.residual
        M = res.shape[0]
        if x is not None:
            raise ValueError("smem_gemm: with norm_in the GEMM's x is norm_in's; pass x=None")
        if split_k != 1:
            raise ValueError(f"smem_gemm: norm_in needs whole rows (split_k=1), got split_k={split_k}")
        vectors = {"scale1p": norm_in.scale1p, "shift": norm_in.shift}
        want = (M, K)
    else:
        M = x.shape[0]
        res = residual_out.residual
        if geglu:
            raise ValueError("smem_gemm: residual_out adds a plain product (no GeGLU)")
        vectors = {"gate": residual_out.gate}
        want = (M, N)
    if not 1 <= M <= X_ROWS:
        raise ValueError(f"smem_gemm: norm_in / residual_out run the {X_ROWS}-row kernel, got {M} rows")
    if res.shape != want or res.dtype != torch.float32 or not res.is_contiguous():
        raise ValueError(f"smem_gemm: the residual must be a contiguous {want} fp32 tensor, got "
                         f"{tuple(res.shape)} {res.dtype}")
    length = want[1]
    for name, v in vectors.items():
        if v.shape != (length,) or v.dtype != torch.float32 or not v.is_contiguous():
            raise ValueError(f"smem_gemm: {name} must be a contiguous ({length},) fp32 vector, got "
                             f"{tuple(v.shape)} {v.dtype}")
    return M, K


@functools.lru_cache(maxsize=None)
def _layout(rows: int, cols: int = BOX_K):
    """The NVMMA shared layout of a bf16 TMA box (rows, cols)."""
    return gl.NVMMASharedLayout.get_default_for([rows, cols], gl.bfloat16)


def smem_gemm(x: torch.Tensor | None, w: torch.Tensor, geglu: bool = False, split_k: int = 1,
              pdl: bool | int = False, out: torch.Tensor | None = None, bias: torch.Tensor | None = None,
              gelu: bool = False, norm_in: AdaNormIn | None = None,
              residual_out: ResidualOut | None = None) -> torch.Tensor:
    """Gluon launcher; the contract of kernels/flashrt_kernels/skinny_gemm.py skinny_gemm_reference (bf16 x and W, M <= 64; the
    16-row kernel up to 16 rows, _smem_gemm_rows_kernel from 17).
    pdl: False, True or EARLY_TRIGGER (kernels/flashrt_kernels/_triton.py). out: optional preallocated result.
    bias (N,) contiguous: added in the epilogue (partial 0 with split-K); gelu: the tanh GELU (not with geglu or
    split-K). norm_in (x=None): smem_gemm_norm_in_reference's result. residual_out: residual_out.residual updated
    to smem_gemm_residual_out_reference's and returned (any split_k; no out)."""
    if not HAVE_GLUON or INTERPRETED:
        raise RuntimeError("smem_gemm needs Triton's Gluon and a Hopper GPU (no interpreter)")
    if norm_in is not None or residual_out is not None:
        return _smem_gemm_fused(x, w, geglu, split_k, pdl, out, bias, gelu, norm_in, residual_out)
    M, K = x.shape
    N = w.shape[0]
    if gelu and (geglu or split_k > 1):
        raise ValueError("smem_gemm: the GELU epilogue needs the whole product: no GeGLU, no split-K")
    if x.dtype != torch.bfloat16 or w.dtype != torch.bfloat16 or not x.is_contiguous() or not w.is_contiguous() \
            or w.shape[1] != K or not smem_gemm_supported(M, N, K, geglu, split_k):
        raise ValueError(f"smem_gemm: contiguous bf16 x (M<=64, K) and W (N, K) with whole 64-row tiles and K "
                         f"slices of 64; got {tuple(x.shape)} {x.dtype}, {tuple(w.shape)} {w.dtype}, "
                         f"geglu={geglu}, split_k={split_k}")
    if bias is not None and (geglu or bias.shape != (N,) or not bias.is_contiguous()):
        raise ValueError(f"smem_gemm: bias must be a contiguous ({N},) tensor, without GeGLU; got "
                         f"{tuple(bias.shape)}, geglu={geglu}")
    F = N // 2 if geglu else N
    shape, dtype = ((split_k, M, N), torch.float32) if split_k > 1 else ((M, F), x.dtype)
    if out is None:
        out = torch.empty(shape, device=x.device, dtype=dtype)
    elif out.shape != shape or out.dtype != dtype or not out.is_contiguous():
        raise ValueError(f"smem_gemm: out must be a contiguous {shape} {dtype} tensor")
    rows = ROWS // 2 if geglu else ROWS
    # TMA descriptors are built per launch (host work only: a captured graph keeps them); a cache would keep the
    # weights alive after their engine is closed
    w_desc = TensorDescriptor.from_tensor(w, [rows, BOX_K], _layout(rows))
    xr = x_tile_rows(M)
    x_desc = TensorDescriptor.from_tensor(x, [xr, BOX_K], _layout(xr))   # rows past M read as zeros
    grid = (F // rows, split_k)
    if M > X_ROWS:
        _smem_gemm_rows_kernel[grid](w_desc, x_desc, out, out if bias is None else bias, M, F, out.stride(-2),
                                     M * N, K_PER_SPLIT=K // split_k, GEGLU=geglu, KGELU=_K_GELU, PDL=int(pdl),
                                     X_STAGES=x_ring_stages(M, K // split_k, geglu), HAS_BIAS=bias is not None,
                                     GELU=gelu, num_warps=4, **launch_options(pdl))
        return out
    _smem_gemm_kernel[grid](w_desc, x_desc, out, out if bias is None else bias, M, F, out.stride(-2), M * N,
                            K_PER_SPLIT=K // split_k, GEGLU=geglu, KGELU=_K_GELU, PDL=int(pdl),
                            HAS_BIAS=bias is not None, GELU=gelu, num_warps=4, **launch_options(pdl))
    return out


def _smem_gemm_fused(x, w, geglu, split_k, pdl, out, bias, gelu, norm_in, residual_out) -> torch.Tensor:
    """smem_gemm with norm_in or residual_out: the 16-row kernel with NORM_IN or RESIDUAL_OUT."""
    M, K = _check_fused(x, w, geglu, split_k, bias, gelu, norm_in, residual_out)
    N = w.shape[0]
    if w.dtype != torch.bfloat16 or not w.is_contiguous() or (x is not None and (
            x.dtype != torch.bfloat16 or not x.is_contiguous() or x.shape[1] != K)) \
            or not smem_gemm_supported(M, N, K, geglu, split_k):
        raise ValueError(f"smem_gemm: contiguous bf16 x and W (N, K) with whole 64-row tiles and K slices of 64; "
                         f"got x {None if x is None else tuple(x.shape)}, W {tuple(w.shape)} {w.dtype}, "
                         f"geglu={geglu}, split_k={split_k}")
    F = N // 2 if geglu else N
    rows = ROWS // 2 if geglu else ROWS
    w_desc = TensorDescriptor.from_tensor(w, [rows, BOX_K], _layout(rows))
    # norm_in loads no x by TMA: a descriptor of W with x's box gives x's shared memory its type and layout
    x_desc = TensorDescriptor.from_tensor(w if x is None else x, [X_ROWS, BOX_K], _layout(X_ROWS))
    grid = (F // rows, split_k)
    if norm_in is not None:
        if out is None:
            out = torch.empty(M, F, device=w.device, dtype=w.dtype)
        elif out.shape != (M, F) or out.dtype != w.dtype or not out.is_contiguous():
            raise ValueError(f"smem_gemm: out must be a contiguous ({M}, {F}) {w.dtype} tensor")
        _smem_gemm_kernel[grid](w_desc, x_desc, out, None, M, F, out.stride(0), 0, K_PER_SPLIT=K, GEGLU=geglu,
                                KGELU=_K_GELU, PDL=int(pdl), res_ptr=norm_in.residual, scale_ptr=norm_in.scale1p,
                                shift_ptr=norm_in.shift, stride_res=norm_in.residual.stride(0),
                                eps=float(norm_in.eps), NORM_IN=True, num_warps=4, **launch_options(pdl))
        return out
    if out is not None:
        raise ValueError("smem_gemm: residual_out writes the residual; out must be None")
    res = residual_out.residual
    _smem_gemm_kernel[grid](w_desc, x_desc, res, None, M, F, 0, 0, K_PER_SPLIT=K // split_k, GEGLU=False,
                            KGELU=_K_GELU, PDL=int(pdl), res_ptr=res, gate_ptr=residual_out.gate,
                            stride_res=res.stride(0), RESIDUAL_OUT=True, num_warps=4, **launch_options(pdl))
    return res


__all__ = ["HAVE_GLUON", "SMEM_GEMM_MAX_ROWS", "X_ROWS", "AdaNormIn", "ResidualOut", "smem_gemm",
           "smem_gemm_norm_in_reference", "smem_gemm_residual_out_reference", "smem_gemm_supported",
           "x_ring_stages", "x_tile_rows"]
