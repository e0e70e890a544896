"""Checkpoint weight table and loading: layout of real checkpoints, name variants, refusals by name."""

import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from flashrt_core.api import load_model
from flashrt_core.checkpoint import WEIGHTS_FILE, load_model_weights, weight_spec
from flashrt_core.config import get_config
from flashrt_core.errors import CheckpointError
from flashrt_core.fixtures import write_random_checkpoint

# lerobot 0.6.1 PI05Pytorch state_dict (REFERENCE.md / lerobot_pi05_keys.txt): 813 tensors, 4,143,404,816
# elements, two of them the lm_heads (257152 x 2048 tied to embed_tokens, 257152 x 1024 unused).
LEROBOT_PI05_TENSORS = 813
LEROBOT_PI05_ELEMENTS = 4_143_404_816
LM_HEAD_ELEMENTS = 257152 * 2048 + 257152 * 1024
# bf16 weights vs fp32 weights on the same checkpoint: actions stay strongly aligned.
BF16_COSINE_MIN = 0.99

IMAGES = [np.full((48, 64, 3), 90, np.uint8), np.full((30, 30, 3), 200, np.uint8)]
NOISE = np.random.default_rng(5).standard_normal((10, 32)).astype(np.float32)
STATE = np.linspace(-1, 1, 32)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    base = tmp_path_factory.mktemp("ckpt")
    return {
        "prefixed": write_random_checkpoint(base / "prefixed", "pi05_tiny", seed=3),
        "bare": write_random_checkpoint(base / "bare", "pi05_tiny", seed=3, prefix_model=False),
        "tied": write_random_checkpoint(base / "tied", "pi05_tiny", seed=3, drop_embed_tokens=True,
                                        include_lm_heads=False),
    }


def predict(path, **kw):
    policy = load_model(path, device="cpu", hardware="reference", **kw)
    try:
        return policy.predict(IMAGES, "stack the blocks", state=STATE, noise=NOISE)
    finally:
        policy.close()


def rewrite(src, dst, edit):
    """Copy a checkpoint directory with model.safetensors passed through edit(dict) -> dict."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name != WEIGHTS_FILE:
            (dst / f.name).write_bytes(f.read_bytes())
    save_file(edit(load_file(src / WEIGHTS_FILE)), dst / WEIGHTS_FILE)
    return dst


def test_spec_matches_lerobot_pi05_layout():
    spec = weight_spec(get_config("pi05"))
    assert len(spec) + 2 == LEROBOT_PI05_TENSORS
    assert sum(math.prod(shape) for shape, _ in spec.values()) + LM_HEAD_ELEMENTS == LEROBOT_PI05_ELEMENTS
    expert = "paligemma_with_expert.gemma_expert.model."
    assert spec[expert + "layers.17.input_layernorm.dense.weight"] == ((3072, 1024), torch.float32)
    assert spec[expert + "norm.dense.bias"] == ((3072,), torch.float32)
    assert spec[expert + "layers.0.self_attn.o_proj.weight"] == ((1024, 2048), torch.bfloat16)
    assert spec["paligemma_with_expert.paligemma.model.language_model.layers.0.mlp.down_proj.weight"] == \
        ((2048, 16384), torch.bfloat16)
    vision = "paligemma_with_expert.paligemma.model.vision_tower.vision_model."
    assert spec[vision + "embeddings.patch_embedding.weight"] == ((1152, 3, 14, 14), torch.float32)
    assert spec[vision + "encoder.layers.26.mlp.fc1.weight"][0] == (4304, 1152)
    assert spec["time_mlp_in.weight"][0] == (1024, 1024)
    assert "state_proj.weight" not in spec


def test_spec_of_pi0_has_state_and_action_time_mlp():
    spec = weight_spec(get_config("pi0"))
    assert spec["state_proj.weight"][0] == (1024, 32)
    assert spec["action_time_mlp_in.weight"][0] == (1024, 2048)
    assert spec["paligemma_with_expert.gemma_expert.model.layers.3.input_layernorm.weight"][0] == (1024,)
    assert not any("time_mlp_in" in n and "action" not in n for n in spec)
    assert not any(".dense." in n for n in spec)


def test_prefix_and_tied_embedding_variants_give_identical_actions(ckpts):
    reference = predict(ckpts["prefixed"])
    assert reference.shape == (10, 32)
    np.testing.assert_array_equal(predict(ckpts["bare"]), reference)
    np.testing.assert_array_equal(predict(ckpts["tied"]), reference)


def test_legacy_paligemma_layout_and_duplicates(ckpts, tmp_path):
    def legacy(d):
        out = {}
        for key, t in d.items():
            for new, old in (("paligemma.model.language_model.", "paligemma.language_model.model."),
                             ("paligemma.lm_head.", "paligemma.language_model.lm_head."),
                             ("paligemma.model.vision_tower.", "paligemma.vision_tower."),
                             ("paligemma.model.multi_modal_projector.", "paligemma.multi_modal_projector.")):
                key = key.replace(new, old)
            out[key] = t
        return out

    path = rewrite(ckpts["prefixed"], tmp_path / "legacy", legacy)
    assert not any("model.language_model" in k for k in load_file(path / WEIGHTS_FILE))
    np.testing.assert_array_equal(predict(path), predict(ckpts["prefixed"]))
    name = "paligemma_with_expert.gemma_expert.model.layers.0.mlp.up_proj.weight"
    twice = rewrite(ckpts["prefixed"], tmp_path / "twice", lambda d: {**d, name: d["model." + name].clone()})
    with pytest.raises(CheckpointError, match=f"given twice .*{name}"):
        load_model(twice, device="cpu")


def test_model_is_fully_materialized_with_fp32_parts(ckpts):
    model = load_model_weights(ckpts["prefixed"], get_config("pi05_tiny"), "cpu", torch.bfloat16)
    assert not any(p.is_meta for p in model.parameters())
    assert model.vision.patch_embedding.weight.dtype == torch.float32
    assert model.vision.position_embedding.dtype == torch.float32
    assert model.expert.layers[0].input_layernorm.dense.weight.dtype == torch.float32
    assert model.paligemma.norm.weight.dtype == torch.float32
    assert model.paligemma.layers[0].q_proj.weight.dtype == torch.bfloat16
    assert not any(p.requires_grad for p in model.parameters())


def test_bf16_weights_track_fp32(ckpts):
    fp32 = predict(ckpts["prefixed"]).ravel()
    bf16 = predict(ckpts["prefixed"], dtype="bfloat16").ravel()
    cosine = float(fp32 @ bf16 / np.linalg.norm(fp32) / np.linalg.norm(bf16))
    assert cosine > BF16_COSINE_MIN


@pytest.mark.parametrize("case", ["missing", "unexpected", "misshaped", "no_embedding", "wrong_model"])
def test_bad_tensors_are_refused_by_name(ckpts, tmp_path, case):
    name = "model.paligemma_with_expert.gemma_expert.model.layers.1.mlp.up_proj.weight"
    config = None
    if case == "missing":
        edit, expect = (lambda d: {k: v for k, v in d.items() if k != name}), ["1 missing", name[len("model."):]]
    elif case == "unexpected":
        edit, expect = (lambda d: {**d, "model.extra_head.weight": torch.zeros(2)}), ["unexpected", "extra_head.weight"]
    elif case == "misshaped":
        edit, expect = (lambda d: {**d, name: torch.zeros(3, 4)}), ["mis-shaped", name, "(3, 4)", "(64, 32)"]
    elif case == "no_embedding":
        drop = ("embed_tokens", "paligemma.lm_head")
        edit = lambda d: {k: v for k, v in d.items() if not any(s in k for s in drop)}  # noqa: E731
        expect = ["embed_tokens.weight"]
    else:
        edit, expect, config = (lambda d: d), ["state_proj.weight", "time_mlp_in.weight"], "pi0_tiny"
    path = rewrite(ckpts["prefixed"], tmp_path / case, edit)
    with pytest.raises(CheckpointError) as info:
        load_model(path, config=config, device="cpu")
    for text in expect:
        assert text in str(info.value)


def test_missing_or_corrupt_weights_file_is_refused(ckpts, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_model_weights(empty, get_config("pi05_tiny"))
    (empty / WEIGHTS_FILE).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    with pytest.raises(CheckpointError, match="cannot read"):
        load_model_weights(empty, get_config("pi05_tiny"))
    with pytest.raises(CheckpointError, match="directory not found"):
        load_model(tmp_path / "nowhere", device="cpu")
