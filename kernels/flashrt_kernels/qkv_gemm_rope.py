"""Decoder QKV projection with the RoPE / q-scale / KV-cache write as its epilogue, one launch per layer and step.

    qkv = x @ W_qkv^T           x (M, K) with few rows (the denoising steps), W_qkv ((H + 2*KVH) * Dh, K)
    then exactly kernels/flashrt_kernels/qkv_rope.py on qkv:  q_out = rope(q) * q_scale, k_cache[offset + m] = rope(k),
                                              v_cache[offset + m] = v

RoPE (split-half form) pairs column i of a head with column i + Dh/2. Program (head, chunk) accumulates both
column blocks of its BLOCK_P pairs, so the rotation is applied to the fp32 accumulators and the projection output
never goes to memory: the separate QKV GEMM + qkv_rope pair of launches becomes one, and the qkv tensor is not
rounded to bf16 in between (the reference below keeps fp32 there too).
Provenance: FlashRT fuses the QKV boundary (split + RoPE + cache write); the GEMM part is kernels/flashrt_kernels/skinny_gemm.py's.
"""

from __future__ import annotations

import torch

from ._triton import launch_options, release_dependents, tl, triton, wait_for_inputs
from .qkv_rope import qkv_rope_reference, rope_and_store_head
from .skinny_gemm import row_tile


def qkv_gemm_rope_reference(x: torch.Tensor, w: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor,
                            sin: torch.Tensor, q_out: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            cache_offset: int, num_heads: int, num_kv_heads: int, q_scale: float = 1.0) -> None:
    """Plain PyTorch: the fp32 product, then qkv_rope_reference (writes q_out and the cache rows)."""
    qkv_rope_reference(x.float() @ w.float().T, pos, cos, sin, q_out, k_cache, v_cache, cache_offset, num_heads,
                       num_kv_heads, q_scale)


@triton.jit
def _qkv_gemm_rope_kernel(x_ptr, w_ptr, pos_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, M, K, cache_offset, q_scale,
                          stride_x, stride_w, stride_q_m, stride_q_h, stride_cache_g, stride_cache_l,
                          H: tl.constexpr, G: tl.constexpr, HALF: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    release_dependents(PDL)
    pid = tl.program_id(0)
    head = pid // (HALF // BLOCK_P)                  # 0..H-1: q, H..H+G-1: k, H+G..H+2G-1: v
    d = (pid % (HALF // BLOCK_P)) * BLOCK_P + tl.arange(0, BLOCK_P)           # (BLOCK_P,) dims < Dh/2
    rows_a = head * (2 * HALF) + d                   # W rows of the first halves of the pairs ...
    rows_b = rows_a + HALF                           # ... and of their partners
    rm = tl.arange(0, BLOCK_M)
    m_ok = rm < M
    rk = tl.arange(0, BLOCK_K)
    wait_for_inputs(PDL)
    acc_a = tl.zeros([BLOCK_M, BLOCK_P], tl.float32)
    acc_b = tl.zeros([BLOCK_M, BLOCK_P], tl.float32)
    for k in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + rm[:, None] * stride_x + (k + rk)[None, :], mask=m_ok[:, None], other=0.0)
        wa = tl.load(w_ptr + rows_a[:, None] * stride_w + (k + rk)[None, :])
        wb = tl.load(w_ptr + rows_b[:, None] * stride_w + (k + rk)[None, :])
        acc_a += tl.dot(x, tl.trans(wa))
        acc_b += tl.dot(x, tl.trans(wb))
    rope_and_store_head(acc_a, acc_b, rm, d, m_ok, head, pos_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr,
                        cache_offset, q_scale, stride_q_m, stride_q_h, stride_cache_g, stride_cache_l, H, G, HALF)


def qkv_gemm_rope(x: torch.Tensor, w: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  q_out: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_offset: int,
                  num_heads: int, num_kv_heads: int, q_scale: float = 1.0, block_p: int = 16, block_k: int = 128,
                  num_stages: int = 4, num_warps: int = 4, pdl: bool = False) -> None:
    """Triton launcher; contract of qkv_gemm_rope_reference. x (M <= 64, K) with unit column stride, W contiguous;
    caches (KVH, L, Dh); head dim a power of two; block_p divides Dh/2 and block_k divides K."""
    M, K = x.shape
    G, L, Dh = k_cache.shape
    n_heads = num_heads + 2 * num_kv_heads
    if M > 64 or x.stride(1) != 1 or w.shape != (n_heads * Dh, K) or not w.is_contiguous():
        raise ValueError(f"qkv_gemm_rope: x (M<=64, K) and contiguous W ({n_heads * Dh}, K); got x "
                         f"{tuple(x.shape)}, W {tuple(w.shape)}")
    if G != num_kv_heads or v_cache.shape != k_cache.shape or k_cache.stride() != v_cache.stride() or \
            k_cache.stride(2) != 1:
        raise ValueError(f"qkv_gemm_rope: caches must both be ({num_kv_heads}, L, Dh) with a contiguous head dim, "
                         f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if q_out.shape != (M, num_heads, Dh) or q_out.stride(2) != 1:
        raise ValueError(f"qkv_gemm_rope: q_out must be ({M}, {num_heads}, {Dh}), got {tuple(q_out.shape)}")
    if Dh & (Dh - 1) or (Dh // 2) % block_p or K % block_k or cos.shape[1] != Dh // 2 or pos.shape != (M,):
        raise ValueError(f"qkv_gemm_rope: head dim {Dh} (a power of two, Dh/2 divisible by block_p={block_p}), "
                         f"K={K} divisible by block_k={block_k}, ({Dh // 2})-wide tables and pos ({M},); got "
                         f"tables {tuple(cos.shape)}, pos {tuple(pos.shape)}")
    if cache_offset + M > L:
        raise ValueError(f"qkv_gemm_rope: rows [{cache_offset}, {cache_offset + M}) exceed cache length {L}")
    block_m = row_tile(M)
    grid = (n_heads * (Dh // 2 // block_p),)
    _qkv_gemm_rope_kernel[grid](
        x, w, pos, cos, sin, q_out, k_cache, v_cache, M, K, cache_offset, q_scale,
        x.stride(0), w.stride(0), q_out.stride(0), q_out.stride(1), k_cache.stride(0), k_cache.stride(1),
        H=num_heads, G=num_kv_heads, HALF=Dh // 2, BLOCK_M=block_m, BLOCK_P=block_p, BLOCK_K=block_k, PDL=pdl,
        num_warps=num_warps, num_stages=num_stages, **launch_options(pdl))
