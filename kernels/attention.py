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
"""

from __future__ import annotations

import torch

from ._triton import launch_options, tl, triton, wait_for_inputs


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
def _attn_split_kernel(q_ptr, k_ptr, v_ptr, bias_ptr, vis_ptr, o_ptr, acc_ptr, ml_ptr,
                       Mq, L, P, heads, scale,
                       stride_q, stride_k, stride_v, stride_o,
                       HAS_SUFFIX: tl.constexpr, SPLIT: tl.constexpr, KEYS_PER_SPLIT: tl.constexpr, D: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PDL: tl.constexpr, EARLY_KV: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < Mq
    d = tl.arange(0, D)
    start = pid_s * KEYS_PER_SPLIT
    end = tl.minimum(start + KEYS_PER_SPLIT, L)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    if EARLY_KV:
        # Denoising step, one key block per program: a block of prefix keys holds K/V that the prefix phase wrote,
        # so it is read before the wait for the kernel ahead (which writes q and the suffix rows); a block with
        # suffix keys is read after it. Exactly one of the two masked loads moves data.
        cols = start + tl.arange(0, BLOCK_N)
        col_ok = cols < end
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
        wait_for_inputs(PDL)
        q = tl.load(q_ptr + rows[:, None] * stride_q + d[None, :], mask=row_ok[:, None], other=0.0)
        vis = rows                                             # unused without suffix keys
        if HAS_SUFFIX:
            vis = tl.load(vis_ptr + rows // heads, mask=row_ok, other=0)
        for n in range(0, KEYS_PER_SPLIT, BLOCK_N):           # the last split may run past L: masked
            cols = start + n + tl.arange(0, BLOCK_N)
            col_ok = cols < end
            k = tl.load(k_ptr + cols[:, None] * stride_k + d[None, :], mask=col_ok[:, None], other=0.0)
            v = tl.load(v_ptr + cols[:, None] * stride_v + d[None, :], mask=col_ok[:, None], other=0.0)
            m_i, l_i, acc = _online_softmax_step(q, k, v, cols, col_ok, bias_ptr, P, vis, m_i, l_i, acc, scale,
                                                 HAS_SUFFIX)
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


def plan(Mq: int, L: int, sms: int = 132) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, splits): enough programs to fill `sms` multiprocessors."""
    block_m = 16 if Mq <= 128 else (32 if Mq <= 1024 else 64)
    block_n = 64
    programs_m = triton.cdiv(Mq, block_m)
    splits = max(1, min(triton.cdiv(sms, programs_m), triton.cdiv(L, block_n), 16))
    return block_m, block_n, splits


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, prefix_len: int,
              visible: torch.Tensor | None, heads: int, scale: float, out: torch.Tensor,
              splits: int | None = None, pdl: bool = False) -> torch.Tensor:
    """Triton launcher; contract of attention_reference, written into out (Mq, D). D must be a power of two."""
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
    block_m, block_n, auto_splits = plan(Mq, L)
    splits = splits or auto_splits
    keys_per_split = triton.cdiv(triton.cdiv(L, splits), block_n) * block_n
    splits = triton.cdiv(L, keys_per_split)
    acc = ml = out
    if splits > 1:
        acc = torch.empty(splits, Mq, D, device=q.device, dtype=torch.float32)
        ml = torch.empty(splits, Mq, 2, device=q.device, dtype=torch.float32)
    grid = (triton.cdiv(Mq, block_m), splits)
    _attn_split_kernel[grid](q, k, v, bias, visible if visible is not None else bias, out, acc, ml,
                             Mq, L, prefix_len, heads, scale,
                             q.stride(0), k.stride(0), v.stride(0), out.stride(0),
                             HAS_SUFFIX=visible is not None, SPLIT=splits, KEYS_PER_SPLIT=keys_per_split, D=D,
                             BLOCK_M=block_m, BLOCK_N=block_n, PDL=pdl,
                             EARLY_KV=pdl and visible is not None and keys_per_split == block_n, num_warps=8 if block_m >= 64 else 4, num_stages=2, **launch_options(pdl))
    if splits > 1:
        _attn_combine_kernel[(Mq,)](acc, ml, out, Mq, out.stride(0), SPLIT=splits,
                                    SPLIT_P2=triton.next_power_of_2(splits), D=D, PDL=pdl, num_warps=4,
                                    **launch_options(pdl))
    return out
