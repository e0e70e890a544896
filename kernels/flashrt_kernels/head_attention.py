"""Multi-head attention of a few query rows (GR00T's DiT: 17 rows per observation, 32 heads of 48), one kernel from
the Q/K/V GEMM's output to the O projection's input:

    out[b * T + i, h * Dh + d] = sum_j softmax_j(q[b, h, i] . k[b, h, j] * scale + mask[b, j]) v[b, h, j, d]

q, k, v are strided views (B, H, rows, Dh): Q (and for self-attention K and V) read in place from the row-major
(B * T, N) output of the merged Q/K/V GEMM, the cross-attention K / V from the backbone features' (B, L, H * Dh)
projections, so no transpose or copy runs before or after. mask: additive (B, L) (0 / -inf), or None. One program
per (batch, head): its T <= 64 query rows against every key in blocks of key_block(L), with the online softmax in fp32;
a query row whose keys are all masked gets zeros. The key count is a compile-time constant (one variant per
signature's self- and cross-attention lengths, compiled before a capture). Launched with PDL like the engine's other kernels, it replaces
torch's SDPA (whose kernel neither reads these strides without a copy nor takes part in PDL's hand-over).
"""

from __future__ import annotations

import torch

from ._triton import launch_options, release_dependents, tl, triton, wait_for_inputs

MAX_ROWS = 64           # query rows a program covers
MAX_BLOCK_N = 256       # keys per step at most (16-bit inputs; fp32 tiles take twice the room: half as many)


def key_block(keys: int, fp32: bool = False) -> int:
    """Keys per step: every key in one step up to MAX_BLOCK_N (32 at least). The steps of a program run one after
    another, each a dependent load of K and V: on the H200 the DiT's cross-attention (208 keys, 17 rows, 32 heads of
    48) takes 4.1 us in one 256-key step against 7.3 us in four of 64; its self-attention (17 keys) 2.1 us."""
    return min(MAX_BLOCK_N // (2 if fp32 else 1), max(32, triton.next_power_of_2(keys)))


def head_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                             scale: float) -> torch.Tensor:
    """Plain PyTorch. q (B, H, T, Dh), k / v (B, H, L, Dh), mask (B, L) additive or None -> (B * T, H * Dh) in q's
    dtype (fp32 softmax; a row with every key masked gives zeros)."""
    logits = torch.einsum("bhid,bhjd->bhij", q.float(), k.float()) * scale
    if mask is not None:
        logits = logits + mask.float()[:, None, None, :]
    weights = torch.softmax(logits, dim=-1).nan_to_num(0.0)
    out = torch.einsum("bhij,bhjd->bhid", weights, v.float())                      # (B, H, T, Dh)
    B, H, T, Dh = out.shape
    return out.transpose(1, 2).reshape(B * T, H * Dh).to(q.dtype)


@triton.jit
def _head_attention_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, out_ptr, T, H, scale,
                           sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, smb, sot,
                           KEYS: tl.constexpr, DH: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           HAS_MASK: tl.constexpr, FP32: tl.constexpr, PDL: tl.constexpr):
    release_dependents(PDL)
    pid = tl.program_id(0)
    b = pid // H
    h = pid % H
    rm = tl.arange(0, BLOCK_M)
    rd = tl.arange(0, BLOCK_D)
    d_ok = rd < DH
    wait_for_inputs(PDL)
    q = tl.load(q_ptr + b * sqb + h * sqh + rm[:, None] * sqt + rd[None, :],
                mask=(rm < T)[:, None] & d_ok[None, :], other=0.0)                     # (BLOCK_M, BLOCK_D)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(0, KEYS, BLOCK_N):
        rn = start + tl.arange(0, BLOCK_N)
        n_ok = rn < KEYS
        kt = tl.load(k_ptr + b * skb + h * skh + rn[None, :] * skt + rd[:, None],
                     mask=n_ok[None, :] & d_ok[:, None], other=0.0)                    # (BLOCK_D, BLOCK_N)
        if FP32:                                   # fp32 inputs: exact products, not TF32 (the tests' fp32 path)
            s = tl.dot(q, kt, input_precision="ieee") * scale
        else:
            s = tl.dot(q, kt) * scale
        if HAS_MASK:
            s += tl.load(mask_ptr + b * smb + rn, mask=n_ok, other=float("-inf")).to(tl.float32)[None, :]
        s = tl.where(n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)          # every key so far masked: no NaN
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        vv = tl.load(v_ptr + b * svb + h * svh + rn[:, None] * svt + rd[None, :],
                     mask=n_ok[:, None] & d_ok[None, :], other=0.0)                    # (BLOCK_N, BLOCK_D)
        if FP32:
            acc = acc * alpha[:, None] + tl.dot(p, vv, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(vv.dtype), vv)
        m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(out_ptr + (b * T + rm[:, None]) * sot + h * DH + rd[None, :], out.to(out_ptr.dtype.element_ty),
             mask=(rm < T)[:, None] & d_ok[None, :])


def head_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
                   out: torch.Tensor | None = None, pdl: bool | int = False, block_n: int | None = None,
                   num_warps: int = 4) -> torch.Tensor:
    """Triton launcher; head_attention_reference's contract. q (B, H, T <= 64, Dh), k / v (B, H, L, Dh), each with a
    unit stride along Dh; mask (B, L) with a unit stride along L, or None; out (B * T, H * Dh), contiguous.
    block_n: keys per step (None: key_block(L)); num_warps: the program's warps."""
    B, H, T, Dh = q.shape
    L = k.shape[2]
    if T > MAX_ROWS or k.shape[:2] != (B, H) or v.shape != k.shape or k.shape[3] != Dh or \
            q.stride(3) != 1 or k.stride(3) != 1 or v.stride(3) != 1:
        raise ValueError(f"head_attention: q (B, H, T <= {MAX_ROWS}, Dh), k / v (B, H, L, Dh) with unit Dh strides; "
                         f"got q {tuple(q.shape)} {q.stride()}, k {tuple(k.shape)} {k.stride()}, v {tuple(v.shape)}")
    if mask is not None and (mask.shape != (B, L) or mask.stride(1) != 1):
        raise ValueError(f"head_attention: mask must be ({B}, {L}) with a unit stride, got {tuple(mask.shape)}")
    if out is None:
        out = torch.empty(B * T, H * Dh, device=q.device, dtype=q.dtype)
    _head_attention_kernel[(B * H,)](
        q, k, v, mask if mask is not None else q, out, T, H, scale,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), mask.stride(0) if mask is not None else 0, out.stride(0),
        KEYS=L, DH=Dh, BLOCK_D=max(16, triton.next_power_of_2(Dh)),          # tl.dot: K and M at least 16
        BLOCK_M=max(16, triton.next_power_of_2(T)), BLOCK_N=block_n or key_block(L, q.dtype == torch.float32),
        HAS_MASK=mask is not None, FP32=q.dtype == torch.float32, PDL=int(pdl), num_warps=num_warps,
        **launch_options(pdl))
    return out
