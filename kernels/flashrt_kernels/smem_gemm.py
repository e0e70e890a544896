"""Few-row GEMM whose weight slice is in shared memory before the PDL wait (NVIDIA sm90, Gluon: TMA + wgmma).

    y = x @ W^T                 x (M, K) with M <= 64, W (N, K); each program owns 64 weight rows (N) for all M
    GeGLU (W = [W_gate; W_up], N = 2F):  y = gelu_tanh(x @ W_gate^T) * (x @ W_up^T)     (M, F); a program owns
                                32 gate rows and the 32 up rows of the same columns, stacked in one 64-row tile
    split-K: program k of SPLIT_K writes the fp32 partial of its K slice into part[k] (SPLIT_K, M, N), as
             kernels/flashrt_kernels/skinny_gemm.py does; the norm after it sums them.

The adaRMSNorm of the pi0.5 action expert folded into the GEMMs on either side of it (`norm_out` / `norm_in`):
with h the gated residual row, r = rsqrt(mean(h^2) + eps), s = 1 + scale and t = shift (the step's modulation),

    (r * h * s + t) @ W^T = r * ((h * s) @ W^T) + t @ W^T

    norm_out (the split-K GEMM before the norm, O or down): after storing its partial, each program counts itself in
             at its 64-column tile (an atomic counter, reset by the last one); the last program of the tile sums
             the tile's partials x and writes h = residual + x * gate into the fp32 residual, x' = h * s in bf16
             (the next GEMM's input) and the tile's per-row sums of h^2 into sq[tile] (TILES, 16): one slot per
             tile, no fp32 atomics, so a replay is bit-identical to the last.
    norm_in  (the GEMM after the norm, QKV or gate/up, on x'): r[m] from the TILES sums of row m, then
             y = acc * r[m] + b[n] in the epilogue (before GeGLU: gate and up columns each get their own b), with
             b = t @ W^T precomputed at load for every (step, layer).
That takes the norm's own kernel out of the chain: two launches fewer per expert layer.

Why: in a denoising step each decoder GEMM (kernels/flashrt_kernels/skinny_gemm.py) starts streaming its weights only after its PDL
wait, so HBM idles while the norms and the attention run (docs/benchmarks/engine_h200_2026-11-29_notes.md,
session 6: the four GEMMs move 34.6 MB per layer at 1.7 TB/s). The one-shot Triton configurations that load their
slice before the wait hold it in registers, which caps the slice at ~32 KB per program; the gate/up GEMM needs
128 KB. Here every program issues its whole weight slice to shared memory with TMA (cp.async.bulk.tensor, one
mbarrier) before griddepcontrol.wait, then loads x (TMA, rows past M zero-filled), and runs the products on the
tensor cores swapped (the weight rows are wgmma's 64-row M side, the x rows its N = 16 side), so only x's few rows
and the 64 x 16 accumulator sit in registers.

17-64 rows (a horizon-50 step: 50 or 51 rows; `_smem_gemm_rows_kernel`): the same weight slice before the wait,
but x in 32- or 64-row boxes does not fit beside a 128 KB slice, so it streams through a ring of 64-column boxes
(x_ring_stages: as many as fit, at most 8) after the wait, each box multiplied as it lands. No folded-norm
epilogues there. Written without a GPU at hand (session 16); measured in session 17 (H200, horizon 50: pi0.5
12.42 -> 12.16 ms per predict, pi0 12.82 -> 12.34 ms), a candidate by default since (EngineOptions.smem_gemm_rows).

Provenance: the swap-AB skinny GEMM is the usual small-batch decode layout (the weights as the MMA's M operand);
the Gluon structure follows Triton's Gluon tutorials (TMA, mbarrier, warpgroup_mma). Written without a GPU at hand
(session 6): compiled for sm90 ahead of time; its GPU test compares it with skinny_gemm_reference.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ._gluon import (HAVE_GLUON, TensorDescriptor, gl, gluon, griddep, mbarrier, tma, warpgroup_mma,
                     warpgroup_mma_wait)
from ._triton import INTERPRETED, launch_options
from .geglu import _K as _K_GELU  # noqa: N811  the tanh GELU's constant
from .geglu import geglu_reference

ROWS = 64            # weight rows per program: wgmma's M
X_ROWS = 16          # x rows per program (M <= 16): wgmma's N
SMEM_GEMM_NORM_MAX_ROWS = X_ROWS     # the folded-norm epilogues (norm_in / norm_out): the 16-row kernel only
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


@dataclass(frozen=True)
class NormOut:
    """Where a norm_out GEMM (the split-K GEMM before a folded adaRMSNorm) leaves its results, all on its device:
    residual (M, N) fp32, updated in place: h = residual + (x @ W^T) * gate
    gate, scale1p (N,) fp32: the step's modulation vectors (scale1p = 1 + scale of the norm)
    xs (M, N) bf16: x' = h * scale1p, the next GEMM's input
    sq (N / 64, 16) fp32: sq[t, m] = sum of h[m, 64t:64t+64]^2
    counter (N / 64,) int32: zeros at allocation; each launch leaves them zero again"""

    residual: torch.Tensor
    gate: torch.Tensor
    scale1p: torch.Tensor
    xs: torch.Tensor
    sq: torch.Tensor
    counter: torch.Tensor

    def check(self, M: int, N: int) -> None:
        tiles = N // ROWS
        want = {"residual": ((M, N), torch.float32), "gate": ((N,), torch.float32),
                "scale1p": ((N,), torch.float32), "xs": ((M, N), torch.bfloat16),
                "sq": ((tiles, X_ROWS), torch.float32), "counter": ((tiles,), torch.int32)}
        for name, (shape, dtype) in want.items():
            t = getattr(self, name)
            if tuple(t.shape) != shape or t.dtype != dtype or not t.is_contiguous():
                raise ValueError(f"smem_gemm norm_out: {name} must be a contiguous {shape} {dtype} tensor, got "
                                 f"{tuple(t.shape)} {t.dtype}")


@dataclass(frozen=True)
class NormIn:
    """The folded norm a norm_in GEMM applies: sq (K / 64, 16) fp32 from the norm_out GEMM before it, bias (N,)
    fp32 = shift @ W^T of this step and layer, eps of the norm."""

    sq: torch.Tensor
    bias: torch.Tensor
    eps: float

    def check(self, M: int, N: int, K: int) -> None:
        tiles = K // ROWS
        if tiles & (tiles - 1) or K % ROWS:
            raise ValueError(f"smem_gemm norm_in: K={K} must be 64 times a power of two")
        if tuple(self.sq.shape) != (tiles, X_ROWS) or self.sq.dtype != torch.float32 or not self.sq.is_contiguous():
            raise ValueError(f"smem_gemm norm_in: sq must be a contiguous ({tiles}, {X_ROWS}) fp32 tensor, got "
                             f"{tuple(self.sq.shape)} {self.sq.dtype}")
        if tuple(self.bias.shape) != (N,) or self.bias.dtype != torch.float32 or not self.bias.is_contiguous():
            raise ValueError(f"smem_gemm norm_in: bias must be a contiguous ({N},) fp32 tensor, got "
                             f"{tuple(self.bias.shape)} {self.bias.dtype}")


def smem_gemm_norm_out_reference(x: torch.Tensor, w: torch.Tensor, residual: torch.Tensor, gate: torch.Tensor,
                                 scale1p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Plain PyTorch of norm_out: (h (M, N) fp32, xs (M, N) bf16, sq (N / 64, M) fp32) with h = residual +
    (x @ W^T) * gate, xs = h * scale1p, sq[t, m] = sum over the t-th 64 columns of h[m]^2."""
    h = residual.float() + (x.float() @ w.float().T) * gate.float()
    sq = h.pow(2).view(h.shape[0], -1, ROWS).sum(-1).T.contiguous()
    return h, (h * scale1p.float()).to(torch.bfloat16), sq


def smem_gemm_norm_in_reference(xs: torch.Tensor, w: torch.Tensor, sq: torch.Tensor, bias: torch.Tensor,
                                eps: float, geglu: bool = False) -> torch.Tensor:
    """Plain PyTorch of norm_in: y = (xs @ W^T) * r[:, None] + bias, r = rsqrt(sum_t sq[t] / K + eps) over the
    first M columns of sq; then GeGLU when asked. (M, N) or (M, N / 2) in xs.dtype."""
    M, K = xs.shape
    r = torch.rsqrt(sq.float()[:, :M].sum(0) / K + eps)
    y = (xs.float() @ w.float().T) * r[:, None] + bias.float()
    return (geglu_reference(y) if geglu else y).to(xs.dtype)


if HAVE_GLUON:
    @gluon.jit
    def _weight_slice_then_wait(w_desc, w_smem, bar, n0, k0, F, NK: gl.constexpr, GEGLU: gl.constexpr,
                                PDL: gl.constexpr, W_BYTES: gl.constexpr = 2):
        """Both kernels' start (and kernels/flashrt_kernels/smem_gemm_fp8.py's, W_BYTES=1 for E4M3): the program's whole weight
        slice (NK boxes of 64 rows x 64 columns, or of 32 gate + 32 up rows with GeGLU) issued to shared memory on
        one mbarrier, then the PDL wait (the slice depends on no earlier kernel, so it streams during the kernel
        ahead's tail)."""
        BLOCK_W: gl.constexpr = w_desc.block_type.shape[0]
        mbarrier.expect(bar, NK * 64 * 64 * W_BYTES)
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
    def _x_ring_products(w_smem, x_smem, x_desc, bars, X_BAR: gl.constexpr, k0, NK: gl.constexpr,
                         X_STAGES: gl.constexpr, XR: gl.constexpr):
        """The products of a weight slice already on its way to w_smem (NK 64 x 64 boxes, on mbarrier bars[0]) with
        x streamed through a ring of X_STAGES boxes of XR rows (mbarriers bars[X_BAR:]) from column k0, each box
        multiplied on wgmma as it lands (the weight rows its 64-row M side, the x rows its N side): the (64, XR)
        fp32 accumulator, every product done. Used after the PDL wait by _smem_gemm_rows_kernel and
        kernels/flashrt_kernels/smem_mlp.py."""
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
    def _smem_gemm_kernel(w_desc, x_desc, y_ptr, M, F, stride_y, split_stride,
                          res_ptr, gate_ptr, scale_ptr, xs_ptr, sq_ptr, cnt_ptr, bias_ptr, eps,
                          K_PER_SPLIT: gl.constexpr, GEGLU: gl.constexpr, SPLIT_K: gl.constexpr,
                          KGELU: gl.constexpr, PDL: gl.constexpr, NORM_IN: gl.constexpr = False,
                          NORM_OUT: gl.constexpr = False, TILES: gl.constexpr = 1):
        BLOCK_W: gl.constexpr = w_desc.block_type.shape[0]         # weight rows per TMA box: 64, or 32 with GeGLU
        NK: gl.constexpr = K_PER_SPLIT // 64
        pid_n, pid_k, n0, k0 = _program_slice(BLOCK_W, K_PER_SPLIT, PDL)
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
        if NORM_IN:             # b = shift @ W^T of this step and layer: a load-time table, read before the wait
            b_lo = gl.load(bias_ptr + n0 + r)
            if GEGLU:
                b_hi = gl.load(bias_ptr + F + n0 + r)
        _weight_slice_then_wait(w_desc, w_smem, bars.index(0), n0, k0, F, NK, GEGLU, PDL)
        mbarrier.expect(bars.index(1), NK * 16 * 64 * 2)
        for i in gl.static_range(NK):
            tma.async_copy_global_to_shared(x_desc, [0, k0 + i * 64], bars.index(1), x_smem.index(i))
        mbarrier.wait(bars.index(0), phase=0)
        mbarrier.wait(bars.index(1), phase=0)
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                             instr_shape=[16, 16, 16])
        acc = gl.zeros((64, 16), dtype=gl.float32, layout=acc_layout)        # (weight rows, x rows) = y^T
        for i in gl.static_range(NK):
            acc = warpgroup_mma(w_smem.index(i), x_smem.index(i).permute((1, 0)), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.invalidate(bars.index(0))
        mbarrier.invalidate(bars.index(1))
        if NORM_IN:             # r[m] = rsqrt(mean(h^2) + eps) from the producer's per-tile sums of row m
            sq_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1], threads_per_warp=[2, 16],
                                                       warps_per_cta=[4, 1], order=[1, 0])
            t = gl.arange(0, TILES, layout=gl.SliceLayout(1, sq_layout))
            tm = gl.arange(0, 16, layout=gl.SliceLayout(0, sq_layout))
            sums = gl.sum(gl.load(sq_ptr + t[:, None] * 16 + tm[None, :]), axis=0)
            rstd = gl.convert_layout(gl.rsqrt(sums / (K_PER_SPLIT * SPLIT_K) + eps), gl.SliceLayout(0, out_layout))
        if GEGLU:
            g, u = _gate_and_up(acc, out_layout, BLOCK_W, 16)
            if NORM_IN:
                g = g * rstd[None, :] + b_lo[:, None]
                u = u * rstd[None, :] + b_hi[:, None]
            y = _tanh_geglu(g, u, KGELU)
        else:
            y = gl.convert_layout(acc, out_layout)
            if NORM_IN:
                y = y * rstd[None, :] + b_lo[:, None]
        cols = n0 + r
        ptrs = y_ptr + pid_k * split_stride + m[None, :] * stride_y + cols[:, None]
        mask = (m < M)[None, :] & (cols < F)[:, None]
        gl.store(ptrs, y.to(y_ptr.dtype.element_ty), mask=mask)
        if NORM_OUT:
            # every thread's partial is stored before one thread counts the program in (release, GPU scope); the
            # last program of the tile sees every partial of it after its acquire
            gl.thread_barrier()
            arrived = gl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT_K - 1:
                x = gl.zeros((BLOCK_W, 16), dtype=gl.float32, layout=out_layout)
                for s in gl.static_range(SPLIT_K):       # L2 reads (.cg): other SMs wrote them
                    x += gl.load(y_ptr + s * split_stride + m[None, :] * stride_y + cols[:, None], mask=mask,
                                 other=0.0, cache_modifier=".cg")
                res = res_ptr + m[None, :] * F + cols[:, None]
                h = gl.load(res, mask=mask, other=0.0) + x * gl.load(gate_ptr + cols)[:, None]
                gl.store(res, h, mask=mask)
                gl.store(xs_ptr + m[None, :] * F + cols[:, None],
                         (h * gl.load(scale_ptr + cols)[:, None]).to(xs_ptr.dtype.element_ty), mask=mask)
                gl.store(sq_ptr + pid_n * 16 + m, gl.sum(h * h, axis=0), mask=m < M)
                gl.atomic_xchg(cnt_ptr + pid_n, 0, sem="relaxed", scope="gpu")     # ready for the next launch


    @gluon.jit
    def _smem_gemm_rows_kernel(w_desc, x_desc, y_ptr, M, F, stride_y, split_stride,
                               K_PER_SPLIT: gl.constexpr, GEGLU: gl.constexpr, KGELU: gl.constexpr,
                               PDL: gl.constexpr, X_STAGES: gl.constexpr):
        """17-64 rows (a horizon-50 denoising step): the weight slice as above, in shared memory before the PDL
        wait; x, 32 or 64 rows per box, too large beside it at these rows, streams through a ring of X_STAGES boxes
        (one mbarrier each) after the wait, and each box's product runs on wgmma as it lands (the weight rows its
        64-row M side, the x rows its N side, as above). No folded-norm epilogues (SMEM_GEMM_NORM_MAX_ROWS)."""
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
        ptrs = y_ptr + pid_k * split_stride + m[None, :] * stride_y + cols[:, None]
        gl.store(ptrs, y.to(y_ptr.dtype.element_ty), mask=(m < M)[None, :] & (cols < F)[:, None])


@functools.lru_cache(maxsize=None)
def _layout(rows: int, cols: int = BOX_K):
    """The NVMMA shared layout of a bf16 TMA box (rows, cols); kernels/flashrt_kernels/smem_mlp.py's boxes too."""
    return gl.NVMMASharedLayout.get_default_for([rows, cols], gl.bfloat16)


def smem_gemm(x: torch.Tensor, w: torch.Tensor, geglu: bool = False, split_k: int = 1, pdl: bool | int = False,
              out: torch.Tensor | None = None, norm_in: NormIn | None = None,
              norm_out: NormOut | None = None) -> torch.Tensor:
    """Gluon launcher; the contract of kernels/flashrt_kernels/skinny_gemm.py skinny_gemm_reference (bf16 x and W, M <= 64; the
    16-row kernel up to 16 rows, _smem_gemm_rows_kernel from 17).
    pdl: False, True or EARLY_TRIGGER (kernels/flashrt_kernels/_triton.py). out: optional preallocated result (with norm_out: the
    (split_k, M, N) fp32 partials, scratch).
    norm_in: x is x' of a folded norm: the result is smem_gemm_norm_in_reference's. norm_out: the result is written
    into norm_out's residual / xs / sq (smem_gemm_norm_out_reference) and norm_out.xs is returned."""
    if not HAVE_GLUON or INTERPRETED:
        raise RuntimeError("smem_gemm needs Triton's Gluon and a Hopper GPU (no interpreter)")
    M, K = x.shape
    N = w.shape[0]
    if (norm_in is not None or norm_out is not None) and M > SMEM_GEMM_NORM_MAX_ROWS:
        raise ValueError(f"smem_gemm: the folded-norm epilogues serve at most {SMEM_GEMM_NORM_MAX_ROWS} rows, got "
                         f"{M}")
    if norm_in is not None and split_k > 1:
        raise ValueError(f"smem_gemm: norm_in adds its bias once per result, so it needs split_k=1 "
                         f"(got split_k={split_k})")
    if x.dtype != torch.bfloat16 or w.dtype != torch.bfloat16 or not x.is_contiguous() or not w.is_contiguous() \
            or w.shape[1] != K or not smem_gemm_supported(M, N, K, geglu, split_k):
        raise ValueError(f"smem_gemm: contiguous bf16 x (M<=64, K) and W (N, K) with whole 64-row tiles and K "
                         f"slices of 64; got {tuple(x.shape)} {x.dtype}, {tuple(w.shape)} {w.dtype}, "
                         f"geglu={geglu}, split_k={split_k}")
    F = N // 2 if geglu else N
    if norm_out is not None:
        if geglu:
            raise ValueError("smem_gemm: norm_out needs a plain GEMM (no GeGLU)")
        norm_out.check(M, N)
        split_k = max(split_k, 1)
    if norm_in is not None:
        norm_in.check(M, N, K)
    shape, dtype = ((split_k, M, N), torch.float32) if split_k > 1 or norm_out is not None else ((M, F), x.dtype)
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
        _smem_gemm_rows_kernel[grid](w_desc, x_desc, out, M, F, out.stride(-2), M * N, K_PER_SPLIT=K // split_k,
                                     GEGLU=geglu, KGELU=_K_GELU, PDL=int(pdl),
                                     X_STAGES=x_ring_stages(M, K // split_k, geglu), num_warps=4,
                                     **launch_options(pdl))
        return out
    no = norm_out
    fold = dict(res_ptr=no.residual if no else out, gate_ptr=no.gate if no else out,
                scale_ptr=no.scale1p if no else out, xs_ptr=no.xs if no else x,
                sq_ptr=(no.sq if no else norm_in.sq) if (no or norm_in) else out,
                cnt_ptr=no.counter if no else out, bias_ptr=norm_in.bias if norm_in else out,
                eps=norm_in.eps if norm_in else 0.0)
    _smem_gemm_kernel[grid](w_desc, x_desc, out, M, F, out.stride(-2), M * N, **fold,
                            K_PER_SPLIT=K // split_k, GEGLU=geglu, SPLIT_K=split_k, KGELU=_K_GELU,
                            PDL=int(pdl), NORM_IN=norm_in is not None, NORM_OUT=no is not None,
                            TILES=K // ROWS if norm_in is not None else 1,
                            num_warps=4, **launch_options(pdl))
    return no.xs if no is not None else out


__all__ = ["HAVE_GLUON", "SMEM_GEMM_MAX_ROWS", "SMEM_GEMM_NORM_MAX_ROWS", "NormIn", "NormOut", "smem_gemm",
           "smem_gemm_norm_in_reference", "smem_gemm_norm_out_reference", "smem_gemm_supported", "x_ring_stages",
           "x_tile_rows"]
