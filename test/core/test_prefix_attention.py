"""The prefix attention's two implementations (ops.Ops.prefix_attention) compute the same thing: the mqa path
(heads stacked on the query axis, the key mask as a vector) and torch SDPA over (1, H, P, Dh) with the one K/V head
shared (enable_gqa) and a boolean key-padding mask. Run here on the CPU in fp32 with the math implementations;
on the GPU the load-time tuning picks the faster (test/gpu checks the engine's actions)."""

from __future__ import annotations

import sys

import pytest
import torch

from flashrt_core.engine import tuning
from flashrt_core.engine.options import EngineOptions

from flashrt_core.engine.dispatch import resolve
from flashrt_core.engine.hardware import CPU
from flashrt_core.engine.kernel_configs import PREFIX_ATTENTION_IMPLS
from flashrt_core.engine.ops import KeyMask, Ops


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


def test_the_wgmma_kernel_joins_the_tuning_only_where_switched_on_and_served():
    """kernels/flashrt_kernels/prefix_attention.py is a candidate by default (EngineOptions.prefix_attention_wgmma; off with
    FLASHRT_PREFIX_ATTENTION_WGMMA=0) that also needs Gluon on a Hopper GPU: on the CPU it is never a candidate,
    switched on or not, and every other implementation stays one."""
    cpu = torch.device("cpu")
    others = [i for i in PREFIX_ATTENTION_IMPLS if not i.startswith("wgmma")]
    assert {"wgmma", "wgmma_overlap"} <= set(PREFIX_ATTENTION_IMPLS)
    assert EngineOptions().prefix_attention_wgmma
    for options in (EngineOptions(), EngineOptions(prefix_attention_wgmma=False)):
        ops = Ops(resolve(CPU, options))
        assert ops.prefix_attention_wgmma == options.prefix_attention_wgmma
        assert tuning.prefix_attention_candidates(ops, 576, 8, 256, cpu) == others
    assert not EngineOptions.from_env(env={"FLASHRT_PREFIX_ATTENTION_WGMMA": "0"}).prefix_attention_wgmma
    assert not Ops(resolve(CPU, EngineOptions(prefix_attention_wgmma=True, fast_paths=False))).prefix_attention_wgmma


def test_the_wgmma_launcher_refuses_what_it_cannot_serve_by_name():
    from flashrt_core.engine.kernel_import import load_kernels
    K = load_kernels()
    q, k = torch.zeros(64, 256, dtype=torch.bfloat16), torch.zeros(128, 256, dtype=torch.bfloat16)
    assert not K.prefix_attention_supported(64, 128, 256, torch.device("cpu"))
    with pytest.raises(ValueError, match="needs Gluon on a Hopper \\(sm90\\) GPU"):
        K.prefix_attention(q, k, k, torch.zeros(128))


def test_the_wgmma_forms_join_the_tuning_by_their_switch_where_the_kernel_serves_them(monkeypatch):
    """Where the kernel serves the shape (faked here: the CPU has no sm90), both wgmma forms join with
    prefix_attention_wgmma and none without it; at a prefix length the kernel does not serve (one key block) they
    stay out."""
    from flashrt_core.engine.kernel_import import load_kernels
    from flashrt_core.engine.kernel_configs import WGMMA_PREFIX_ATTENTION
    K = load_kernels()
    split_blocks = sys.modules[K.__name__ + ".prefix_attention"].split_blocks
    monkeypatch.setattr(K, "prefix_attention_supported",
                        lambda Mq, P, D, device, splits=1, block_n=64: split_blocks(P, splits, block_n) > 0)
    cpu = torch.device("cpu")
    base = [i for i in PREFIX_ATTENTION_IMPLS if not i.startswith("wgmma")]
    for wgmma, want in ((True, base + list(WGMMA_PREFIX_ATTENTION)), (False, base)):
        ops = Ops(resolve(CPU, EngineOptions(prefix_attention_wgmma=wgmma)))
        assert tuning.prefix_attention_candidates(ops, 576, 8, 256, cpu) == want, wgmma
    assert tuning.prefix_attention_candidates(Ops(resolve(CPU, EngineOptions())), 64, 8, 256, cpu) == base


def test_split_blocks_gives_every_program_at_least_two_key_blocks():
    from flashrt_core.engine.kernel_import import load_kernels
    K = load_kernels()
    split_blocks = sys.modules[K.__name__ + ".prefix_attention"].split_blocks
    assert split_blocks(560, 1, 64) == 9 and split_blocks(560, 2, 64) == 5 and split_blocks(560, 2, 32) == 9
    assert split_blocks(560, 3, 32) == 6 and split_blocks(832, 3, 32) == 9
    assert split_blocks(64, 1, 64) == 0 and split_blocks(65, 1, 64) == 2      # one block only: not served
    assert split_blocks(192, 2, 64) == 0                                     # 3 blocks: 2 + 1
    for P in range(33, 1200, 7):
        for splits in (1, 2, 3, 4):
            for block_n in (32, 64):
                per = split_blocks(P, splits, block_n)
                n_blocks = -(-P // block_n)
                if per:                 # the programs cover every block once, each with two or more
                    counts = [min(per, n_blocks - s * per) for s in range(splits)]
                    assert sum(counts) == n_blocks and min(counts) >= 2, (P, splits, block_n, counts)
