"""tools/benchmark_prefix_attention.py: its fp32 reference is the engine's prefix attention (checked here on the
CPU against Ops.prefix_attention with padded keys), and without a GPU it stops with a message instead of timing.
The GPU numbers come from the device."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tools"))

import benchmark_prefix_attention as bench  # noqa: E402

from flashrt_core.engine.options import EngineOptions  # noqa: E402

from flashrt_core.engine.dispatch import resolve  # noqa: E402
from flashrt_core.engine.hardware import CPU  # noqa: E402
from flashrt_core.engine.ops import KeyMask, Ops  # noqa: E402


def test_reference_is_the_engines_prefix_attention_over_the_valid_keys():
    g = torch.Generator().manual_seed(5)
    P, H, Dh, valid = 24, 4, 16, 19
    q = torch.randn(P, H, Dh, generator=g) * Dh ** -0.5
    k, v = torch.randn(P, Dh, generator=g), torch.randn(P, Dh, generator=g)
    bias = torch.zeros(P)
    bias[valid:] = float("-inf")
    engine = Ops(resolve(CPU, EngineOptions())).prefix_attention(q, k, v, KeyMask(bias, P, None, H), impl="mqa")
    want = bench.reference(q, k, v, valid)
    assert want.shape == (P, H * Dh)
    torch.testing.assert_close(want, engine, atol=1e-5, rtol=1e-5)
    # the padded keys are outside it: changing them changes nothing, changing a valid one does
    v2 = v.clone()
    v2[valid:] += 50.0
    torch.testing.assert_close(bench.reference(q, k, v2, valid), want)
    v2[0] += 50.0
    assert not torch.allclose(bench.reference(q, k, v2, valid), want)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit")
def test_without_a_gpu_it_stops_with_a_message():
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        bench.main([])
