"""Gemma building blocks against their formulas (REFERENCE.md section 1)."""

import math

import torch

from flashrt_core.model.gemma import AdaRMSNorm, RMSNorm, attention, rope
from flashrt_core.model.pi_model import make_attention_mask, sincos_time_embedding

FP32_TOL = 1e-5


def test_rms_norm_formula():
    norm = RMSNorm(8, eps=1e-6)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(2, 3, 8)
    y, gate = norm(x)
    expected = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (1 + norm.weight)
    torch.testing.assert_close(y, expected, atol=FP32_TOL, rtol=FP32_TOL)
    assert gate is None


def test_ada_rms_norm_splits_scale_shift_gate_in_that_order():
    norm = AdaRMSNorm(4, cond_dim=6, eps=1e-6)
    x, cond = torch.randn(2, 3, 4), torch.randn(2, 6)
    y, gate = norm(x, cond)
    mod = cond @ norm.dense.weight.T + norm.dense.bias  # [2, 12]
    scale, shift, g = mod[:, None, :4], mod[:, None, 4:8], mod[:, None, 8:]
    rms = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(y, rms * (1 + scale) + shift, atol=FP32_TOL, rtol=FP32_TOL)
    torch.testing.assert_close(gate, g)


def test_rope_is_split_half_and_relative():
    head_dim = 8
    q, k = torch.randn(1, 1, 1, head_dim), torch.randn(1, 1, 1, head_dim)
    # split-half rotation at position p by angle p * 10000^(-2i/D) on pairs (i, i + D/2)
    p = 3
    rotated = rope(q, torch.tensor([[p]]), 10_000.0)[0, 0, 0]
    inv = 10_000.0 ** (-torch.arange(0, head_dim, 2).float() / head_dim)
    a, b = q[0, 0, 0, :4], q[0, 0, 0, 4:]
    cos, sin = torch.cos(p * inv), torch.sin(p * inv)
    expected = torch.cat([a * cos - b * sin, b * cos + a * sin])
    torch.testing.assert_close(rotated, expected, atol=FP32_TOL, rtol=FP32_TOL)

    def score(pq, pk):
        return (rope(q, torch.tensor([[pq]]), 1e4) * rope(k, torch.tensor([[pk]]), 1e4)).sum()

    torch.testing.assert_close(score(5, 2), score(13, 10), atol=1e-4, rtol=1e-4)


def test_attention_ignores_masked_keys_and_is_mqa():
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 5, 1, 8), torch.randn(1, 5, 1, 8)
    mask = torch.tensor([[[1, 1, 0, 1, 0], [1, 0, 0, 0, 0]]], dtype=torch.bool)
    out = attention(q, k, v, mask)  # [1, 2, 32]
    k2, v2 = k.clone(), v.clone()
    k2[:, [2, 4]] = 100.0
    v2[:, [2, 4]] = -100.0
    torch.testing.assert_close(attention(q, k2, v2, mask), out)
    # row 1 sees only key 0: output is v[0] for every head
    torch.testing.assert_close(out[0, 1].view(4, 8), v[0, 0, 0].expand(4, 8))
    # plain softmax reference for row 0, head 3
    logits = (q[0, 0, 3] @ k[0, [0, 1, 3], 0].T) / math.sqrt(8)
    expected = torch.softmax(logits, -1) @ v[0, [0, 1, 3], 0]
    torch.testing.assert_close(out[0, 0, 24:], expected, atol=FP32_TOL, rtol=FP32_TOL)


def test_pi0_style_mask_rules():
    # prefix of 3 (last one padding), then state token (ar=1), then 2 action tokens (first ar=1)
    valid = torch.tensor([[1, 1, 0, 1, 1, 1]], dtype=torch.bool)
    ar = torch.tensor([0, 0, 0, 1, 1, 0], dtype=torch.bool)
    m = make_attention_mask(valid, ar)[0].int()
    expected = torch.tensor([
        [1, 1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0],  # padded query attends nothing
        [1, 1, 0, 1, 0, 0],  # state: prefix + itself
        [1, 1, 0, 1, 1, 1],  # actions: prefix + state + all actions
        [1, 1, 0, 1, 1, 1],
    ])
    assert torch.equal(m, expected)


def test_time_embedding_is_sin_first_with_geometric_periods():
    t = torch.tensor([0.3])
    emb = sincos_time_embedding(t, 8, 4e-3, 4.0)
    periods = 4e-3 * (4.0 / 4e-3) ** torch.linspace(0, 1, 4, dtype=torch.float64)
    angles = 2 * math.pi * t.double()[0] / periods  # t is fp32 0.3
    torch.testing.assert_close(emb[0], torch.cat([angles.sin(), angles.cos()]).float())
