"""Attention of the vision tower: every head attends every token of its view (no mask), flash-style.

    q, k, v: (B, H, N, Dh), any strides with the head dim contiguous (the engine passes strided views of the QKV
             GEMM output, (B, N, 3, H, Dh) in memory)
    out[b, h, i] = sum_j softmax_j(scale * q[b, h, i] . k[b, h, j]) v[b, h, j]       (fp32 softmax and sums)
    returned as a (B, H, N, Dh) view of a (B, N, H, Dh) tensor: the layout the O GEMM reads as (B * N, H * Dh)
    rows, so the transpose after the attention costs no copy.

One program owns BLOCK_M queries of one (view, head) and walks the N keys in BLOCK_N blocks with an online softmax
(FlashAttention-2). SigLIP so400m has Dh = 72: the head dim is padded to the next power of two in registers and
masked. Written as a candidate of the engine's vision attention tuning (flashrt_core/engine/ops.py
tune_vision_attention), which times it at load beside torch's SDPA backends and keeps the fastest: on the H200,
cuDNN's SDPA took 12.5 us per layer on the critical path for 7.2 us of kernel (session 8's timeline).
Provenance: FlashAttention-2's forward loop; independent Triton implementation.
"""

from __future__ import annotations

import torch

from ._triton import tl, triton


def vision_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Plain PyTorch. q, k, v (B, H, N, Dh) -> (B, H, N, Dh) in q's dtype."""
    p = torch.softmax((q.float() @ k.float().transpose(-1, -2)) * scale, dim=-1)
    return (p @ v.float()).to(q.dtype)


@triton.jit
def _vision_attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, H, scale,
                             sq_b, sq_h, sq_n, sk_b, sk_h, sk_n, sv_b, sv_h, sv_n, so_b, so_h, so_n,
                             N: tl.constexpr, DH: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < N
    d = tl.arange(0, BLOCK_D)
    d_ok = d < DH
    q = tl.load(q_ptr + b * sq_b + h * sq_h + rows[:, None] * sq_n + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_ok = cols < N
        kv_ok = col_ok[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + b * sk_b + h * sk_h + cols[:, None] * sk_n + d[None, :], mask=kv_ok, other=0.0)
        v = tl.load(v_ptr + b * sv_b + h * sv_h + cols[:, None] * sv_n + d[None, :], mask=kv_ok, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale                                      # (BLOCK_M, BLOCK_N) fp32
        s = tl.where(col_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + b * so_b + h * so_h + rows[:, None] * so_n + d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])


def vision_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, block_m: int = 64,
                     block_n: int = 64) -> torch.Tensor:
    """Triton launcher; contract of vision_attention_reference. Returns a (B, H, N, Dh) view of a new (B, N, H, Dh)
    tensor."""
    B, H, N, Dh = q.shape
    if k.shape != q.shape or v.shape != q.shape or min(q.stride(3), k.stride(3), v.stride(3)) != 1:
        raise ValueError(f"vision_attention: q, k, v of one (B, H, N, Dh) shape with the head dim contiguous; got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    out = torch.empty(B, N, H, Dh, device=q.device, dtype=q.dtype)
    o = out.transpose(1, 2)                                                        # (B, H, N, Dh) view
    grid = (triton.cdiv(N, block_m), B * H)
    _vision_attention_kernel[grid](q, k, v, o, H, scale, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
                                   *o.stride()[:3], N=N, DH=Dh, BLOCK_D=max(16, triton.next_power_of_2(Dh)),
                                   BLOCK_M=block_m, BLOCK_N=block_n, num_warps=4, num_stages=2)
    return o


__all__ = ["vision_attention", "vision_attention_reference"]
