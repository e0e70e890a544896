"""pi0.5's expert with its adaRMSNorms folded into the GEMMs around them (EngineOptions.ada_norm_in_gemms,
forward._folded_layers) on the CPU: the folded ops run as their plain-PyTorch references (the kernels,
kernels/flashrt_kernels/smem_gemm.py norm_in / residual_out, need a Hopper GPU: test/gpu/test_kernels.py), so this
checks the forward's wiring (which modulation vector goes to which GEMM, the residual updates, the step's end)
against the unfolded forward on the same tiny weights, in fp32. The switch's dispatch is checked here too."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flashrt_core.checkpoint import load_model_weights
from flashrt_core.config import get_config
from flashrt_core.engine.dispatch import Op, eager_cpu_dispatch, resolve
from flashrt_core.engine.gate import random_observation
from flashrt_core.engine.graph_executor import EngineExecutor
from flashrt_core.engine.hardware import Hardware, Vendor
from flashrt_core.engine.kernel_import import load_kernels
from flashrt_core.engine.options import EngineOptions
from flashrt_core.fixtures import write_random_checkpoint

K = load_kernels()


def _fold_with_references(ops, monkeypatch) -> list[str]:
    """Make `ops` run the folded forward with the references of its folded ops; returns the log of folded calls."""
    calls: list[str] = []
    decoder, attention = ops.decoder, ops.decoder_attention

    def normed(residual, scale1p, shift, eps):
        y, _ = K.ada_rms_norm_reference(None, residual, None, scale1p, shift, eps, out_dtype=residual.dtype)
        return y

    def decoder_norm_in(lin, kind, residual, scale1p, shift, eps):
        calls.append(f"{kind} norm_in")
        return decoder(normed(residual, scale1p, shift, eps), lin, kind)

    def decoder_residual_out(x, lin, kind, residual, gate):
        calls.append(f"{kind} residual_out")
        y = decoder(x, lin, kind)
        return residual.add_(gate * (y.sum(0) if y.dim() == 3 else y))

    def decoder_attention(x, lin, *args, norm_in=None):
        if norm_in is not None:
            calls.append("qkv norm_in")
            x = normed(*norm_in)
        return attention(x, lin, *args)

    def ada_norm(*args, **kwargs):
        raise AssertionError("a folded layer runs no norm kernel")

    monkeypatch.setattr(ops, "folds_ada_norms", lambda y, layers: True)
    monkeypatch.setattr(ops, "decoder_norm_in", decoder_norm_in)
    monkeypatch.setattr(ops, "decoder_residual_out", decoder_residual_out)
    monkeypatch.setattr(ops, "decoder_attention", decoder_attention)
    if not ops.fused_denoise_step:     # the final norm still runs (the step's end), on the whole residual
        real = ops.ada_norm
        monkeypatch.setattr(ops, "ada_norm", lambda x, residual, gate, *a, **k: (
            ada_norm() if k.get("site") in ("norm1", "norm2") else real(x, residual, gate, *a, **k)))
    return calls


@pytest.mark.parametrize("fused_step_ends", [True, False])
def test_the_folded_expert_gives_the_unfolded_actions(tmp_path, monkeypatch, fused_step_ends):
    ckpt = tmp_path / "pi05"
    write_random_checkpoint(ckpt, "pi05_tiny", seed=11)
    cfg = get_config("pi05_tiny")
    model = load_model_weights(ckpt, cfg, "cpu", torch.float32)
    obs = random_observation(cfg, np.random.default_rng(4), views=2, n_text=7, vocab=cfg.paligemma.vocab_size)
    options = EngineOptions(text_buckets=(16,), fused_denoise_step=fused_step_ends)
    predict = lambda engine: engine.predict_observation(obs.images, obs.tokens, obs.token_mask, obs.state,  # noqa
                                                        obs.noise)
    want = predict(EngineExecutor(model, cfg, torch.device("cpu"), eager_cpu_dispatch(options), dtype=torch.float32))
    folded = EngineExecutor(model, cfg, torch.device("cpu"), eager_cpu_dispatch(options), dtype=torch.float32)
    calls = _fold_with_references(folded.ops, monkeypatch)
    got = predict(folded)
    steps, layers = len(folded.weights.dts), len(folded.weights.expert)
    assert calls == ["qkv norm_in", "o residual_out", "gate_up norm_in", "down residual_out"] * steps * layers
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)
    assert not np.allclose(want, 0)


def test_the_fold_is_opt_in_and_needs_the_shared_memory_gemm():
    hopper = Hardware(Vendor.NVIDIA, "NVIDIA H200", capability=(9, 0))
    assert resolve(hopper, EngineOptions())[Op.ADA_NORM_IN_GEMMS] == "separate"
    on = EngineOptions(ada_norm_in_gemms=True)
    expected = "folded" if K.HAVE_GLUON else "separate"          # the shared-memory GEMM is Gluon's
    assert resolve(hopper, on)[Op.ADA_NORM_IN_GEMMS] == expected
    assert resolve(hopper, EngineOptions(ada_norm_in_gemms=True, smem_gemm=False))[Op.ADA_NORM_IN_GEMMS] == "separate"
    assert resolve(Hardware(Vendor.NVIDIA, "NVIDIA A100", capability=(8, 0)), on)[Op.ADA_NORM_IN_GEMMS] == "separate"
    assert eager_cpu_dispatch(on)[Op.ADA_NORM_IN_GEMMS] == "separate"
    assert EngineOptions.from_env(env={"FLASHRT_ADA_NORM_IN_GEMMS": "1"}).ada_norm_in_gemms
