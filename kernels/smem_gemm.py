"""Few-row GEMM whose weight slice is in shared memory before the PDL wait (NVIDIA sm90+, Gluon: TMA + wgmma).

    y = x @ W^T                 x (M, K) with M <= 16, W (N, K); each program owns 64 weight rows (N) for all M
    GeGLU (W = [W_gate; W_up], N = 2F):  y = gelu_tanh(x @ W_gate^T) * (x @ W_up^T)     (M, F); a program owns
                                32 gate rows and the 32 up rows of the same columns, stacked in one 64-row tile
    split-K: program k of SPLIT_K writes the fp32 partial of its K slice into part[k] (SPLIT_K, M, N), as
             kernels/skinny_gemm.py does; the norm after it sums them.

Why: in a denoising step each decoder GEMM (kernels/skinny_gemm.py) starts streaming its weights only after its PDL
wait, so HBM idles while the norms and the attention run (docs/benchmarks/engine_h200_2026-11-29_notes.md,
session 6: the four GEMMs move 34.6 MB per layer at 1.7 TB/s). The one-shot Triton configurations that load their
slice before the wait hold it in registers, which caps the slice at ~32 KB per program; the gate/up GEMM needs
128 KB. Here every program issues its whole weight slice to shared memory with TMA (cp.async.bulk.tensor, one
mbarrier) before griddepcontrol.wait, then loads x (TMA, rows past M zero-filled), and runs the products on the
tensor cores swapped (the weight rows are wgmma's 64-row M side, the x rows its N = 16 side), so only x's few rows
and the 64 x 16 accumulator sit in registers.

Provenance: the swap-AB skinny GEMM is the usual small-batch decode layout (the weights as the MMA's M operand);
the Gluon structure follows Triton's Gluon tutorials (TMA, mbarrier, warpgroup_mma). Written without a GPU at hand
(session 6): compiled for sm90 ahead of time; its GPU test compares it with skinny_gemm_reference.
"""

from __future__ import annotations

import functools
import math

import torch

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    HAVE_GLUON = True
except ImportError:      # Triton without Gluon (or none at all): the engine does not offer this GEMM
    HAVE_GLUON = False

from ._triton import INTERPRETED

ROWS = 64            # weight rows per program: wgmma's M
X_ROWS = 16          # x rows per program (M <= 16): wgmma's N
BOX_K = 64           # K per TMA box: 128 bytes of bf16, the 128-byte swizzle
_K_GELU = 2.0 * math.sqrt(2.0 / math.pi)


def smem_gemm_supported(M: int, N: int, K: int, geglu: bool, split_k: int) -> bool:
    """Shapes this kernel serves: at most 16 rows, whole 64-row (32 with GeGLU) weight tiles, K slices of whole
    64-column boxes, and a weight + x slice that fits the 227 KB of shared memory of a Hopper SM."""
    rows = ROWS // 2 if geglu else ROWS
    if M > X_ROWS or K % (split_k * BOX_K) or (geglu and (N % 2 or split_k > 1)):
        return False
    F = N // 2 if geglu else N
    k_slice = K // split_k
    return F % rows == 0 and (ROWS + X_ROWS) * k_slice * 2 + 4 * ROWS * X_ROWS <= 220 * 1024


if HAVE_GLUON:
    @gluon.jit
    def _griddep(ASM: gl.constexpr):
        gl.inline_asm_elementwise(ASM, "=r", [], dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _smem_gemm_kernel(w_desc, x_desc, y_ptr, M, F, stride_y, split_stride,
                          K_PER_SPLIT: gl.constexpr, GEGLU: gl.constexpr, SPLIT_K: gl.constexpr,
                          KGELU: gl.constexpr, PDL: gl.constexpr):
        BLOCK_W: gl.constexpr = w_desc.block_type.shape[0]         # weight rows per TMA box: 64, or 32 with GeGLU
        NK: gl.constexpr = K_PER_SPLIT // 64
        if PDL == 2:                                               # kernels/_triton.py EARLY_TRIGGER
            _griddep("griddepcontrol.launch_dependents; // dummy $0")
        pid_n = gl.program_id(0)
        pid_k = gl.program_id(1)
        n0 = pid_n * BLOCK_W
        k0 = pid_k * K_PER_SPLIT
        w_smem = gl.allocate_shared_memory(w_desc.dtype, [NK, 64, 64], w_desc.layout)
        x_smem = gl.allocate_shared_memory(x_desc.dtype, [NK, 16, 64], x_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(bars.index(0), count=1)
        mbarrier.init(bars.index(1), count=1)
        # the whole weight slice in flight before the wait: it depends on no earlier kernel
        mbarrier.expect(bars.index(0), NK * 64 * 64 * 2)
        for i in gl.static_range(NK):
            if GEGLU:
                tma.async_copy_global_to_shared(w_desc, [n0, k0 + i * 64], bars.index(0),
                                                w_smem.index(i).slice(0, BLOCK_W))
                tma.async_copy_global_to_shared(w_desc, [F + n0, k0 + i * 64], bars.index(0),
                                                w_smem.index(i).slice(BLOCK_W, BLOCK_W))
            else:
                tma.async_copy_global_to_shared(w_desc, [n0, k0 + i * 64], bars.index(0), w_smem.index(i))
        if PDL:
            _griddep("griddepcontrol.wait; // dummy $0")
            if PDL == 1:
                _griddep("griddepcontrol.launch_dependents; // dummy $0")
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
        # y[m, n0 + r] = acc[r, m]: threads along r, the contiguous axis of y
        out_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1], threads_per_warp=[32, 1],
                                                    warps_per_cta=[1, 4], order=[0, 1])
        if GEGLU:   # gate rows 0..31 and up rows 32..63 sit in different warps: meet in shared memory
            scratch = gl.allocate_shared_memory(gl.float32, [64, 16],
                                                gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1,
                                                                        order=[1, 0]))
            scratch.store(acc)
            gl.thread_barrier()
            g = scratch.slice(0, BLOCK_W).load(out_layout)
            u = scratch.slice(BLOCK_W, BLOCK_W).load(out_layout)
            y = g / (1.0 + gl.exp(-KGELU * (g + 0.044715 * g * g * g))) * u
        else:
            y = gl.convert_layout(acc, out_layout)
        r = gl.arange(0, BLOCK_W, layout=gl.SliceLayout(1, out_layout))
        m = gl.arange(0, 16, layout=gl.SliceLayout(0, out_layout))
        ptrs = y_ptr + pid_k * split_stride + m[None, :] * stride_y + (n0 + r)[:, None]
        mask = (m < M)[None, :] & ((n0 + r) < F)[:, None]
        gl.store(ptrs, y.to(y_ptr.dtype.element_ty), mask=mask)


@functools.lru_cache(maxsize=None)
def _layout(rows: int):
    return gl.NVMMASharedLayout.get_default_for([rows, BOX_K], gl.bfloat16)


def smem_gemm(x: torch.Tensor, w: torch.Tensor, geglu: bool = False, split_k: int = 1, pdl: bool | int = False,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """Gluon launcher; the contract of kernels/skinny_gemm.py skinny_gemm_reference (bf16 x and W, M <= 16).
    pdl: False, True or EARLY_TRIGGER (kernels/_triton.py). out: optional preallocated result."""
    if not HAVE_GLUON or INTERPRETED:
        raise RuntimeError("smem_gemm needs Triton's Gluon and a Hopper GPU (no interpreter)")
    M, K = x.shape
    N = w.shape[0]
    if x.dtype != torch.bfloat16 or w.dtype != torch.bfloat16 or not x.is_contiguous() or not w.is_contiguous() \
            or w.shape[1] != K or not smem_gemm_supported(M, N, K, geglu, split_k):
        raise ValueError(f"smem_gemm: contiguous bf16 x (M<=16, K) and W (N, K) with whole 64-row tiles and K "
                         f"slices of 64; got {tuple(x.shape)} {x.dtype}, {tuple(w.shape)} {w.dtype}, "
                         f"geglu={geglu}, split_k={split_k}")
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
    x_desc = TensorDescriptor.from_tensor(x, [X_ROWS, BOX_K], _layout(X_ROWS))   # rows past M read as zeros
    grid = (F // rows, split_k)
    _smem_gemm_kernel[grid](w_desc, x_desc, out, M, F, out.stride(-2), M * N,
                            K_PER_SPLIT=K // split_k, GEGLU=geglu, SPLIT_K=split_k, KGELU=_K_GELU,
                            PDL=int(pdl), num_warps=4, **({"launch_pdl": True} if pdl else {}))
    return out


__all__ = ["HAVE_GLUON", "smem_gemm", "smem_gemm_supported"]
