"""Folding the partial products of many programs into one fp32 activation, the building block of a persistent
denoiser MLP whose down GEMM is split over its programs' K slices (each program's GeGLU columns times its rows of
W_down give a partial of the whole (M, N) output):

    out[l] = sum_p partial(p, l)        p = 0 .. P-1 programs, l = 0 .. L-1 layers, out[l] (M, N) fp32

How the partials meet (``mode``):
- ``"atomic"``: every program adds its partial into out[l] with Triton's atomic add (relaxed, 16 bytes per thread:
  ``atom.global.add.v4.f32``, which ptxas makes a reduction, ``REDG.E.ADD.F32x4``, since nothing reads its result),
  then counts itself into the layer's counter (a release): what a consumer waiting for the counter to reach P
  would read.
- ``"stored"``: every program stores its partial into parts[p], and a second launch sums the P partials of each
  output tile: the reduce-stage form (one more hand-over per layer).
The partials are generated in registers (partial(p, l)[m, n] = (p + 1) / 128 + l + m, exact in fp32, so every sum
is exact whatever order the additions land in): the kernels time the folding alone, not a product before it.
"""

from __future__ import annotations

import torch

from ._triton import tl, triton

MODES = ("atomic", "stored")
BLOCK_M = 16           # rows a program covers (the denoiser's 10-row steps)
PARTIAL_SCALE = 1.0 / 128.0


def partial_sums_reference(programs: int, layers: int, rows: int, width: int,
                           device: torch.device | str = "cpu") -> torch.Tensor:
    """Plain PyTorch: (layers, rows, width) fp32, out[l, m, n] = sum_p ((p + 1) / 128 + l + m)."""
    p = torch.arange(programs, dtype=torch.float64)
    base = float(((p + 1) * PARTIAL_SCALE).sum())
    l = torch.arange(layers, dtype=torch.float64)[:, None, None]
    m = torch.arange(rows, dtype=torch.float64)[None, :, None]
    return (base + programs * (l + m)).expand(layers, rows, width).to(device=device, dtype=torch.float32)


@triton.jit
def _partial(pid, layer, rm, rn):
    """This program's generated partial of `layer` at rows rm, columns rn (exact in fp32)."""
    return (pid + 1).to(tl.float32) * 0.0078125 + layer + rm[:, None].to(tl.float32) + 0.0 * rn[None, :]


@triton.jit
def _fold_kernel(out_ptr, counter_ptr, M, LAYERS: tl.constexpr, N: tl.constexpr, BLOCK_M: tl.constexpr):
    """Program p adds its partial of every layer into out[layer], then counts itself into counter[layer]
    (release)."""
    pid = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)
    rn = tl.arange(0, N)
    m_ok = (rm < M)[:, None]
    for layer in range(LAYERS):
        ptrs = out_ptr + layer * M * N + rm[:, None] * N + rn[None, :]
        tl.atomic_add(ptrs, _partial(pid, layer, rm, rn), mask=m_ok, sem="relaxed")
        tl.debug_barrier()                   # every thread's additions issued before the count
        tl.atomic_add(counter_ptr + layer, 1, sem="release")


@triton.jit
def _store_kernel(parts_ptr, P, M, layer, N: tl.constexpr, BLOCK_M: tl.constexpr):
    """Program p stores its partial of `layer` into parts[p] (P, M, N)."""
    pid = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)
    rn = tl.arange(0, N)
    tl.store(parts_ptr + pid * M * N + rm[:, None] * N + rn[None, :], _partial(pid, layer, rm, rn),
             mask=(rm < M)[:, None])


@triton.jit
def _reduce_kernel(parts_ptr, out_ptr, M, P: tl.constexpr, N: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    """Program t sums the P partials of columns t * BLOCK_N .. + BLOCK_N, every row: out (M, N)."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    m_ok = (rm < M)[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for p in range(P):
        acc += tl.load(parts_ptr + p * M * N + rm[:, None] * N + rn[None, :], mask=m_ok, other=0.0)
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], acc, mask=m_ok)


class PartialSums:
    """Static buffers for `layers` foldings of `programs` partials (rows x width fp32); `run()` fills `out`
    (layers, rows, width) and `counters` (layers,); capturable."""

    def __init__(self, programs: int, layers: int, rows: int, width: int, mode: str, device: torch.device | str,
                 num_warps: int = 8):
        if mode not in MODES:
            raise ValueError(f"partial_sums: mode {mode!r} is not one of {MODES}")
        if not 1 <= rows <= BLOCK_M or width & (width - 1) or width % 64:
            raise ValueError(f"partial_sums: 1-{BLOCK_M} rows and a power-of-two width (a multiple of 64), got "
                             f"{rows} x {width}")
        self.programs, self.layers, self.rows, self.width, self.mode = programs, layers, rows, width, mode
        self.num_warps = num_warps
        self.out = torch.zeros(layers, rows, width, device=device, dtype=torch.float32)
        self.counters = torch.zeros(layers, device=device, dtype=torch.int32)
        self.parts = (torch.empty(programs, rows, width, device=device, dtype=torch.float32)
                      if mode == "stored" else None)

    def run(self) -> torch.Tensor:
        P, L, M, N = self.programs, self.layers, self.rows, self.width
        if self.mode == "stored":
            block_n = 64
            for layer in range(L):
                _store_kernel[(P,)](self.parts, P, M, layer, N=N, BLOCK_M=BLOCK_M, num_warps=self.num_warps)
                _reduce_kernel[(N // block_n,)](self.parts, self.out[layer], M, P=P, N=N, BLOCK_M=BLOCK_M,
                                                BLOCK_N=block_n, num_warps=4)
            return self.out
        self.out.zero_()
        self.counters.zero_()
        _fold_kernel[(P,)](self.out, self.counters, M, LAYERS=L, N=N, BLOCK_M=BLOCK_M, num_warps=self.num_warps)
        return self.out


__all__ = ["MODES", "PartialSums", "partial_sums_reference"]
