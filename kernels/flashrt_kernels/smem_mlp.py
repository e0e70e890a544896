"""An action-expert MLP (gate/up GEMM, GeGLU, down GEMM) in one launch on few rows, its weights in shared memory
before the PDL wait (NVIDIA sm90, Gluon: TMA + wgmma + one grid barrier).

    act = gelu_tanh(x @ W_gate^T) * (x @ W_up^T)      (M, F), rounded to bf16 as the chain's GeGLU output is
    y   = act @ W_down^T                               (M, W), summed in fp32

x (M, W) with M <= 16. The intermediate dimension F is split over P = F / 32 programs, one per SM: program j owns
act columns [32j, 32j + 32), so it needs the 32 gate and 32 up rows of W_gate_up (64 x W) and the 32 columns of
W_down (W x 32), and no other program's act:

    1  the program's gate/up rows (128 KB at W = 1024) and down columns (64 KB) issued to shared memory with TMA
       before griddepcontrol.wait: they depend on no earlier kernel, so they stream during the kernel ahead's tail
    2  after the wait, x streams in 64-column boxes through a small ring; gate/up on wgmma (the weight rows its
       64-row M side, x's rows its 16-row N side, as kernels/flashrt_kernels/smem_gemm.py); GeGLU; act^T into shared memory
    3  the program's down partial, act[:, own 32 columns] @ W_down[:, own 32 columns]^T (M, W) fp32, on wgmma,
       into part[j] (P, M, W) in global memory
    4  a grid barrier (an arrival count and a generation number in global memory: every program must be resident,
       so P <= the SM count); then program j sums the P partials of its W / P columns, in program order (a replay
       gives the same bits), into y

Why: in a denoising step the chain runs gate/up (kernels/flashrt_kernels/smem_gemm.py, GeGLU epilogue) and down as two launches,
3.4 + 4.0 us of a 23.4-us expert layer on the H200 (docs/benchmarks/timeline_h200_2026-12-01_bf16_session17.json).
Here the down weights are in shared memory before the wait too, and the kernel boundary between the two GEMMs
becomes a grid barrier (0.8-1.0 us in the persistent layer's time stamps, session 16). The partial sums cross
through L2 (40 KB per program written, 40 KB read) instead of fp32 atomics: 128 programs' atomics would be 1.3 M
adds, where the persistent layer's down phase made 82 K in ~2 us.

A barrier that waited MAX_SPINS polls gives up and counts itself in `errors` (the result is then wrong; the test
checks the count stays zero), so a program that was never made resident cannot hang the GPU.

Measured on the H200 (session 22): correct (its GPU tests and the engine's gates with it pass) but slower, 16.2 us
per MLP at 10 rows against 8.4 us for the chain (tools/benchmark_smem_mlp.py), and pi0.5's predict 9.73 -> 11.24 ms
in bf16. Without PDL it takes 18.3 us against the chain's 12.5, so the kernel itself is slower (suspects: the
5.2 MB of partials through L2, the ordered sum, the barrier); and PDL saves it 2.0 us where it saves the chain 4.1,
since a program's 206 KB of shared memory keeps it off an SM until the kernel ahead has left it
(docs/benchmarks/engine_h200_2026-11-29_notes.md, session 22). The engine runs it only when asked
(EngineOptions.fused_mlp, FLASHRT_FUSED_MLP=1: Ops.decoder_mlp).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._gluon import (HAVE_GLUON, TensorDescriptor, fence_async_shared, gl, gluon, griddep, mbarrier, tma,
                     warpgroup_mma, warpgroup_mma_wait)
from ._triton import INTERPRETED, launch_options
from .geglu import _K as _K_GELU  # noqa: N811  the tanh GELU's constant
from .smem_gemm import BOX_K, SMEM_BUDGET, X_ROWS, _layout

ACT_COLS = 32        # act columns per program: 32 gate + 32 up weight rows make wgmma's 64-row M side
DOWN_ROWS = 64       # W_down rows (output columns) per TMA box and per down wgmma
X_STAGES = 4         # x boxes (16 x 64) in flight after the wait
PART_BLOCK = 32      # partials summed per step of the reduction
MAX_SPINS = 1 << 20  # polls of the grid barrier before a program gives up (well under a second)


def smem_mlp_programs(F: int) -> int:
    """Programs of a launch: one per 32 act columns."""
    return F // ACT_COLS


def smem_mlp_shared_bytes(W: int) -> int:
    """Shared memory of one program: gate/up rows, down columns, the x ring, GeGLU's scratch and act."""
    return (2 * ACT_COLS * W + W * ACT_COLS + X_STAGES * X_ROWS * BOX_K) * 2 + 4 * 2 * ACT_COLS * X_ROWS \
        + X_ROWS * ACT_COLS * 2


def smem_mlp_supported(M: int, W: int, F: int, sms: int) -> bool:
    """Shapes this kernel serves on a GPU of `sms` SMs: 1-16 rows, W a multiple of the 64-column boxes and of the
    down boxes, F / 32 programs that fit the SMs at once and divide W into power-of-two column slices for the
    reduction, and one program's weights in shared memory."""
    if not 1 <= M <= X_ROWS or W % BOX_K or W % DOWN_ROWS or F % ACT_COLS:
        return False
    P = smem_mlp_programs(F)
    cols = W // P if P and W % P == 0 else 0
    return (P <= sms and P % PART_BLOCK == 0 and cols > 0 and cols & (cols - 1) == 0
            and smem_mlp_shared_bytes(W) <= SMEM_BUDGET)


def smem_mlp_reference(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch: (M, W) fp32 = bf16(gelu_tanh(x @ W_gate^T) * (x @ W_up^T)) @ W_down^T, with W_gate_up
    (2F, W) gate rows first and W_down (W, F)."""
    gate, up = (x.float() @ w_gate_up.float().T).chunk(2, dim=-1)
    act = (torch.nn.functional.gelu(gate, approximate="tanh") * up).to(x.dtype)
    return act.float() @ w_down.float().T


@dataclass(frozen=True)
class MlpScratch:
    """What a launch needs besides its operands, all on its device: part (P, M, W) fp32, the programs' partial
    sums; barrier (2,) int32, the arrival count and the generation number (zeros at allocation; any generation
    works after); errors (1,) int32, barriers given up (stays zero)."""

    part: torch.Tensor
    barrier: torch.Tensor
    errors: torch.Tensor

    @classmethod
    def allocate(cls, M: int, W: int, F: int, device) -> "MlpScratch":
        return cls(torch.empty(smem_mlp_programs(F), M, W, device=device),
                   torch.zeros(2, device=device, dtype=torch.int32), torch.zeros(1, device=device, dtype=torch.int32))

    def check(self, M: int, W: int, F: int) -> None:
        want = {"part": ((smem_mlp_programs(F), M, W), torch.float32), "barrier": ((2,), torch.int32),
                "errors": ((1,), torch.int32)}
        for name, (shape, dtype) in want.items():
            t = getattr(self, name)
            if tuple(t.shape) != shape or t.dtype != dtype or not t.is_contiguous():
                raise ValueError(f"smem_mlp: scratch.{name} must be a contiguous {shape} {dtype} tensor, got "
                                 f"{tuple(t.shape)} {t.dtype}")


if HAVE_GLUON:
    from .smem_gemm import _gate_and_up, _tanh_geglu, _weight_slice_then_wait, _x_ring_products

    @gluon.jit
    def _grid_barrier(bar_ptr, err_ptr, P: gl.constexpr, SPINS: gl.constexpr):
        """Every program of the launch past this point before any goes on: the generation number is read before
        the program counts itself in; the last to arrive resets the count and moves the generation on (release),
        the others poll it (acquire). Gives up after SPINS polls and counts that in err_ptr."""
        gl.thread_barrier()                       # every thread's partial stored before the program arrives
        gen = gl.atomic_add(bar_ptr + 1, 0, sem="acquire", scope="gpu")
        arrived = gl.atomic_add(bar_ptr, 1, sem="acq_rel", scope="gpu")
        if arrived == P - 1:
            gl.atomic_xchg(bar_ptr, 0, sem="relaxed", scope="gpu")
            gl.atomic_add(bar_ptr + 1, 1, sem="release", scope="gpu")
        else:
            spins = 0
            while (gl.atomic_add(bar_ptr + 1, 0, sem="acquire", scope="gpu") == gen) & (spins < SPINS):
                spins += 1
            if spins >= SPINS:
                gl.atomic_add(err_ptr, 1, sem="relaxed", scope="gpu")
        gl.thread_barrier()

    @gluon.jit
    def _smem_mlp_kernel(wgu_desc, wd_desc, x_desc, part_ptr, y_ptr, bar_ptr, err_ptr, M, F,
                         W: gl.constexpr, P: gl.constexpr, KGELU: gl.constexpr, PDL: gl.constexpr,
                         XS: gl.constexpr, PB: gl.constexpr, SPINS: gl.constexpr):
        NK: gl.constexpr = W // 64                                   # x / gate-up boxes along W
        DR: gl.constexpr = wd_desc.block_type.shape[0]               # output columns per down box: 64
        ND: gl.constexpr = W // DR                                   # down boxes
        AC: gl.constexpr = wgu_desc.block_type.shape[0]              # act columns per program: 32
        if PDL == 2:                       # EARLY_TRIGGER: the next kernel may launch now (it waits for this one)
            griddep("griddepcontrol.launch_dependents; // dummy $0")
        pid = gl.program_id(0)
        n0 = pid * AC
        wgu_smem = gl.allocate_shared_memory(wgu_desc.dtype, [NK, 64, 64], wgu_desc.layout)
        wd_smem = gl.allocate_shared_memory(wd_desc.dtype, [ND, DR, AC], wd_desc.layout)
        x_smem = gl.allocate_shared_memory(x_desc.dtype, [XS, 16, 64], x_desc.layout)
        act_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([16, AC], gl.bfloat16)
        act_smem = gl.allocate_shared_memory(gl.bfloat16, [16, AC], act_layout)
        bars = gl.allocate_shared_memory(gl.int64, [XS + 2, 1], mbarrier.MBarrierLayout())   # gate/up, down, x
        for i in gl.static_range(XS + 2):
            mbarrier.init(bars.index(i), count=1)
        # 1: the down columns, then the gate/up rows and the PDL wait (both depend on no earlier kernel)
        mbarrier.expect(bars.index(1), ND * DR * AC * 2)
        for t in gl.static_range(ND):
            tma.async_copy_global_to_shared(wd_desc, [t * DR, n0], bars.index(1), wd_smem.index(t))
        _weight_slice_then_wait(wgu_desc, wgu_smem, bars.index(0), n0, 0, F, NK, True, PDL)
        # 2: x through the ring, gate/up on wgmma as each box lands (after the down columns' barrier: index 2 on)
        acc = _x_ring_products(wgu_smem, x_smem, x_desc, bars, 2, 0, NK, XS, 16)   # (gate; up rows, x rows)
        out_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1], threads_per_warp=[32, 1],
                                                    warps_per_cta=[1, 4], order=[0, 1])
        g, u = _gate_and_up(acc, out_layout, AC, 16)
        act = _tanh_geglu(g, u, KGELU)                                       # act^T (AC, 16) fp32
        act_smem.store(gl.permute(act.to(gl.bfloat16), [1, 0]))
        fence_async_shared()                   # each thread's act stores visible to the async proxy (wgmma) ...
        gl.thread_barrier()                    # ... and every thread's before the down products start
        # 3: the down partial, 64 output columns per wgmma, into part[pid]
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                             instr_shape=[16, 16, 16])
        mbarrier.wait(bars.index(1), phase=0)
        r = gl.arange(0, DR, layout=gl.SliceLayout(1, out_layout))
        m = gl.arange(0, 16, layout=gl.SliceLayout(0, out_layout))
        row_ok = (m < M)[None, :]
        for t in gl.static_range(ND):
            d = gl.zeros((DR, 16), dtype=gl.float32, layout=acc_layout)     # (output columns, x rows)
            d = warpgroup_mma(wd_smem.index(t), act_smem.permute((1, 0)), d, is_async=True)
            d = warpgroup_mma_wait(num_outstanding=0, deps=(d,))
            cols = t * DR + r
            gl.store(part_ptr + pid * M * W + m[None, :] * W + cols[:, None], gl.convert_layout(d, out_layout),
                     mask=row_ok)
        for i in gl.static_range(XS + 2):
            mbarrier.invalidate(bars.index(i))
        # 4: every partial stored, then this program's W / P columns summed over the P partials in program order
        _grid_barrier(bar_ptr, err_ptr, P, SPINS)
        C: gl.constexpr = W // P
        sum_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1], threads_per_warp=[1, 32],
                                                    warps_per_cta=[1, 4], order=[1, 0])
        p = gl.arange(0, PB, layout=gl.SliceLayout(1, sum_layout))
        e = gl.arange(0, 16 * C, layout=gl.SliceLayout(0, sum_layout))     # (row, column) pairs of this program
        em = e // C
        ec = pid * C + e % C
        ok = em < M
        total = gl.zeros((16 * C,), dtype=gl.float32, layout=gl.SliceLayout(0, sum_layout))
        for b in gl.static_range(P // PB):
            ptrs = part_ptr + (b * PB + p)[:, None] * (M * W) + (em * W + ec)[None, :]
            total += gl.sum(gl.load(ptrs, mask=ok[None, :], other=0.0, cache_modifier=".cg"), axis=0)
        gl.store(y_ptr + em * W + ec, total.to(y_ptr.dtype.element_ty), mask=ok)


def smem_mlp(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, pdl: bool | int = False,
             out: torch.Tensor | None = None, scratch: MlpScratch | None = None) -> torch.Tensor:
    """Gluon launcher; the contract of smem_mlp_reference: bf16 x (M <= 16, W), W_gate_up (2F, W) gate rows first,
    W_down (W, F). out: optional preallocated (M, W) result, bf16 or fp32 (default fp32). scratch: the partial
    sums and the barrier (MlpScratch.allocate; a launch allocates its own when None). pdl: False, True or
    EARLY_TRIGGER (kernels/flashrt_kernels/_triton.py)."""
    if not HAVE_GLUON or INTERPRETED:
        raise RuntimeError("smem_mlp needs Triton's Gluon and a Hopper GPU (no interpreter)")
    M, W = x.shape
    F = w_down.shape[1]
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    if any(t.dtype != torch.bfloat16 or not t.is_contiguous() for t in (x, w_gate_up, w_down)) \
            or tuple(w_gate_up.shape) != (2 * F, W) or tuple(w_down.shape) != (W, F) \
            or not smem_mlp_supported(M, W, F, sms):
        raise ValueError(f"smem_mlp: contiguous bf16 x (M<=16, W), W_gate_up (2F, W) and W_down (W, F) with F / 32 "
                         f"programs on at most {sms} SMs; got {tuple(x.shape)} {x.dtype}, {tuple(w_gate_up.shape)} "
                         f"{w_gate_up.dtype}, {tuple(w_down.shape)} {w_down.dtype}")
    if out is None:
        out = torch.empty(M, W, device=x.device, dtype=torch.float32)
    elif tuple(out.shape) != (M, W) or out.dtype not in (torch.float32, torch.bfloat16) or not out.is_contiguous():
        raise ValueError(f"smem_mlp: out must be a contiguous ({M}, {W}) fp32 or bf16 tensor")
    if scratch is None:
        scratch = MlpScratch.allocate(M, W, F, x.device)
    scratch.check(M, W, F)
    # TMA descriptors per launch (host work only: a captured graph keeps them), as kernels/flashrt_kernels/smem_gemm.py builds them
    wgu_desc = TensorDescriptor.from_tensor(w_gate_up, [ACT_COLS, BOX_K], _layout(ACT_COLS, BOX_K))
    wd_desc = TensorDescriptor.from_tensor(w_down, [DOWN_ROWS, ACT_COLS], _layout(DOWN_ROWS, ACT_COLS))
    x_desc = TensorDescriptor.from_tensor(x, [X_ROWS, BOX_K], _layout(X_ROWS, BOX_K))   # rows past M read as zeros
    P = smem_mlp_programs(F)
    _smem_mlp_kernel[(P,)](wgu_desc, wd_desc, x_desc, scratch.part, out, scratch.barrier, scratch.errors, M, F,
                           W=W, P=P, KGELU=_K_GELU, PDL=int(pdl), XS=min(X_STAGES, W // BOX_K), PB=PART_BLOCK,
                           SPINS=MAX_SPINS, num_warps=4, **launch_options(pdl))
    return out


__all__ = ["ACT_COLS", "MlpScratch", "smem_mlp", "smem_mlp_programs", "smem_mlp_reference", "smem_mlp_shared_bytes",
           "smem_mlp_supported"]
