"""tools/benchmark_denoise_ablation.py's Ablation on the CPU (the benchmark itself times CUDA graphs: GPU only), on a
tiny pi0.5 engine with the plain-PyTorch ops: each ablation leaves out exactly its ops in every layer of every step
(the actions change), and leaving the context restores the Ops, so the denoise gives the same actions again."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flashrt_core.checkpoint import load_model_weights
from flashrt_core.config import get_config
from flashrt_core.engine.dispatch import eager_cpu_dispatch
from flashrt_core.engine.forward import denoise, prefix, vision
from flashrt_core.engine.graph_executor import EngineExecutor
from flashrt_core.engine.options import EngineOptions
from flashrt_core.engine.gate import random_observation
from flashrt_core.fixtures import write_random_checkpoint
from tools.benchmark_denoise_ablation import ABLATIONS, Ablation


@pytest.fixture(scope="module")
def engine_and_inputs(tmp_path_factory):
    ckpt = tmp_path_factory.mktemp("pi05_tiny")
    write_random_checkpoint(ckpt, "pi05_tiny", seed=5)
    cfg = get_config("pi05_tiny")
    model = load_model_weights(ckpt, cfg, "cpu", torch.float32)
    engine = EngineExecutor(model, cfg, torch.device("cpu"), eager_cpu_dispatch(EngineOptions(text_buckets=(16,))),
                            dtype=torch.float32)
    obs = random_observation(cfg, np.random.default_rng(1), views=1, n_text=9, vocab=cfg.paligemma.vocab_size)
    engine.predict_observation(obs.images, obs.tokens, obs.token_mask, obs.state, obs.noise)
    entry = next(iter(engine.entries.values()))
    tokens = vision(entry.ws, engine.weights, engine.ops)
    bias, n_valid = prefix(entry.ws, engine.weights, engine.ops, tokens)
    return engine, entry.ws, bias, n_valid


def _denoised(engine, ws, bias, n_valid) -> torch.Tensor:
    denoise(ws, engine.weights, engine.ops, bias, n_valid)
    return ws.actions.clone()


def test_each_ablation_leaves_out_its_ops_in_every_layer_and_restores_them(engine_and_inputs):
    engine, ws, bias, n_valid = engine_and_inputs
    ops, w = engine.ops, engine.weights
    steps, layers = len(w.dts), len(w.expert)
    recorded: dict = {}
    with Ablation(ops, (), recorded) as whole:
        want = _denoised(engine, ws, bias, n_valid)
    assert whole.left_out == {} and {name for name, _ in recorded} == {"decoder", "decoder_attention"}
    first_norm_fused = steps * (1 if ops.fused_denoise_step else 0)    # the step's input kernel runs layer 0's
    expected = {"norms": 2 * steps * layers - first_norm_fused, "attention": steps * layers,
                **{kind: steps * layers for kind in ("qkv", "o", "gate_up", "down")}}
    for name, parts in ABLATIONS.items():
        if "attention_merge" in parts:       # the Triton attention's merge kernel: not on the CPU ops
            continue
        with Ablation(ops, parts, recorded) as ablation:
            got = _denoised(engine, ws, bias, n_valid)
        assert ablation.left_out == {part: expected[part] for part in parts}, name
        assert not torch.allclose(got, want), f"{name}: leaving ops out changed nothing"
        assert not {"decoder", "decoder_attention", "ada_norm"} & set(vars(ops)), name
        torch.testing.assert_close(_denoised(engine, ws, bias, n_valid), want, rtol=0, atol=0)


def test_an_unknown_part_or_an_unrecorded_op_is_named():
    with pytest.raises(ValueError, match="unknown ablation parts.*'mlp'"):
        Ablation(None, ("mlp",))
    with pytest.raises(RuntimeError, match="no recorded result of decoder"):
        Ablation(None, ("o",))._recorded("decoder", ("o", (10, 2048)))
