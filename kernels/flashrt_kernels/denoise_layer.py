"""One pi0.5 action-expert layer in one persistent launch: eight phases separated by grid barriers.

A denoising layer of pi0.5 is eight dependent kernels of 2-4 us each on ~10 rows (adaRMSNorm, QKV GEMM, attention,
its combine, O GEMM, adaRMSNorm, gate/up GEMM + GeGLU, down GEMM); their weights stream in ~8.6 us but the chain
takes ~24 us on the H200 (docs/benchmarks/engine_h200_2026-11-29_notes.md, session 14). Here one launch of one
program per SM runs the layer as eight phases; between two phases every program waits at a grid barrier (an atomic
counter in global memory) instead of a kernel boundary:

    norm1    h1 = residual + gate0 * x_prev  (x_prev: the previous layer's down output, if any);
             xs = h1 * scale1p_1 in the engine dtype; per 128-column chunk the rows' sums of h1^2
    qkv      qkv = rsqrt(mean(h1^2) + eps) * (xs @ Wqkv^T) + shift_1 @ Wqkv^T  (rounded to the engine dtype);
             q <- rope(q) * q_scale;  K/V cache rows [P, P + S) <- rope(k), v
    attention  the S * H query rows over the P prefix keys (key bias 0 / -inf) and the visible suffix keys, each
             program one (head, key split): its unnormalized output, row maximum and row sum
    merge    attn = the splits merged, per head and 64-wide chunk of the head dim
    o        o_acc += attn[:, head h] @ Wo[:, head h]^T                 (fp32 atomics: split-K over the heads)
    norm2    h2 = h1 + gate1 * o_acc;  residual <- h2;  xs = h2 * scale1p_2;  the sums of h2^2
    gate_up  gu = rsqrt(mean(h2^2) + eps) * (xs @ Wgu^T) + shift_2 @ Wgu^T;  act = gelu_tanh(gate) * up
    down     x_out += act[:, k-split] @ Wd[:, k-split]^T                (fp32 atomics, per K split)

Each norm's shift passes through the GEMM after it as a bias (EngineWeights.ada_fold_bias: shift @ W^T in fp32)
and its rsqrt multiplies that GEMM's output (the algebra of kernels/flashrt_kernels/smem_gemm.py's NormIn), so the norm phases
only scale and sum and the GEMM phases are plain weight streams. x_out and o_acc are sums of fp32 atomics: the
order of the additions varies between runs (last-bit differences).

With `prefetch` (NVIDIA sm90+) every program bulk-prefetches into L2 the weight tiles it reads later, fire and
forget (kernels/flashrt_kernels/l2_prefetch.py): its O and gate/up tiles when the attention starts, its down tile when norm2 starts,
its tile of the next layer's QKV weight when the down phase starts, so HBM streams while the short phases run.

Grid barriers need every program resident at once: the launcher asks for at most one program per SM. With
`grid_sync=False` each phase is a launch of its own (stream order is the barrier): the form Triton's CPU
interpreter runs (it runs programs one after another) and the A/B of the barriers themselves. A barrier that
waited longer than MAX_SPINS polls gives up and counts itself in `errors` (a test checks it stays zero), so a
program that was never scheduled cannot hang the GPU.
Provenance: the FlashRT engine runs this layer as a chain of fused kernels under a CUDA graph; the persistent
form with grid barriers follows the "megakernel" designs for small-batch decoding (one launch, programs that
wait on counters between dependent steps). Independent Triton implementation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._triton import INTERPRETED, tl, triton
from .attention import _online_softmax_step
from .geglu import _K as GELU_K  # noqa: N811
from .geglu import geglu_reference, gelu_tanh_times
from .l2_prefetch import prefetch_rows_l2

PHASES = ("norm1", "qkv", "attention", "merge", "o", "norm2", "gate_up", "down")   # in order: `phases=(i, i)`
# of the launcher runs PHASES[i] (the package exports it as DENOISE_LAYER_PHASES)
MERGE_CHUNK = 64             # head-dim columns per program of the merge phase
_MERGE_CHUNK = tl.constexpr(MERGE_CHUNK)
MAX_SPINS = 1 << 22          # ~4 s of polling before a barrier gives up (and counts an error)
_MAX_SPINS = tl.constexpr(MAX_SPINS)
GELU_KC = tl.constexpr(GELU_K)
STAMP_SLOTS = tl.constexpr(16)   # per program: start, (work done, released) per barrier (7), end
ROPE_BLOCK = 16              # QKV output columns per half-head tile: 16 of the first half, their 16 partners


@dataclass
class DenoiseLayerScratch:
    """Static buffers of the layer kernel for S rows (allocated once, outside any capture).
    h1 (S, W) fp32: the residual after the attention's gated add; x_acc (2, S, W) fp32: the down output of
    even / odd layers (the next layer's x_prev); o_acc (S, W) fp32; xs (S, W) engine dtype: the scaled rows a
    norm phase leaves for the GEMM after it, ssq (W / 16, BLOCK_R) fp32 their sums of squares per column chunk;
    q (S, H, Dh), attn (S, H * Dh), act (S, F) engine dtype; part_acc (H, C, BLOCK_R, Dh) and part_ml
    (H, C, 2, BLOCK_R) fp32: the attention's splits; head_counters (H,) int32: the splits of each head that have
    finished (LayerConfig.merge_in_attention; the last one sets it back to zero); counters: one int32 per launch of
    a predict, zeroed before the first (reset_counters); errors (1,) int32."""

    h1: torch.Tensor
    x_acc: torch.Tensor
    o_acc: torch.Tensor
    xs: torch.Tensor
    ssq: torch.Tensor
    q: torch.Tensor
    attn: torch.Tensor
    act: torch.Tensor
    part_acc: torch.Tensor
    part_ml: torch.Tensor
    head_counters: torch.Tensor
    counters: torch.Tensor
    errors: torch.Tensor
    splits: int

    @classmethod
    def allocate(cls, rows: int, width: int, heads: int, head_dim: int, mlp: int, launches: int,
                 dtype: torch.dtype, device: torch.device | str, splits: int = 8) -> "DenoiseLayerScratch":
        br = block_rows(rows)
        f32 = dict(device=device, dtype=torch.float32)
        dt = dict(device=device, dtype=dtype)
        return cls(h1=torch.zeros(rows, width, **f32), x_acc=torch.zeros(2, rows, width, **f32),
                   o_acc=torch.zeros(rows, width, **f32), xs=torch.zeros(rows, width, **dt),
                   ssq=torch.zeros(max(width // 16, 1), br, **f32),
                   q=torch.zeros(rows, heads, head_dim, **dt), attn=torch.zeros(rows, heads * head_dim, **dt),
                   act=torch.zeros(rows, mlp, **dt),
                   part_acc=torch.zeros(heads, splits, br, head_dim, **f32),
                   part_ml=torch.zeros(heads, splits, 2, br, **f32),
                   head_counters=torch.zeros(heads, device=device, dtype=torch.int32),
                   counters=torch.zeros(max(launches, 1), device=device, dtype=torch.int32),
                   errors=torch.zeros(1, device=device, dtype=torch.int32), splits=splits)

    def reset_counters(self) -> None:
        """Zero the barrier counters: once per predict, before its first layer launch (a memset in the graph)."""
        self.counters.zero_()


def barriers_per_launch(cfg: "LayerConfig") -> int:
    """The grid barriers one launch passes: one between two phases, less the merge's with merge_in_attention."""
    return len(PHASES) - 1 - int(cfg.merge_in_attention)


def block_rows(rows: int) -> int:
    """Rows padded to the tensor-core tile (16 at least)."""
    return max(16, triton.next_power_of_2(rows))


@dataclass(frozen=True)
class LayerTables:
    """One layer's load-time vectors for one denoising step (fp32, contiguous): gate0 (W,) the previous layer's
    second gate (None for the first layer: no x_prev); scale1p_1, shift_1, gate1, scale1p_2, shift_2 (W,) its two
    adaRMSNorms; bias_qkv (N_qkv,) and bias_gu (2F,): the shifts through the GEMMs after them (fold_shift), which
    the kernel adds (the shifts themselves only the reference reads)."""

    gate0: torch.Tensor | None
    scale1p_1: torch.Tensor
    shift_1: torch.Tensor
    gate1: torch.Tensor
    scale1p_2: torch.Tensor
    shift_2: torch.Tensor
    bias_qkv: torch.Tensor
    bias_gu: torch.Tensor


def fold_shift(shift: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A norm's shift through the GEMM after it: shift @ W^T in fp32 (N,)."""
    return shift.float() @ w.float().T


@dataclass(frozen=True)
class LayerWeights:
    """The layer's GEMM weights in the engine dtype, row-major (out, in): qkv (H*Dh + 2*Dh, W) heads ordered
    [q_0..q_{H-1}, k, v]; o (W, H*Dh); gate_up (2F, W) gate rows first; down (W, F)."""

    qkv: torch.Tensor
    o: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


def denoise_layer_reference(residual: torch.Tensor, x_prev: torch.Tensor | None, tables: LayerTables,
                            weights: LayerWeights, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor,
                            cos: torch.Tensor, sin: torch.Tensor, key_bias: torch.Tensor, visible: torch.Tensor,
                            heads: int, q_scale: float, eps: float = 1e-6) -> torch.Tensor:
    """Plain PyTorch, by definition the engine's separate ops in fp32 with their roundings to the weights' dtype:
    adaRMSNorm, QKV GEMM, qkv_rope, attention, O GEMM, adaRMSNorm, gate/up GEMM, GeGLU, down GEMM.
    residual (S, W) fp32 is updated in place to h2; the cache rows [P, P + S) are written (P = key_bias length);
    returns the down output (S, W) fp32 (the next layer's x_prev)."""
    from .ada_rms_norm import ada_rms_norm_reference
    from .attention import attention_reference
    from .qkv_rope import qkv_rope_reference
    dt = weights.qkv.dtype
    S, W = residual.shape
    P = key_bias.shape[0]
    dh = k_cache.shape[-1]
    y, h1 = ada_rms_norm_reference(x_prev, residual, tables.gate0, tables.scale1p_1, tables.shift_1, eps,
                                   out_dtype=dt)
    qkv = (y.float() @ weights.qkv.float().T).to(dt)
    q = torch.empty(S, heads, dh, device=residual.device, dtype=dt)
    qkv_rope_reference(qkv, pos, cos, sin, q, k_cache[None], v_cache[None], P, heads, 1, q_scale)
    attn = attention_reference(q.view(S * heads, dh), k_cache[:P + S], v_cache[:P + S], key_bias, P, visible,
                               heads, 1.0).view(S, heads * dh)
    o = (attn.to(dt).float() @ weights.o.float().T).to(dt)
    y2, h2 = ada_rms_norm_reference(o, h1, tables.gate1, tables.scale1p_2, tables.shift_2, eps, out_dtype=dt)
    act = geglu_reference((y2.float() @ weights.gate_up.float().T).to(dt))
    residual.copy_(h2)
    return act.float() @ weights.down.float().T


@triton.jit
def _stamp(stamp_ptr, slot, STAMPS: tl.constexpr):
    """With STAMPS, the GPU's global nanosecond timer into this program's row of stamps, at `slot`."""
    if STAMPS:
        tl.store(stamp_ptr + tl.program_id(0) * STAMP_SLOTS + slot, tl.extra.cuda.globaltimer())


@triton.jit
def _grid_sync(counter_ptr, err_ptr, target, stamp_ptr, phase: tl.constexpr, STAMPS: tl.constexpr):
    """Every program of the launch arrives, then waits until `target` arrivals have been counted. The CTA barrier
    before the release orders every thread's writes before the arrival; the acquire poll and the CTA barrier
    after it make every program's writes visible to every thread here. STAMPS: the time of the arrival (this
    program's work of `phase` done) and of the release, at slots 1 + 2 * phase and 2 + 2 * phase."""
    tl.debug_barrier()
    _stamp(stamp_ptr, 1 + 2 * phase, STAMPS)
    tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    spins = 0
    while (seen < target) & (spins < _MAX_SPINS):
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
        spins += 1
    if seen < target:
        tl.atomic_add(err_ptr, 1, sem="relaxed", scope="gpu")
    tl.debug_barrier()
    _stamp(stamp_ptr, 2 + 2 * phase, STAMPS)


@triton.jit
def _rounds(N: tl.constexpr, NPROG: tl.constexpr):
    """How many items each program takes at most when N items are dealt out to NPROG programs."""
    return (N + NPROG - 1) // NPROG


@triton.jit
def _norm_phase(pid, res_ptr, x_ptr, gate_ptr, scale_ptr, h_out_ptr, xs_ptr, ssq_ptr, zero_a_ptr, zero_b_ptr,
                rows, row_ok, HAS_X: tl.constexpr, W: tl.constexpr, BK: tl.constexpr, BLOCK_R: tl.constexpr,
                NPROG: tl.constexpr, ZERO: tl.constexpr):
    """Per BK-wide column chunk (one program each): h = res + gate * x (HAS_X) -> h_out, xs = h * scale1p in the
    GEMM's dtype, the rows' sums of h^2 -> ssq[chunk]; with ZERO the chunk's columns of zero_a / zero_b set to 0
    (the accumulators later phases add into)."""
    for rnd in range(0, _rounds(W // BK, NPROG)):
        t = pid + rnd * NPROG
        if t < W // BK:
            ks = t * BK + tl.arange(0, BK)
            offs = rows[:, None] * W + ks[None, :]
            h = tl.load(res_ptr + offs, mask=row_ok[:, None], other=0.0, cache_modifier=".cg")
            if HAS_X:
                h += tl.load(x_ptr + offs, mask=row_ok[:, None], other=0.0,
                             cache_modifier=".cg") * tl.load(gate_ptr + ks)[None, :]
            tl.store(h_out_ptr + offs, h, mask=row_ok[:, None])
            tl.store(xs_ptr + offs, (h * tl.load(scale_ptr + ks)[None, :]).to(xs_ptr.dtype.element_ty),
                     mask=row_ok[:, None])
            tl.store(ssq_ptr + t * BLOCK_R + rows, tl.sum(h * h, axis=1))
            if ZERO:
                zero = tl.zeros([BLOCK_R, BK], tl.float32)
                tl.store(zero_a_ptr + offs, zero, mask=row_ok[:, None])
                tl.store(zero_b_ptr + offs, zero, mask=row_ok[:, None])


@triton.jit
def _row_rsqrt(ssq_ptr, rows, eps, W: tl.constexpr, BK: tl.constexpr, BLOCK_R: tl.constexpr):
    """rsqrt(mean(h^2) + eps) per row from the norm phase's per-chunk sums."""
    chunks = tl.arange(0, W // BK)
    total = tl.sum(tl.load(ssq_ptr + chunks[:, None] * BLOCK_R + rows[None, :], cache_modifier=".cg"), axis=0)
    return tl.rsqrt(total / W + eps)


@triton.jit
def _pair_gemm(x_ptr, w_ptr, rows, row_ok, n1, n2, K: tl.constexpr, BK: tl.constexpr, BLOCK_R: tl.constexpr,
               BN: tl.constexpr):
    """x @ W[n1]^T and x @ W[n2]^T (x: rows of K columns, W row-major with K columns), fp32."""
    acc1 = tl.zeros([BLOCK_R, BN], tl.float32)
    acc2 = tl.zeros([BLOCK_R, BN], tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        x = tl.load(x_ptr + rows[:, None] * K + ks[None, :], mask=row_ok[:, None], other=0.0, cache_modifier=".cg")
        acc1 += tl.dot(x, tl.trans(tl.load(w_ptr + n1[:, None] * K + ks[None, :])))
        acc2 += tl.dot(x, tl.trans(tl.load(w_ptr + n2[:, None] * K + ks[None, :])))
    return acc1, acc2


@triton.jit
def _wo_tile(wo_ptr, t, H: tl.constexpr, DH: tl.constexpr, W: tl.constexpr, BN_O: tl.constexpr):
    """The O weight tile of O item t (output columns (t // H) * BN_O.., head t % H's inputs): (BN_O, DH)."""
    n = (t // H) * BN_O + tl.arange(0, BN_O)
    ok = t < (W // BN_O) * H
    return tl.load(wo_ptr + n[:, None] * (H * DH) + (t % H) * DH + tl.arange(0, DH)[None, :], mask=ok, other=0.0)


@triton.jit
def _wd_tile(wd_ptr, t, W: tl.constexpr, F: tl.constexpr, BN_D: tl.constexpr, KS_D: tl.constexpr):
    """The down weight tile of down item t (output columns, one K split): (BN_D, KS_D)."""
    KSPLITS: tl.constexpr = F // KS_D
    n = (t // KSPLITS) * BN_D + tl.arange(0, BN_D)
    ks = (t % KSPLITS) * KS_D + tl.arange(0, KS_D)
    return tl.load(wd_ptr + n[:, None] * F + ks[None, :], mask=t < (W // BN_D) * KSPLITS, other=0.0)


@triton.jit
def _merge_head_columns(pml_ptr, pacc_ptr, attn_ptr, h, first, rows, row_ok, H: tl.constexpr, DH: tl.constexpr,
                        SPLITS: tl.constexpr, BLOCK_R: tl.constexpr, MC: tl.constexpr):
    """Head h's key splits merged for the head-dim columns [first, first + MC): the softmax over all keys from each
    split's unnormalized output, row maximum and row sum, into attn in its dtype."""
    splits = tl.arange(0, SPLITS)
    cols = first + tl.arange(0, MC)
    ml = pml_ptr + (h * SPLITS + splits)[:, None] * (2 * BLOCK_R) + rows[None, :]
    m = tl.load(ml, cache_modifier=".cg")                                          # (SPLITS, BLOCK_R)
    l_s = tl.load(ml + BLOCK_R, cache_modifier=".cg")
    m_max = tl.max(m, axis=0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    a = tl.exp(m - m_max[None, :])                                               # (SPLITS, BLOCK_R)
    den = tl.sum(a * l_s, axis=0)
    num = tl.zeros([BLOCK_R, MC], tl.float32)
    for c in tl.static_range(SPLITS):
        a_c = tl.sum(tl.where(splits[:, None] == c, a, 0.0), axis=0)
        part = tl.load(pacc_ptr + ((h * SPLITS + c) * BLOCK_R + rows)[:, None] * DH + cols[None, :],
                       mask=row_ok[:, None], other=0.0, cache_modifier=".cg")
        num += a_c[:, None] * part
    out = num / tl.where(den > 0, den, 1.0)[:, None]
    tl.store(attn_ptr + rows[:, None] * (H * DH) + h * DH + cols[None, :], out.to(attn_ptr.dtype.element_ty),
             mask=row_ok[:, None])


@triton.jit
def _denoise_layer_kernel(
        res_ptr, h1_ptr, xin_ptr, xout_ptr, oacc_ptr, xs_ptr, ssq_ptr,
        gate0_ptr, scale1_ptr, gate1_ptr, scale2_ptr, bias_qkv_ptr, bias_gu_ptr,
        wqkv_ptr, wo_ptr, wgu_ptr, wd_ptr,
        k_ptr, v_ptr, q_ptr, attn_ptr, pacc_ptr, pml_ptr, act_ptr,
        pos_ptr, cos_ptr, sin_ptr, kbias_ptr, vis_ptr, counter_ptr, err_ptr, head_cnt_ptr, stamp_ptr,
        wo_addr, wgu_addr, wd_addr, wqkv_next_addr,
        R, P, eps, q_scale, stride_kv,
        PHASE_FIRST: tl.constexpr, PHASE_LAST: tl.constexpr, GRID_SYNC: tl.constexpr, HAS_X: tl.constexpr,
        W: tl.constexpr, H: tl.constexpr, DH: tl.constexpr, F: tl.constexpr, BLOCK_R: tl.constexpr,
        SPLITS: tl.constexpr, BK: tl.constexpr, BKW: tl.constexpr, BN_O: tl.constexpr, BN_GU: tl.constexpr,
        BN_D: tl.constexpr, KS_D: tl.constexpr, BLOCK_KEYS: tl.constexpr, RB: tl.constexpr, NPROG: tl.constexpr,
        KEYS_PER_SPLIT: tl.constexpr, PREFETCH: tl.constexpr = False, ESIZE: tl.constexpr = 2,
        MERGE_IN_ATTENTION: tl.constexpr = False, STAMPS: tl.constexpr = False, PRELOAD: tl.constexpr = False):
    pid = tl.program_id(0)
    rows = tl.arange(0, BLOCK_R)
    row_ok = rows < R
    HALF: tl.constexpr = DH // 2
    SUBS: tl.constexpr = HALF // RB
    KSPLITS: tl.constexpr = F // KS_D
    MC: tl.constexpr = _MERGE_CHUNK if DH > _MERGE_CHUNK else DH
    OK: tl.constexpr = BK if BK < DH else DH                  # the O GEMM's K step (its K per program is DH)
    dt = wqkv_ptr.dtype.element_ty

    _stamp(stamp_ptr, 0, STAMPS)

    # ---- 0 norm1: h1, xs, the sums of squares; this layer's O and down accumulators zeroed
    if PHASE_FIRST <= 0 and 0 <= PHASE_LAST:
        _norm_phase(pid, res_ptr, xin_ptr, gate0_ptr, scale1_ptr, h1_ptr, xs_ptr, ssq_ptr, oacc_ptr, xout_ptr,
                    rows, row_ok, HAS_X, W, BK, BLOCK_R, NPROG, True)
        if GRID_SYNC and PHASE_LAST > 0:
            _grid_sync(counter_ptr, err_ptr, NPROG * 1, stamp_ptr, 0, STAMPS)

    # ---- 1 qkv: the QKV GEMM of 16 first-half columns and their 16 partners per program, RoPE, q and suffix K/V
    if PHASE_FIRST <= 1 and 1 <= PHASE_LAST:
        for rnd in range(0, _rounds((H + 2) * SUBS, NPROG)):
            t = pid + rnd * NPROG
            if t < (H + 2) * SUBS:
                hb = t // SUBS
                d = (t % SUBS) * RB + tl.arange(0, RB)
                n1 = hb * DH + d
                n2 = n1 + HALF
                acc1, acc2 = _pair_gemm(xs_ptr, wqkv_ptr, rows, row_ok, n1, n2, W, BKW, BLOCK_R, RB)
                r = _row_rsqrt(ssq_ptr, rows, eps, W, BK, BLOCK_R)[:, None]
                o1 = (acc1 * r + tl.load(bias_qkv_ptr + n1)[None, :]).to(dt).to(tl.float32)
                o2 = (acc2 * r + tl.load(bias_qkv_ptr + n2)[None, :]).to(dt).to(tl.float32)
                if hb == H + 1:                                                    # v: no RoPE
                    vo = v_ptr + (P + rows)[:, None] * stride_kv + d[None, :]
                    tl.store(vo, o1.to(dt), mask=row_ok[:, None])
                    tl.store(vo + HALF, o2.to(dt), mask=row_ok[:, None])
                else:
                    p = tl.load(pos_ptr + rows, mask=row_ok, other=0)
                    table = p[:, None] * HALF + d[None, :]
                    c = tl.load(cos_ptr + table, mask=row_ok[:, None], other=0.0)
                    s = tl.load(sin_ptr + table, mask=row_ok[:, None], other=0.0)
                    r1 = o1 * c - o2 * s
                    r2 = o2 * c + o1 * s
                    if hb == H:                                                    # k
                        ko = k_ptr + (P + rows)[:, None] * stride_kv + d[None, :]
                        tl.store(ko, r1.to(dt), mask=row_ok[:, None])
                        tl.store(ko + HALF, r2.to(dt), mask=row_ok[:, None])
                    else:                                                          # q head hb, scaled
                        qo = q_ptr + rows[:, None] * (H * DH) + hb * DH + d[None, :]
                        tl.store(qo, (r1 * q_scale).to(dt), mask=row_ok[:, None])
                        tl.store(qo + HALF, (r2 * q_scale).to(dt), mask=row_ok[:, None])
        if GRID_SYNC and PHASE_LAST > 1:
            _grid_sync(counter_ptr, err_ptr, NPROG * 2, stamp_ptr, 1, STAMPS)

    # ---- 2 attention, one (head, key split) per program
    if PHASE_FIRST <= 2 and 2 <= PHASE_LAST:
        if PRELOAD and 4 <= PHASE_LAST:   # this program's O tile, in registers until the O phase (one O item each)
            wo_tile = _wo_tile(wo_ptr, pid, H, DH, W, BN_O)
        if PREFETCH:                  # this program's O and gate/up tiles, while the attention leaves HBM idle
            for rnd in range(0, _rounds((W // BN_O) * H, NPROG)):
                t = pid + rnd * NPROG
                prefetch_rows_l2(wo_addr + (t % H) * DH * ESIZE, H * DH * ESIZE, DH * ESIZE,
                                 (t // H) * BN_O + tl.arange(0, BN_O), t < (W // BN_O) * H)
            for rnd in range(0, _rounds(F // BN_GU, NPROG)):
                t = pid + rnd * NPROG
                n = t * BN_GU + tl.arange(0, BN_GU)
                prefetch_rows_l2(wgu_addr, W * ESIZE, W * ESIZE, n, t < F // BN_GU)
                prefetch_rows_l2(wgu_addr, W * ESIZE, W * ESIZE, n + F, t < F // BN_GU)
        dd = tl.arange(0, DH)
        L = P + R
        vis = tl.load(vis_ptr + rows, mask=row_ok, other=0)
        for rnd in range(0, _rounds(H * SPLITS, NPROG)):
            t = pid + rnd * NPROG
            if t < H * SPLITS:
                h = t // SPLITS
                c = t % SPLITS
                q = tl.load(q_ptr + rows[:, None] * (H * DH) + h * DH + dd[None, :], mask=row_ok[:, None], other=0.0,
                            cache_modifier=".cg")
                start = c * KEYS_PER_SPLIT
                end = tl.minimum(start + KEYS_PER_SPLIT, L)
                m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
                l_i = tl.zeros([BLOCK_R], tl.float32)
                acc = tl.zeros([BLOCK_R, DH], tl.float32)
                for n in range(0, KEYS_PER_SPLIT, BLOCK_KEYS):
                    cols = start + n + tl.arange(0, BLOCK_KEYS)
                    col_ok = cols < end
                    kv = cols[:, None] * stride_kv + dd[None, :]
                    k = tl.load(k_ptr + kv, mask=col_ok[:, None], other=0.0, cache_modifier=".cg")
                    v = tl.load(v_ptr + kv, mask=col_ok[:, None], other=0.0, cache_modifier=".cg")
                    m_i, l_i, acc = _online_softmax_step(q, k, v, cols, col_ok, kbias_ptr, P, vis, m_i, l_i, acc, 1.0,
                                                         True)
                base = h * SPLITS + c
                tl.store(pacc_ptr + (base * BLOCK_R + rows)[:, None] * DH + dd[None, :], acc, mask=row_ok[:, None])
                tl.store(pml_ptr + base * 2 * BLOCK_R + rows, m_i)
                tl.store(pml_ptr + base * 2 * BLOCK_R + BLOCK_R + rows, l_i)
                if MERGE_IN_ATTENTION:
                    # the head's last split to arrive merges it (every thread's stores ordered before the arrival by
                    # the CTA barrier and released by the acq_rel add; the last one's acquire sees the others')
                    tl.debug_barrier()
                    arrived = tl.atomic_add(head_cnt_ptr + h, 1, sem="acq_rel", scope="gpu")
                    if arrived == SPLITS - 1:
                        for first in range(0, DH, MC):
                            _merge_head_columns(pml_ptr, pacc_ptr, attn_ptr, h, first, rows, row_ok, H, DH, SPLITS,
                                                BLOCK_R, MC)
                        tl.atomic_xchg(head_cnt_ptr + h, 0, sem="relaxed", scope="gpu")   # zero for the next launch
        if GRID_SYNC and PHASE_LAST > 2:
            _grid_sync(counter_ptr, err_ptr, NPROG * 3, stamp_ptr, 2, STAMPS)

    # ---- 3 merge: the splits of one head, MC columns of its dim per program -> attn (MERGE_IN_ATTENTION: the
    # attention phase's last program of each head did it)
    if PHASE_FIRST <= 3 and 3 <= PHASE_LAST and not MERGE_IN_ATTENTION:
        for rnd in range(0, _rounds(H * (DH // MC), NPROG)):
            t = pid + rnd * NPROG
            if t < H * (DH // MC):
                _merge_head_columns(pml_ptr, pacc_ptr, attn_ptr, t // (DH // MC), (t % (DH // MC)) * MC, rows,
                                    row_ok, H, DH, SPLITS, BLOCK_R, MC)
        if GRID_SYNC and PHASE_LAST > 3:
            _grid_sync(counter_ptr, err_ptr, NPROG * 4, stamp_ptr, 3, STAMPS)

    # ---- 4 o: the O GEMM split over the heads into o_acc
    if PHASE_FIRST <= 4 and 4 <= PHASE_LAST and PRELOAD:
        if PHASE_FIRST > 2:                                  # a launch without the attention phase: load it now
            wo_tile = _wo_tile(wo_ptr, pid, H, DH, W, BN_O)
        if pid < (W // BN_O) * H:
            a = tl.load(attn_ptr + rows[:, None] * (H * DH) + (pid % H) * DH + tl.arange(0, DH)[None, :],
                        mask=row_ok[:, None], other=0.0, cache_modifier=".cg")
            out = tl.dot(a, tl.trans(wo_tile))
            n = (pid // H) * BN_O + tl.arange(0, BN_O)
            tl.atomic_add(oacc_ptr + rows[:, None] * W + n[None, :], out, mask=row_ok[:, None], sem="relaxed",
                          scope="gpu")
    if PHASE_FIRST <= 4 and 4 <= PHASE_LAST and not PRELOAD:
        for rnd in range(0, _rounds((W // BN_O) * H, NPROG)):
            t = pid + rnd * NPROG
            if t < (W // BN_O) * H:
                h = t % H
                n = (t // H) * BN_O + tl.arange(0, BN_O)
                out = tl.zeros([BLOCK_R, BN_O], tl.float32)
                for k0 in range(0, DH, OK):
                    ks = h * DH + k0 + tl.arange(0, OK)
                    a = tl.load(attn_ptr + rows[:, None] * (H * DH) + ks[None, :], mask=row_ok[:, None], other=0.0,
                                cache_modifier=".cg")
                    out += tl.dot(a, tl.trans(tl.load(wo_ptr + n[:, None] * (H * DH) + ks[None, :])))
                tl.atomic_add(oacc_ptr + rows[:, None] * W + n[None, :], out, mask=row_ok[:, None], sem="relaxed",
                              scope="gpu")
    if PHASE_FIRST <= 4 and 4 <= PHASE_LAST and GRID_SYNC and PHASE_LAST > 4:
        _grid_sync(counter_ptr, err_ptr, NPROG * (5 - MERGE_IN_ATTENTION), stamp_ptr, 4, STAMPS)

    # ---- 5 norm2: h2 -> residual, xs, the sums of squares
    if PHASE_FIRST <= 5 and 5 <= PHASE_LAST:
        if PREFETCH:                  # this program's down tile
            for rnd in range(0, _rounds((W // BN_D) * KSPLITS, NPROG)):
                t = pid + rnd * NPROG
                prefetch_rows_l2(wd_addr + (t % KSPLITS) * KS_D * ESIZE, F * ESIZE, KS_D * ESIZE,
                                 (t // KSPLITS) * BN_D + tl.arange(0, BN_D), t < (W // BN_D) * KSPLITS)
        _norm_phase(pid, h1_ptr, oacc_ptr, gate1_ptr, scale2_ptr, res_ptr, xs_ptr, ssq_ptr, oacc_ptr, oacc_ptr,
                    rows, row_ok, True, W, BK, BLOCK_R, NPROG, False)
        if GRID_SYNC and PHASE_LAST > 5:
            _grid_sync(counter_ptr, err_ptr, NPROG * (6 - MERGE_IN_ATTENTION), stamp_ptr, 5, STAMPS)

    # ---- 6 gate_up: the gate/up GEMM, GeGLU
    if PHASE_FIRST <= 6 and 6 <= PHASE_LAST:
        if PRELOAD and 7 <= PHASE_LAST:   # this program's down tile, in registers until the down phase
            wd_tile = _wd_tile(wd_ptr, pid, W, F, BN_D, KS_D)
        for rnd in range(0, _rounds(F // BN_GU, NPROG)):
            t = pid + rnd * NPROG
            if t < F // BN_GU:
                n1 = t * BN_GU + tl.arange(0, BN_GU)
                n2 = n1 + F
                acc1, acc2 = _pair_gemm(xs_ptr, wgu_ptr, rows, row_ok, n1, n2, W, BKW, BLOCK_R, BN_GU)
                r = _row_rsqrt(ssq_ptr, rows, eps, W, BK, BLOCK_R)[:, None]
                g = (acc1 * r + tl.load(bias_gu_ptr + n1)[None, :]).to(dt).to(tl.float32)
                u = (acc2 * r + tl.load(bias_gu_ptr + n2)[None, :]).to(dt).to(tl.float32)
                act = gelu_tanh_times(g, u, GELU_KC)
                tl.store(act_ptr + rows[:, None] * F + n1[None, :], act.to(dt), mask=row_ok[:, None])
        if GRID_SYNC and PHASE_LAST > 6:
            _grid_sync(counter_ptr, err_ptr, NPROG * (7 - MERGE_IN_ATTENTION), stamp_ptr, 6, STAMPS)

    # ---- 7 down: the down GEMM split over K into x_out
    if PHASE_FIRST <= 7 and 7 <= PHASE_LAST:
        if PREFETCH:                  # this program's tile of the next layer's QKV weight
            for rnd in range(0, _rounds((H + 2) * SUBS, NPROG)):
                t = pid + rnd * NPROG
                n = (t // SUBS) * DH + (t % SUBS) * RB + tl.arange(0, RB)
                prefetch_rows_l2(wqkv_next_addr, W * ESIZE, W * ESIZE, n, t < (H + 2) * SUBS)
                prefetch_rows_l2(wqkv_next_addr, W * ESIZE, W * ESIZE, n + HALF, t < (H + 2) * SUBS)
        if PRELOAD:
            if PHASE_FIRST > 6:                              # a launch without the gate/up phase: load it now
                wd_tile = _wd_tile(wd_ptr, pid, W, F, BN_D, KS_D)
            if pid < (W // BN_D) * KSPLITS:
                ks = (pid % KSPLITS) * KS_D + tl.arange(0, KS_D)
                a = tl.load(act_ptr + rows[:, None] * F + ks[None, :], mask=row_ok[:, None], other=0.0,
                            cache_modifier=".cg")
                acc = tl.dot(a, tl.trans(wd_tile))
                n = (pid // KSPLITS) * BN_D + tl.arange(0, BN_D)
                tl.atomic_add(xout_ptr + rows[:, None] * W + n[None, :], acc, mask=row_ok[:, None], sem="relaxed",
                              scope="gpu")
        if not PRELOAD:
            for rnd in range(0, _rounds((W // BN_D) * KSPLITS, NPROG)):
                t = pid + rnd * NPROG
                if t < (W // BN_D) * KSPLITS:
                    n = (t // KSPLITS) * BN_D + tl.arange(0, BN_D)
                    k_first = (t % KSPLITS) * KS_D
                    acc = tl.zeros([BLOCK_R, BN_D], tl.float32)
                    for kk in range(0, KS_D, BK):
                        ks = k_first + kk + tl.arange(0, BK)
                        a = tl.load(act_ptr + rows[:, None] * F + ks[None, :], mask=row_ok[:, None], other=0.0,
                                    cache_modifier=".cg")
                        acc += tl.dot(a, tl.trans(tl.load(wd_ptr + n[:, None] * F + ks[None, :])))
                    tl.atomic_add(xout_ptr + rows[:, None] * W + n[None, :], acc, mask=row_ok[:, None], sem="relaxed",
                                  scope="gpu")
    _stamp(stamp_ptr, STAMP_SLOTS - 1, STAMPS)


@dataclass(frozen=True)
class LayerConfig:
    """Tile sizes: bk the column chunk of a norm phase and the K step of the O and down GEMMs, bk_wide the K step
    of the QKV and gate/up GEMMs (K = W: fewer, wider steps keep more weight bytes in flight; 256 measured 0.7 us
    per layer faster than 128, 1.2 us faster than 512, session 15); bn_o / bn_gu / bn_d the output columns per
    program of the O, gate/up (each of gate and up) and down GEMMs; ks_d the down GEMM's K per program;
    block_keys the keys per attention step. merge_in_attention: the last split of each head to finish merges it at
    the end of the attention phase (an atomic count per head), so the merge phase and its barrier drop out.
    per_sm: programs per SM with grid barriers (2: twice the programs, so smaller tiles have more weight bytes in
    flight; every program must still be resident at once: the kernel's registers and shared memory must allow it).
    preload: each program loads its O tile into registers when the attention phase starts and its down tile when
    the gate/up phase starts, so those weights arrive before the barriers (one O and one down item per program:
    the grid must cover them; with per_sm=2's halved tiles they are 16 and 32 KB).
    merge_in_attention, per_sm=2 and preload were measured on the H200 in session 16: each makes the layer slower
    (32-44 us against 28.1 us for the defaults; docs/benchmarks/denoise_layer_phases_h200_2026-12-01_v4_session16.md).
    Defaults, for pi0.5's expert (W 1024, H 8, Dh 256, F 4096): 8 norm chunks, 80 QKV tiles, 64 attention items
    (8 key splits), 32 merge items, 128 O, gate/up and down tiles."""

    bk: int = 128
    bk_wide: int = 256
    bn_o: int = 64
    bn_gu: int = 32
    bn_d: int = 64
    ks_d: int = 512
    block_keys: int = 32
    num_warps: int = 4
    rb: int = ROPE_BLOCK
    merge_in_attention: bool = False
    per_sm: int = 1
    preload: bool = False

    @classmethod
    def fit(cls, width: int, mlp: int, head_dim: int) -> "LayerConfig":
        """The default tiles, each cut down to a layer narrower than it (the tiny test models)."""
        bk = min(cls.bk, width)
        return cls(bk=bk, bk_wide=min(cls.bk_wide, width), bn_o=min(cls.bn_o, width), bn_gu=min(cls.bn_gu, mlp),
                   bn_d=min(cls.bn_d, width), ks_d=max(bk, min(cls.ks_d, mlp)), rb=min(ROPE_BLOCK, head_dim // 2))


def grid_programs(width: int, heads: int, head_dim: int, mlp: int, splits: int, cfg: LayerConfig,
                  sms: int | None) -> int:
    """The launcher's default grid: as many programs as the largest phase has items, at most cfg.per_sm per SM
    (sms None: no limit, the interpreter)."""
    items = max(width // cfg.bk, (heads + 2) * (head_dim // 2 // cfg.rb), heads * splits,
                heads * max(head_dim // MERGE_CHUNK, 1), (width // cfg.bn_o) * heads, mlp // cfg.bn_gu,
                (width // cfg.bn_d) * (mlp // cfg.ks_d))
    return items if sms is None else min(items, sms * cfg.per_sm)


def _check(residual, x_prev, tables, weights, k_cache, v_cache, heads, cfg: LayerConfig) -> tuple[int, ...]:
    S, W = residual.shape
    dh = k_cache.shape[-1]
    F = weights.down.shape[1]
    want = {"qkv": ((heads + 2) * dh, W), "o": (W, heads * dh), "gate_up": (2 * F, W), "down": (W, F)}
    for name, shape in want.items():
        t = getattr(weights, name)
        if tuple(t.shape) != shape or not t.is_contiguous():
            raise ValueError(f"denoise_layer: weight {name} must be contiguous {shape}, got {tuple(t.shape)}")
    if residual.dtype != torch.float32 or not residual.is_contiguous():
        raise ValueError("denoise_layer: residual must be contiguous fp32 (S, W)")
    if x_prev is not None and (x_prev.shape != residual.shape or x_prev.dtype != torch.float32
                               or not x_prev.is_contiguous() or tables.gate0 is None):
        raise ValueError("denoise_layer: x_prev must be contiguous fp32 like residual, with tables.gate0")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or k_cache.stride(0) != v_cache.stride(0):
        raise ValueError("denoise_layer: k_cache / v_cache must be (L, Dh) with unit column stride, same row stride")
    if (dh // 2) % cfg.rb or W % cfg.bk or W % cfg.bn_o or F % cfg.bn_gu or W % cfg.bn_d or F % cfg.ks_d \
            or cfg.ks_d % cfg.bk or (W // cfg.bk) & (W // cfg.bk - 1) or cfg.bk < 16 or dh % min(cfg.bk, dh) \
            or W % cfg.bk_wide or cfg.per_sm not in (1, 2):
        raise ValueError(f"denoise_layer: tiles {cfg} do not divide W={W}, F={F}, Dh={dh}")
    return S, W, dh, F


def denoise_layer(residual: torch.Tensor, x_prev: torch.Tensor | None, x_out: torch.Tensor, tables: LayerTables,
                  weights: LayerWeights, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor,
                  cos: torch.Tensor, sin: torch.Tensor, key_bias: torch.Tensor, visible: torch.Tensor,
                  scratch: DenoiseLayerScratch, launch: int, heads: int, q_scale: float, eps: float = 1e-6,
                  grid_sync: bool = True, programs: int | None = None, cfg: LayerConfig | None = None,
                  prefetch: bool = False, next_qkv: torch.Tensor | None = None,
                  phases: tuple[int, int] | None = None, stamps: torch.Tensor | None = None) -> torch.Tensor:
    """Triton launcher; denoise_layer_reference's contract: residual (S, W) fp32 updated in place to h2, the cache
    rows [P, P + S) written, x_out (S, W) fp32 <- the down output. x_prev: the previous layer's x_out or None.
    launch: this launch's barrier counter (scratch.counters[launch], zero before it). prefetch (NVIDIA sm90+): when
    the attention starts, every program bulk-prefetches into L2 its O and gate/up weight tiles, when norm2 starts
    its down tile, when the down phase starts its tiles of `next_qkv` (the next layer's QKV weight; default this
    layer's). phases: (first, last) indices into PHASES: only those, in one launch (for timing them; what the
    others write is left as it was). programs: the grid (default: the GPU's SM count, at most the largest phase's
    items); with grid_sync every program must be resident at once, so it may not exceed the SM count.
    stamps: an int64 (programs, 16) tensor (NVIDIA; phase_stamps_us reads it): each program writes the GPU's
    global timer at its start, at each barrier (its work done, the barrier passed) and at its end. Returns x_out."""
    if cfg is None:
        cfg = LayerConfig.fit(residual.shape[1], weights.down.shape[1], k_cache.shape[-1])
    S, W, dh, F = _check(residual, x_prev, tables, weights, k_cache, v_cache, heads, cfg)
    P = key_bias.shape[0]
    splits = scratch.splits
    keys_per_split = triton.cdiv(triton.cdiv(P + S, splits), cfg.block_keys) * cfg.block_keys
    sms = torch.cuda.get_device_properties(residual.device).multi_processor_count if residual.is_cuda else None
    if programs is None:
        programs = grid_programs(W, heads, dh, F, splits, cfg, sms)
    if cfg.preload and programs < max((W // cfg.bn_o) * heads, (W // cfg.bn_d) * (F // cfg.ks_d)):
        raise ValueError(f"denoise_layer: preload needs a program per O and down item; {programs} programs")
    if grid_sync and (INTERPRETED or not residual.is_cuda):
        raise ValueError("denoise_layer: grid_sync needs a GPU (the interpreter runs programs one by one)")
    if grid_sync and sms is not None and programs > sms * cfg.per_sm:
        raise ValueError(f"denoise_layer: {programs} programs with grid barriers need {cfg.per_sm} per SM on "
                         f"{sms} SMs at most")
    if prefetch and (INTERPRETED or not residual.is_cuda or torch.cuda.get_device_capability(residual.device)[0] < 9):
        raise ValueError("denoise_layer: the L2 prefetch (cp.async.bulk.prefetch.L2) needs an sm90+ GPU")
    next_qkv = weights.qkv if next_qkv is None else next_qkv
    if next_qkv.shape != weights.qkv.shape or next_qkv.dtype != weights.qkv.dtype:
        raise ValueError("denoise_layer: next_qkv must be shaped like this layer's QKV weight")
    if stamps is not None and (stamps.dtype != torch.int64 or not stamps.is_cuda
                               or tuple(stamps.shape) != (programs, int(STAMP_SLOTS))):
        raise ValueError(f"denoise_layer: stamps must be an int64 CUDA tensor ({programs}, {int(STAMP_SLOTS)})")
    gate0 = tables.gate0 if tables.gate0 is not None else tables.gate1
    args = (residual, scratch.h1, x_prev if x_prev is not None else residual, x_out, scratch.o_acc, scratch.xs,
            scratch.ssq, gate0, tables.scale1p_1, tables.gate1, tables.scale1p_2, tables.bias_qkv, tables.bias_gu,
            weights.qkv, weights.o, weights.gate_up, weights.down,
            k_cache, v_cache, scratch.q, scratch.attn, scratch.part_acc, scratch.part_ml, scratch.act,
            pos, cos, sin, key_bias, visible, scratch.counters[launch:], scratch.errors, scratch.head_counters,
            stamps if stamps is not None else scratch.errors,
            weights.o.data_ptr(), weights.gate_up.data_ptr(), weights.down.data_ptr(), next_qkv.data_ptr(),
            S, P, eps, q_scale, k_cache.stride(0))
    consts = dict(GRID_SYNC=grid_sync, HAS_X=x_prev is not None, W=W, H=heads, DH=dh, F=F,
                  BLOCK_R=block_rows(S), SPLITS=splits, BK=cfg.bk, BKW=cfg.bk_wide, BN_O=cfg.bn_o, BN_GU=cfg.bn_gu,
                  BN_D=cfg.bn_d, KS_D=cfg.ks_d, BLOCK_KEYS=cfg.block_keys, RB=cfg.rb, NPROG=programs,
                  KEYS_PER_SPLIT=keys_per_split, PREFETCH=prefetch, ESIZE=weights.qkv.element_size(),
                  MERGE_IN_ATTENTION=cfg.merge_in_attention, STAMPS=stamps is not None, PRELOAD=cfg.preload,
                  num_warps=cfg.num_warps)
    if phases is not None:
        _denoise_layer_kernel[(programs,)](*args, PHASE_FIRST=phases[0], PHASE_LAST=phases[1], **consts)
    elif grid_sync:
        _denoise_layer_kernel[(programs,)](*args, PHASE_FIRST=0, PHASE_LAST=len(PHASES) - 1, **consts)
    else:
        for phase in range(len(PHASES)):
            _denoise_layer_kernel[(programs,)](*args, PHASE_FIRST=phase, PHASE_LAST=phase, **consts)
    return x_out


def phase_stamps_us(stamps: torch.Tensor, merge_in_attention: bool = False) -> dict[str, float]:
    """One grid launch's stamps (denoise_layer's `stamps`) as its critical path, us: per phase, from the last
    program's release of the barrier before it (the launch's first start for the first phase) to the last
    program's arrival at the barrier after it (its end for the last phase), and per barrier from the last arrival
    to the last release."""
    t = stamps.double().cpu()
    phases = [i for i, name in enumerate(PHASES) if not (merge_in_attention and name == "merge")]
    out, ready = {}, t[:, 0].min()
    for j, i in enumerate(phases):
        last = j == len(phases) - 1
        done = t[:, -1].max() if last else t[:, 1 + 2 * i].max()
        out[PHASES[i]] = float(done - ready) / 1e3
        if not last:
            ready = t[:, 2 + 2 * i].max()
            out[f"barrier after {PHASES[i]}"] = float(ready - done) / 1e3
    return out


__all__ = ["PHASES", "DenoiseLayerScratch", "LayerConfig", "LayerTables", "LayerWeights", "barriers_per_launch",
           "block_rows", "denoise_layer", "denoise_layer_reference", "fold_shift",
           "grid_programs", "phase_stamps_us"]
