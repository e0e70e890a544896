"""FP8 of the wide GEMMs (fp8.Fp8Linear / quantize_wide) on the CPU, where torch._scaled_mm runs too: the per-tensor
static path equals x @ W^T + b within E4M3's rounding, quantize_wide serves the backbone's gate/up and down GEMMs
and nothing else, and weights quantized already (shared with another executor) are kept. Speed and the accuracy
gate are GPU checks (tools/device_engine_checks.sh: bench, engine-gates)."""

from __future__ import annotations

import pytest
import torch

from flashrt_core.checkpoint import load_model_weights
from flashrt_core.config import get_config
from flashrt_core.engine.fp8 import Fp8Linear, quantize_wide, wide_linears
from flashrt_core.engine.weights import Linear, prepare_weights
from flashrt_core.fixtures import write_random_checkpoint

E4M3 = torch.float8_e4m3fn


def _layer(seed: int, n: int = 48, k: int = 256) -> Linear:
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16)
    b = (torch.randn(n, generator=g) * 0.1).to(torch.bfloat16)
    return Linear([(w, b)])


def test_per_tensor_fp8_matches_the_bf16_product():
    lin = _layer(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 256, generator=g).to(torch.bfloat16)
    fp8 = Fp8Linear(lin, float(x.float().abs().max()), E4M3)
    with pytest.raises(ValueError, match="takes a torch.float8_e4m3fn input"):
        fp8.matmul_quantized(x)                                  # bf16, not quantized
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


def test_quantize_wide_serves_the_backbone_mlp_only_and_keeps_shared_weights(weights):
    linears = wide_linears(weights)
    want = [lin for layer in weights.backbone for lin in (layer.gate_up, layer.down) if lin is not None]
    assert [id(lin) for lin in linears] == [id(lin) for lin in want] and linears
    amax = {id(lin): 1.0 for lin in linears}
    try:
        with pytest.raises(ValueError, match="did not see every wide GEMM"):
            quantize_wide(weights, dict(list(amax.items())[1:]), "e4m3fn")
        for lin in linears:
            lin.fp8 = None
        assert quantize_wide(weights, amax, "e4m3fn") == len(linears)
        first = [lin.fp8 for lin in linears]
        assert all(isinstance(f, Fp8Linear) and f.dtype == E4M3 for f in first)
        assert quantize_wide(weights, amax, "e4m3fn") == len(linears)                 # shared: kept as is
        assert all(lin.fp8 is f for lin, f in zip(linears, first))
        others = [lin for layer in weights.backbone for lin in (layer.qkv, layer.o) if lin is not None]
        others += [lin for layer in weights.vision for lin in (layer.qkv, layer.out, layer.fc1, layer.fc2)]
        assert all(lin.fp8 is None for lin in others + [weights.projector])
    finally:
        for lin in linears:
            lin.fp8 = None
