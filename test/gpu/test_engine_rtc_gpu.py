"""Real-time chunking inside the captured graph (flashrt_core/engine/rtc_blend.py: the hard prefix, the guidance
with the Jacobian as identity, training-time RTC's clean prefix with per-row modulation) on a GPU: the replayed graph
equals the eager engine, keeps the frozen rows exactly (hard prefix, training time), agrees with the reference sampler, serves
every delay without a recapture, leaves the plain graph alone; and what it costs on full-size pi0.5 (graph replay
GPU time with and without it, training-time RTC's replay, and guided RTC on the reference path). Skips without CUDA.

    .venv/bin/python -m pytest -q -s test/gpu/test_engine_rtc_gpu.py     # -s prints the measured costs
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from flashrt_core.checkpoint import load_model_weights
from flashrt_core.config import get_config
from flashrt_core.engine import EngineOptions, build_executor
from flashrt_core.engine.gate import GATE_BF16, cosine, random_observation
from flashrt_core.engine.graph_executor import graph_replay_ms
from flashrt_core.executor import ReferenceExecutor
from flashrt_core.fixtures import CONFIG_FILE, write_random_checkpoint
from flashrt_core.rtc import RtcPlan, prefix_weights

pytestmark = pytest.mark.gpu

REPLAY_ATOL = 0.0                # the same kernels on the same inputs: bitwise equal
RTC_OVERHEAD_LIMIT = 0.03        # the blend: num_steps + 1 elementwise ops on a (horizon, 32) tile


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
    cfg, dev = model.config, torch.device("cuda")
    pixels = torch.stack([torch.from_numpy(img).permute(2, 0, 1).float() / 255.0 * 2.0 - 1.0 if img is not None
                          else torch.full((3, cfg.vision.image_size, cfg.vision.image_size), -1.0)
                          for img in obs.images])
    masks = torch.tensor([img is not None for img in obs.images])
    state = torch.from_numpy(obs.state)[None].to(dev) if cfg.model_type == "pi0" else None
    out = ReferenceExecutor(model, cfg, dev).sample_actions_rtc(
        pixels[None].to(dev), masks[None].to(dev), torch.from_numpy(obs.tokens)[None].to(dev),
        torch.from_numpy(obs.token_mask)[None].to(dev), state, torch.from_numpy(obs.noise)[None].to(dev),
        plan.to(dev))
    return out[0].float().cpu().numpy()


@pytest.mark.parametrize("mode", ["hard_prefix", "guided_identity", "training_time"])
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
        np.testing.assert_allclose(got, eager.predict_observation(*args, rtc=plan), atol=REPLAY_ATOL, rtol=0)
        if mode in ("hard_prefix", "training_time"):
            np.testing.assert_array_equal(got[:delay], plan.target[0, :delay].numpy())
        assert cosine(got, _reference_rtc(tiny, obs, plan)) >= GATE_BF16
        rtc_entries = [e for key, e in graph._entries.items() if isinstance(key[-1], tuple)]
        assert len(rtc_entries) == 1 and rtc_entries[0].graph is not None
        captured = captured or rtc_entries[0].graph
        assert rtc_entries[0].graph is captured                       # every delay: the same graph
    np.testing.assert_array_equal(graph.predict_observation(*args), plain_before)


def _checkpoint(name: str) -> Path:
    root = Path(os.environ.get("FLASHRT_FULL_CKPT_ROOT")
                or Path(os.environ.get("FLASHRT_CACHE_DIR", Path.home() / ".cache" / "flashrt")) / "full")
    path = root / name
    if not (path / CONFIG_FILE).is_file():
        write_random_checkpoint(path, name, seed=0)
    return path


def test_cost_of_rtc_on_full_size_pi05():
    """Full-size pi0.5, bf16: the hard prefix adds at most RTC_OVERHEAD_LIMIT to the graph's replay; guided RTC on the
    reference path (eager, a backward per step) is measured beside the plain reference and printed."""
    cfg = get_config("pi05")
    model = load_model_weights(_checkpoint("pi05"), cfg, "cuda", torch.bfloat16)
    engine = build_executor(model, cfg, torch.device("cuda"), "auto", EngineOptions(chain_tuning_passes=1))
    obs = random_observation(cfg, np.random.default_rng(0), views=2, n_text=20, vocab=1024)
    args = (obs.images, obs.tokens, obs.token_mask, obs.state, obs.noise)
    plan = _plan(cfg, 5, 0)
    engine.predict_observation(*args)
    engine.predict_observation(*args, rtc=plan)
    engine.predict_observation(*args, rtc=_plan(cfg, 5, 0, "training_time"))
    graphs = {(key[-1][1] if isinstance(key[-1], tuple) else "plain"): e.graph for key, e in engine._entries.items()}
    times = {name: [] for name in graphs}
    for _ in range(5):                                 # interleaved rounds: drift hits both alike
        for name, g in graphs.items():
            times[name] += graph_replay_ms(g, 20)
    plain_ms, rtc_ms, tt_ms = (statistics.median(times[name]) for name in ("plain", "hard_prefix", "training_time"))
    reference = ReferenceExecutor(model, cfg, torch.device("cuda"))
    ref_ms = {}
    for mode in (None, "hard_prefix", "guided"):
        samples = []
        for _ in range(4):
            torch.cuda.synchronize()
            start = time.perf_counter()
            if mode is None:
                _reference_plain(reference, obs)
            else:
                _reference_rtc(model, obs, _plan(cfg, 5, 0, mode))
            torch.cuda.synchronize()
            samples.append((time.perf_counter() - start) * 1e3)
        ref_ms[mode or "plain"] = statistics.median(samples[1:])
    print(f"\nRTC cost, full-size pi0.5 bf16, 2 views: graph replay plain {plain_ms:.3f} ms, hard prefix "
          f"{rtc_ms:.3f} ms (+{rtc_ms - plain_ms:.3f}), training time {tt_ms:.3f} ms (+{tt_ms - plain_ms:.3f}: "
          f"per-row modulation, unfused step ends); reference path plain {ref_ms['plain']:.1f} ms, hard prefix "
          f"{ref_ms['hard_prefix']:.1f} ms, guided {ref_ms['guided']:.1f} ms")
    assert rtc_ms <= plain_ms * (1 + RTC_OVERHEAD_LIMIT), (plain_ms, rtc_ms)
    del engine, reference, model
    torch.cuda.empty_cache()


def _reference_plain(reference: ReferenceExecutor, obs) -> None:
    from flashrt_core.engine.gate import reference_actions
    reference_actions(reference, obs)
