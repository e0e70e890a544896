"""The prefix attention's two implementations (ops.Ops.prefix_attention) compute the same thing: the mqa path
(heads stacked on the query axis, the key mask as a vector) and torch SDPA over (1, H, P, Dh) with the one K/V head
shared (enable_gqa) and a boolean key-padding mask. Run here on the CPU in fp32 with the math implementations;
on the GPU the load-time tuning picks the faster (test/gpu checks the engine's actions)."""

from __future__ import annotations

import pytest
import torch

from flashrt_core.engine.dispatch import EngineOptions, resolve
from flashrt_core.engine.hardware import CPU
from flashrt_core.engine.ops import PREFIX_ATTENTION_IMPLS, KeyMask, Ops


@pytest.mark.parametrize("impl", [i for i in PREFIX_ATTENTION_IMPLS if i.startswith("sdpa")])
def test_sdpa_and_mqa_prefix_attention_agree_with_padded_keys(impl):
    g = torch.Generator().manual_seed(3)
    P, H, Dh = 40, 4, 16
    q = torch.randn(P, H, Dh, generator=g) * Dh ** -0.5          # scaled, as the engine hands it over
    k, v = torch.randn(P, Dh, generator=g), torch.randn(P, Dh, generator=g)
    bias = torch.zeros(P)
    bias[33:] = float("-inf")                                    # text padding: keys no query may see
    ops = Ops(resolve(CPU, EngineOptions()))
    mqa = ops.prefix_attention(q, k, v, KeyMask(bias, P, None, H), impl="mqa")
    sdpa = ops.prefix_attention(q, k, v, KeyMask(bias, P, None, H), impl=impl)
    assert mqa.shape == sdpa.shape == (P, H * Dh)
    torch.testing.assert_close(sdpa, mqa, atol=1e-5, rtol=1e-5)
    # the masked keys really are excluded: changing them changes nothing
    v2 = v.clone()
    v2[33:] += 100.0
    torch.testing.assert_close(ops.prefix_attention(q, k, v2, KeyMask(bias, P, None, H), impl=impl), sdpa)
    # and the plain answer, written out
    logits = torch.einsum("phd,kd->hpk", q, k) + bias
    want = torch.einsum("hpk,kd->phd", torch.softmax(logits, dim=-1), v).reshape(P, H * Dh)
    torch.testing.assert_close(sdpa, want, atol=1e-5, rtol=1e-5)
