"""Masked multi-query attention over a KV cache, flash-style (online softmax), split over keys for few queries.

One KV head: every query head attends the same keys, so heads are stacked on the query axis
(row r = token r // heads). For row r and key j < L:
    s[r, j] = scale * q[r] . k[j] + bias[j]                    j <  P  (bias: 0 or -inf, the prefix key mask)
    s[r, j] = scale * q[r] . k[j]  if j - P < visible[r // heads] else -inf      j >= P  (suffix keys)
    out[r]  = softmax_j(s[r]) @ v
The key range is cut into `splits` pieces; each program keeps (max, sum, unnormalized acc) of its piece and a
second kernel merges them: out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s. With few query rows (the 10-51
token denoising steps) the split keeps the GPU busy; the prefix uses one split.
Provenance: FlashAttention-2 / flash-decoding; replaces SDPA with an additive mask (cuDNN, ~50 us a call here).

`decoder_attention` is the same attention for a denoising step, read straight from the step's fused QKV GEMM
output: it applies RoPE and the q scale to the queries itself, takes the suffix keys and values from the QKV rows
(RoPE on the keys) and only the prefix keys from the cache. That is `qkv_rope` followed by `attention`, without
the qkv_rope launch between them and without writing the suffix rows into the cache (nothing else reads them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._triton import launch_options, release_dependents, tl, triton, wait_for_inputs


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, prefix_len: int,
                        visible: torch.Tensor | None, heads: int, scale: float) -> torch.Tensor:
    """Plain PyTorch. q (Mq, D), k/v (L, D), bias (P,) fp32, visible (Mq // heads,) int or None -> (Mq, D)."""
    L = k.shape[0]
    s = (q.float() @ k.float().T) * scale                                          # (Mq, L)
    key = torch.arange(L, device=q.device)
    full_bias = torch.zeros(q.shape[0], L, device=q.device)
    full_bias[:, :prefix_len] = bias[:prefix_len].float()[None]
    if L > prefix_len:
        vis = visible.repeat_interleave(heads)[:, None]                            # (Mq, 1)
        allowed = (key[None, prefix_len:] - prefix_len) < vis
        full_bias[:, prefix_len:] = torch.where(allowed, 0.0, float("-inf"))
    return (torch.softmax(s + full_bias, dim=-1) @ v.float()).to(q.dtype)


def decoder_attention_reference(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor,
                                cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor, prefix_len: int,
                                visible: torch.Tensor, heads: int, q_scale: float) -> torch.Tensor:
    """Plain PyTorch, by definition qkv_rope then attention on copies of the caches.
    qkv (S, (heads + 2) * D) of S suffix tokens; k_cache/v_cache (>= prefix_len + S, D) with the prefix keys in
    rows < prefix_len, pos (S,) -> (S * heads, D)."""
    from .qkv_rope import qkv_rope_reference
    S, D = qkv.shape[0], k_cache.shape[1]
    L = prefix_len + S
    q = torch.empty(S, heads, D, device=qkv.device, dtype=qkv.dtype)
    kc, vc = k_cache[:L].clone()[None], v_cache[:L].clone()[None]                  # (1, L, D)
    qkv_rope_reference(qkv, pos, cos, sin, q, kc, vc, prefix_len, heads, 1, q_scale)
    return attention_reference(q.view(S * heads, D), kc[0], vc[0], bias, prefix_len, visible, heads, 1.0)


@triton.jit
def _online_softmax_step(q, k, v, cols, col_ok, bias_ptr, P, vis, m_i, l_i, acc, scale, HAS_SUFFIX: tl.constexpr):
    """One block of keys into the running (max, sum, unnormalized output) of the query rows."""
    s = tl.dot(q, tl.trans(k)) * scale                                             # (BLOCK_M, BLOCK_N) fp32
    s += tl.load(bias_ptr + cols, mask=cols < P, other=0.0)[None, :]
    ok = col_ok[None, :]
    if HAS_SUFFIX:
        ok = ok & ((cols[None, :] < P) | ((cols[None, :] - P) < vis[:, None]))
    s = tl.where(ok, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def _rows_f32(base, cols, row_ok):
    """Rows base[r] + cols in fp32 (zeros where not row_ok)."""
    return tl.load(base + cols, mask=row_ok[:, None], other=0.0).to(tl.float32)


@triton.jit
def _rope_rows(base, d, row_ok, p, cos_ptr, sin_ptr, D: tl.constexpr):
    """RoPE (split-half form) of rows base[r] + d, in fp32: x * cos + rotate_half(x) * sin, position p[r]."""
    HALF: tl.constexpr = D // 2
    x = _rows_f32(base, d[None, :], row_ok)
    x_swap = _rows_f32(base, ((d + HALF) % D)[None, :], row_ok)
    table = p[:, None] * HALF + (d % HALF)[None, :]
    c = tl.load(cos_ptr + table, mask=row_ok[:, None], other=0.0)
    sn = tl.load(sin_ptr + table, mask=row_ok[:, None], other=0.0)
    sign = tl.where(d < HALF, -1.0, 1.0)
    return x * c + sign[None, :] * x_swap * sn


@triton.jit
def _rope_queries(qkv_ptr, rows, row_ok, d, stride_qkv, heads, pos_ptr, cos_ptr, sin_ptr, q_scale, q_dtype,
                  D: tl.constexpr):
    """Query rows (BLOCK_M, D) from the QKV rows (token r // heads, head r % heads) with RoPE and the q scale
    applied (qkv_rope's rounding: fp32, scaled, then q_dtype, the caches' dtype)."""
    tok = rows // heads
    p = tl.load(pos_ptr + tok, mask=row_ok, other=0)
    base = qkv_ptr + tok[:, None] * stride_qkv + (rows % heads)[:, None] * D
    return (_rope_rows(base, d, row_ok, p, cos_ptr, sin_ptr, D) * q_scale).to(q_dtype)


@triton.jit
def _cached_keys(q, k_ptr, v_ptr, start, end, d, stride_k, stride_v, bias_ptr, P, vis, m_i, l_i, acc, scale,
                 HAS_SUFFIX: tl.constexpr, KEYS_PER_SPLIT: tl.constexpr, BLOCK_N: tl.constexpr):
    """The keys [start, end) of the cache into the running softmax, BLOCK_N at a time (the split may run past
    `end`: masked)."""
    for n in range(0, KEYS_PER_SPLIT, BLOCK_N):
        cols = start + n + tl.arange(0, BLOCK_N)
        col_ok = cols < end
        k = tl.load(k_ptr + cols[:, None] * stride_k + d[None, :], mask=col_ok[:, None], other=0.0)
        v = tl.load(v_ptr + cols[:, None] * stride_v + d[None, :], mask=col_ok[:, None], other=0.0)
        m_i, l_i, acc = _online_softmax_step(q, k, v, cols, col_ok, bias_ptr, P, vis, m_i, l_i, acc, scale,
                                             HAS_SUFFIX)
    return m_i, l_i, acc


@triton.jit
def _load_suffix_kv(qkv_ptr, cols, ok, d, P, stride_qkv, heads, pos_ptr, cos_ptr, sin_ptr, k_dtype, D: tl.constexpr):
    """Suffix keys (RoPE applied) and values of key columns cols >= P, read from the QKV rows cols - P
    (zeros where not ok), in the caches' dtype."""
    srow = tl.where(ok, cols - P, 0)
    p = tl.load(pos_ptr + srow, mask=ok, other=0)
    base = qkv_ptr + srow[:, None] * stride_qkv + heads * D
    k = _rope_rows(base, d, ok, p, cos_ptr, sin_ptr, D).to(k_dtype)
    v = _rows_f32(base + D, d[None, :], ok).to(k_dtype)
    return k, v


@triton.jit
def _attn_split_kernel(q_ptr, k_ptr, v_ptr, bias_ptr, vis_ptr, o_ptr, acc_ptr, ml_ptr, pos_ptr, cos_ptr, sin_ptr,
                       Mq, L, P, heads, scale, q_scale,
                       stride_q, stride_k, stride_v, stride_o,
                       HAS_SUFFIX: tl.constexpr, SPLIT: tl.constexpr, KEYS_PER_SPLIT: tl.constexpr, D: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr, EARLY_KV: tl.constexpr,
                       FROM_QKV: tl.constexpr, BLOCK_S: tl.constexpr):
    release_dependents(PDL)
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < Mq
    d = tl.arange(0, D)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    if FROM_QKV:
        # decoder_attention: q_ptr is the QKV GEMM output. Splits 0..SPLIT-2 cover the prefix keys [0, P) from the
        # cache; the last split covers the suffix keys, read from the QKV rows (RoPE on K here), BLOCK_S of them.
        start = pid_s * KEYS_PER_SPLIT
        end = tl.minimum(start + KEYS_PER_SPLIT, P)           # the suffix split: start >= P, nothing from the cache
        if EARLY_KV:
            # one block of prefix keys per split, written by the prefix phase: read before the wait for the kernel
            # ahead (the QKV GEMM)
            cols = start + tl.arange(0, BLOCK_N)
            col_ok = cols < end
            k = tl.load(k_ptr + cols[:, None] * stride_k + d[None, :], mask=col_ok[:, None], other=0.0)
            v = tl.load(v_ptr + cols[:, None] * stride_v + d[None, :], mask=col_ok[:, None], other=0.0)
        wait_for_inputs(PDL)
        q = _rope_queries(q_ptr, rows, row_ok, d, stride_q, heads, pos_ptr, cos_ptr, sin_ptr, q_scale,
                          k_ptr.dtype.element_ty, D)
        vis = tl.load(vis_ptr + rows // heads, mask=row_ok, other=0)
        if pid_s == SPLIT - 1:
            cols_s = P + tl.arange(0, BLOCK_S)
            ok_s = cols_s < L
            k_s, v_s = _load_suffix_kv(q_ptr, cols_s, ok_s, d, P, stride_q, heads, pos_ptr, cos_ptr, sin_ptr,
                                       k_ptr.dtype.element_ty, D)
            m_i, l_i, acc = _online_softmax_step(q, k_s, v_s, cols_s, ok_s, bias_ptr, P, vis, m_i, l_i, acc, scale,
                                                 HAS_SUFFIX)
        else:
            if EARLY_KV:
                m_i, l_i, acc = _online_softmax_step(q, k, v, cols, col_ok, bias_ptr, P, vis, m_i, l_i, acc, scale,
                                                     HAS_SUFFIX)
            else:
                m_i, l_i, acc = _cached_keys(q, k_ptr, v_ptr, start, end, d, stride_k, stride_v, bias_ptr, P, vis,
                                             m_i, l_i, acc, scale, HAS_SUFFIX, KEYS_PER_SPLIT, BLOCK_N)
    elif EARLY_KV:
        # Denoising step, one key block per program: a block of prefix keys holds K/V that the prefix phase wrote,
        # so it is read before the wait for the kernel ahead (which writes q and the suffix rows); a block with
        # suffix keys is read after it. Exactly one of the two masked loads moves data.
        start = pid_s * KEYS_PER_SPLIT
        cols = start + tl.arange(0, BLOCK_N)
        col_ok = cols < tl.minimum(start + KEYS_PER_SPLIT, L)
        before = col_ok[:, None] & (start + BLOCK_N <= P)
        after = col_ok[:, None] & (start + BLOCK_N > P)
        k_ptrs = k_ptr + cols[:, None] * stride_k + d[None, :]
        v_ptrs = v_ptr + cols[:, None] * stride_v + d[None, :]
        k = tl.load(k_ptrs, mask=before, other=0.0)
        v = tl.load(v_ptrs, mask=before, other=0.0)
        wait_for_inputs(PDL)
        k += tl.load(k_ptrs, mask=after, other=0.0)
        v += tl.load(v_ptrs, mask=after, other=0.0)
        q = tl.load(q_ptr + rows[:, None] * stride_q + d[None, :], mask=row_ok[:, None], other=0.0)
        vis = tl.load(vis_ptr + rows // heads, mask=row_ok, other=0)
        m_i, l_i, acc = _online_softmax_step(q, k, v, cols, col_ok, bias_ptr, P, vis, m_i, l_i, acc, scale,
                                             HAS_SUFFIX)
    else:
        start = pid_s * KEYS_PER_SPLIT
        end = tl.minimum(start + KEYS_PER_SPLIT, L)
        wait_for_inputs(PDL)
        q = tl.load(q_ptr + rows[:, None] * stride_q + d[None, :], mask=row_ok[:, None], other=0.0)
        vis = rows                                             # unused without suffix keys
        if HAS_SUFFIX:
            vis = tl.load(vis_ptr + rows // heads, mask=row_ok, other=0)
        m_i, l_i, acc = _cached_keys(q, k_ptr, v_ptr, start, end, d, stride_k, stride_v, bias_ptr, P, vis, m_i, l_i,
                                     acc, scale, HAS_SUFFIX, KEYS_PER_SPLIT, BLOCK_N)
    if SPLIT == 1:
        out = acc / tl.maximum(l_i, 1e-30)[:, None]
        tl.store(o_ptr + rows[:, None] * stride_o + d[None, :], out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])
    else:
        base = pid_s * Mq + rows
        tl.store(acc_ptr + base[:, None] * D + d[None, :], acc, mask=row_ok[:, None])
        tl.store(ml_ptr + base * 2, m_i, mask=row_ok)
        tl.store(ml_ptr + base * 2 + 1, l_i, mask=row_ok)


@triton.jit
def _attn_combine_kernel(acc_ptr, ml_ptr, o_ptr, Mq, stride_o, SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr,
                         D: tl.constexpr, PDL: tl.constexpr):
    release_dependents(PDL)
    wait_for_inputs(PDL)
    row = tl.program_id(0)
    sp = tl.arange(0, SPLIT_P2)
    sp_ok = sp < SPLIT
    m = tl.load(ml_ptr + (sp * Mq + row) * 2, mask=sp_ok, other=float("-inf"))
    l = tl.load(ml_ptr + (sp * Mq + row) * 2 + 1, mask=sp_ok, other=0.0)
    m_max = tl.max(m, axis=0)
    w = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_max))                       # (SPLIT_P2,)
    d = tl.arange(0, D)
    acc = tl.load(acc_ptr + (sp[:, None] * Mq + row) * D + d[None, :], mask=sp_ok[:, None], other=0.0)
    out = tl.sum(acc * w[:, None], axis=0) / tl.maximum(tl.sum(l * w, axis=0), 1e-30)
    tl.store(o_ptr + row * stride_o + d, out.to(o_ptr.dtype.element_ty))


# Key blocks of a denoising step's attention: one block per split, held in registers across the PDL wait
# (measured on the H200 with tools/benchmark_attention.py, 2026-11-29). With the suffix keys in the cache
# (`attention`), a 64-key block of 256-wide K and V compiles for sm90 to 32 registers and ~9 KB of spills per
# thread; 32 keys fit (250 registers, no spills): 14.07 -> 12.88 us per layer for GEMM + qkv_rope + attention.
# decoder_attention loads prefix keys only and 64 keys fit (237 registers, no spills): 11.33 us, vs 11.67 us with
# 32. A launcher's key_block argument sets either, for kernel benchmarks.
KEY_BLOCKS = (16, 32, 64)
DECODER_KEY_BLOCK = 32              # attention() with suffix keys
DECODER_PREFIX_KEY_BLOCK = 64       # decoder_attention()
ROW_BLOCKS = (16, 32, 64)           # query rows per program (a given block_m; else plan's own by the row count)


def plan(Mq: int, L: int, sms: int = 132, key_block: int | None = None,
         block_m: int | None = None) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, splits): enough programs to fill `sms` multiprocessors. key_block (a denoising step):
    one block of that many keys per split where that many splits fit the GPU (the early-K/V path under PDL), else
    blocks of that many keys, several per split (with 64-key blocks held across the wait, many-row steps spill:
    tools/kernel_resources.py). The prefix (no key_block): 64-key blocks, several per split. block_m: query rows
    per program (None: 16 up to 128 rows, 32 up to 1024, else 64). The plan never depends on PDL, so both launch
    modes sum alike."""
    if block_m is None:
        block_m = 16 if Mq <= 128 else (32 if Mq <= 1024 else 64)
    programs_m = triton.cdiv(Mq, block_m)
    if key_block:
        splits = triton.cdiv(L, key_block)
        if splits <= min(triton.cdiv(sms, programs_m), 32):
            return block_m, key_block, splits
    block_n = key_block or 64
    splits = max(1, min(triton.cdiv(sms, programs_m), triton.cdiv(L, block_n), 16))
    return block_m, block_n, splits


@dataclass(frozen=True)
class SplitLaunch:
    """How the split kernel runs for one shape: its grid, constexprs and warps (the launchers use it, and so does
    tools/kernel_resources.py, which compiles exactly these configurations for sm90)."""

    grid: tuple[int, int]
    constexprs: dict
    num_warps: int
    num_stages: int = 2

    @property
    def splits(self) -> int:
        return self.constexprs["SPLIT"]


def split_launch(Mq: int, L: int, prefix_len: int, D: int, has_suffix: bool, from_qkv: bool, pdl: bool,
                 splits: int | None = None, key_block: int | None = None,
                 block_m: int | None = None) -> SplitLaunch:
    """The split kernel's launch for Mq query rows over L keys (prefix_len of them prefix keys). from_qkv
    (decoder_attention): the splits cover the prefix keys and one more split the L - prefix_len suffix keys; a
    given `splits` counts that suffix split too. key_block: keys per split of a denoising step (None: the
    defaults above); the prefix (no suffix keys) always uses 64-key blocks, several per split. block_m: query
    rows per program, one of ROW_BLOCKS (None: plan's pick by the row count)."""
    if key_block is not None and key_block not in KEY_BLOCKS:
        raise ValueError(f"attention: key_block must be one of {KEY_BLOCKS}, got {key_block}")
    if block_m is not None and block_m not in ROW_BLOCKS:
        raise ValueError(f"attention: block_m must be one of {ROW_BLOCKS}, got {block_m}")
    keyed = prefix_len if from_qkv else L                         # keys the splits divide
    if not has_suffix:
        key_block = None
    elif key_block is None:
        key_block = DECODER_PREFIX_KEY_BLOCK if from_qkv else DECODER_KEY_BLOCK
    block_m, block_n, auto_splits = plan(Mq, keyed, key_block=key_block, block_m=block_m)
    if from_qkv and splits is not None:
        splits = max(1, splits - 1)
    splits = splits or auto_splits
    keys_per_split = triton.cdiv(triton.cdiv(keyed, splits), block_n) * block_n
    splits = triton.cdiv(keyed, keys_per_split) + from_qkv
    constexprs = {"HAS_SUFFIX": has_suffix, "SPLIT": splits, "KEYS_PER_SPLIT": keys_per_split, "D": D,
                  "BLOCK_M": block_m, "BLOCK_N": block_n, "PDL": pdl,
                  "EARLY_KV": pdl and has_suffix and keys_per_split == block_n, "FROM_QKV": from_qkv,
                  "BLOCK_S": max(16, triton.next_power_of_2(L - prefix_len)) if from_qkv else 16}
    return SplitLaunch((triton.cdiv(Mq, block_m), splits), constexprs, 8 if block_m >= 64 else 4)


def _launch(q, k, v, bias, prefix_len, visible, heads, scale, out, splits, pdl, L, rope=None, key_block=None,
            block_m=None):
    """Split kernel (+ combine): q is the queries (Mq, D), or the QKV rows (S, N) when rope = (pos, cos, sin,
    q_scale)."""
    Mq, D = out.shape
    launch = split_launch(Mq, L, prefix_len, D, visible is not None, rope is not None, pdl, splits, key_block,
                          block_m)
    acc = ml = out
    if launch.splits > 1:
        acc = torch.empty(launch.splits, Mq, D, device=out.device, dtype=torch.float32)
        ml = torch.empty(launch.splits, Mq, 2, device=out.device, dtype=torch.float32)
    pos, cos, sin, q_scale = rope if rope is not None else (bias, bias, bias, 1.0)
    _attn_split_kernel[launch.grid](q, k, v, bias, visible if visible is not None else bias, out, acc, ml, pos, cos,
                                    sin, Mq, L, prefix_len, heads, scale, q_scale,
                                    q.stride(0), k.stride(0), v.stride(0), out.stride(0), **launch.constexprs,
                                    num_warps=launch.num_warps, num_stages=launch.num_stages, **launch_options(pdl))
    if launch.splits > 1:
        merge_splits(acc, ml, out, pdl)
    return out


def merge_splits_reference(acc: torch.Tensor, ml: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch. acc (S, Mq, D) fp32 unnormalized outputs of S key splits, ml (S, Mq, 2) their row maxima
    (natural-log units, -inf for a split with no visible key) and row sums -> (Mq, D) fp32:
    sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s, M = max_s m_s."""
    m, l = ml[..., 0], ml[..., 1]
    w = torch.where(m == float("-inf"), 0.0, torch.exp(m - m.max(dim=0).values))      # (S, Mq)
    return (acc * w[..., None]).sum(0) / (l * w).sum(0).clamp(min=1e-30)[:, None]


def merge_splits(acc: torch.Tensor, ml: torch.Tensor, out: torch.Tensor, pdl: bool | int = False) -> torch.Tensor:
    """Triton launcher; contract of merge_splits_reference, written into out (Mq, D) in out's dtype. The second
    launch of a key-split attention (this file's split kernel, kernels/flashrt_kernels/prefix_attention.py with splits > 1)."""
    splits, Mq, D = acc.shape
    if ml.shape != (splits, Mq, 2) or out.shape != (Mq, D) or acc.dtype != torch.float32 or D & (D - 1):
        raise ValueError(f"merge_splits: acc (S, Mq, D) fp32 with D a power of two, ml (S, Mq, 2), out (Mq, D); "
                         f"got acc {tuple(acc.shape)} {acc.dtype}, ml {tuple(ml.shape)}, out {tuple(out.shape)}")
    _attn_combine_kernel[(Mq,)](acc, ml, out, Mq, out.stride(0), SPLIT=splits, SPLIT_P2=triton.next_power_of_2(splits),
                                D=D, PDL=pdl, num_warps=4, **launch_options(pdl))
    return out


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, prefix_len: int,
              visible: torch.Tensor | None, heads: int, scale: float, out: torch.Tensor,
              splits: int | None = None, pdl: bool = False, key_block: int | None = None,
              block_m: int | None = None) -> torch.Tensor:
    """Triton launcher; contract of attention_reference, written into out (Mq, D). D must be a power of two.
    key_block: keys per split of a denoising step (None: DECODER_KEY_BLOCK); block_m: query rows per program
    (None: plan's pick)."""
    Mq, D = q.shape
    L = k.shape[0]
    if D & (D - 1) or k.shape != (L, D) or v.shape != (L, D) or out.shape != (Mq, D):
        raise ValueError(f"attention: q (Mq, D) with D a power of two, k/v (L, D), out (Mq, D); got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, out {tuple(out.shape)}")
    if min(q.stride(1), k.stride(1), v.stride(1), out.stride(1)) != 1:
        raise ValueError("attention: the head dim must be contiguous")
    if (L > prefix_len) != (visible is not None) or bias.shape[0] < prefix_len:
        raise ValueError(f"attention: suffix keys ({L - prefix_len}) need `visible` and bias must cover the "
                         f"{prefix_len} prefix keys")
    return _launch(q, k, v, bias, prefix_len, visible, heads, scale, out, splits, pdl, L, key_block=key_block,
                   block_m=block_m)


def decoder_attention(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor,
                      cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor, prefix_len: int,
                      visible: torch.Tensor, heads: int, q_scale: float, out: torch.Tensor,
                      splits: int | None = None, pdl: bool = False, key_block: int | None = None,
                      block_m: int | None = None) -> torch.Tensor:
    """Triton launcher; contract of decoder_attention_reference, written into out (S * heads, D). One KV head;
    D a power of two; the caches are read only below prefix_len. key_block: prefix keys per split (None:
    DECODER_PREFIX_KEY_BLOCK); block_m: query rows per program (None: plan's pick)."""
    S = qkv.shape[0]
    D = k_cache.shape[1] if k_cache.dim() == 2 else -1
    if D <= 0 or D & (D - 1) or qkv.dim() != 2 or qkv.shape[1] != (heads + 2) * D or \
            min(qkv.stride(1), k_cache.stride(1)) != 1:
        raise ValueError(f"decoder_attention: qkv (S, (heads + 2) * D) and caches (L, D) with D a power of two "
                         f"and contiguous rows; got qkv {tuple(qkv.shape)}, k_cache {tuple(k_cache.shape)}, "
                         f"{heads} heads")
    if v_cache.shape != k_cache.shape or v_cache.stride(1) != 1 or k_cache.shape[0] < prefix_len or prefix_len < 1:
        raise ValueError(f"decoder_attention: v_cache must match k_cache {tuple(k_cache.shape)} and hold the "
                         f"{prefix_len} prefix keys; got {tuple(v_cache.shape)}")
    if out.shape != (S * heads, D) or out.stride(1) != 1:
        raise ValueError(f"decoder_attention: out must be ({S * heads}, {D}), got {tuple(out.shape)}")
    if pos.shape != (S,) or visible.shape != (S,) or cos.shape[1] != D // 2 or bias.shape[0] < prefix_len:
        raise ValueError(f"decoder_attention: pos and visible ({S},), ({D // 2})-wide rope tables, bias over the "
                         f"{prefix_len} prefix keys; got pos {tuple(pos.shape)}, visible {tuple(visible.shape)}, "
                         f"tables {tuple(cos.shape)}, bias {tuple(bias.shape)}")
    return _launch(qkv, k_cache, v_cache, bias, prefix_len, visible, heads, 1.0, out, splits, pdl,
                   prefix_len + S, rope=(pos, cos, sin, q_scale), key_block=key_block, block_m=block_m)
