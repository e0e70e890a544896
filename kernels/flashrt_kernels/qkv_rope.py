"""QKV split + rotary position embedding + KV-cache write, one launch for all heads of all rows.

    qkv: (M, (H + 2*KVH) * Dh)   fused projection output, heads ordered [q_0..q_{H-1}, k_0.., v_0..]
    rope(x)[i]        = x[i] * cos(p f_i) - x[i + Dh/2] * sin(p f_i)        i < Dh/2  (split-half form)
    rope(x)[i + Dh/2] = x[i + Dh/2] * cos(p f_i) + x[i] * sin(p f_i),       f_i = 10000^(-2i/Dh)
    q_out[m, h]               = rope(q_h[m]) * q_scale                      (M, H, Dh)
    k_cache[g, offset + m]    = rope(k_g[m])                                (KVH, L, Dh)
    v_cache[g, offset + m]    = v_g[m]

With head_norm (Qwen3's q_norm / k_norm, (2, Dh) fp32: row 0 the query heads' weight, row 1 the key heads'), each
query and key head is RMS-normalized over its Dh values before the rotation:
    x <- x / sqrt(mean(x^2) + norm_eps) * head_norm[0 if query else 1]

p = pos[m] is read from a device tensor, so positions that depend on the input (valid prefix length) need no host
sync. cos/sin come from (max_pos, Dh/2) fp32 tables built once. Provenance: Gemma RoPE (rotate_half form);
FlashRT fuses split + RoPE + cache write the same way.
"""

from __future__ import annotations

import torch

from ._triton import launch_options, release_dependents, tl, triton, wait_for_inputs


def rope_tables(max_pos: int, head_dim: int, base: float = 10000.0, device: torch.device | str = "cpu"
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: (max_pos, head_dim // 2) fp32, computed in float64."""
    i = torch.arange(head_dim // 2, dtype=torch.float64)
    freq = base ** (-2.0 * i / head_dim)                                      # (Dh/2,)
    angle = torch.arange(max_pos, dtype=torch.float64)[:, None] * freq[None]  # (P, Dh/2)
    return angle.cos().float().to(device), angle.sin().float().to(device)


def _rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (M, n, Dh) fp32; cos, sin: (M, 1, Dh/2)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def _head_rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # x: (M, n, Dh) fp32, weight (Dh,): each head's RMSNorm
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


def qkv_rope_reference(qkv: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       q_out: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_offset: int,
                       num_heads: int, num_kv_heads: int, q_scale: float = 1.0,
                       head_norm: torch.Tensor | None = None, norm_eps: float = 1e-6) -> None:
    """Plain PyTorch, writes q_out (M, H, Dh) and rows [offset, offset+M) of k_cache/v_cache (KVH, L, Dh)."""
    M = qkv.shape[0]
    Dh = q_out.shape[-1]
    x = qkv.float().view(M, num_heads + 2 * num_kv_heads, Dh)                 # (M, H+2G, Dh)
    c, s = cos[pos][:, None], sin[pos][:, None]                               # (M, 1, Dh/2)
    q, k = x[:, :num_heads], x[:, num_heads:num_heads + num_kv_heads]
    if head_norm is not None:
        q, k = _head_rms(q, head_norm[0], norm_eps), _head_rms(k, head_norm[1], norm_eps)
    q = _rope_ref(q, c, s) * q_scale                                          # (M, H, Dh)
    k = _rope_ref(k, c, s)                                                    # (M, G, Dh)
    v = x[:, num_heads + num_kv_heads:]                                       # (M, G, Dh)
    q_out.copy_(q.to(q_out.dtype))
    k_cache[:, cache_offset:cache_offset + M].copy_(k.transpose(0, 1).to(k_cache.dtype))
    v_cache[:, cache_offset:cache_offset + M].copy_(v.transpose(0, 1).to(v_cache.dtype))


@triton.jit
def rope_rotate(x1, x2, p, d, row_ok, cos_ptr, sin_ptr, HALF: tl.constexpr):
    """The split-half rotation in fp32 of the column pairs (d, d + HALF) of rows at positions p: (x1 cos - x2 sin,
    x2 cos + x1 sin) with cos / sin from the tables' rows p (zeros where not row_ok). x1, x2: (rows, len(d))."""
    c = tl.load(cos_ptr + p[:, None] * HALF + d[None, :], mask=row_ok[:, None], other=0.0)
    s = tl.load(sin_ptr + p[:, None] * HALF + d[None, :], mask=row_ok[:, None], other=0.0)
    return x1 * c - x2 * s, x2 * c + x1 * s


@triton.jit
def rope_and_store_head(x1, x2, rows, d, row_ok, head, pos_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, cache_offset,
                        q_scale, stride_q_m, stride_q_h, stride_cache_g, stride_cache_l, H: tl.constexpr,
                        G: tl.constexpr, HALF: tl.constexpr):
    """The column pairs (d, d + HALF) of one head of the QKV rows, x1 and x2 in fp32, to where they go: a query head
    (head < H) rotated and scaled into q_out, a key head (H..H+G-1) rotated into the key cache, a value head as it
    is into the value cache (cache rows cache_offset + rows). qkv_rope's and qkv_gemm_rope's epilogue."""
    mask = row_ok[:, None]
    if head < H + G:
        p = tl.load(pos_ptr + rows, mask=row_ok, other=0)
        y1, y2 = rope_rotate(x1, x2, p, d, row_ok, cos_ptr, sin_ptr, HALF)
        if head < H:
            dst = q_ptr + rows[:, None] * stride_q_m + head * stride_q_h + d[None, :]
            tl.store(dst, (y1 * q_scale).to(q_ptr.dtype.element_ty), mask=mask)
            tl.store(dst + HALF, (y2 * q_scale).to(q_ptr.dtype.element_ty), mask=mask)
        else:
            dst = k_ptr + (head - H) * stride_cache_g + (cache_offset + rows[:, None]) * stride_cache_l + d[None, :]
            tl.store(dst, y1.to(k_ptr.dtype.element_ty), mask=mask)
            tl.store(dst + HALF, y2.to(k_ptr.dtype.element_ty), mask=mask)
    else:
        dst = v_ptr + (head - H - G) * stride_cache_g + (cache_offset + rows[:, None]) * stride_cache_l + d[None, :]
        tl.store(dst, x1.to(v_ptr.dtype.element_ty), mask=mask)
        tl.store(dst + HALF, x2.to(v_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _qkv_rope_kernel(qkv_ptr, pos_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, norm_ptr, M, cache_offset, q_scale,
                     norm_eps, stride_qkv, stride_q_m, stride_q_h, stride_cache_g, stride_cache_l,
                     H: tl.constexpr, G: tl.constexpr, HALF: tl.constexpr, BLOCK_M: tl.constexpr,
                     PDL: tl.constexpr, HEAD_NORM: tl.constexpr = False):
    release_dependents(PDL)
    wait_for_inputs(PDL)
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)                     # (BLOCK_M,) rows
    head = tl.program_id(1)                  # 0..H-1: q, H..H+G-1: k, H+G..H+2G-1: v
    i = tl.arange(0, HALF)
    row_ok = m < M
    src = qkv_ptr + m[:, None] * stride_qkv + head * (2 * HALF) + i[None, :]      # (BLOCK_M, HALF)
    x1 = tl.load(src, mask=row_ok[:, None], other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=row_ok[:, None], other=0.0).to(tl.float32)
    if HEAD_NORM:
        if head < H + G:                     # query and key heads: RMSNorm over the head's 2 * HALF values
            r = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * HALF) + norm_eps)
            w = norm_ptr + (head >= H).to(tl.int32) * (2 * HALF) + i
            x1 = x1 * r[:, None] * tl.load(w)[None, :]
            x2 = x2 * r[:, None] * tl.load(w + HALF)[None, :]
    rope_and_store_head(x1, x2, m, i, row_ok, head, pos_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr, cache_offset,
                        q_scale, stride_q_m, stride_q_h, stride_cache_g, stride_cache_l, H, G, HALF)


# Rows per program. One row per one-warp program moves the prefix's ~6 MB (576 rows) in 7.8 us on the H200 (18
# launches: 141 us per predict), ~0.8 TB/s: 5,760 programs of 512-byte loads. From QKV_ROPE_WIDE_ROWS rows on, a
# program takes QKV_ROPE_BLOCK_ROWS rows with 4 warps (16-byte loads per thread, 720 programs for the prefix:
# 18 x 2.8 us = 51 us per predict); GR00T's Qwen3 prompt (208 rows, 32 heads with q/k norms) the same way. Fewer
# rows (the denoising steps) keep one row per program, where more programs mean more of the GPU. A launcher's
# rows_per_program pins it (1 = the one-row programs).
QKV_ROPE_BLOCK_ROWS = 8
QKV_ROPE_WIDE_ROWS = 128
QKV_ROPE_ROW_CHOICES = (1, 2, 4, 8, 16)


def qkv_rope_rows_per_program(M: int, rows_per_program: int | None = None) -> int:
    """The kernel's rows per program for M rows: rows_per_program where given, else QKV_ROPE_BLOCK_ROWS from
    QKV_ROPE_WIDE_ROWS rows on and 1 below."""
    if rows_per_program is not None:
        if rows_per_program not in QKV_ROPE_ROW_CHOICES:
            raise ValueError(f"qkv_rope: rows_per_program must be one of {QKV_ROPE_ROW_CHOICES}, "
                             f"got {rows_per_program!r}")
        return rows_per_program
    return QKV_ROPE_BLOCK_ROWS if M >= QKV_ROPE_WIDE_ROWS else 1


def qkv_rope(qkv: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, q_out: torch.Tensor,
             k_cache: torch.Tensor, v_cache: torch.Tensor, cache_offset: int, num_heads: int, num_kv_heads: int,
             q_scale: float = 1.0, pdl: bool = False, rows_per_program: int | None = None,
             head_norm: torch.Tensor | None = None, norm_eps: float = 1e-6) -> None:
    """Triton launcher; same contract as qkv_rope_reference. Head dim must be a power of two (Gemma: 256, Qwen3:
    128). rows_per_program: see qkv_rope_rows_per_program (None: by the row count). head_norm: (2, Dh) fp32."""
    M = qkv.shape[0]
    G, L, Dh = k_cache.shape
    if G != num_kv_heads or v_cache.shape != k_cache.shape or k_cache.stride() != v_cache.stride():
        raise ValueError(f"qkv_rope: caches must both be ({num_kv_heads}, L, Dh), got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    if qkv.shape[1] != (num_heads + 2 * num_kv_heads) * Dh or qkv.stride(1) != 1:
        raise ValueError(f"qkv_rope: qkv must be ({M}, {(num_heads + 2 * num_kv_heads) * Dh}), got "
                         f"{tuple(qkv.shape)}")
    if q_out.shape != (M, num_heads, Dh) or q_out.stride(2) != 1 or k_cache.stride(2) != 1:
        raise ValueError(f"qkv_rope: q_out must be ({M}, {num_heads}, {Dh}), got {tuple(q_out.shape)}")
    if Dh & (Dh - 1) or cos.shape[1] != Dh // 2 or pos.shape != (M,):
        raise ValueError(f"qkv_rope: head dim {Dh} must be a power of two with ({Dh // 2})-wide tables and "
                         f"pos ({M},); got tables {tuple(cos.shape)}, pos {tuple(pos.shape)}")
    if cache_offset + M > L:
        raise ValueError(f"qkv_rope: rows [{cache_offset}, {cache_offset + M}) exceed cache length {L}")
    if head_norm is not None and (head_norm.shape != (2, Dh) or head_norm.dtype != torch.float32
                                  or not head_norm.is_contiguous()):
        raise ValueError(f"qkv_rope: head_norm must be a contiguous (2, {Dh}) fp32 tensor (query and key heads' "
                         f"weights), got {tuple(head_norm.shape)} {head_norm.dtype}")
    block_m = qkv_rope_rows_per_program(M, rows_per_program)
    _qkv_rope_kernel[(triton.cdiv(M, block_m), num_heads + 2 * num_kv_heads)](
        qkv, pos, cos, sin, q_out, k_cache, v_cache, qkv if head_norm is None else head_norm, M, cache_offset,
        q_scale, norm_eps, qkv.stride(0), q_out.stride(0), q_out.stride(1), k_cache.stride(0), k_cache.stride(1),
        H=num_heads, G=num_kv_heads, HALF=Dh // 2, BLOCK_M=block_m, PDL=pdl, HEAD_NORM=head_norm is not None,
        num_warps=1 if block_m == 1 else 4, **launch_options(pdl))
