"""FP8 of the wide GEMMs (fp8.Fp8Linear / quantize_wide) on the CPU, where torch._scaled_mm runs too: the per-tensor
static path equals x @ W^T + b within E4M3's rounding, the accumulation mode (EngineOptions.fp8_fast_accum) reaches
every layer, and shared weights quantized with the other mode are refused by name. Speed and the accuracy gate of
fast accumulation are GPU checks (tools/device_engine_checks.sh: bench, engine-gates)."""

from __future__ import annotations

import pytest
import torch

from flashrt_core.checkpoint import load_model_weights
from flashrt_core.config import get_config
from flashrt_core.engine.dispatch import EngineOptions
from flashrt_core.engine.fp8 import Fp8Linear, quantize_wide, wide_linears
from flashrt_core.engine.weights import Linear, prepare_weights
from flashrt_core.fixtures import write_random_checkpoint

E4M3 = torch.float8_e4m3fn


def _layer(seed: int, n: int = 48, k: int = 256) -> Linear:
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16)
    b = (torch.randn(n, generator=g) * 0.1).to(torch.bfloat16)
    return Linear([(w, b)])


@pytest.mark.parametrize("fast_accum", [False, True])
def test_per_tensor_fp8_matches_the_bf16_product(fast_accum):
    lin = _layer(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 256, generator=g).to(torch.bfloat16)
    fp8 = Fp8Linear(lin, float(x.float().abs().max()), E4M3, "tensor", fast_accum=fast_accum)
    assert fp8.fast_accum is fast_accum
    xq = (x.float() * fp8.x_inv).clamp(-448, 448).to(E4M3)       # the input as the producer kernels quantize it
    got = fp8.matmul_quantized(xq).float()
    (w, b), = lin.parts
    want = x.float() @ w.float().T + b.float()
    cos = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
    assert cos > 0.998, cos                                      # E4M3 inputs and weights: ~2^-4 relative each
    assert (got - want).abs().max() < 0.1 * want.abs().max()


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    path = tmp_path_factory.mktemp("pi05_tiny")
    write_random_checkpoint(path, "pi05_tiny", seed=0)
    cfg = get_config("pi05_tiny")
    return prepare_weights(load_model_weights(path, cfg, "cpu", torch.bfloat16), torch.bfloat16, fold=True)


def test_the_accumulation_mode_reaches_every_layer_and_shared_weights_must_agree(weights):
    assert EngineOptions().fp8_fast_accum is False                                # opt-in until measured
    assert EngineOptions.from_env(env={"FLASHRT_FP8_FAST_ACCUM": "1"}).fp8_fast_accum
    linears = wide_linears(weights, "backbone_mlp")
    amax = {id(lin): 1.0 for lin in linears}
    try:
        assert quantize_wide(weights, amax, "e4m3fn", fast_accum=True) == len(linears) > 0
        assert all(lin.fp8.fast_accum for lin in linears)
        assert quantize_wide(weights, amax, "e4m3fn", fast_accum=True) == len(linears)   # shared: kept as is
        with pytest.raises(ValueError, match="fp8_fast_accum=True, this executor needs fp8_fast_accum=False"):
            quantize_wide(weights, amax, "e4m3fn", fast_accum=False)
    finally:
        for lin in linears:
            lin.fp8 = None
