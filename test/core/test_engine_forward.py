"""The engine's forward (folded/merged weights, precomputed time tables, static KV caches, masks, text buckets)
against the eager reference executor, on the CPU with the plain-PyTorch op implementations, tiny configs, fp32.

The graph capture itself needs a GPU (test/gpu/test_engine_gpu.py); everything it captures is checked here.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flashrt_core.checkpoint import load_model_weights
from flashrt_core.config import get_config
from flashrt_core.engine.dispatch import Dispatch, Op, eager_cpu_dispatch
from flashrt_core.engine.options import EngineOptions
from flashrt_core.engine.graph_executor import EngineExecutor
from flashrt_core.engine.ops import Ops
from flashrt_core.executor import ReferenceExecutor
from flashrt_core.fixtures import write_random_checkpoint

FP32_ATOL = 2e-5  # same math in fp32, different op order (folded norms, merged GEMMs)


def _dispatch(fused: bool, **options) -> Dispatch:
    return eager_cpu_dispatch(EngineOptions(fused_weights=fused, text_buckets=(16, 32), **options))


@pytest.fixture(scope="module", params=["pi05_tiny", "pi0_tiny"])
def model(request, tmp_path_factory):
    ckpt = tmp_path_factory.mktemp(request.param)
    write_random_checkpoint(ckpt, request.param, seed=3)
    return load_model_weights(ckpt, get_config(request.param), "cpu", torch.float32)


def _inputs(cfg, rng: np.random.Generator, n_text: int, views: tuple[int, ...]):
    size = cfg.vision.image_size
    images = [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) if v in views else None
              for v in range(len(cfg.view_names))]
    tokens = np.zeros(cfg.max_token_len, dtype=np.int64)
    tokens[:n_text] = rng.integers(1, cfg.paligemma.vocab_size, n_text)
    mask = np.zeros(cfg.max_token_len, dtype=bool)
    mask[:n_text] = True
    state = rng.standard_normal(cfg.max_action_dim).astype(np.float32)
    noise = rng.standard_normal((cfg.action_horizon, cfg.max_action_dim)).astype(np.float32)
    return images, tokens, mask, state, noise


def _reference(model, images, tokens, mask, state, noise):
    cfg = model.config
    size = cfg.vision.image_size
    pixels = torch.stack([torch.from_numpy(img).permute(2, 0, 1).float() / 255 * 2 - 1 if img is not None
                          else torch.full((3, size, size), -1.0) for img in images])
    masks = torch.tensor([img is not None for img in images])
    ref = ReferenceExecutor(model, cfg, torch.device("cpu"))
    return ref.sample_actions(pixels[None], masks[None], torch.from_numpy(tokens)[None],
                              torch.from_numpy(mask)[None], torch.from_numpy(state)[None],
                              torch.from_numpy(noise)[None])[0]


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("n_text,views", [(5, (0, 1)), (23, (0,)), (48, (0, 1, 2))])
def test_engine_forward_matches_reference(model, fused, n_text, views):
    rng = np.random.default_rng(n_text)
    images, tokens, mask, state, noise = _inputs(model.config, rng, n_text, views)
    want = _reference(model, images, tokens, mask, state, noise)
    engine = EngineExecutor(model, model.config, torch.device("cpu"), _dispatch(fused), dtype=torch.float32)
    got = engine.predict_observation(images, tokens, mask, state, noise)
    assert got.shape == (model.config.action_horizon, model.config.max_action_dim)
    np.testing.assert_allclose(got, want.numpy(), atol=FP32_ATOL, rtol=0)


def test_new_prompt_reuses_the_bucket(model):
    """Two prompts of different lengths in one bucket share one workspace (no new graph), results differ."""
    engine = EngineExecutor(model, model.config, torch.device("cpu"), _dispatch(True), dtype=torch.float32)
    rng = np.random.default_rng(0)
    outs = []
    for n_text in (4, 11):
        images, tokens, mask, state, noise = _inputs(model.config, np.random.default_rng(1), n_text, (0, 1))
        tokens[:n_text] = rng.integers(1, 1000, n_text)
        outs.append(engine.predict_observation(images, tokens, mask, state, noise))
        np.testing.assert_allclose(outs[-1], _reference(model, images, tokens, mask, state, noise).numpy(),
                                   atol=FP32_ATOL, rtol=0)
    assert len(engine.entries) == 1
    assert not np.allclose(outs[0], outs[1])


def test_sample_actions_contract(model):
    """The executor contract used by Policy: preprocessed tensors in, (1, horizon, A) out."""
    cfg = model.config
    rng = np.random.default_rng(5)
    images, tokens, mask, state, noise = _inputs(cfg, rng, 9, (0, 2))
    want = _reference(model, images, tokens, mask, state, noise)
    size = cfg.vision.image_size
    pixels = torch.stack([torch.from_numpy(img).permute(2, 0, 1).float() / 255 * 2 - 1 if img is not None
                          else torch.full((3, size, size), -1.0) for img in images])[None]
    engine = EngineExecutor(model, cfg, torch.device("cpu"), _dispatch(True), dtype=torch.float32)
    args = (pixels, torch.tensor([[True, False, True]]), torch.from_numpy(tokens)[None], torch.from_numpy(mask)[None],
            torch.from_numpy(state)[None], torch.from_numpy(noise)[None])
    got = engine.sample_actions(*args)
    assert got.shape == (1, cfg.action_horizon, cfg.max_action_dim)
    torch.testing.assert_close(got[0], want, atol=FP32_ATOL, rtol=0)
    # the fused patch embedding's path for float pixels (and resized views): patch rows in the engine dtype from
    # one converting copy, the patch GEMM without its bias, then position embedding + bias in one add
    engine.ops.fused_patch_embed = True
    torch.testing.assert_close(engine.sample_actions(*args)[0], want, atol=FP32_ATOL, rtol=0)


def test_unnormalization_inside_the_forward(model):
    cfg = model.config
    rng = np.random.default_rng(8)
    scale = rng.uniform(0.5, 2.0, cfg.max_action_dim)
    offset = rng.standard_normal(cfg.max_action_dim)
    engine = EngineExecutor(model, cfg, torch.device("cpu"), _dispatch(True), dtype=torch.float32,
                            action_affine=(scale, offset))
    images, tokens, mask, state, noise = _inputs(cfg, rng, 6, (1,))
    normalized = engine.predict_observation(images, tokens, mask, state, noise)
    robot = engine.predict_observation(images, tokens, mask, state, noise, unnormalize=True)
    np.testing.assert_allclose(robot, normalized * scale + offset, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="action_affine"):
        EngineExecutor(model, cfg, torch.device("cpu"), _dispatch(True), dtype=torch.float32).predict_observation(
            images, tokens, mask, state, noise, unnormalize=True)


def test_shared_weights_serve_another_horizon(model):
    """One prepared weight set, a second executor at horizon 50: equals the reference at that horizon."""
    cfg = model.config
    first = EngineExecutor(model, cfg, torch.device("cpu"), _dispatch(True), dtype=torch.float32)
    cfg50 = cfg.replace(action_horizon=50 if cfg.action_horizon != 50 else 10)
    second = EngineExecutor(model, cfg50, torch.device("cpu"), _dispatch(True), dtype=torch.float32,
                            weights=first.weights)
    images, tokens, mask, state, noise = _inputs(cfg50, np.random.default_rng(4), 6, (0, 1))
    got = second.predict_observation(images, tokens, mask, state, noise)
    model.config = cfg50        # the reference model reads its horizon from its config
    try:
        want = _reference(model, images, tokens, mask, state, noise)
    finally:
        model.config = cfg
    np.testing.assert_allclose(got, want.numpy(), atol=FP32_ATOL, rtol=0)


def tiny_model_with_14px_patches(ckpt_dir):
    """Tiny pi0.5 with SigLIP's real patch size (14 px, 3 x 14 x 14 = 588 columns per patch row, not a multiple of
    8) on 56 x 56 views, so the fused patch embedding's padding to 592 columns is exercised."""
    import dataclasses
    base = get_config("pi05_tiny")
    cfg = base.replace(name="pi05_tiny_14px", vision=dataclasses.replace(base.vision, image_size=56, patch_size=14))
    write_random_checkpoint(ckpt_dir, cfg, seed=3)
    return load_model_weights(ckpt_dir, cfg, "cpu", torch.float32)


@pytest.fixture(scope="module")
def model_14px_patches(tmp_path_factory):
    return tiny_model_with_14px_patches(tmp_path_factory.mktemp("pi05_tiny_14px"))


def test_fused_patch_embedding_pads_the_rows_and_keeps_the_actions(model_14px_patches):
    """The converting-copy path of the fused patch embedding (float pixels, as resized camera views take) with
    588-wide patch rows: the GEMM weight is padded to 592 columns with zeros, and the actions are the reference's."""
    model = model_14px_patches
    cfg = model.config
    images, tokens, mask, state, noise = _inputs(cfg, np.random.default_rng(6), 9, (0, 1))
    want = _reference(model, images, tokens, mask, state, noise)
    engine = EngineExecutor(model, cfg, torch.device("cpu"), _dispatch(True), dtype=torch.float32)
    engine.ops.fused_patch_embed = True
    pixels = torch.stack([torch.from_numpy(img).permute(2, 0, 1).float() / 255 * 2 - 1 if img is not None
                          else torch.full((3, 56, 56), -1.0) for img in images])[None]
    args = (pixels, torch.tensor([[img is not None for img in images]]), torch.from_numpy(tokens)[None],
            torch.from_numpy(mask)[None], torch.from_numpy(state)[None], torch.from_numpy(noise)[None])
    torch.testing.assert_close(engine.sample_actions(*args)[0], want, atol=FP32_ATOL, rtol=0)
    patch_w, _ = engine.weights.patch_gemm_tables()
    assert patch_w.shape[1] == 592
    assert torch.equal(patch_w[:, 588:], torch.zeros_like(patch_w[:, 588:]))


@pytest.mark.parametrize("fused", [True, False])
def test_padded_vision_mlp_keeps_the_actions(model, fused):
    """vision_mlp_pad rounds the vision MLP's hidden width up at load (zero rows and bias of fc1, zero columns of
    fc2): the GEMM shapes change, the actions do not (the tiny width 64 becomes 96 with a multiple of 48). The
    default pads to a multiple of 128; 0 (FLASHRT_VISION_MLP_PAD=0) leaves the width as it is."""
    from flashrt_core.engine.weights import pad_mlp_width
    cfg = model.config
    images, tokens, mask, state, noise = _inputs(cfg, np.random.default_rng(7), 9, (0, 1))
    plain = EngineExecutor(model, cfg, torch.device("cpu"), _dispatch(fused, vision_mlp_pad=0), dtype=torch.float32)
    padded = EngineExecutor(model, cfg, torch.device("cpu"), _dispatch(fused, vision_mlp_pad=48), dtype=torch.float32)
    width = cfg.vision.mlp_dim
    for before, after in zip(plain.weights.vision, padded.weights.vision):
        (w1, b1), (w2, _) = after.fc1.parts[0], after.fc2.parts[0]
        assert w1.shape == (96, before.fc1.parts[0][0].shape[1]) and w2.shape == (cfg.vision.width, 96)
        assert torch.equal(w1[:width], before.fc1.parts[0][0]) and not w1[width:].any() and not b1[width:].any()
        assert torch.equal(w2[:, :width], before.fc2.parts[0][0]) and not w2[:, width:].any()
    assert padded.weights.vision_mlp_pad == 48 and plain.weights.vision_mlp_pad == 0
    assert EngineOptions().vision_mlp_pad == 128
    assert EngineOptions.from_env(env={"FLASHRT_VISION_MLP_PAD": "0"}).vision_mlp_pad == 0
    got = padded.predict_observation(images, tokens, mask, state, noise)
    want = plain.predict_observation(images, tokens, mask, state, noise)
    np.testing.assert_allclose(got, want, atol=FP32_ATOL, rtol=0)
    layer = plain.weights.vision[0]
    assert pad_mlp_width(layer.fc1, layer.fc2, 64) == (layer.fc1, layer.fc2)      # a multiple already: unchanged
    with pytest.raises(ValueError, match="shared weights .* vision_mlp_pad=0"):
        EngineExecutor(model, cfg, torch.device("cpu"), _dispatch(fused, vision_mlp_pad=48), dtype=torch.float32,
                       weights=plain.weights)


def _record_order(engine, monkeypatch) -> list[str]:
    """The order of the prefix's attention calls ("P") and the denoiser's ("D") in the next forward."""
    order: list[str] = []
    for name, tag in (("prefix_attention", "P"), ("decoder_attention", "D")):
        fn = getattr(engine.ops, name)

        def recorded(*args, _fn=fn, _tag=tag, **kwargs):
            order.append(_tag)
            return _fn(*args, **kwargs)
        monkeypatch.setattr(engine.ops, name, recorded)
    return order


def test_overlapped_first_step_interleaves_with_the_prefix_and_keeps_the_actions(model, monkeypatch):
    """overlap_first_step (the default; FLASHRT_OVERLAP_FIRST_STEP=0 turns it off): the first denoising step's layer i runs right after the prefix's layer i has written its K/V, before
    that layer's attention (on the GPU on a second stream; on the CPU in this order in one); the actions are the
    sequential forward's, bit for bit, and the reference's."""
    cfg = model.config
    inputs = _inputs(cfg, np.random.default_rng(5), 11, (0, 1))
    sequential = EngineExecutor(model, cfg, torch.device("cpu"), _dispatch(True, overlap_first_step=False),
                                dtype=torch.float32)
    overlapped = EngineExecutor(model, cfg, torch.device("cpu"), _dispatch(True), dtype=torch.float32)
    assert overlapped.ops.overlap_first_step and not sequential.ops.overlap_first_step
    assert EngineOptions().overlap_first_step
    assert not EngineOptions.from_env(env={"FLASHRT_OVERLAP_FIRST_STEP": "0"}).overlap_first_step
    assert eager_cpu_dispatch(EngineOptions(fast_paths=False))[Op.OVERLAP_FIRST_STEP] == "one_stream"
    assert Ops(eager_cpu_dispatch()).overlap_first_step
    assert not Ops(eager_cpu_dispatch(EngineOptions(overlap_first_step=False))).overlap_first_step
    orders = {}
    for name, engine in (("sequential", sequential), ("overlapped", overlapped)):
        orders[name] = _record_order(engine, monkeypatch)
        got = engine.predict_observation(*inputs)
        if name == "sequential":
            want = got
        else:
            np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(want, _reference(model, *inputs).numpy(), atol=FP32_ATOL, rtol=0)
    layers, steps = cfg.expert.depth, len(sequential.weights.dts)
    prefix_attentions = orders["sequential"].count("P")
    assert orders["sequential"] == ["P"] * prefix_attentions + ["D"] * layers * steps
    # overlapped: D before each P (the first step's layer i before the prefix's attention of layer i), the rest after
    assert orders["overlapped"] == ["D", "P"] * prefix_attentions + ["D"] * (layers * steps - prefix_attentions)
    assert prefix_attentions == cfg.paligemma.depth - 1 == layers - 1     # the last prefix layer: K/V only
