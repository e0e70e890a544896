"""Random checkpoint writer: real key layout and dtypes, determinism, norm-stats formats, CLI."""

import json
import zlib

import numpy as np
import torch
from safetensors import safe_open

from flashrt_core import fixtures, normalization
from flashrt_core.checkpoint import EMBED_TOKENS, KNOWN_UNUSED, TIED_LM_HEAD, weight_spec
from flashrt_core.config import get_config
from flashrt_core.tokenizer import PromptTokenizer


def read_all(path):
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def test_layout_dtypes_and_files(tmp_path):
    out = fixtures.write_random_checkpoint(tmp_path / "a", "pi05_tiny", seed=1)
    tensors = read_all(out)
    spec = weight_spec(get_config("pi05_tiny"), torch.bfloat16)
    expected = {"model." + n for n in spec} | {"model." + TIED_LM_HEAD, "model." + KNOWN_UNUSED[0]}
    assert set(tensors) == expected
    for name, (shape, dtype) in spec.items():
        t = tensors["model." + name]
        assert (tuple(t.shape), t.dtype) == (shape, dtype), name
    assert torch.equal(tensors["model." + TIED_LM_HEAD], tensors["model." + EMBED_TOKENS])
    # sane scales: Gemma norms near 0 (scaled by 1 + w), adaRMS gate bias near 1, weights ~ fan_in^-1/2
    norm = tensors["model.paligemma_with_expert.paligemma.model.language_model.norm.weight"].float()
    assert norm.abs().max() < 0.2
    gate_bias = tensors["model.paligemma_with_expert.gemma_expert.model.layers.0.input_layernorm.dense.bias"][64:]
    assert abs(gate_bias.float().mean() - 1.0) < 0.05
    q = tensors["model.paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.q_proj.weight"]
    assert abs(q.float().std() - 64**-0.5) < 0.03
    record = json.loads((out / fixtures.CONFIG_FILE).read_text())
    assert record["config"] == "pi05_tiny" and record["seed"] == 1
    assert PromptTokenizer(out / fixtures.TOKENIZER_FILE).vocab_size == 1024
    stats = normalization.load_norm_stats(out)
    assert stats.state.dim == 32 and stats.actions.dim == 32


def test_seed_determinism(tmp_path):
    a = fixtures.write_random_checkpoint(tmp_path / "a", "pi0_tiny", seed=4, prefix_model=False)
    b = fixtures.write_random_checkpoint(tmp_path / "b", "pi0_tiny", seed=4, prefix_model=False)
    c = fixtures.write_random_checkpoint(tmp_path / "c", "pi0_tiny", seed=5, prefix_model=False)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    ta, tc = read_all(a), read_all(c)
    assert "state_proj.weight" in ta and "time_mlp_in.weight" not in ta
    assert not torch.equal(ta["action_in_proj.weight"], tc["action_in_proj.weight"])


def test_streaming_writer_holds_each_tensors_own_draw_in_every_dtype(tmp_path):
    """write_safetensors_streaming draws every tensor into two reused buffers and writes from them on a thread:
    what it writes is, tensor by tensor, what safetensors holds for the same tensors drawn afresh
    (torch.randn(shape) * std and the rest of _random_tensor's formulas, then cast), in bf16, fp16 and fp32 in one
    file, with a tensor larger and one smaller than the one before it, a scalar and an empty one among them."""
    from safetensors.torch import save_file
    names = ["vision_model.encoder.layers.0.layer_norm1.weight", "layers.0.input_layernorm.dense.bias",
             "embed_tokens.weight", "mlp.down_proj.weight", "model.norm.weight", "x.bias", "empty.weight"]
    shapes = [(24,), (48,), (300, 16), (32, 24), (), (7,), (0, 5)]
    dtypes = [torch.float32, torch.bfloat16, torch.bfloat16, torch.float16, torch.float32, torch.bfloat16,
              torch.bfloat16]
    plan = {f"t{i}." + name: (shape, dtype, name) for i, (name, shape, dtype) in enumerate(zip(names, shapes, dtypes))}
    path = tmp_path / "streamed.safetensors"
    fixtures.write_safetensors_streaming(path, plan, lambda name, shape, out: fixtures._random_tensor(name, shape, 3,
                                                                                                      out))
    fresh = {key: fixtures._random_tensor(source, shape, 3).to(dtype) for key, (shape, dtype, source) in plan.items()}
    save_file(fresh, str(tmp_path / "fresh.safetensors"))
    with safe_open(str(path), framework="pt") as f, safe_open(str(tmp_path / "fresh.safetensors"), "pt") as g:
        assert sorted(f.keys()) == sorted(g.keys()) == sorted(plan)
        for key in plan:
            got, want = f.get_tensor(key), g.get_tensor(key)
            assert got.dtype == want.dtype and got.shape == want.shape, key
            assert torch.equal(got, want), key
    # the draws of earlier sessions' checkpoints (before the buffers were reused): torch.randn(shape) * fan_in^-1/2
    gen = torch.Generator().manual_seed(3 * 1_000_003 + zlib.crc32(b"mlp.down_proj.weight"))
    assert torch.equal(fresh["t3.mlp.down_proj.weight"], (torch.randn((32, 24), generator=gen) * 24**-0.5).half())
    gate = fresh["t1.layers.0.input_layernorm.dense.bias"].float()
    assert gate[32:].mean() > 0.9 and gate[:32].abs().mean() < 0.1         # the formulas ran: gate bias ~ 1
    assert not torch.equal(fresh["t2.embed_tokens.weight"][:2], fresh["t2.embed_tokens.weight"][2:4])


def test_lerobot_norm_stats_hold_the_same_values(tmp_path):
    overrides = {"state_dim": 8, "action_dim": 7}
    a = fixtures.write_random_checkpoint(tmp_path / "a", "pi05_tiny", seed=2, overrides=overrides)
    b = fixtures.write_random_checkpoint(tmp_path / "b", "pi05_tiny", seed=2, norm_stats="lerobot", overrides=overrides)
    assert not (b / fixtures.NORM_STATS_FILE).exists()
    sa, sb = normalization.load_norm_stats(a), normalization.load_norm_stats(b)
    assert sa.state.dim == 8 and sa.actions.dim == 7
    np.testing.assert_allclose(sb.actions.q99, sa.actions.q99, rtol=1e-6)
    np.testing.assert_allclose(sb.state.mean, sa.state.mean, rtol=1e-6)
    assert json.loads((b / fixtures.CONFIG_FILE).read_text())["overrides"] == overrides


def test_cli_writes_a_loadable_checkpoint(tmp_path, capsys):
    fixtures.main([str(tmp_path / "cli"), "--config", "pi0_tiny", "--seed", "7", "--dtype", "float32",
                   "--state-dim", "6", "--action-dim", "5"])
    assert capsys.readouterr().out.strip() == str(tmp_path / "cli")
    tensors = read_all(tmp_path / "cli")
    assert all(t.dtype == torch.float32 for t in tensors.values())
    from flashrt_core.api import load_model

    policy = load_model(tmp_path / "cli", device="cpu")
    assert (policy.config.name, policy.state_dim, policy.action_dim, policy.horizon) == ("pi0_tiny", 6, 5, 50)
    actions = policy.predict([np.zeros((32, 32, 3), np.uint8)], "wave", state=np.zeros(6))
    assert actions.shape == (50, 5) and actions.dtype == np.float32
