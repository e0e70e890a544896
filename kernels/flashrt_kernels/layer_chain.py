"""A chain of dependent one-shot GEMMs, the building block of a persistent denoiser: how much a dependency between
layers costs when it is a kernel boundary (one launch per layer, in a CUDA graph, with or without PDL), a counter in
global memory inside one persistent kernel, or a flag that travels in every data word.

    x_0 = x;  x_{l+1} = bf16(x_l @ W_l^T)   x (M, D), W_l (D, D), l = 0 .. L-1;  returns x_L

Every program owns BLOCK_N output columns of a layer (a tile: its BLOCK_N x D weight slice, loaded whole, "one
shot", before it waits for its input), so a layer is D / BLOCK_N tiles and every weight byte is read once.
- ``wait="launch"``: layer l is its own launch of D / BLOCK_N programs; with PDL the next layer's programs start,
  load their weights and wait (griddepcontrol) while this one finishes.
- ``wait="counter"``: one persistent launch of D / BLOCK_N programs (all resident: at most one per SM), each owning
  the same tile of every layer. A program loads its slice of W_l, then spins (volatile loads, then one acquire)
  until layer l - 1's counter holds D / BLOCK_N (every tile of x_l written), reads x_l, writes its tile of x_{l+1}
  and adds one to layer l's counter (a CTA barrier, then a release at GPU scope).
- ``wait="flagged_data"``: the same persistent programs, but no counter and no fence: every activation is a 32-bit
  word, its bf16 bits in the low half and a flag in the high half (the "LL" protocol of NCCL's small messages). A
  32-bit aligned store is seen whole or not at all, so a program polls x_l itself (volatile loads) until every
  word carries the flag, and the values are then in its registers: the hand-over is one store and one load
  through L2, where the counter takes a fence, an atomic, a poll and an acquire before the data load.
- ``wait="launch_flagged_data"``: a launch per layer again, on flagged words: every layer's programs release the
  next layer at their start (PDL's early trigger) and, instead of griddepcontrol's wait for the whole grid before
  them to finish and flush, poll their input words as above. The first layer runs in stream order after the
  zeroing of the words; its successors need no wait on the grid, since the flags say when their input is there.
- ``wait="staged_flagged_data"`` (Gluon, Hopper): the persistent flagged form with the weights in shared memory
  instead of registers. Every program owns STAGED_BLOCK_N (8) output columns, so D / 8 programs stream, and keeps
  a ring of `stages` weight slices that the tensor memory accelerator fills (TMA, one mbarrier per slot): the slices
  of layers l + 1 .. l + stages - 1 are in flight while the program polls layer l's input, and each slot is
  refilled with the layer `stages` ahead as soon as its product is done. x, polled as above, goes through shared
  memory into mma.sync's operand layout. It answers whether the weight stream, once it runs layers ahead of the
  dependency, hides the hand-over (the design of a persistent denoiser). ``wait="staged_counter"`` is the same
  ring with the counter's hand-over instead (bf16 activations, half the bytes of the words), the one a consumer of
  a wide activation needs. ``chained=False`` runs its layers
  without the dependency (each multiplies x_0): what its streams and products cost alone. ``fp8=True`` streams
  the weights as E4M3 with a scale per row (half the bytes), widened to bf16 as they leave shared memory.
In the persistent forms the weights of layer l stream while the program waits for layer l - 1, in the flagged
launches while the layer before works. The counters and the flagged words are zeroed before each run (the launcher
does it).
``resident=True`` makes every layer multiply by W_0 (x_{l+1} = bf16(x_l @ W_0^T)): the persistent forms load their
slice of it once, before the first layer, the staged form fills its ring slots with it, and the launches read it
from L2 each time, so what a layer costs is the hand-over alone, without its weight stream; set beside the
streamed chain, it says how much of that stream the wait hides.
"""

from __future__ import annotations

import torch

from ._gluon import HAVE_GLUON, TensorDescriptor, gl, gluon, mbarrier, mma_v2, tma
from ._triton import EARLY_TRIGGER, INTERPRETED, launch_options, release_dependents, tl, triton, wait_for_inputs

BLOCK_M = 16           # rows a program covers (the denoiser's 10-row steps; at most 16)
WAITS = ("launch", "counter", "flagged_data", "launch_flagged_data", "staged_flagged_data", "staged_counter")
FLAGGED_WAITS = ("flagged_data", "launch_flagged_data", "staged_flagged_data")   # activations as flagged words
PERSISTENT_WAITS = ("counter", "flagged_data", "staged_flagged_data", "staged_counter")   # programs wait on each other
GLUON_WAITS = ("staged_flagged_data", "staged_counter")     # Gluon on a Hopper GPU (no interpreter)
STAGED_BLOCK_N = 8       # weight rows per program of the staged form: mma.sync's N, so D / 8 programs stream
STAGED_WIDTH = 1024      # the staged form's D: 8 warps x 2 boxes of 64 columns (the expert's width)
STAGED_SPIN_LIMIT = 1 << 20       # reads of one input before the staged form's poll gives up (~1 s, not us)
STAGED_SMEM = 160 * 1024          # the staged form's weight ring (the layout conversions take the rest)
# the staged form's register cap: one program per SM, so all of them (ptxas's own cap for 256 threads, 128,
# spills the counted form)
STAGED_MAXNREG = 255
FLAG = 1               # high half of a written word of the flagged form; zeroed words read as "not yet written"


def layer_chain_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch. x (M, D), w (L, D, D) -> x_L (M, D) in x.dtype, each layer's product rounded to x.dtype."""
    for layer in w:
        x = (x.float() @ layer.float().T).to(x.dtype)
    return x


@triton.jit
def _tile_indices(M, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's output columns rn, the reduction index rk, the rows rm and the (BLOCK_M, 1) row mask."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.arange(0, BLOCK_M)
    return rn, tl.arange(0, D), rm, (rm < M)[:, None]


@triton.jit
def _layer_kernel(x_ptr, w_ptr, y_ptr, M, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  PDL: tl.constexpr):
    """One layer: y[:, tile] = x @ W[tile, :]^T."""
    release_dependents(PDL)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, D)
    rm = tl.arange(0, BLOCK_M)
    w = tl.load(w_ptr + rn[:, None] * D + rk[None, :])                                  # (BLOCK_N, D)
    wait_for_inputs(PDL)
    x = tl.load(x_ptr + rm[:, None] * D + rk[None, :], mask=(rm < M)[:, None], other=0.0)
    y = tl.dot(x, tl.trans(w))                                                          # (BLOCK_M, BLOCK_N) fp32
    tl.store(y_ptr + rm[:, None] * D + rn[None, :], y.to(y_ptr.dtype.element_ty), mask=(rm < M)[:, None])


@triton.jit
def _persistent_chain_kernel(buf_ptr, w_ptr, counter_ptr, M, LAYERS: tl.constexpr, D: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, RESIDENT: tl.constexpr):
    """Every layer's tile `program_id` in turn; buf (LAYERS + 1, M, D): buf[0] = x, buf[l + 1] = layer l's output.
    RESIDENT: W_0's slice loaded once, for every layer."""
    tiles: tl.constexpr = D // BLOCK_N
    rn, rk, rm, m_ok = _tile_indices(M, D, BLOCK_M, BLOCK_N)
    if RESIDENT:
        w = tl.load(w_ptr + rn[:, None] * D + rk[None, :])
    for layer in range(LAYERS):
        if not RESIDENT:
            w = tl.load(w_ptr + layer * D * D + rn[:, None] * D + rk[None, :])          # before the wait
        ok = m_ok
        if layer > 0:
            counter = counter_ptr + layer - 1
            done = tl.load(counter, volatile=True)       # spin on the L2 line, no read-modify-write traffic
            while done < tiles:
                done = tl.load(counter, volatile=True)
            # the acquire: its value masks the input's loads, which keeps it (an atomic whose result nothing
            # reads is dropped by the compiler) and orders them after it
            ok = m_ok & (tl.atomic_add(counter, 0, sem="acquire") >= tiles)
        x = tl.load(buf_ptr + layer * M * D + rm[:, None] * D + rk[None, :], mask=ok, other=0.0,
                    cache_modifier=".cg")                                               # written by other SMs
        y = tl.dot(x, tl.trans(w))
        tl.store(buf_ptr + (layer + 1) * M * D + rm[:, None] * D + rn[None, :], y.to(buf_ptr.dtype.element_ty),
                 mask=m_ok)
        tl.debug_barrier()                       # every thread's stores of the tile before the release
        tl.atomic_add(counter_ptr + layer, 1, sem="release")


@triton.jit
def _flagged_input(src, m_ok, FLAG: tl.constexpr):
    """Poll the int32 words at src (volatile loads) until every one under m_ok carries FLAG; their bf16 values."""
    words = tl.load(src, mask=m_ok, other=FLAG << 16, volatile=True)
    while tl.min((words >> 16) & 0xFFFF) != FLAG:            # some word not written yet: read them all again
        words = tl.load(src, mask=m_ok, other=FLAG << 16, volatile=True)
    return (words & 0xFFFF).to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _flagged_store(dst, y, m_ok, FLAG: tl.constexpr):
    """Store y as flagged words: bf16(y)'s bits in the low half, FLAG in the high half."""
    bits = y.to(tl.bfloat16).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    tl.store(dst, bits | (FLAG << 16), mask=m_ok)


@triton.jit
def _persistent_flagged_chain_kernel(buf_ptr, w_ptr, M, LAYERS: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
                                     BLOCK_N: tl.constexpr, FLAG: tl.constexpr, RESIDENT: tl.constexpr):
    """Every layer's tile `program_id` in turn; buf (LAYERS + 1, M, D) int32 words (bf16 bits | FLAG << 16):
    buf[0] = x, buf[l + 1] = layer l's output. RESIDENT: W_0's slice loaded once, for every layer."""
    rn, rk, rm, m_ok = _tile_indices(M, D, BLOCK_M, BLOCK_N)
    if RESIDENT:
        w = tl.load(w_ptr + rn[:, None] * D + rk[None, :])
    for layer in range(LAYERS):
        if not RESIDENT:
            w = tl.load(w_ptr + layer * D * D + rn[:, None] * D + rk[None, :])          # before the wait
        x = _flagged_input(buf_ptr + layer * M * D + rm[:, None] * D + rk[None, :], m_ok, FLAG)
        y = tl.dot(x, tl.trans(w))
        _flagged_store(buf_ptr + (layer + 1) * M * D + rm[:, None] * D + rn[None, :], y, m_ok, FLAG)


@triton.jit
def _flagged_layer_kernel(x_ptr, w_ptr, y_ptr, M, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          FLAG: tl.constexpr, PDL: tl.constexpr, F32_DOT: tl.constexpr):
    """One layer on flagged words: y[:, tile] = x @ W[tile, :]^T. With PDL (the early trigger) the next layer
    launches as soon as every program of this one has started; it polls this one's words instead of waiting for
    the grid to finish (no griddepcontrol.wait). F32_DOT: the product of the bf16 values in fp32 (Triton's
    interpreter, whose bf16 dot is wrong)."""
    release_dependents(PDL)
    rn, rk, rm, m_ok = _tile_indices(M, D, BLOCK_M, BLOCK_N)
    w = tl.load(w_ptr + rn[:, None] * D + rk[None, :])                                  # (BLOCK_N, D)
    x = _flagged_input(x_ptr + rm[:, None] * D + rk[None, :], m_ok, FLAG)
    if F32_DOT:
        x = x.to(tl.float32)
        w = w.to(tl.float32)
    y = tl.dot(x, tl.trans(w))
    _flagged_store(y_ptr + rm[:, None] * D + rn[None, :], y, m_ok, FLAG)


if HAVE_GLUON:
    @gluon.jit
    def _staged_weights(w_desc, w_smem, bar, layer, n0, D: gl.constexpr):
        """Issue this program's slice of W_layer (BLOCK_N rows from n0, all D columns as D / 64 boxes of 64) into
        one ring slot w_smem (BLOCK_N, D / 64, 64) on mbarrier bar: one TMA copy of w_desc's 3-D view (weight row,
        column box, column) of the weights."""
        mbarrier.expect(bar, D * w_desc.block_type.shape[0] * (1 if w_desc.dtype == gl.float8e4nv else 2))
        tma.async_copy_global_to_shared(w_desc, [layer * D + n0, 0, 0], bar, w_smem)

    @gluon.jit
    def _staged_half(buf_ptr, layer, M, half, D: gl.constexpr, BLOCK_M: gl.constexpr, GROUPS: gl.constexpr,
                     layout: gl.constexpr):
        """Pointers and row mask of half `half` of layer `layer`'s input words as (GROUPS, BLOCK_M, 64): element
        (g, m, k) is x[m, (half * GROUPS + g) * 64 + k], so group g's columns are the boxes g and GROUPS + g."""
        g = gl.arange(0, GROUPS, layout=gl.SliceLayout(1, gl.SliceLayout(2, layout)))
        m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, gl.SliceLayout(2, layout)))
        k = gl.arange(0, 64, layout=gl.SliceLayout(0, gl.SliceLayout(1, layout)))
        cols = (half * GROUPS + g[:, None, None]) * 64 + k[None, None, :]
        return buf_ptr + layer * M * D + m[None, :, None] * D + cols, (m < M)[None, :, None]

    @gluon.jit
    def _flagged_values(words, m_ok):
        """The bf16 values of flagged words (0 where m_ok is False)."""
        return gl.where(m_ok, words & 0xFFFF, 0).to(gl.int16).to(gl.bfloat16, bitcast=True)

    @gluon.jit
    def _staged_flagged_input(buf_ptr, source, M, D: gl.constexpr, BLOCK_M: gl.constexpr, GROUPS: gl.constexpr,
                              layout: gl.constexpr, FLAG: gl.constexpr, limit):
        """The staged form's input x_source as flagged words, polled until every word carries FLAG or `limit`
        reads: (its two halves' bf16 values (GROUPS, BLOCK_M, 64), the reads)."""
        src0, m_ok = _staged_half(buf_ptr, source, M, 0, D, BLOCK_M, GROUPS, layout)
        src1, _ = _staged_half(buf_ptr, source, M, 1, D, BLOCK_M, GROUPS, layout)
        w0 = gl.load(src0, mask=m_ok, other=FLAG << 16, volatile=True)
        w1 = gl.load(src1, mask=m_ok, other=FLAG << 16, volatile=True)
        flags = gl.minimum((w0 >> 16) & 0xFFFF, (w1 >> 16) & 0xFFFF)
        polls = 1
        while (gl.min(gl.min(gl.min(flags, axis=2), axis=1), axis=0) != FLAG) & (polls < limit):
            w0 = gl.load(src0, mask=m_ok, other=FLAG << 16, volatile=True)     # a word not written yet
            w1 = gl.load(src1, mask=m_ok, other=FLAG << 16, volatile=True)
            flags = gl.minimum((w0 >> 16) & 0xFFFF, (w1 >> 16) & 0xFFFF)
            polls += 1
        return _flagged_values(w0, m_ok), _flagged_values(w1, m_ok), polls

    @gluon.jit
    def _staged_counted_input(buf_ptr, counter_ptr, source, M, D: gl.constexpr, BLOCK_M: gl.constexpr,
                              GROUPS: gl.constexpr, layout: gl.constexpr, TILES: gl.constexpr, limit):
        """The staged form's input x_source as bf16, read once counter[source - 1] holds TILES (every tile of
        x_source written; source 0 is written before the launch) or after `limit` reads of the counter: (its two
        halves (GROUPS, BLOCK_M, 64), the reads)."""
        src0, m_ok = _staged_half(buf_ptr, source, M, 0, D, BLOCK_M, GROUPS, layout)
        src1, _ = _staged_half(buf_ptr, source, M, 1, D, BLOCK_M, GROUPS, layout)
        polls = 1
        ok = m_ok
        if source > 0:
            done = gl.load(counter_ptr + source - 1, volatile=True)    # spin on the L2 line, no atomics
            while (done < TILES) & (polls < limit):
                done = gl.load(counter_ptr + source - 1, volatile=True)
                polls += 1
            # the acquire: its value masks the loads below, which keeps it (an atomic whose result nothing reads
            # is dropped by the compiler) and orders them after it
            ok = m_ok & (gl.atomic_add(counter_ptr + source - 1, 0, sem="acquire") >= TILES)
        x0 = gl.load(src0, mask=ok, other=0.0, cache_modifier=".cg")            # written by other SMs
        x1 = gl.load(src1, mask=ok, other=0.0, cache_modifier=".cg")
        return x0, x1, polls

    @gluon.jit
    def _staged_flagged_chain_kernel(buf_ptr, w_desc, scale_ptr, stall_ptr, counter_ptr, M, LAYERS: gl.constexpr,
                                     D: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, FLAG: gl.constexpr,
                                     SPIN_LIMIT: gl.constexpr, RESIDENT: gl.constexpr = False,
                                     CHAINED: gl.constexpr = True, COUNTED: gl.constexpr = False):
        """Every layer's tile `program_id` in turn, weights through a ring of STAGES shared-memory slots filled by
        TMA layers ahead; buf (LAYERS + 1, M, D) int32 flagged words as _persistent_flagged_chain_kernel's. Warp g
        of the 8 multiplies the column boxes g and 8 + g of D (mma.sync on a batch of 8, one batch per half of D),
        and the 8 partial products are summed across the warps. A poll that has read its words SPIN_LIMIT times
        without every flag gives up: the program writes layer + 1 to stall_ptr[program] (0 when every poll ended)
        and goes on with what it read, reading each later input once, so a chain that would never end ends wrong
        instead (within about one limit's time), and says where. RESIDENT: every slot is filled with W_0's slice
        (from L2 after the first layers), the ring's hand-overs without the weight stream. CHAINED False: every
        layer reads x_0 (written before the launch) instead of the layer before's output, so no layer waits for
        another: the same streams and products without a dependency. E4M3 weights (w_desc over float8e4nv): each
        slice is widened to bf16 as it leaves shared memory, and the product of output column n of layer l is
        scaled by scale_ptr[l * D + n] (one scale per weight row). COUNTED: buf holds bf16 (LAYERS + 1, M, D) and
        the hand-over is _persistent_chain_kernel's counter per layer (a release after each program's tile, a
        volatile spin and an acquire before the input), with the same ring."""
        GROUPS: gl.constexpr = 8                                   # = num_warps: one K group per warp
        BLOCK_N: gl.constexpr = w_desc.block_type.shape[0]
        NK: gl.constexpr = 2 * GROUPS                              # 64-column boxes per slot
        gl.static_assert(D == NK * 64, "the staged form's D is 8 warps x 2 boxes of 64 columns")
        FP8: gl.constexpr = w_desc.dtype == gl.float8e4nv
        n0 = gl.program_id(0) * BLOCK_N
        w_smem = gl.allocate_shared_memory(w_desc.dtype, [STAGES * BLOCK_N, NK, 64], w_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(bars.index(s), count=1)
        for s in gl.static_range(STAGES):                          # the first STAGES layers' slices in flight
            if s < LAYERS:
                _staged_weights(w_desc, w_smem.slice(s * BLOCK_N, BLOCK_N), bars.index(s), 0 if RESIDENT else s,
                                n0, D)
        # x polled as (group, row, 64 columns) halves, each warp its group's 16-byte words along the columns
        x_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1, 4], threads_per_warp=[1, 2, 16],
                                                  warps_per_cta=[GROUPS, 1, 1], order=[2, 1, 0])
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[GROUPS, 1, 1],
                                                      instr_shape=[1, 16, 8])
        a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        b_layout: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=2)
        out_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1], threads_per_warp=[4, 8],
                                                    warps_per_cta=[GROUPS, 1], order=[1, 0])
        w_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1, 8], threads_per_warp=[4, 1, 8],
                                                  warps_per_cta=[1, GROUPS, 1], order=[2, 1, 0])
        om = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, out_layout))
        on = n0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, out_layout))
        limit = SPIN_LIMIT
        # the layers in rounds of STAGES, so that each one's ring slot (s) is known when compiling
        for first in range(0, LAYERS, STAGES):
            for s in gl.static_range(STAGES):
                layer = first + s
                if layer < LAYERS:
                    source = layer if CHAINED else 0
                    if COUNTED:
                        x0, x1, polls = _staged_counted_input(buf_ptr, counter_ptr, source, M, D, BLOCK_M, GROUPS,
                                                              x_layout, D // BLOCK_N, limit)
                    else:
                        x0, x1, polls = _staged_flagged_input(buf_ptr, source, M, D, BLOCK_M, GROUPS, x_layout, FLAG,
                                                              limit)
                    if polls >= limit:
                        if limit > 1:                           # the first poll that gave up: where
                            gl.store(stall_ptr + gl.program_id(0), layer + 1)
                        limit = 1                               # the later ones read once: the run ends soon
                    a0 = gl.convert_layout(x0, a_layout)
                    a1 = gl.convert_layout(x1, a_layout)
                    mbarrier.wait(bars.index(s), phase=(first // STAGES) & 1)
                    ring = w_smem.slice(s * BLOCK_N, BLOCK_N)
                    # (group, 64 columns, BLOCK_N): the slot's (row, box, column) read as they are, boxes j * 8 ..
                    # j * 8 + 7 for half j, reordered in registers
                    w_lo = ring.slice(0, GROUPS, dim=1).load(w_layout).to(gl.bfloat16)
                    w_hi = ring.slice(GROUPS, GROUPS, dim=1).load(w_layout).to(gl.bfloat16)
                    b0 = gl.convert_layout(gl.permute(w_lo, (1, 2, 0)), b_layout)
                    b1 = gl.convert_layout(gl.permute(w_hi, (1, 2, 0)), b_layout)
                    acc = gl.zeros((GROUPS, BLOCK_M, BLOCK_N), dtype=gl.float32, layout=mma)
                    acc = mma_v2(a0, b0, acc)
                    acc = mma_v2(a1, b1, acc)
                    gl.thread_barrier()             # every warp done reading the slot before it is refilled
                    if layer + STAGES < LAYERS:
                        _staged_weights(w_desc, ring, bars.index(s), 0 if RESIDENT else layer + STAGES, n0, D)
                    y = gl.convert_layout(gl.sum(acc, axis=0), out_layout)
                    if FP8:
                        y = y * gl.load(scale_ptr + (0 if RESIDENT else layer) * D + on)[None, :]
                    dst = buf_ptr + (layer + 1) * M * D + om[:, None] * D + on[None, :]
                    if COUNTED:
                        gl.store(dst, y.to(gl.bfloat16), mask=(om < M)[:, None])
                        gl.thread_barrier()             # every thread's stores of the tile before the release
                        gl.atomic_add(counter_ptr + layer, 1, sem="release")
                    else:
                        bits = y.to(gl.bfloat16).to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
                        gl.store(dst, bits | (FLAG << 16), mask=(om < M)[:, None])
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(s))


def staged_box_layout(dtype=torch.bfloat16):
    """The shared layout of the staged form's weight slices (row, column box, 64 columns): their rows swizzled over
    128 bytes (bf16) or 64 (E4M3)."""
    bits = 8 if dtype == torch.float8_e4m3fn else 16
    return gl.NVMMASharedLayout(swizzle_byte_width=64 * bits // 8, element_bitwidth=bits, rank=3)


def staged_stages(D: int, block_n: int = STAGED_BLOCK_N, layers: int | None = None, elem_bytes: int = 2) -> int:
    """Weight slices (block_n x D elements of elem_bytes each) the staged form's ring holds: the most that fit
    STAGED_SMEM, at most 16 and at most `layers`, a power of two (the ring's shape must be one)."""
    fits = max(1, min(16, STAGED_SMEM // (block_n * D * elem_bytes), layers or 16))
    return 1 << (fits.bit_length() - 1)


def fp8_weights(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(L, D, D) weights -> E4M3 weights and their fp32 scales (L, D), one per weight row: w ~ w8 * scale[..., None],
    the row's largest magnitude at 448."""
    scale = (w.float().abs().amax(dim=-1) / 448.0).clamp_min(1e-12)
    return (w.float() / scale[..., None]).to(torch.float8_e4m3fn), scale


def chain_tiles(D: int, block_n: int) -> int:
    return D // block_n


def check_shapes(x: torch.Tensor, w: torch.Tensor, block_n: int) -> None:
    M, D = x.shape
    if w.dim() != 3 or w.shape[1:] != (D, D) or M > BLOCK_M or D % block_n or D & (D - 1):
        raise ValueError(f"layer_chain: x (M <= {BLOCK_M}, D) with D a power of two, w (L, D, D), D a multiple of "
                         f"block_n={block_n}; got x {tuple(x.shape)}, w {tuple(w.shape)}")


class LayerChain:
    """Static buffers for one chain: `run()` computes x_L from `x` (written in place into bf16[0]); capturable.
    wait: one of WAITS (the module's docstring); pdl applies to wait="launch"; resident: every layer multiplies by
    w[0] (the module's docstring; layer_chain_reference(x, resident_weights(w)) is then the result); chained
    False (the staged form only): every layer multiplies x itself, no layer waits for another, and the result is
    unchained_reference(x, w); fp8 (the staged form only): the weights streamed as E4M3 with a scale per row
    (fp8_weights(w)), so the result is that of w8 * scale."""

    def __init__(self, w: torch.Tensor, rows: int, wait: str, pdl: bool | int = False, block_n: int = 16,
                 num_warps: int | None = None, resident: bool = False, chained: bool = True, fp8: bool = False):
        if wait not in WAITS:
            raise ValueError(f"layer_chain: wait {wait!r} is not one of {WAITS}")
        if wait in FLAGGED_WAITS and w.dtype != torch.bfloat16:
            raise ValueError(f"layer_chain: the flagged forms carry bf16 values in their words, got {w.dtype} weights")
        if wait in GLUON_WAITS:
            if w.dtype != torch.bfloat16:
                raise ValueError(f"layer_chain: wait={wait!r} streams bf16 weights (fp8=True quantizes them), got "
                                 f"{w.dtype}")
            if not HAVE_GLUON or INTERPRETED or not w.is_cuda:
                raise RuntimeError(f"layer_chain: wait={wait!r} needs Triton's Gluon on a Hopper GPU (no interpreter)")
            if w.shape[-1] != STAGED_WIDTH:
                raise ValueError(f"layer_chain: wait={wait!r} splits D into 8 warps' pairs of 64-column boxes (D = "
                                 f"{STAGED_WIDTH}), got D {w.shape[-1]}")
            block_n = STAGED_BLOCK_N
        elif not chained or fp8:
            raise ValueError(f"layer_chain: chained=False and fp8 are modes of the staged form, not of wait={wait!r}")
        self.w, self.wait, self.pdl, self.block_n, self.resident = w, wait, pdl, block_n, resident
        self.chained = chained
        # the staged form's E4M3 weights and their row scales (fp8), else None
        self.w8, self.scale = fp8_weights(w) if fp8 else (None, None)
        # the flagged form holds x as 32-bit words: 8 warps keep them and the weight slice in registers
        self.num_warps = num_warps or (8 if wait in FLAGGED_WAITS else 4)
        layers, D, _ = w.shape
        self.bf16 = torch.zeros(layers + 1, rows, D, device=w.device, dtype=w.dtype)
        check_shapes(self.bf16[0], w, block_n)
        self.words = (torch.zeros(layers + 1, rows, D, device=w.device, dtype=torch.int32)
                      if wait in FLAGGED_WAITS else None)
        self.counters = torch.zeros(layers, device=w.device, dtype=torch.int32)
        # the staged form's programs: the layer + 1 at which a poll gave up (0: none did)
        self.stalls = torch.zeros(chain_tiles(D, block_n), device=w.device, dtype=torch.int32)
        tiles = chain_tiles(D, block_n)
        if wait in PERSISTENT_WAITS and w.is_cuda:
            sms = torch.cuda.get_device_properties(w.device).multi_processor_count
            if tiles > sms:
                raise ValueError(f"layer_chain: a persistent run needs its {tiles} programs resident at once, "
                                 f"this GPU has {sms} multiprocessors (raise block_n)")

    @property
    def x(self) -> torch.Tensor:
        """The chain's input (rows, D) in the weights' dtype: write it before run()."""
        return self.bf16[0]

    @property
    def out(self) -> torch.Tensor:
        """x_L (rows, D) after run() (the flagged form unpacks it from its words in run())."""
        return self.bf16[-1]

    def _weight(self, layer: int) -> torch.Tensor:
        """The weight the launch of `layer` reads: W_layer, or W_0 for every layer when resident."""
        return self.w[0 if self.resident else layer]

    def _run_staged(self, buffer: torch.Tensor, counted: bool) -> None:
        """The staged form's launch over `buffer` (flagged words, or bf16 with the counters when counted)."""
        layers, rows, D = self.bf16.shape[0] - 1, self.bf16.shape[1], self.bf16.shape[2]
        # the weights as (row, column box, column): one TMA copy moves a program's slice of a layer
        streamed = self.w if self.w8 is None else self.w8
        boxes = streamed.reshape(layers * D, D // 64, 64)
        w_desc = TensorDescriptor.from_tensor(boxes, [self.block_n, D // 64, 64], staged_box_layout(streamed.dtype))
        self.stalls.zero_()
        self.counters.zero_()
        _staged_flagged_chain_kernel[(chain_tiles(D, self.block_n),)](
            buffer, w_desc, self.stalls if self.scale is None else self.scale, self.stalls, self.counters, rows,
            LAYERS=layers, D=D, BLOCK_M=BLOCK_M, STAGES=staged_stages(D, self.block_n, layers, streamed.element_size()),
            FLAG=FLAG, SPIN_LIMIT=STAGED_SPIN_LIMIT, RESIDENT=self.resident, CHAINED=self.chained, COUNTED=counted,
            num_warps=8, maxnreg=STAGED_MAXNREG)

    def run(self) -> torch.Tensor:
        layers, rows, D = self.bf16.shape[0] - 1, self.bf16.shape[1], self.bf16.shape[2]
        tiles = chain_tiles(D, self.block_n)
        if self.wait == "staged_counter":
            self._run_staged(self.bf16, counted=True)
        elif self.wait == "counter":
            self.counters.zero_()
            _persistent_chain_kernel[(tiles,)](self.bf16, self.w, self.counters, rows, LAYERS=layers, D=D,
                                               BLOCK_M=BLOCK_M, BLOCK_N=self.block_n, RESIDENT=self.resident,
                                               num_warps=self.num_warps)
        elif self.words is not None:
            self.words[1:].zero_()
            self.words[0].copy_(pack_flagged_words(self.bf16[0]))
            if self.wait == "staged_flagged_data":
                self._run_staged(self.words, counted=False)
            elif self.wait == "flagged_data":
                _persistent_flagged_chain_kernel[(tiles,)](self.words, self.w, rows, LAYERS=layers, D=D,
                                                           BLOCK_M=BLOCK_M, BLOCK_N=self.block_n, FLAG=FLAG,
                                                           RESIDENT=self.resident, num_warps=self.num_warps)
            else:
                # the first layer in stream order after the zeroing; each later one as soon as the one before has
                # started (early trigger), polling its words
                for layer in range(layers):
                    pdl = EARLY_TRIGGER if layer else False
                    _flagged_layer_kernel[(tiles,)](self.words[layer], self._weight(layer), self.words[layer + 1], rows,
                                                    D=D, BLOCK_M=BLOCK_M, BLOCK_N=self.block_n, FLAG=FLAG,
                                                    PDL=int(EARLY_TRIGGER), F32_DOT=INTERPRETED,
                                                    num_warps=self.num_warps,
                                                    **launch_options(pdl))
            self.bf16[-1].copy_(unpack_flagged_words(self.words[-1]))
        else:
            for layer in range(layers):
                _layer_kernel[(tiles,)](self.bf16[layer], self._weight(layer), self.bf16[layer + 1], rows, D=D,
                                        BLOCK_M=BLOCK_M, BLOCK_N=self.block_n, PDL=int(self.pdl),
                                        num_warps=self.num_warps, **launch_options(self.pdl))
        return self.out


def unchained_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """What an unchained run (LayerChain(chained=False)) leaves as its output: the last layer's product of x
    itself, bf16(x @ W_{L-1}^T)."""
    return layer_chain_reference(x, w[-1:])


def resident_weights(w: torch.Tensor) -> torch.Tensor:
    """The weights a resident chain multiplies by: w[0] for each of w's layers (a view, no copy)."""
    return w[:1].expand_as(w)


def pack_flagged_words(x: torch.Tensor) -> torch.Tensor:
    """bf16 (..., D) -> int32 words of the flagged form: the bf16 bits in the low half, FLAG in the high half."""
    return (x.view(torch.int16).to(torch.int32) & 0xFFFF) | (FLAG << 16)


def unpack_flagged_words(words: torch.Tensor) -> torch.Tensor:
    """The flagged form's int32 words -> their bf16 values (the flag dropped)."""
    return (words & 0xFFFF).to(torch.int16).view(torch.bfloat16)


def layer_chain(x: torch.Tensor, w: torch.Tensor, wait: str, pdl: bool | int = False,
                block_n: int = 16) -> torch.Tensor:
    """Triton launcher; contract of layer_chain_reference (a new chain's buffers per call: tests)."""
    chain = LayerChain(w, x.shape[0], wait, pdl, block_n)
    chain.x.copy_(x)
    return chain.run().clone()
