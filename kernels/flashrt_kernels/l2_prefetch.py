"""Bulk L2 prefetch of weights a later kernel will read (NVIDIA sm90+, PTX ``cp.async.bulk.prefetch.L2``).

    prefetch_l2(addr, nbytes, chunk): the bytes [addr, addr + nbytes) are fetched from HBM into L2; nothing is
    written, no register receives them, and the issuing program does not wait for them (fire and forget).

A denoising step is a chain of latency-bound kernels (norms, RoPE, attention) between weight-streaming GEMMs,
so HBM sits idle for most of a layer (docs/benchmarks/engine_h200_2026-11-29_notes.md: ~2.1 of 4.3 TB/s while the
GEMMs run, little in between). The decoder's QKV GEMM of layer i prefetches the rest of layer i's weights and
layer i+1's QKV weights (one contiguous window of the expert's weight arena, ~35 MB of the 50 MB L2 for pi0.5),
so the later GEMMs find them in L2. It is issued before the kernel's wait for its inputs: weights do not depend
on earlier kernels.

The window is cut into ``programs x 32 x num_warps`` chunks (16-byte multiples, the instruction's granule), one
per element of a ``32 x num_warps`` range in each program: in Triton's default layout that is one chunk per thread
(were an element replicated across threads, its chunk would only be requested twice). A chunk past the window's
end has size 0 and is predicated off.
The reference of this op is doing nothing: outputs with and without it are identical (test/gpu compares them).
Measured on the H200 (session 5, docs/benchmarks/engine_h200_2026-11-29_notes.md): both uses are slower. The window
costs 0.3-0.4 ms per predict and each GEMM prefetching its own slice costs 1.0 ms. Both stay opt-in.
"""

from __future__ import annotations

from ._triton import tl, triton

GRANULE = 16      # cp.async.bulk sizes and addresses are multiples of 16 bytes


@triton.jit
def _bulk_prefetch(addr, size):
    """One ``cp.async.bulk.prefetch.L2`` of ``size`` bytes (int32) at ``addr`` (int64) per element; size 0 is
    predicated off."""
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [addr, size], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def prefetch_l2(addr, nbytes, chunk, SLOTS: tl.constexpr):
    """This program's share of the window [addr, addr + nbytes): SLOTS chunks of ``chunk`` bytes, one per thread
    (SLOTS = 32 x num_warps). Call it before ``wait_for_inputs`` so the fetch overlaps the kernel ahead."""
    pid = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
    start = (pid * SLOTS + tl.arange(0, SLOTS)).to(tl.int64) * chunk
    _bulk_prefetch(addr + start, tl.minimum(tl.maximum(nbytes - start, 0), chunk).to(tl.int32))


@triton.jit
def prefetch_rows_l2(addr, row_stride, nbytes, rows, ok):
    """Bulk-prefetch into L2 ``nbytes`` from ``addr + rows * row_stride`` for every element of ``rows`` where
    ``ok`` (all in bytes, 16-byte multiples): one instruction per element. Fire and forget, like prefetch_l2."""
    _bulk_prefetch(addr + rows.to(tl.int64) * row_stride, tl.where(ok, nbytes, 0).to(tl.int32))


def prefetch_chunk(nbytes: int, programs: int, num_warps: int) -> int:
    """Bytes per thread so that ``programs`` programs of ``num_warps`` warps cover ``nbytes`` (16-byte multiple)."""
    slots = programs * 32 * num_warps
    per_slot = -(-nbytes // slots)
    return -(-per_slot // GRANULE) * GRANULE


def check_window(addr: int, nbytes: int) -> None:
    """The instruction's alignment rules: both multiples of 16 bytes, a non-empty window below 2 GiB."""
    if addr % GRANULE or nbytes % GRANULE or not 0 < nbytes < 2**31:
        raise ValueError(f"L2 prefetch window must be 16-byte aligned, 0 < size < 2 GiB; got address {addr:#x}, "
                         f"{nbytes} bytes")


__all__ = ["GRANULE", "prefetch_l2", "prefetch_rows_l2", "prefetch_chunk", "check_window"]
