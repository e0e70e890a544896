"""The prefix's one-KV-head attention on Hopper tensor cores (NVIDIA sm90, Gluon: TMA + wgmma).

    o = softmax(q @ k^T + bias) @ v      q (Mq, D) with the heads stacked on the query axis (RoPE and the scale
                                         applied), k / v (P, D) the one K/V head, bias (P,) 0 / -inf: the key
                                         padding; every query sees every unmasked key (the prefix is bidirectional)

Why: the engine's Triton kernel (kernels/flashrt_kernels/attention.py, one key split) and FlashAttention-2 both take ~25 us per
backbone layer at 560 keys on the H200 for ~2.7 GFLOP (tools/benchmark_prefix_attention.py, 2026-12-01): ~15%
of the tensor cores' rate, ~0.45 ms per predict over 18 layers. This kernel runs both products on wgmma.

How: one program per 64 query rows (one warpgroup; 70 programs at 2 views). Its q rows sit in shared memory for the
whole loop (four 64-column boxes: the 128-byte swizzle holds 64 bf16 per row); blocks of 64 keys stream through two
stages of K and V (TMA, one mbarrier per stage), the next-but-one block loading while this one is computed.
Per block: s = q @ k^T on wgmma from shared memory (four K=64 steps), the key bias, an online softmax in the
accumulator's registers (base 2), then o_c += p @ v_c for the four 64-column chunks of the head dim, p passed to
wgmma from registers. The output is divided by the row sums and stored in bf16. Rows past Mq and keys past P are
read as zeros by TMA; the bias masks those keys. With `overlap` the next block's q @ k^T is issued before this
block's softmax (FlashAttention-3's intra-warpgroup overlap, one warpgroup): the tensor cores compute it while the
warps run the softmax, for 41 more registers (253, no spill on sm90) and one unused product after the last block.

Key splits (`splits` 2-4; the engine does not use them: 24.0-26.1 us per layer on the H200 against 17.6 us with
one split, docs/engine.md "Tried and rejected"): at 2 views the 72 row
blocks leave 60 of the H200's 132 SMs idle, and each program walks its 9 key blocks one after another (17.7 us
measured against ~5 us of tensor-core work per program). With splits, `splits` programs per row block each take
a contiguous share of the key blocks and write their unnormalized output, row maximum and row sum in fp32; the
combine kernel of kernels/flashrt_kernels/attention.py merges them (flash-decoding's merge; one more launch). With 32-key blocks
a program needs 96 KB of shared memory, so two fit one SM and the 144-216 programs run in one wave; the scores'
wgmma is then m64n32, and the output chunks use the same accumulator layout (n32 instructions twice), so the
row statistics need no layout conversion.

Provenance: the online softmax is FlashAttention's (Dao et al.); the Gluon structure (TMA descriptors, mbarriers,
warpgroup_mma with the A operand in registers) follows Triton's Gluon tutorials. Compiled for sm90 ahead of time
(tools/kernel_resources.py); its GPU test compares it with kernels/flashrt_kernels/attention.py
attention_reference. Measured on the H200: 17.7 us per call at 576 tokens (560
valid keys), against 25.4 us for the Triton kernel of kernels/flashrt_kernels/attention.py; `wgmma_overlap` 20.1 us.
"""

from __future__ import annotations

import torch

from ._gluon import (HAVE_GLUON, TensorDescriptor, gl, gluon, griddep, mbarrier, tma, warpgroup_mma,
                     warpgroup_mma_wait)
from ._triton import launch_options
from .attention import merge_splits

BLOCK_M = 64             # query rows per program: one warpgroup's wgmma M
BLOCK_N = 64             # keys per block (the default; 32 halves the shared memory: two programs fit one SM)
BLOCKS_N = (32, 64)
SPLITS = (1, 2, 3, 4)    # programs per row block, each over a contiguous share of the key blocks (merged after)
CHUNK = 64               # head-dim columns per TMA box and per output accumulator (128 bytes of bf16)
LOG2E = 1.4426950408889634


def split_blocks(P: int, splits: int, block_n: int) -> int:
    """Key blocks per program when `splits` programs share each row block's P keys in blocks of block_n; 0 where a
    program would get fewer than two (both stages are loaded before the loop)."""
    n_blocks = -(-P // block_n)
    per = -(-n_blocks // splits)
    return per if per >= 2 and n_blocks - (splits - 1) * per >= 2 else 0


def prefix_attention_supported(Mq: int, P: int, D: int, device: torch.device, splits: int = 1,
                               block_n: int = BLOCK_N) -> bool:
    """Shapes and devices this kernel serves: Gluon, an NVIDIA Hopper GPU (sm90: wgmma, which Blackwell does not
    have), a head dim of whole 64-column chunks up to 256, key blocks of 32 or 64 and at least two of them per
    program (both stages are loaded before the loop)."""
    if not HAVE_GLUON or device.type != "cuda" or torch.version.hip is not None:
        return False
    if torch.cuda.get_device_capability(device)[0] != 9:
        return False
    if splits not in SPLITS or block_n not in BLOCKS_N:
        return False
    return D % CHUNK == 0 and D <= 256 and Mq > 0 and split_blocks(P, splits, block_n) > 0


if HAVE_GLUON:
    @gluon.jit
    def _scores(q_smem, k_smem, stage, NCHUNK: gl.constexpr, BM: gl.constexpr, BN: gl.constexpr,
                mma: gl.constexpr):
        """s = q @ k^T of the key block in `stage`, issued on the tensor cores (async: the caller waits)."""
        s = gl.zeros([BM, BN], gl.float32, layout=mma)
        for c in gl.static_range(NCHUNK):
            s = warpgroup_mma(q_smem.index(c), k_smem.index(stage * NCHUNK + c).permute((1, 0)), s, is_async=True)
        return s

    @gluon.jit
    def _prefix_attention_kernel(q_desc, k_desc, v_desc, bias_ptr, o_ptr, acc_ptr, ml_ptr, Mq, P, stride_o,
                                 blocks_per_split,
                                 NCHUNK: gl.constexpr, LOG2E: gl.constexpr, PDL: gl.constexpr,
                                 OVERLAP: gl.constexpr, SPLITS: gl.constexpr = 1):
        BM: gl.constexpr = q_desc.block_type.shape[0]
        BN: gl.constexpr = k_desc.block_type.shape[0]
        C: gl.constexpr = q_desc.block_type.shape[1]
        KV_BYTES: gl.constexpr = 2 * NCHUNK * BN * C * 2                  # one stage: K and V blocks, bf16
        if PDL == 2:                                                      # kernels/flashrt_kernels/_triton.py EARLY_TRIGGER
            griddep("griddepcontrol.launch_dependents; // dummy $0")
        off_m = gl.program_id(0) * BM
        # with SPLITS > 1 this program takes key blocks [first, first + blocks_per_split) (the last split fewer)
        first = gl.program_id(1) * blocks_per_split
        # one accumulator layout for the scores (BN wide) and the output chunks (C wide, BN-wide instructions
        # repeated): their rows sit alike, so alpha and the row sums need no conversion between the two
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        row_l: gl.constexpr = gl.SliceLayout(1, mma)
        col_l: gl.constexpr = gl.SliceLayout(0, mma)

        q_smem = gl.allocate_shared_memory(q_desc.dtype, [NCHUNK, BM, C], q_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [2 * NCHUNK, BN, C], k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [2 * NCHUNK, BN, C], v_desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [3, 1], mbarrier.MBarrierLayout())   # q, stage 0, stage 1
        for i in gl.static_range(3):
            mbarrier.init(bars.index(i), count=1)
        if PDL:                          # q, K and V are the kernel ahead's output (qkv_rope): nothing read before
            griddep("griddepcontrol.wait; // dummy $0")
            if PDL == 1:
                griddep("griddepcontrol.launch_dependents; // dummy $0")

        mbarrier.expect(bars.index(0), NCHUNK * BM * C * 2)
        for c in gl.static_range(NCHUNK):
            tma.async_copy_global_to_shared(q_desc, [off_m, c * C], bars.index(0), q_smem.index(c))
        for b in gl.static_range(2):                 # this program's key blocks 0 and 1 (the launcher: both exist)
            mbarrier.expect(bars.index(1 + b), KV_BYTES)
            for c in gl.static_range(NCHUNK):
                tma.async_copy_global_to_shared(k_desc, [(first + b) * BN, c * C], bars.index(1 + b),
                                                k_smem.index(b * NCHUNK + c))
                tma.async_copy_global_to_shared(v_desc, [(first + b) * BN, c * C], bars.index(1 + b),
                                                v_smem.index(b * NCHUNK + c))

        m_i = gl.full([BM], float("-inf"), gl.float32, layout=row_l)
        l_i = gl.zeros([BM], gl.float32, layout=row_l)
        o0 = gl.zeros([BM, C], gl.float32, layout=mma)
        o1 = gl.zeros([BM, C], gl.float32, layout=mma)
        o2 = gl.zeros([BM, C], gl.float32, layout=mma)
        o3 = gl.zeros([BM, C], gl.float32, layout=mma)
        mbarrier.wait(bars.index(0), phase=0)
        n_blocks = gl.minimum(gl.cdiv(P, BN) - first, blocks_per_split)
        if OVERLAP:
            mbarrier.wait(bars.index(1), phase=0)
            s_next = _scores(q_smem, k_smem, 0, NCHUNK, BM, BN, mma)             # block 0's scores in flight
        for j in range(n_blocks):
            st = j % 2
            if OVERLAP:
                # this block's scores were issued one block ahead; the next block's go to the tensor cores now and
                # run while this block's softmax runs on the warps (after the last block: a stale stage, unused)
                s = warpgroup_mma_wait(num_outstanding=0, deps=(s_next,))
                if j + 1 < n_blocks:
                    mbarrier.wait(bars.index(1 + (j + 1) % 2), phase=((j + 1) // 2) & 1)
                s_next = _scores(q_smem, k_smem, (j + 1) % 2, NCHUNK, BM, BN, mma)
            else:
                mbarrier.wait(bars.index(1 + st), phase=(j // 2) & 1)
                s = warpgroup_mma_wait(num_outstanding=0, deps=(_scores(q_smem, k_smem, st, NCHUNK, BM, BN, mma),))
            cols = (first + j) * BN + gl.arange(0, BN, layout=col_l)
            bias = gl.load(bias_ptr + cols, mask=cols < P, other=float("-inf"))
            s = (s + bias[None, :]) * LOG2E
            m_new = gl.maximum(m_i, gl.max(s, axis=1))
            m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = gl.exp2(m_i - m_safe)
            p = gl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + gl.sum(p, axis=1)
            m_i = m_new
            p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
            a = alpha[:, None]
            o0 = warpgroup_mma(p_op, v_smem.index(st * NCHUNK + 0), o0 * a, is_async=True)
            if NCHUNK > 1:
                o1 = warpgroup_mma(p_op, v_smem.index(st * NCHUNK + 1), o1 * a, is_async=True)
            if NCHUNK > 2:
                o2 = warpgroup_mma(p_op, v_smem.index(st * NCHUNK + 2), o2 * a, is_async=True)
            if NCHUNK > 3:
                o3 = warpgroup_mma(p_op, v_smem.index(st * NCHUNK + 3), o3 * a, is_async=True)
            # with OVERLAP this waits for the next block's scores too (issued before these products)
            o0, o1, o2, o3 = warpgroup_mma_wait(num_outstanding=0, deps=(o0, o1, o2, o3))
            if j + 2 < n_blocks:                                          # this stage's next block: j + 2
                mbarrier.expect(bars.index(1 + st), KV_BYTES)
                for c in gl.static_range(NCHUNK):
                    tma.async_copy_global_to_shared(k_desc, [(first + j + 2) * BN, c * C], bars.index(1 + st),
                                                    k_smem.index(st * NCHUNK + c))
                    tma.async_copy_global_to_shared(v_desc, [(first + j + 2) * BN, c * C], bars.index(1 + st),
                                                    v_smem.index(st * NCHUNK + c))
        for i in gl.static_range(3):
            mbarrier.invalidate(bars.index(i))

        rows = off_m + gl.arange(0, BM, layout=row_l)
        ok = rows[:, None] < Mq
        if SPLITS == 1:
            inv = 1.0 / gl.maximum(l_i, 1e-30)
            base = o_ptr + rows[:, None] * stride_o + gl.arange(0, C, layout=col_l)[None, :]
            gl.store(base, (o0 * inv[:, None]).to(gl.bfloat16), mask=ok)
            if NCHUNK > 1:
                gl.store(base + C, (o1 * inv[:, None]).to(gl.bfloat16), mask=ok)
            if NCHUNK > 2:
                gl.store(base + 2 * C, (o2 * inv[:, None]).to(gl.bfloat16), mask=ok)
            if NCHUNK > 3:
                gl.store(base + 3 * C, (o3 * inv[:, None]).to(gl.bfloat16), mask=ok)
        else:
            # this split's unnormalized output, row maximum (natural log units) and row sum, in the layout
            # kernels/flashrt_kernels/attention.py's merge_splits merges: acc (SPLITS, Mq, D) fp32, ml (SPLITS, Mq, 2)
            part = gl.program_id(1) * Mq + rows
            base = acc_ptr + part[:, None] * (NCHUNK * C) + gl.arange(0, C, layout=col_l)[None, :]
            gl.store(base, o0, mask=ok)
            if NCHUNK > 1:
                gl.store(base + C, o1, mask=ok)
            if NCHUNK > 2:
                gl.store(base + 2 * C, o2, mask=ok)
            if NCHUNK > 3:
                gl.store(base + 3 * C, o3, mask=ok)
            row_ok = rows < Mq
            gl.store(ml_ptr + part * 2, m_i / LOG2E, mask=row_ok)
            gl.store(ml_ptr + part * 2 + 1, l_i, mask=row_ok)


def _layout(rows: int):
    return gl.NVMMASharedLayout.get_default_for([rows, CHUNK], gl.bfloat16)


def prefix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
                     out: torch.Tensor | None = None, pdl: bool | int = False, overlap: bool = False,
                     splits: int = 1, block_n: int = BLOCK_N) -> torch.Tensor:
    """q (Mq, D) bf16 (scaled), k / v (P, D) bf16, bias (P,) fp32 0 / -inf -> (Mq, D) bf16: the contract of
    kernels/flashrt_kernels/attention.py attention_reference with prefix_len = P, no suffix keys and scale 1. pdl: False, True or
    EARLY_TRIGGER (kernels/flashrt_kernels/_triton.py). overlap: the next key block's q @ k^T is issued before this block's
    softmax, so the tensor cores compute it while the warps do the softmax (one extra, unused product per
    program after the last block). splits > 1: that many programs per 64 query rows, each over its share of the
    key blocks, writing fp32 partials that kernels/flashrt_kernels/attention.py's merge_splits merges (one more launch):
    at 2 views the 72 row blocks leave 60 of the H200's 132 SMs idle with one split. block_n: keys per block
    (32: 96 KB of shared memory, so two programs fit one SM; 64: 160 KB)."""
    Mq, D = q.shape
    P = k.shape[0]
    if not prefix_attention_supported(Mq, P, D, q.device, splits, block_n):
        raise ValueError(f"prefix_attention: needs Gluon on a Hopper (sm90) GPU, D a multiple of {CHUNK} up to 256, "
                         f"splits in {SPLITS}, block_n in {BLOCKS_N} and at least two key blocks per split; got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, splits {splits}, block_n {block_n} on {q.device}")
    if k.shape != (P, D) or v.shape != (P, D) or bias.shape[0] < P:
        raise ValueError(f"prefix_attention: k / v must be (P, {D}) and bias cover P keys; got k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}, bias {tuple(bias.shape)}")
    if any(t.dtype != torch.bfloat16 for t in (q, k, v)) or bias.dtype != torch.float32:
        raise ValueError("prefix_attention: q, k, v must be bf16 and bias fp32")
    if min(q.stride(1), k.stride(1), v.stride(1)) != 1:
        raise ValueError("prefix_attention: the head dim must be contiguous")
    if out is None:
        out = torch.empty(Mq, D, device=q.device, dtype=torch.bfloat16)
    elif out.shape != (Mq, D) or out.dtype != torch.bfloat16 or out.stride(1) != 1:
        raise ValueError(f"prefix_attention: out must be a bf16 ({Mq}, {D}) tensor with a contiguous head dim")
    # TMA descriptors are built per launch (host work only: a captured graph keeps them)
    q_desc = TensorDescriptor.from_tensor(q, [BLOCK_M, CHUNK], _layout(BLOCK_M))   # rows past Mq read as zeros
    k_desc = TensorDescriptor.from_tensor(k, [block_n, CHUNK], _layout(block_n))   # keys past P read as zeros
    v_desc = TensorDescriptor.from_tensor(v, [block_n, CHUNK], _layout(block_n))
    acc = ml = out                                                                 # unused with one split
    if splits > 1:
        acc = torch.empty(splits, Mq, D, device=q.device, dtype=torch.float32)
        ml = torch.empty(splits, Mq, 2, device=q.device, dtype=torch.float32)
    _prefix_attention_kernel[((Mq + BLOCK_M - 1) // BLOCK_M, splits)](
        q_desc, k_desc, v_desc, bias, out, acc, ml, Mq, P, out.stride(0), split_blocks(P, splits, block_n),
        NCHUNK=D // CHUNK, LOG2E=LOG2E, PDL=int(pdl), OVERLAP=overlap, SPLITS=splits, num_warps=4,
        **launch_options(pdl))
    if splits > 1:
        merge_splits(acc, ml, out, pdl)
    return out


__all__ = ["BLOCKS_N", "BLOCK_M", "BLOCK_N", "CHUNK", "HAVE_GLUON", "SPLITS", "prefix_attention",
           "prefix_attention_supported", "split_blocks"]
