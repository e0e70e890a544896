"""tools/fp8_scope_emulation.py on the tiny pi0.5: the folded operands reproduce the reference when nothing is
quantized, each scope quantizes exactly its GEMMs (the action expert's too, and the weight alone), and a scope's
error shows in the cosine."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flashrt_core.checkpoint import load_model_weights
from flashrt_core.config import get_config
from flashrt_core.engine.gate import random_observation, reference_actions
from flashrt_core.executor import ReferenceExecutor
from flashrt_core.fixtures import write_random_checkpoint
from tools import fp8_scope_emulation as emu


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    ckpt = write_random_checkpoint(tmp_path_factory.mktemp("pi05_tiny"), "pi05_tiny", seed=3)
    return ckpt, get_config("pi05_tiny")


@pytest.fixture(scope="module")
def tiny_pi0(tmp_path_factory):
    ckpt = write_random_checkpoint(tmp_path_factory.mktemp("pi0_tiny"), "pi0_tiny", seed=3)
    return ckpt, get_config("pi0_tiny")


@pytest.mark.parametrize("model_name", ["tiny", "tiny_pi0"])
def test_the_folded_operands_compute_the_reference_gemms(model_name, request, monkeypatch):
    """With quantization replaced by the identity, every scope's GEMMs on the engine's operands (the norm's affine
    folded into the weight: pi0's action expert folds its RMSNorm's, pi0.5's adaRMSNorm folds nothing) give the
    reference's actions: the folding is right."""
    ckpt, cfg = request.getfixturevalue(model_name)
    obs = random_observation(cfg, np.random.default_rng(1), views=2, n_text=12, vocab=cfg.paligemma.vocab_size)
    want = reference_actions(ReferenceExecutor(load_model_weights(ckpt, cfg, "cpu", torch.float32), cfg,
                                               torch.device("cpu")), obs)
    model = load_model_weights(ckpt, cfg, "cpu", torch.float32)
    scopes = emu.attach(model)
    monkeypatch.setattr(emu, "quantize_dequantize", lambda t, scale: t)
    emu.switch(scopes, "+".join(emu.SCOPES))
    assert all(g.quantized for gemms in scopes.values() for g in gemms)
    assert len(scopes["expert_mlp"]) == 3 * len(model.expert.layers)             # gate, up and down per layer
    got = reference_actions(ReferenceExecutor(model, cfg, torch.device("cpu")), obs)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_each_scope_quantizes_its_gemms_and_costs_accuracy(tiny):
    ckpt, cfg = tiny
    model = load_model_weights(ckpt, cfg, "cpu", torch.float32)
    scopes = ["vision_mlp", "backbone_mlp+vision_mlp@row", "expert_mlp", "expert_attn@weight"]
    result = emu.emulate(model, cfg, [""] + scopes, report=lambda line: None)
    assert result[""] == pytest.approx([1.0] * emu.GATE_OBSERVATIONS, abs=1e-6)     # nothing quantized: exact
    for scope in scopes:
        assert all(0.9 < c < 1.0 - 1e-7 for c in result[scope]), (scope, result[scope])
    assert not any(g.quantized for g in emu.attach(load_model_weights(ckpt, cfg, "cpu", torch.float32))["vision_mlp"])
    with pytest.raises(ValueError, match="names of .* joined by '\\+'"):
        emu.switch(emu.attach(model), "vision_mlp@col")
