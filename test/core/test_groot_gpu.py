"""GR00T N1.6 reference path on CUDA (hardware="reference"; test_groot_graph_gpu.py tests the graph executor): the
same chunk as on the CPU (fp32), a finite bf16 chunk close to it, and the released sizes load and predict from a
random sharded checkpoint (bf16, one H200)."""

import time

import numpy as np
import pytest
import torch

from flashrt_core import load_model
from flashrt_core.groot_fixtures import write_random_groot_checkpoint

pytestmark = pytest.mark.gpu
TINY = "groot_n1.6_tiny"


def observation(policy, hw=(72, 96), seed=0):
    rng = np.random.default_rng(seed)
    images = {v: rng.integers(0, 256, (*hw, 3), dtype=np.uint8) for v in policy.view_names}
    state = rng.uniform(-1, 1, policy.state_dim)
    cfg = policy.config
    noise = rng.standard_normal((cfg.action_horizon, cfg.max_action_dim)).astype(np.float32)
    return images, state, noise


def test_cuda_matches_cpu(tmp_path):
    ckpt = write_random_groot_checkpoint(tmp_path / "c", TINY, seed=4)
    cpu = load_model(ckpt, embodiment="new_embodiment", device="cpu")
    gpu = load_model(ckpt, embodiment="new_embodiment", device="cuda", dtype="float32", hardware="reference")
    images, state, noise = observation(cpu)
    a = cpu.predict(images, "pick up the cube", state, noise)
    b = gpu.predict(images, "pick up the cube", state, noise)
    np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-3)
    half = load_model(ckpt, embodiment="new_embodiment", device="cuda", hardware="reference")   # bf16 on CUDA
    c = half.predict(images, "pick up the cube", state, noise)
    assert np.isfinite(c).all()
    assert np.abs(c - a).max() < 0.2 * (np.abs(a).max() + 1)


def test_released_sizes_on_cuda(tmp_path):
    ckpt = write_random_groot_checkpoint(tmp_path / "full", "groot_n1.6", seed=0, shards=4, dtype=torch.bfloat16)
    policy = load_model(ckpt, embodiment="new_embodiment", device="cuda", hardware="reference")
    images, state, noise = observation(policy, hw=(224, 224))
    first = policy.predict(images, "pick up the cube", state, noise)
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        again = policy.predict(images, "pick up the cube", state, noise)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    print(f"GR00T N1.6 reference, 2 views 224x224, bf16: median {1000 * sorted(times)[2]:.1f} ms")
    assert first.shape == (16, 6) and np.isfinite(first).all()
    np.testing.assert_allclose(again, first, rtol=1e-2, atol=1e-2)
