"""Public API: load_model / Policy.predict over the demo checkpoint and fixture checkpoints (CPU, tiny)."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

import flashrt_core
from flashrt_core.api import demo_checkpoint_dir
from flashrt_core.config import get_config
from flashrt_core.errors import CheckpointError, InputError
from flashrt_core.executor import ReferenceExecutor
from flashrt_core.fixtures import write_random_checkpoint

# Manual unnormalization in float64 vs the policy's own path: same formula, float32 output.
UNNORMALIZE_TOL = 1e-5
# A change that matters moves actions by far more than this.
MIN_EFFECT = 1e-3
# The engine forward vs the reference in fp32 (test_engine_forward: 2e-5 normalized), times the demo stats' scale.
ENGINE_TOL = 1e-4

RNG = np.random.default_rng(0)
IMAGES = [RNG.integers(0, 256, (120, 160, 3), dtype=np.uint8) for _ in range(3)]
NOISE = RNG.standard_normal((10, 32)).astype(np.float32)
NOISE_PI0 = RNG.standard_normal((50, 32)).astype(np.float32)


@pytest.fixture(scope="module")
def demo():
    policy = flashrt_core.load_model(device="cpu")
    yield policy
    policy.close()


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("api")


def load_variant(ckpt_dir, config, **overrides):
    name = f"{config}_" + "_".join(f"{k}{v}" for k, v in overrides.items())
    path = write_random_checkpoint(ckpt_dir / name, config, seed=1, overrides=overrides)
    return flashrt_core.load_model(path, device="cpu")


def test_demo_checkpoint_is_generated_once_and_described(demo):
    target = demo_checkpoint_dir()
    assert target.parent == Path(os.environ["FLASHRT_CACHE_DIR"])
    stamp = (target / "model.safetensors").stat().st_mtime_ns
    again = flashrt_core.load_model(device="cpu")
    assert (target / "model.safetensors").stat().st_mtime_ns == stamp
    again.close()
    assert demo.model_id == "pi05_tiny:demo_pi05_tiny"
    assert (demo.horizon, demo.action_dim, demo.state_dim) == (10, 32, 32)
    assert demo.view_names == ["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"]
    assert demo.device == torch.device("cpu")
    assert isinstance(demo.executor, ReferenceExecutor)
    assert demo.requires_state  # pi05 with the discrete-state prompt


def test_pinned_noise_is_deterministic_and_noise_matters(demo):
    state = np.linspace(-0.5, 0.5, 32)
    a = demo.predict(IMAGES, "pick up the red block", state=state, noise=NOISE)
    assert a.shape == (10, 32) and a.dtype == np.float32 and np.isfinite(a).all()
    np.testing.assert_array_equal(demo.predict(IMAGES, "pick up the red block", state=state, noise=NOISE), a)
    np.testing.assert_array_equal(demo.predict(IMAGES, "pick up the red block", state=state,
                                               noise=torch.from_numpy(NOISE)), a)
    assert np.abs(demo.predict(IMAGES, "pick up the red block", state=state, noise=NOISE + 0.5) - a).max() > MIN_EFFECT
    drawn = [demo.predict(IMAGES, "pick up the red block", state=state) for _ in range(2)]
    assert np.abs(drawn[0] - drawn[1]).max() > MIN_EFFECT
    # the prompt and the images matter
    assert np.abs(demo.predict(IMAGES, "open the drawer", state=state, noise=NOISE) - a).max() > MIN_EFFECT
    assert np.abs(demo.predict(IMAGES[::-1], "pick up the red block", state=state, noise=NOISE) - a).max() > MIN_EFFECT


def test_missing_views_list_and_dict_forms_agree(demo):
    two = demo.predict(IMAGES[:2], "wipe", state=np.zeros(32), noise=NOISE)
    as_dict = demo.predict({"base_0_rgb": IMAGES[0], "left_wrist_0_rgb": IMAGES[1]}, "wipe", state=np.zeros(32),
                           noise=NOISE)
    with_none = demo.predict(IMAGES[:2] + [None], "wipe", state=np.zeros(32), noise=NOISE)
    np.testing.assert_array_equal(as_dict, two)
    np.testing.assert_array_equal(with_none, two)
    three = demo.predict(IMAGES, "wipe", state=np.zeros(32), noise=NOISE)
    assert np.abs(three - two).max() > MIN_EFFECT


def test_pi05_prompt_modes_use_state_as_configured(ckpt_dir):
    s0, s1 = np.full(32, -0.9), np.full(32, 0.9)  # robot units; bins differ after normalization
    discrete = load_variant(ckpt_dir, "pi05_tiny", prompt_mode="discrete_state")
    a0 = discrete.predict(IMAGES, "fold", state=s0, noise=NOISE)
    assert np.abs(discrete.predict(IMAGES, "fold", state=s1 * 10, noise=NOISE) - a0).max() > MIN_EFFECT
    with pytest.raises(InputError, match="state"):
        discrete.predict(IMAGES, "fold", noise=NOISE)
    results = {}
    for mode in ("no_state", "lerobot_no_state"):
        policy = load_variant(ckpt_dir, "pi05_tiny", prompt_mode=mode)
        assert not policy.requires_state
        results[mode] = policy.predict(IMAGES, "fold", state=s0, noise=NOISE)
        np.testing.assert_array_equal(policy.predict(IMAGES, "fold", state=s1, noise=NOISE), results[mode])
        np.testing.assert_array_equal(policy.predict(IMAGES, "fold", noise=NOISE), results[mode])
    assert np.abs(results["no_state"] - results["lerobot_no_state"]).max() > MIN_EFFECT  # different prompts


def test_pi0_uses_state_token_and_robot_dims(ckpt_dir):
    policy = load_variant(ckpt_dir, "pi0_tiny", state_dim=8, action_dim=7)
    assert policy.model_id.startswith("pi0_tiny:") and policy.requires_state
    a = policy.predict(IMAGES[:1], "push", state=np.zeros(8), noise=NOISE_PI0)
    assert a.shape == (50, 7) and a.dtype == np.float32
    assert np.abs(policy.predict(IMAGES[:1], "push", state=np.ones(8), noise=NOISE_PI0) - a).max() > MIN_EFFECT
    with pytest.raises(InputError, match="pi0 needs the robot state"):
        policy.predict(IMAGES[:1], "push", noise=NOISE_PI0)
    with pytest.raises(InputError, match="state has 32 values, the model expects 8"):
        policy.predict(IMAGES[:1], "push", state=np.zeros(32), noise=NOISE_PI0)


def test_actions_are_unnormalized_with_checkpoint_stats(ckpt_dir):
    policy = load_variant(ckpt_dir, "pi05_tiny", state_dim=8, action_dim=7)
    state = np.linspace(-1, 1, 8)
    raw = policy.executor.sample_actions(*policy.prepare_inputs(IMAGES[:2], "stack", state, NOISE))[0].numpy()
    actions = policy.predict(IMAGES[:2], "stack", state=state, noise=NOISE)
    stats = json.loads((ckpt_dir / "pi05_tiny_state_dim8_action_dim7" / "norm_stats.json").read_text())
    q01, q99 = (np.asarray(stats["norm_stats"]["actions"][k], np.float64) for k in ("q01", "q99"))
    manual = (raw[:, :7].astype(np.float64) + 1.0) / 2.0 * (q99 - q01 + 1e-6) + q01
    np.testing.assert_allclose(actions, manual, atol=UNNORMALIZE_TOL, rtol=UNNORMALIZE_TOL)
    assert np.abs(actions - raw[:, :7]).max() > MIN_EFFECT  # the stats really changed something


BAD_INPUTS = [
    (dict(images=IMAGES + IMAGES[:1]), "got 4 images but the model has 3 views"),
    (dict(images=[IMAGES[0].astype(np.float32)]), "dtype must be uint8"),
    (dict(images=[IMAGES[0][:, :, 0]]), "shape must be HxWx3"),
    (dict(images={"top_cam": IMAGES[0]}), "unknown view name"),
    (dict(images=[]), "no images given"),
    (dict(prompt=""), "prompt must be a non-empty str"),
    (dict(prompt="   "), "prompt must be a non-empty str"),
    (dict(prompt=None), "prompt must be a non-empty str"),
    (dict(state=np.zeros(31)), "state has 31 values, the model expects 32"),
    (dict(state=np.zeros((2, 16))), "state must be 1-D"),
    (dict(state=np.r_[np.zeros(31), np.nan]), r"non-finite values \(NaN/inf\) at indices \[31\]"),
    (dict(noise=np.zeros((50, 32))), r"noise must have shape \(10, 32\)"),
    (dict(noise=np.full((10, 32), np.inf)), "noise has non-finite values"),
    (dict(noise="abc"), "noise must be a numeric array"),
]


@pytest.mark.parametrize("bad,message", BAD_INPUTS, ids=[m for _, m in BAD_INPUTS])
def test_bad_inputs_are_named(demo, bad, message):
    args = dict(images=IMAGES, prompt="pick", state=np.zeros(32), noise=NOISE) | bad
    with pytest.raises(InputError, match=message):
        demo.predict(args["images"], args["prompt"], state=args["state"], noise=args["noise"])


def test_robot_dims_come_from_norm_stats_unless_explicit(ckpt_dir, tmp_path):
    path = write_random_checkpoint(tmp_path / "libero", "pi05_tiny", seed=2,
                                   overrides={"state_dim": 8, "action_dim": 7})
    (path / "flashrt_config.json").unlink()  # a real checkpoint has no flashrt config: dims from the stats
    policy = flashrt_core.load_model(path, config="pi05_tiny", device="cpu")
    assert (policy.state_dim, policy.action_dim) == (8, 7)
    assert policy.predict(IMAGES[:2], "open", state=np.zeros(8), noise=NOISE).shape == (10, 7)
    with pytest.raises(CheckpointError, match="config state_dim=9 but the norm stats .* cover only 8"):
        flashrt_core.load_model(path, config=get_config("pi05_tiny", state_dim=9), device="cpu")
    (path / "norm_stats.json").unlink()
    with pytest.raises(CheckpointError, match="has no normalization stats .*norm_stats.json"):
        flashrt_core.load_model(path, config="pi05_tiny", device="cpu")
    policy = flashrt_core.load_model(path, config="pi05_tiny", device="cpu", require_norm_stats=False)
    raw = policy.executor.sample_actions(*policy.prepare_inputs(IMAGES[:2], "open", np.zeros(32), NOISE))[0]
    np.testing.assert_array_equal(policy.predict(IMAGES[:2], "open", state=np.zeros(32), noise=NOISE), raw.numpy())


def test_tokenizer_is_searched_and_a_missing_one_is_named(tmp_path, monkeypatch):
    path = write_random_checkpoint(tmp_path / "ckpt", "pi05_tiny", seed=2)
    moved = tmp_path / "elsewhere.model"
    (path / "tokenizer.model").rename(moved)
    monkeypatch.delenv("FLASHRT_TOKENIZER", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no openpi download cache
    with pytest.raises(CheckpointError, match="tokenizer model not found; tried .*ckpt/tokenizer.model"):
        flashrt_core.load_model(path, device="cpu")
    monkeypatch.setenv("FLASHRT_TOKENIZER", str(moved))
    assert flashrt_core.load_model(path, device="cpu").tokenizer.model_path == moved
    assert flashrt_core.load_model(path, device="cpu", tokenizer=moved).tokenizer.model_path == moved


def test_load_options_are_validated_and_close_releases(ckpt_dir):
    with pytest.raises(ValueError, match="unsupported dtype"):
        flashrt_core.load_model(device="cpu", dtype="int8")
    with pytest.raises(ValueError, match="unknown model config"):
        flashrt_core.load_model(config="pi7", device="cpu")
    with pytest.raises(ValueError, match="hardware='h200' needs a CUDA device"):
        flashrt_core.load_model(device="cpu", hardware="h200")
    policy = flashrt_core.load_model(device="cpu", dtype="bf16", hardware="reference")
    assert policy.model.paligemma.layers[0].q_proj.weight.dtype == torch.bfloat16
    assert policy.predict(IMAGES, "pick", state=np.zeros(32), noise=NOISE).dtype == np.float32
    with policy:
        pass
    assert policy.model is None and policy.executor is None
    with pytest.raises(RuntimeError, match="after close"):
        policy.predict(IMAGES, "pick", state=np.zeros(32))


def _cpu_engine(policy, text_buckets=(64, 128), action_affine=None):
    """The graph engine's executor over the policy's model, eager on the CPU with the plain-PyTorch ops;
    action_affine: the unnormalization it can apply itself (None: none)."""
    from flashrt_core.engine.options import EngineOptions
    from flashrt_core.engine.dispatch import eager_cpu_dispatch
    from flashrt_core.engine.graph_executor import EngineExecutor

    return EngineExecutor(policy.model, policy.config, torch.device("cpu"),
                          eager_cpu_dispatch(EngineOptions(text_buckets=text_buckets)),
                          dtype=torch.float32,
                          action_affine=action_affine)


def _with_executor(policy, executor, **switches):
    """The same model, tokenizer and normalization as `policy`, run by `executor`."""
    return flashrt_core.api.Policy(policy.model, policy.config, executor, policy.tokenizer, policy.normalizer,
                                   policy.device, policy.model_id, **switches)


def test_the_engine_unnormalizes_inside_its_graph_where_it_holds_the_policys_affine(demo, monkeypatch):
    """With the normalizer's action affine given to the engine (load_model does), Policy.predict asks the engine
    for actions in robot units (predict_observation(unnormalize=True): the affine runs in the graph, no host
    arithmetic after the wait) and they equal the host unnormalization; gpu_unnormalize=False, an engine without
    the affine, or one holding another affine, unnormalizes on the host."""
    affine = demo.normalizer.action_affine(demo.config.max_action_dim)
    assert not (np.allclose(affine[0], 1.0) and np.allclose(affine[1], 0.0))      # the demo's stats are not identity
    engine = _cpu_engine(demo, action_affine=affine)
    np.testing.assert_array_equal(engine.action_affine[0], affine[0].astype(np.float32))
    asked = []
    real = engine.predict_observation

    def recording(*args, **kwargs):
        asked.append(kwargs.get("unnormalize", False))
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "predict_observation", recording)
    images = _model_sized_images(demo)
    state = np.linspace(-0.5, 0.5, 32)
    in_graph = _with_executor(demo, engine)
    on_host = _with_executor(demo, engine, gpu_unnormalize=False)
    assert in_graph.gpu_unnormalize and not on_host.gpu_unnormalize
    got = in_graph.predict(images, "pick up the red block", state=state, noise=NOISE)
    want = on_host.predict(images, "pick up the red block", state=state, noise=NOISE)
    assert asked == [True, False]
    assert got.dtype == np.float32 and got.shape == (demo.horizon, demo.action_dim) and got.flags.c_contiguous
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    tokens, mask, _ = demo._encode_prompt_and_state("pick up the red block", state)
    normalized = real(flashrt_core.preprocess.validate_images(images, demo.config.view_names), tokens, mask, None,
                      NOISE)
    assert not np.allclose(got, normalized[:, :demo.action_dim], atol=1e-3)            # really unnormalized
    assert not _with_executor(demo, _cpu_engine(demo)).gpu_unnormalize                   # no affine held
    other = (affine[0] * 2.0, affine[1])
    assert not _with_executor(demo, _cpu_engine(demo, action_affine=other)).gpu_unnormalize
    with pytest.raises(ValueError, match="action_affine must be"):
        _cpu_engine(demo, action_affine=(affine[0][:7], affine[1][:7]))
    monkeypatch.setenv("FLASHRT_GPU_UNNORMALIZE", "2")
    with pytest.raises(ValueError, match="FLASHRT_GPU_UNNORMALIZE must be 0 or 1"):
        flashrt_core.load_model(device="cpu")


def test_the_engine_needs_no_model_after_load(ckpt_dir):
    """The graph engine reads the model once, into its own prepared weights: with the last reference to the model
    gone its tensors are freed (load_model keeps none for the engine), and the engine predicts the same."""
    import gc
    import weakref
    policy = load_variant(ckpt_dir, "pi05_tiny", prompt_mode="no_state")
    assert policy.model is not None and policy.executor.uses_model           # the reference path keeps it
    engine = _cpu_engine(policy)
    assert not engine.uses_model
    images = _model_sized_images(policy)
    before = _with_executor(policy, engine).predict(images, "pick up the block", noise=NOISE)
    merged_away = weakref.ref(policy.model.paligemma.layers[0].q_proj.weight)    # merged into the engine's QKV
    model = weakref.ref(policy.model)
    alone = flashrt_core.api.Policy(None, policy.config, engine, policy.tokenizer, policy.normalizer,
                                    policy.device, policy.model_id)
    policy.close()
    gc.collect()
    assert model() is None and merged_away() is None
    np.testing.assert_array_equal(alone.predict(images, "pick up the block", noise=NOISE), before)


def _model_sized_images(policy):
    size = policy.config.vision.image_size
    return [np.random.default_rng(v).integers(0, 256, (size, size, 3), dtype=np.uint8) for v in range(3)]


def test_engine_branch_keeps_the_noise_on_the_host(demo):
    """With an executor that has predict_observation (the engine, eager on the CPU here), Policy.predict hands it
    the noise as a host float32 array: the pinned noise as given, or for noise=None the same torch CPU draw the
    reference path gets under the same seed; and the actions agree with the reference path."""
    engine = _cpu_engine(demo)
    handed = []
    real_predict_observation = engine.predict_observation

    def recording(*args, **kwargs):
        handed.append(args[4] if len(args) > 4 else kwargs["noise"])
        return real_predict_observation(*args, **kwargs)

    engine.predict_observation = recording
    policy = _with_executor(demo, engine)
    assert policy.gpu_preprocess
    images = _model_sized_images(demo)  # no resize: the GPU-preprocess and host paths see equal pixels
    state = np.linspace(-0.5, 0.5, 32)
    for noise in (NOISE, torch.from_numpy(NOISE), NOISE.tolist()):
        got = policy.predict(images, "pick up the red block", state=state, noise=noise)
        assert isinstance(handed[-1], np.ndarray) and handed[-1].dtype == np.float32
        np.testing.assert_array_equal(handed[-1], NOISE)
        if noise is NOISE:  # a host float32 array goes through as it is: no copy, no device round trip
            assert np.shares_memory(handed[-1], NOISE)
        np.testing.assert_allclose(got, demo.predict(images, "pick up the red block", state=state, noise=NOISE),
                                   atol=ENGINE_TOL, rtol=0)
    torch.manual_seed(7)
    drawn = policy.predict(images, "pick up the red block", state=state)
    assert isinstance(handed[-1], np.ndarray) and handed[-1].shape == (10, 32)
    torch.manual_seed(7)
    np.testing.assert_array_equal(handed[-1], torch.randn(1, 10, 32)[0].numpy())
    torch.manual_seed(7)
    np.testing.assert_allclose(drawn, demo.predict(images, "pick up the red block", state=state),
                               atol=ENGINE_TOL, rtol=0)


def test_warm_up_text_buckets_prepares_every_bucket_once(demo, ckpt_dir, monkeypatch):
    """The engine keeps one workspace (on a GPU: one captured graph) per text bucket; warm_up_text_buckets makes
    all of them, so prompts of any length afterwards make none. The reference path has no buckets: no pass."""
    plain = load_variant(ckpt_dir, "pi05_tiny", prompt_mode="no_state")  # short prompts: every bucket reachable
    images, slots = _model_sized_images(plain), [16, 64, plain.config.max_token_len]
    prompts = ("go", "pick up the red block and put it in the bin " * 4, "x " * 150)  # one prompt per bucket
    cold = _with_executor(plain, _cpu_engine(plain, text_buckets=(16, 64)))
    for prompt in prompts:
        cold.predict(images, prompt, noise=NOISE)
    assert sorted(key[3] for key in cold.executor.entries) == slots
    engine = _cpu_engine(plain, text_buckets=(16, 64))
    policy = _with_executor(plain, engine)
    assert policy.text_buckets == tuple(slots)
    assert policy.warm_up_text_buckets(images, "pick") == slots
    assert sorted(key[3] for key in engine.entries) == slots
    for prompt in prompts:
        np.testing.assert_allclose(policy.predict(images, prompt, noise=NOISE),
                                   cold.predict(images, prompt, noise=NOISE), atol=ENGINE_TOL, rtol=0)
    assert len(engine.entries) == 3

    # pi0.5's discrete-state prompt carries the state bins: short buckets can never serve an instruction
    stated = _with_executor(demo, _cpu_engine(demo, text_buckets=(16, 64)))
    state = np.zeros(demo.config.state_dim or 8, dtype=np.float32)
    _, mask, _ = stated._encode_prompt_and_state("a", state)
    assert stated.text_buckets == (16, 64, demo.config.max_token_len) and int(mask.sum()) > 64
    assert stated.reachable_text_buckets(state) == (demo.config.max_token_len,)
    assert stated.warm_up_text_buckets(_model_sized_images(demo), "pick", state) == [demo.config.max_token_len]
    assert policy.reachable_text_buckets() == tuple(slots)

    # the state's numbers change the prompt's length: a warm-up with one state covers the buckets of every other
    low = np.full_like(state, -5.0)                                      # bins 0 and -1: short numbers
    _, low_mask, _ = stated._encode_prompt_and_state("pick", low)
    assert int(low_mask.sum()) < int(mask.sum()) - 16                   # more than a 16-token bucket shorter
    fine = _with_executor(demo, _cpu_engine(demo, text_buckets=tuple(range(16, 200, 16))))
    assert fine.shortest_prompt_tokens(state) <= int(low_mask.sum())
    warmed = fine.warm_up_text_buckets(_model_sized_images(demo), "pick", state)
    assert warmed == list(fine.reachable_text_buckets(state)) and min(warmed) > 16
    entries = set(fine.executor.entries)
    for st in (low, state, np.full_like(state, 5.0)):
        fine.predict(_model_sized_images(demo), "pick", st, noise=NOISE)
    assert set(fine.executor.entries) == entries                        # no bucket left for later

    passes = []
    real_sample_actions = demo.executor.sample_actions
    monkeypatch.setattr(demo.executor, "sample_actions", lambda *a: passes.append(1) or real_sample_actions(*a))
    assert demo.text_buckets == () and demo.warm_up_text_buckets(IMAGES, "pick", state=np.zeros(32)) == []
    assert passes == []
