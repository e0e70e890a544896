"""Weight-only FP8 of the action expert's GEMMs (fp8.quantize_rows / quantize_expert_weights), on the CPU: the
quantized copy sits beside the bf16 weight and dequantizes to it within E4M3's precision. The kernel that streams
it is checked against its reference in test/gpu/test_kernels.py (GPU, and on the CPU under Triton's interpreter);
the accuracy gate with it in test/gpu/test_engine_gpu.py. Also: the prepared layers' GEMM shapes, which the
kernels' tests and shape rules take from the config."""

from __future__ import annotations

import pytest
import torch

from flashrt_core.checkpoint import load_model_weights
from flashrt_core.config import get_config
from flashrt_core.engine.fp8 import quantize_expert_weights, quantize_rows
from flashrt_core.engine.weights import prepare_weights
from flashrt_core.fixtures import write_random_checkpoint

E4M3_REL = 2.0 ** -4          # E4M3 has 3 mantissa bits: relative rounding error <= 2^-4 for normal values


def test_rows_dequantize_within_e4m3_precision():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 256, generator=g) * torch.logspace(-3, 1, 64)[:, None]    # rows of very different scale
    w_q, scale = quantize_rows(w, torch.float8_e4m3fn)
    assert w_q.dtype == torch.float8_e4m3fn and scale.shape == (64,) and scale.dtype == torch.float32
    assert torch.allclose(w_q.float().abs().amax(dim=1), torch.full((64,), 448.0))   # each row uses the full range
    back = w_q.float() * scale[:, None]
    normal = w.abs() >= scale[:, None] * 2.0 ** -6                                   # E4M3 normals (min 2^-6)
    rel = ((back - w).abs() / w.abs().clamp(min=1e-30))[normal]
    assert rel.max() <= E4M3_REL + 1e-6
    assert ((back - w).abs() <= scale[:, None] * 2.0 ** -9 + 1e-12)[~normal].all()   # subnormal step 2^-9


@pytest.fixture(scope="module", params=["pi05_tiny", "pi0_tiny"])
def weights(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    write_random_checkpoint(path, request.param, seed=0)
    cfg = get_config(request.param)
    return prepare_weights(load_model_weights(path, cfg, "cpu", torch.bfloat16), torch.bfloat16, fold=True)


def test_every_expert_gemm_gets_a_weight_only_copy_once(weights):
    n = quantize_expert_weights(weights, "e4m3fn")
    lins = [lin for layer in weights.expert for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)]
    assert n == len(lins) == 4 * len(weights.expert)
    for lin in lins:
        (w, _), = lin.parts
        w_q, scale = lin.w_fp8
        assert w_q.shape == w.shape and w_q.dtype == torch.float8_e4m3fn and w.dtype == torch.bfloat16
        back = w_q.float() * scale[:, None]
        assert ((back - w.float()).norm() / w.float().norm()) < E4M3_REL / 2
    first = lins[0].w_fp8
    assert quantize_expert_weights(weights, "e4m3fn") == n and lins[0].w_fp8 is first    # shared: not redone
    for layer in weights.backbone:                                                         # the prefix untouched
        assert all(lin is None or lin.w_fp8 is None for lin in (layer.qkv, layer.o, layer.gate_up, layer.down))


def test_the_prepared_layers_have_the_gemm_shapes_the_config_names(weights):
    """GemmaConfig.layer_gemm_shapes (what the kernel tests, tools/kernel_resources.py and the shape rules take as
    a layer's GEMMs) is the (N, K) of the merged weights prepare_weights makes, for the expert and the backbone
    (whose last layer keeps only QKV)."""
    cfg = weights.config
    for layers, gemma in ((weights.expert, cfg.expert), (weights.backbone, cfg.paligemma)):
        want = gemma.layer_gemm_shapes()
        kept = [(kind, getattr(layer, kind)) for layer in layers for kind in want if getattr(layer, kind) is not None]
        assert len(kept) == 4 * len(layers) - 3 * (layers is weights.backbone)
        for kind, lin in kept:
            assert tuple(lin.parts[0][0].shape) == want[kind], (cfg.name, kind)
