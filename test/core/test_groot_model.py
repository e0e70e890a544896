"""GR00T N1.6 reference path: name table, sharded loading, shapes, pinned-noise determinism, sampler, API."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from flashrt_core import load_model
from flashrt_core.errors import CheckpointError, InputError
from flashrt_core.groot_checkpoint import INDEX_FILE, check_names, load_state_dict, weight_table
from flashrt_core.groot_fixtures import random_tensor, write_random_groot_checkpoint
from flashrt_core.groot_policy import GrootPolicy
from flashrt_core.model.groot.config import get_groot_config
from flashrt_core.model.groot.model import GrootModel
from flashrt_core.model.groot.sampler import sample_actions

TINY = "groot_n1.6_tiny"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_random_groot_checkpoint(tmp_path_factory.mktemp("groot") / "ckpt", TINY, seed=3)


@pytest.fixture(scope="module")
def policy(ckpt):
    return load_model(ckpt, config=TINY, embodiment="new_embodiment", device="cpu")


def observation(policy, seed=0):
    rng = np.random.default_rng(seed)
    images = {v: rng.integers(0, 256, (72, 96, 3), dtype=np.uint8) for v in policy.view_names}
    state = {name: rng.uniform(-1, 1, dim) for name, dim in policy.state_groups}
    return images, state


def noise(seed=1):
    cfg = get_groot_config(TINY)
    return np.random.default_rng(seed).standard_normal((cfg.action_horizon, cfg.max_action_dim)).astype(np.float32)


@pytest.mark.parametrize("name", ["groot_n1.6", TINY])
def test_name_table_is_the_module_tree(name):
    cfg = get_groot_config(name)
    with torch.device("meta"):
        model = GrootModel(cfg)
    held = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert held == weight_table(cfg)


def test_real_sizes():
    table = weight_table(get_groot_config("groot_n1.6"))
    assert table["backbone.model.mlp1.1.weight"] == (2048, 4 * 1152)
    assert table["action_head.model.transformer_blocks.0.attn1.to_k.weight"] == (1536, 2048)   # cross
    assert table["action_head.model.transformer_blocks.1.attn1.to_k.weight"] == (1536, 1536)   # self
    assert table["action_head.action_encoder.W2.W"] == (32, 3072, 1536)
    assert "backbone.model.language_model.model.layers.15.mlp.down_proj.weight" in table
    assert "backbone.model.language_model.model.layers.16.mlp.down_proj.weight" not in table
    assert 2.9e9 < sum(np.prod(s) for s in table.values()) < 3.1e9


def test_sharded_layout(ckpt):
    index = json.loads((ckpt / INDEX_FILE).read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert shards == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert set(index["weight_map"]) == set(weight_table(get_groot_config(TINY)))
    state = load_state_dict(ckpt, get_groot_config(TINY))
    name = "action_head.state_encoder.layer1.W"
    assert torch.equal(state[name], random_tensor(name, state[name].shape, 3))


@pytest.mark.parametrize("damage", ["header", "data"])
def test_a_corrupt_shard_is_named(ckpt, tmp_path, damage):
    """A shard with a broken header, or cut short of its tensors' bytes, is a CheckpointError naming the file, from
    load_model and from flashrt-inspect (safetensors' own error types otherwise escape as they are)."""
    import shutil
    from flashrt_core.checkpoint_inspect import inspect_checkpoint
    folder = tmp_path / "c"
    shutil.copytree(ckpt, folder)
    shard = sorted(folder.glob("model-*.safetensors"))[-1]
    data = shard.read_bytes()
    shard.write_bytes(data[:100] if damage == "header" else data[:-1000])
    with pytest.raises(CheckpointError, match=f"cannot read {shard}"):
        load_model(folder, config=TINY, embodiment="new_embodiment", device="cpu")
    report = inspect_checkpoint(folder)
    assert any(line.startswith(f"weights: cannot read {shard}") for line in report.missing)


def test_strict_names(tmp_path):
    cfg = get_groot_config(TINY)
    table = weight_table(cfg)
    shapes = dict(table)
    # known unused names are accepted and reported
    extra = {"backbone.model.language_model.lm_head.weight": (512, 48),
             "backbone.model.language_model.model.layers.7.mlp.up_proj.weight": (96, 48),
             "backbone.model.vision_model.vision_model.head.probe": (1, 1, 32), "action_head.mask_token": (1, 1, 32)}
    assert sorted(check_names({**shapes, **extra}, cfg, "x")) == sorted(extra)
    missing = dict(shapes)
    del missing["action_head.vlln.weight"]
    with pytest.raises(CheckpointError, match=r"missing tensors: action_head\.vlln\.weight"):
        check_names(missing, cfg, "x")
    with pytest.raises(CheckpointError, match=r"unexpected tensors: action_head\.extra"):
        check_names({**shapes, "action_head.extra": (1,)}, cfg, "x")
    bad = {**shapes, "action_head.action_encoder.W1.W": (32, 16, 33)}
    with pytest.raises(CheckpointError, match=r"action_encoder\.W1\.W: checkpoint \(32, 16, 33\), .* expects "
                                              r"\(32, 16, 32\)"):
        check_names(bad, cfg, "x")
    # a real checkpoint read against the real-size preset: every shape is refused by name
    out = write_random_groot_checkpoint(tmp_path / "c", TINY, shards=1)
    with pytest.raises(CheckpointError, match="shape mismatches"):
        load_state_dict(out, cfg.replace(hidden_size=48, dit=cfg.dit.__class__(num_layers=4, num_heads=4,
                                                                               head_dim=8, output_dim=48)))


def test_index_pointing_at_a_missing_shard(tmp_path):
    out = write_random_groot_checkpoint(tmp_path / "c", TINY)
    (out / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors"):
        load_state_dict(out, get_groot_config(TINY))


def test_index_and_shard_disagree(tmp_path):
    out = write_random_groot_checkpoint(tmp_path / "c", TINY)
    index = json.loads((out / INDEX_FILE).read_text())
    # the index still sends keys to the second shard, which now holds one tensor of the first
    assert "model-00002-of-00002.safetensors" in index["weight_map"].values()
    save_file({"action_head.vlln.weight": torch.ones(48)}, str(out / "model-00002-of-00002.safetensors"))
    with pytest.raises(CheckpointError, match="does not\\s+hold|that it does not"):
        load_state_dict(out, get_groot_config(TINY))


def test_predict_shapes_and_pinned_noise(policy):
    assert isinstance(policy, GrootPolicy)
    assert (policy.horizon, policy.action_dim, policy.state_dim) == (16, 6, 6)
    images, state = observation(policy)
    a = policy.predict(images, "Pick up the red cube.", state, noise())
    assert a.shape == (16, 6) and a.dtype == np.float32 and np.isfinite(a).all()
    b = policy.predict(images, "Pick up the red cube.", np.concatenate([state[n] for n, _ in policy.state_groups]),
                       noise())
    np.testing.assert_array_equal(a, b)                  # dict by joint group == flat in group order
    c = policy.predict(images, "Pick up the red cube.", state, noise(2))
    assert np.abs(a - c).max() > 1e-3                     # the noise matters
    d = policy.predict(images, "open the drawer", state, noise())
    assert np.abs(a - d).max() > 1e-4                     # the instruction reaches the actions
    other_images, other_state = observation(policy, seed=5)
    e = policy.predict(other_images, "Pick up the red cube.", state, noise())
    assert np.abs(a - e).max() > 1e-4                     # the images do
    f = policy.predict(images, "Pick up the red cube.", other_state, noise())
    assert np.abs(a - f).max() > 1e-4                     # the state does
    # within the statistics' bounds (min/max unnormalization clips to [-1, 1] first)
    stats = policy.embodiment.action
    lo = np.concatenate([g.lo for g in stats])
    hi = np.concatenate([g.hi for g in stats])
    assert (a >= lo - 1e-5).all() and (a <= hi + 1e-5).all()


def test_prompt_layout(policy):
    cfg = policy.config
    images, state = observation(policy)
    images["wrist"] = images["wrist"][:56, :56]
    views, ids, mask, state_t, emb_id, noise_t = policy.prepare_inputs(images, "Pick up!", state, noise())
    # 72 x 96: shortest edge 56 -> 56 x 75, crop 0.95 -> 53 x 71, 56 x 75 again, multiples of 28 -> 56 x 84
    assert [tuple(v.shape) for v in views] == [(3, 56, 84), (3, 56, 56)]
    assert all(v.min() >= -1 and v.max() <= 1 for v in views)
    slots = (ids[0] == cfg.image_token_index).nonzero().flatten()
    assert len(slots) == 6 + 4
    assert state_t.shape == (1, 1, cfg.max_state_dim) and (state_t[0, 0, 6:] == 0).all()
    assert emb_id.tolist() == [10] and noise_t.shape == (1, 16, 16) and bool(mask.all())
    # formalized language: case and punctuation do not change the tokens
    _, ids2, *_ = policy.prepare_inputs(images, "PICK up", state, noise())
    assert torch.equal(ids, ids2)


@pytest.mark.parametrize("hw, final, tokens", [((224, 224), (252, 252), 81), ((480, 640), (252, 336), 108),
                                               ((720, 1280), (252, 448), 144)])
def test_image_geometry_of_the_released_processor(hw, final, tokens):
    from flashrt_core.groot_inputs import image_geometry
    cfg = get_groot_config("groot_n1.6")
    *_, size = image_geometry(*hw, cfg.shortest_image_edge, cfg.crop_fraction, cfg.image_factor)
    assert size == final and cfg.image_tokens(*size) == tokens


def test_input_errors(policy):
    images, state = observation(policy)
    with pytest.raises(InputError, match=r"missing \['wrist'\]"):
        policy.predict({"front": images["front"]}, "pick", state)
    with pytest.raises(InputError, match="state has 5 values; embodiment 'new_embodiment' takes 6"):
        policy.predict(images, "pick", np.zeros(5))
    with pytest.raises(InputError, match=r"missing \['gripper'\]"):
        policy.predict(images, "pick", {"single_arm": np.zeros(5)})
    with pytest.raises(InputError, match=r"state\['gripper'\] has 2 values"):
        policy.predict(images, "pick", {"single_arm": np.zeros(5), "gripper": [0, 1]})
    with pytest.raises(InputError, match="needs the robot state"):
        policy.predict(images, "pick", None)
    with pytest.raises(InputError, match=r"noise must have shape \(16, 16\)"):
        policy.predict(images, "pick", state, np.zeros((10, 16)))


def test_sampler_is_euler_over_discrete_buckets():
    """sample_actions == noise + sum_k v(x_k, bucket_k) / N with the buckets 0, 250, 500, 750."""
    cfg = get_groot_config(TINY)
    torch.manual_seed(0)
    head = GrootModel(cfg).action_head.eval()
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.2)
    feats = torch.randn(1, 9, cfg.backbone_embedding_dim)
    image_mask = torch.tensor([[False, True, True, True, True, False, False, False, False]])
    mask = torch.ones(1, 9, dtype=torch.bool)
    state = torch.randn(1, 1, cfg.max_state_dim)
    emb = torch.tensor([3])
    x0 = torch.randn(1, cfg.action_horizon, cfg.max_action_dim)
    with torch.no_grad():
        out = sample_actions(head, feats, mask, image_mask, state, emb, x0)
        vl, sf = head.encode(feats, state, emb)
        x, seen = x0, []
        for k in range(4):
            bucket = head.timestep_bucket(k)
            seen.append(bucket)
            x = x + 0.25 * head.velocity(vl, sf, x, bucket, emb, image_mask, mask)
    assert seen == [0, 250, 500, 750]
    torch.testing.assert_close(out, x)
    # another embodiment slot gives other actions (the projectors are per embodiment)
    with torch.no_grad():
        other = sample_actions(head, feats, mask, image_mask, state, torch.tensor([4]), x0)
    assert (other - out).abs().max() > 1e-3


def test_gpu_targets_refused_on_the_cpu(ckpt):
    with pytest.raises(ValueError, match="hardware='sm90' needs a CUDA device"):
        load_model(ckpt, config=TINY, embodiment="new_embodiment", device="cpu", hardware="sm90")
    assert load_model(ckpt, config=TINY, embodiment="new_embodiment", device="cpu",
                      hardware="reference").executor.name == "reference"


def test_checkpoint_detected_without_config(ckpt):
    pol = load_model(ckpt, embodiment="new_embodiment", device="cpu", config=None)
    assert isinstance(pol, GrootPolicy)


@pytest.mark.parametrize("config", ["pi05", "pi0_tiny"])
def test_a_pi_config_on_a_groot_checkpoint_names_both(ckpt, config):
    with pytest.raises(CheckpointError, match=f"is a GR00T N1.6 checkpoint .* but config='{config}' is a "
                                              "pi-family model: pass config=None"):
        load_model(ckpt, config=config, device="cpu")


def test_a_groot_config_on_another_models_folder_names_it(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"type": "pi05", "chunk_size": 50}))
    with pytest.raises(CheckpointError, match="names model_type 'pi05', not GR00T N1.6's 'Gr00tN1d6'"):
        load_model(tmp_path, config=TINY, embodiment="new_embodiment", device="cpu")


def test_embodiment_on_a_pi_config_is_refused():
    with pytest.raises(ValueError, match="GR00T checkpoints only"):
        load_model(None, config="pi05_tiny", embodiment="gr1")


def test_bf16_runs(ckpt):
    pol = load_model(ckpt, config=TINY, embodiment="new_embodiment", device="cpu", dtype="bfloat16")
    images, state = observation(pol)
    a = pol.predict(images, "pick", state, noise())
    assert a.shape == (16, 6) and np.isfinite(a).all()


def test_fixture_cli(tmp_path):
    from flashrt_core.groot_fixtures import main
    main([str(tmp_path / "cli"), "--config", TINY, "--seed", "2", "--shards", "3"])
    index = json.loads((tmp_path / "cli" / INDEX_FILE).read_text())
    assert len(set(index["weight_map"].values())) == 3
    pol = load_model(tmp_path / "cli", embodiment="new_embodiment", device="cpu")
    assert pol.config.name == TINY
