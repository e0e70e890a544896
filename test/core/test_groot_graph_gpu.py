"""GR00T N1.6's graph executor on CUDA: the captured replay equals the reference executor (tiny, fp32) with the
fused DiT on and off, the policy picks it by default and the engine options' switches turn it off, and at the
released sizes (random bf16 sharded checkpoint) its bf16 chunk passes the accuracy gate against the fp32 reference
on the same weights, with the fused DiT (engine/groot_fused_dit.py: Triton norms, GELU epilogue) on and off."""

import time

import numpy as np
import pytest
import torch

from flashrt_core import load_model
from flashrt_core.engine import EngineOptions
from flashrt_core.engine.gate import GATE_BF16, cosine
from flashrt_core.engine.groot_graph import GrootGraphExecutor
from flashrt_core.engine.timing import graph_replay_ms
from flashrt_core.groot_fixtures import random_groot_model, write_random_groot_checkpoint
from flashrt_core.groot_policy import GrootReferenceExecutor

pytestmark = pytest.mark.gpu
TINY = "groot_n1.6_tiny"
WORST_COSINE = 0.995


def tiny_inputs(cfg, sizes, text, seed, device):
    gen = torch.Generator().manual_seed(seed)
    views = [(torch.rand(3, h, w, generator=gen) * 2 - 1).to(device) for h, w in sizes]
    pieces = [torch.randint(0, cfg.image_token_index, (text,), generator=gen)]
    for h, w in sizes:
        pieces += [torch.tensor([7]), torch.full((cfg.image_tokens(h, w),), cfg.image_token_index), torch.tensor([8])]
    ids = torch.cat(pieces)[None]
    return (views, ids.to(device), torch.ones_like(ids, dtype=torch.bool).to(device),
            (torch.rand(1, 1, cfg.max_state_dim, generator=gen) * 2 - 1).to(device), torch.tensor([3]).to(device),
            torch.randn(1, cfg.action_horizon, cfg.max_action_dim, generator=gen).to(device))


@pytest.mark.parametrize("fused_dit", [True, False])
@pytest.mark.parametrize("sizes, text", [([(56, 56)], 5), ([(56, 84), (56, 56)], 17), ([(84, 84), (84, 84)], 9)])
def test_tiny_replay_equals_the_reference(sizes, text, fused_dit):
    cuda = torch.device("cuda")
    model = random_groot_model(TINY, seed=5, device=cuda)                      # fp32
    ref = GrootReferenceExecutor(model, cuda)
    graph = GrootGraphExecutor(model, cuda, fused_dit=fused_dit)
    assert graph.capture and graph.name == "graph" and graph.fused_dit == fused_dit
    first = tiny_inputs(model.cfg, sizes, text, 1, cuda)
    got = graph.sample_actions(*first)                                          # captures
    torch.testing.assert_close(got, ref.sample_actions(*first), rtol=1e-4, atol=1e-4)
    (entry,) = graph.entries.values()
    assert entry.graph is not None
    second = tiny_inputs(model.cfg, sizes, text, 2, cuda)
    again = graph.sample_actions(*second)                                       # replays
    torch.testing.assert_close(again, ref.sample_actions(*second), rtol=1e-4, atol=1e-4)
    assert (again - got).abs().max() > 1e-3
    host = tiny_inputs(model.cfg, sizes, text, 3, torch.device("cpu"))         # staged through the pinned blob
    torch.testing.assert_close(graph.sample_actions(*host), ref.sample_actions(*tiny_inputs(
        model.cfg, sizes, text, 3, cuda)), rtol=1e-4, atol=1e-4)
    assert len(graph.entries) == 1                                              # one signature, one graph


def test_policy_executor_and_its_switches(tmp_path):
    ckpt = write_random_groot_checkpoint(tmp_path / "c", TINY, seed=4)
    rng = np.random.default_rng(0)
    images = {v: rng.integers(0, 256, (72, 96, 3), dtype=np.uint8) for v in ("front", "wrist")}
    state, noise = rng.uniform(-1, 1, 6), rng.standard_normal((16, 16)).astype(np.float32)
    ref = load_model(ckpt, embodiment="new_embodiment", device="cuda", dtype="float32", hardware="reference")
    want = ref.predict(images, "pick up the cube", state, noise)
    for options, name, tables, fused in (
            (None, "graph", True, True), (EngineOptions(groot_fused_dit=False), "graph", True, False),
            (EngineOptions(groot_step_tables=False), "graph", False, False),
            (EngineOptions(cuda_graph=False), "static-eager", True, True),
            (EngineOptions(fast_paths=False), "reference", None, None)):
        pol = load_model(ckpt, embodiment="new_embodiment", device="cuda", dtype="float32", engine_options=options)
        assert pol.executor.name == name and getattr(pol.executor, "step_tables", None) == tables
        assert getattr(pol.executor, "fused_dit", None) == fused
        np.testing.assert_allclose(pol.predict(images, "pick up the cube", state, noise), want, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="FP8 GEMMs serve the pi family only"):
        load_model(ckpt, embodiment="new_embodiment", device="cuda", engine_options=EngineOptions(fp8=True))


def test_released_sizes_pass_the_gate(tmp_path):
    """The bf16 graph with the fused DiT (the default) and without it, each against the fp32 reference."""
    ckpt = write_random_groot_checkpoint(tmp_path / "full", "groot_n1.6", seed=0, shards=4, dtype=torch.bfloat16)
    ref32 = load_model(ckpt, embodiment="new_embodiment", device="cuda", dtype="float32", hardware="reference")
    assert ref32.executor.name == "reference"
    rng = np.random.default_rng(0)
    observations = []
    for _ in range(4):
        images = {v: rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for v in ref32.view_names}
        state = rng.uniform(-1, 1, ref32.state_dim)
        noise = rng.standard_normal((16, 128)).astype(np.float32)
        want = ref32.executor.sample_actions(*ref32.prepare_inputs(images, "pick up the cube", state, noise))
        observations.append((images, state, noise, want.float().cpu().numpy()))
    del ref32
    for fused_dit in (True, False):
        options = None if fused_dit else EngineOptions(groot_fused_dit=False)
        graph = load_model(ckpt, embodiment="new_embodiment", device="cuda", engine_options=options)   # bf16
        assert graph.executor.name == "graph" and graph.executor.fused_dit == fused_dit
        _gate_and_times(graph, observations, "on" if fused_dit else "off")
        graph.close()
        del graph
        torch.cuda.empty_cache()


def _gate_and_times(graph, observations, fused: str) -> None:
    cosines = []
    for images, state, noise, want in observations:
        got = graph.executor.sample_actions(*graph.prepare_inputs(images, "pick up the cube", state, noise))
        assert torch.isfinite(got).all()
        cosines.append(cosine(got.float().cpu().numpy(), want))
    inputs = graph.prepare_inputs(images, "pick up the cube", state, noise)
    times = []
    for _ in range(30):
        torch.cuda.synchronize()
        start = time.perf_counter()
        graph.executor.sample_actions(*inputs)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    (entry,) = graph.executor.entries.values()
    replay = graph_replay_ms(entry.graph, 30)
    phases = graph.executor.phase_times(reps=10)
    print(f"GR00T N1.6 graph (fused DiT {fused}), 2 views 224x224 (252x252), bf16: sample_actions median "
          f"{np.median(times):.2f} ms, replay median {np.median(replay):.2f} ms (phases {phases}); cosine vs fp32 "
          f"mean {np.mean(cosines):.6f} worst {min(cosines):.6f}")
    assert set(phases) == {"vision", "language", "action_head"} and min(phases.values()) > 0
    assert 0.7 < sum(phases.values()) / np.median(replay) < 1.3       # the phases make up the whole graph
    assert np.mean(cosines) >= GATE_BF16 and min(cosines) >= WORST_COSINE
