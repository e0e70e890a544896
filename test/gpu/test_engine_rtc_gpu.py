"""Real-time chunking inside the captured graph (flashrt_core/engine/rtc_blend.py: the hard prefix, the guidance
with the Jacobian as identity, training-time RTC's clean prefix with per-row modulation; engine/rtc_guided.py: the
guidance through the denoiser's Jacobian) on a GPU: the replayed graph equals the eager engine, keeps the frozen
rows exactly (hard prefix, training time), agrees with the reference
sampler, serves every delay without a recapture and leaves the plain graph alone. Skips without CUDA. What each
mode costs is measured by tools/benchmark_rtc.py (docs/performance.md).

    .venv/bin/python -m pytest -q test/gpu/test_engine_rtc_gpu.py
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flashrt_core.checkpoint import load_model_weights
from flashrt_core.config import get_config
from flashrt_core.engine import EngineOptions, build_executor
from flashrt_core.engine.gate import GATE_BF16, cosine, random_observation, reference_inputs
from flashrt_core.executor import ReferenceExecutor
from flashrt_core.fixtures import write_random_checkpoint
from flashrt_core.rtc import RtcPlan, prefix_weights

pytestmark = pytest.mark.gpu

REPLAY_ATOL = 0.0                # the same kernels on the same inputs: bitwise equal
GUIDED_REPLAY_ATOL = 1e-5        # guided: the backward's cuBLAS GEMMs may take another algorithm under capture


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("pi05_tiny_rtc")
    write_random_checkpoint(path, "pi05_tiny", seed=1)
    return load_model_weights(path, get_config("pi05_tiny"), "cuda", torch.float32)


def _plan(cfg, delay: int, seed: int, mode: str = "hard_prefix") -> RtcPlan:
    target = torch.from_numpy(np.random.default_rng(seed).uniform(-1, 1, (1, cfg.action_horizon, cfg.max_action_dim))
                              .astype(np.float32))
    soft = mode in ("guided", "guided_identity")
    weights = prefix_weights(delay, cfg.action_horizon if soft else delay, cfg.action_horizon,
                             "exp" if soft else "zeros")
    return RtcPlan(mode, target, weights, delay)


def _reference_rtc(model, obs, plan: RtcPlan) -> np.ndarray:
    dev = torch.device("cuda")
    out = ReferenceExecutor(model, model.config, dev).sample_actions_rtc(
        *reference_inputs(model.config, obs, dev), plan.to(dev))
    return out[0].float().cpu().numpy()


@pytest.mark.parametrize("mode", ["hard_prefix", "guided_identity", "training_time", "guided"])
def test_rtc_in_the_graph(tiny, mode):
    cfg = tiny.config
    graph = build_executor(tiny, cfg, torch.device("cuda"), "auto")
    eager = build_executor(tiny, cfg, torch.device("cuda"), "auto", EngineOptions(cuda_graph=False))
    eager.ops.decoder_impl = dict(graph.ops.decoder_impl)
    obs = random_observation(cfg, np.random.default_rng(0), views=2, n_text=9)
    args = (obs.images, obs.tokens, obs.token_mask, obs.state, obs.noise)
    plain_before = graph.predict_observation(*args)
    captured = None
    for seed, delay in enumerate((3, 0, cfg.action_horizon - 1, 5)):
        plan = _plan(cfg, delay, seed, mode)
        got = graph.predict_observation(*args, rtc=plan)
        np.testing.assert_allclose(got, eager.predict_observation(*args, rtc=plan), rtol=0,
                                   atol=GUIDED_REPLAY_ATOL if mode == "guided" else REPLAY_ATOL)
        if mode in ("hard_prefix", "training_time"):
            np.testing.assert_array_equal(got[:delay], plan.target[0, :delay].numpy())
        assert cosine(got, _reference_rtc(tiny, obs, plan)) >= GATE_BF16
        rtc_entries = [e for key, e in graph._entries.items() if isinstance(key[-1], tuple)]
        assert len(rtc_entries) == 1 and rtc_entries[0].graph is not None
        captured = captured or rtc_entries[0].graph
        assert rtc_entries[0].graph is captured                       # every delay: the same graph
    np.testing.assert_array_equal(graph.predict_observation(*args), plain_before)
