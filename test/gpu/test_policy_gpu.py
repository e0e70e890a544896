"""The public API on a GPU: load_model(device="cuda") picks the graph engine, predict() hands it the raw uint8
camera images (resize inside the graph), and its actions match the fp32 CPU reference path on the same
checkpoint and pinned noise. Skips without CUDA."""

from __future__ import annotations

import numpy as np
import pytest

import flashrt_core
from flashrt_core.engine.gate import GATE_BF16, cosine
from flashrt_core.fixtures import write_random_checkpoint

pytestmark = pytest.mark.gpu

OBSERVATIONS = 3
# Host resize (PIL-exact) and GPU resize (antialiased interpolate) differ by <= 1 uint8 level per pixel.
HOST_VS_GPU_RESIZE_COSINE = 0.999


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("pi05_tiny_gpu")
    write_random_checkpoint(path, "pi05_tiny", seed=3)
    return path


def _observation(rng, policy):
    # camera-sized frames of different shapes: resize-with-pad is part of what is compared
    images = [rng.integers(0, 256, (480, 640, 3), dtype=np.uint8), rng.integers(0, 256, (240, 320, 3), np.uint8)]
    state = rng.uniform(-1, 1, policy.state_dim).astype(np.float32)
    noise = rng.standard_normal((policy.horizon, 32)).astype(np.float32)
    return images, state, noise


def test_gpu_policy_uses_the_engine_and_matches_the_cpu_reference(checkpoint):
    gpu = flashrt_core.load_model(checkpoint, device="cuda")
    cpu = flashrt_core.load_model(checkpoint, device="cpu", hardware="reference")
    assert gpu.gpu_preprocess and hasattr(gpu.executor, "predict_observation"), gpu.executor
    rng = np.random.default_rng(0)
    for _ in range(OBSERVATIONS):
        images, state, noise = _observation(rng, gpu)
        got = gpu.predict(images, "pick up the red cube", state, noise)
        want = cpu.predict(images, "pick up the red cube", state, noise)
        assert got.shape == want.shape == (gpu.horizon, gpu.action_dim)
        assert cosine(got, want) >= GATE_BF16, cosine(got, want)
    gpu.close()
    cpu.close()


def test_gpu_preprocess_switch_gives_the_same_actions(checkpoint):
    on = flashrt_core.load_model(checkpoint, device="cuda", gpu_preprocess=True)
    off = flashrt_core.load_model(checkpoint, device="cuda", gpu_preprocess=False)
    assert on.gpu_preprocess and not off.gpu_preprocess
    images, state, noise = _observation(np.random.default_rng(1), on)
    a = on.predict(images, "open the drawer", state, noise)
    b = off.predict(images, "open the drawer", state, noise)
    assert cosine(a, b) >= HOST_VS_GPU_RESIZE_COSINE
    with pytest.raises(flashrt_core.InputError, match="dtype"):
        on.predict([images[0].astype(np.float32)], "open the drawer", state, noise)


def test_unnormalizing_in_the_graph_gives_the_host_unnormalization(checkpoint):
    """load_model hands the engine the normalizer's action affine: Policy.predict gets robot units straight from
    the graph (gpu_unnormalize, the default), equal to the host unnormalization of the normalized actions
    (gpu_unnormalize=False) on the same engine, graph and noise to fp32 rounding."""
    on = flashrt_core.load_model(checkpoint, device="cuda")
    assert on.gpu_unnormalize and on.executor.action_affine is not None
    off = flashrt_core.api.Policy(None, on.config, on.executor, on.tokenizer, on.normalizer, on.device, on.model_id,
                                  gpu_unnormalize=False)
    assert not off.gpu_unnormalize
    rng = np.random.default_rng(11)
    for _ in range(OBSERVATIONS):
        images, state, noise = _observation(rng, on)
        a = on.predict(images, "wipe the table", state, noise)
        b = off.predict(images, "wipe the table", state, noise)
        assert a.dtype == np.float32 and a.shape == b.shape == (on.horizon, on.action_dim)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * float(np.abs(b).max()))
    on.close()


# What a load/predict/close cycle may leave for the life of the process (cuBLAS workspaces per handle and stream);
# an engine that is not freed leaves its weights, static buffers and graph pools.
CYCLE_LEAK_TOLERANCE_B = 4 * 1024 * 1024


def test_close_releases_the_engine_and_its_gpu_memory(checkpoint):
    import gc
    import weakref

    import torch

    rng = np.random.default_rng(5)

    def cycle() -> tuple[int, int, weakref.ref]:
        policy = flashrt_core.load_model(checkpoint, device="cuda")
        images, state, noise = _observation(rng, policy)
        actions = policy.predict(images, "pick up the cube", state=state, noise=noise)
        assert np.isfinite(actions).all()
        loaded = torch.cuda.memory_allocated()
        engine = weakref.ref(policy.executor)
        policy.close()
        del policy
        gc.collect()
        return loaded, torch.cuda.memory_allocated(), engine

    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    loaded, first, engine = cycle()
    assert engine() is None, "the engine is still referenced after close"
    assert loaded > start and first < loaded
    _, second, _ = cycle()
    assert second <= first + CYCLE_LEAK_TOLERANCE_B, (start, loaded, first, second)
