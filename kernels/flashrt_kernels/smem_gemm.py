"""Few-row GEMM whose weight slice is in shared memory before the PDL wait (NVIDIA sm90, Gluon: TMA + wgmma).

    y = x @ W^T                 x (M, K) with M <= 64, W (N, K); each program owns 64 weight rows (N) for all M
    GeGLU (W = [W_gate; W_up], N = 2F):  y = gelu_tanh(x @ W_gate^T) * (x @ W_up^T)     (M, F); a program owns
                                32 gate rows and the 32 up rows of the same columns, stacked in one 64-row tile
    split-K: program k of SPLIT_K writes the fp32 partial of its K slice into part[k] (SPLIT_K, M, N), as
             kernels/flashrt_kernels/skinny_gemm.py does; the norm after it sums them.
    bias (N,):  y = x @ W^T + b, added to the fp32 products (to partial 0 alone with split-K); gelu (no GeGLU, no
             split-K): y = gelu_tanh(x @ W^T [+ b]) -- GR00T's DiT GEMMs (engine/groot_dit_gemms.py), as the
             few-row Triton GEMM's epilogues

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

import torch

from ._gluon import (HAVE_GLUON, TensorDescriptor, gl, gluon, griddep, mbarrier, tma, warpgroup_mma,
                     warpgroup_mma_wait)
from ._triton import INTERPRETED, launch_options
from .geglu import _K as _K_GELU  # noqa: N811  the tanh GELU's constant

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
    def _smem_gemm_kernel(w_desc, x_desc, y_ptr, bias_ptr, M, F, stride_y, split_stride,
                          K_PER_SPLIT: gl.constexpr, GEGLU: gl.constexpr, KGELU: gl.constexpr, PDL: gl.constexpr,
                          HAS_BIAS: gl.constexpr = False, GELU: gl.constexpr = False):
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
        if GEGLU:
            g, u = _gate_and_up(acc, out_layout, BLOCK_W, 16)
            y = _tanh_geglu(g, u, KGELU)
        else:
            y = gl.convert_layout(acc, out_layout)
        cols = n0 + r
        y = _bias_and_gelu(y, bias_ptr, cols, pid_k, F, HAS_BIAS, GELU, KGELU)
        ptrs = y_ptr + pid_k * split_stride + m[None, :] * stride_y + cols[:, None]
        mask = (m < M)[None, :] & (cols < F)[:, None]
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


@functools.lru_cache(maxsize=None)
def _layout(rows: int, cols: int = BOX_K):
    """The NVMMA shared layout of a bf16 TMA box (rows, cols)."""
    return gl.NVMMASharedLayout.get_default_for([rows, cols], gl.bfloat16)


def smem_gemm(x: torch.Tensor, w: torch.Tensor, geglu: bool = False, split_k: int = 1, pdl: bool | int = False,
              out: torch.Tensor | None = None, bias: torch.Tensor | None = None, gelu: bool = False) -> torch.Tensor:
    """Gluon launcher; the contract of kernels/flashrt_kernels/skinny_gemm.py skinny_gemm_reference (bf16 x and W, M <= 64; the
    16-row kernel up to 16 rows, _smem_gemm_rows_kernel from 17).
    pdl: False, True or EARLY_TRIGGER (kernels/flashrt_kernels/_triton.py). out: optional preallocated result.
    bias (N,) contiguous: added in the epilogue (partial 0 with split-K); gelu: the tanh GELU (not with geglu or
    split-K)."""
    if not HAVE_GLUON or INTERPRETED:
        raise RuntimeError("smem_gemm needs Triton's Gluon and a Hopper GPU (no interpreter)")
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


__all__ = ["HAVE_GLUON", "SMEM_GEMM_MAX_ROWS", "X_ROWS", "smem_gemm", "smem_gemm_supported", "x_ring_stages",
           "x_tile_rows"]
