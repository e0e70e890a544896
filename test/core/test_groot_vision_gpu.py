"""GR00T N1.6's engine vision (engine/groot_vision.py, EngineOptions.groot_engine_vision) on CUDA: at the released
vision sizes (SigLIP2 1152 wide, 27 layers, 16 heads, MLP 4304 padded to 4352, the projector to the 2048-wide LLM;
random weights, the LLM and DiT cut to one and two layers, which the vision does not read) its bf16 image tokens,
run eagerly and replayed from a CUDA graph, agree with transformers' bf16 tokens and are at least as near the fp32
reference's, for two 252 x 252 views and for two view sizes; the policy's options reach it (the switch,
fused_weights, vision_mlp_pad) and its chunk is the reference's (tiny, fp32)."""

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_groot_graph_gpu import tiny_policy_case

from flashrt_core import load_model
from flashrt_core.engine import EngineOptions
from flashrt_core.engine.groot_graph import GrootGraphExecutor
from flashrt_core.engine.groot_static import GrootSignature, StaticTables, image_tokens
from flashrt_core.engine.groot_vision import GrootVision
from flashrt_core.engine.timing import graph_replay_ms, warm_up_and_capture
from flashrt_core.groot_fixtures import random_groot_model
from flashrt_core.model.groot.config import get_groot_config

pytestmark = pytest.mark.gpu
MIN_TOKEN_COSINE = 0.998      # worst per-token cosine of the engine's bf16 tokens vs transformers' bf16 tokens
COSINE_MARGIN = 5e-4          # the engine's mean cosine to fp32 may trail transformers' bf16 one by at most this
MLP_PAD = 128                 # EngineOptions.vision_mlp_pad's default: 4304 -> 4352


def _vision_only_config():
    """The released vision tower and projector; the LLM and DiT cut short (the vision does not read them)."""
    base = get_groot_config("groot_n1.6")
    return base.replace(llm=dataclasses.replace(base.llm, num_layers=1, vocab_size=1024), image_token_index=1000,
                        dit=dataclasses.replace(base.dit, num_layers=2))


@pytest.fixture(scope="module")
def models():
    cfg = _vision_only_config()
    cuda = torch.device("cuda")
    return (random_groot_model(cfg, seed=0, dtype=torch.bfloat16, device=cuda),
            random_groot_model(cfg, seed=0, dtype=torch.float32, device=cuda))


def _cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.cosine_similarity(a.float(), b.float(), dim=-1)


@pytest.mark.parametrize("sizes", [[(252, 252), (252, 252)], [(252, 252), (224, 308)]])
def test_released_vision_tokens_agree_with_transformers(models, sizes):
    with torch.inference_mode():
        _released_vision_tokens(*models, sizes)


def _released_vision_tokens(m16, m32, sizes) -> None:
    cuda = torch.device("cuda")
    ex = GrootGraphExecutor(m16, cuda, fused_dit=False, vision_mlp_pad=MLP_PAD)   # the Ops without the fused DiT
    vision = ex._vision
    assert isinstance(vision, GrootVision) and vision.layers[0].fc1.parts[0][0].shape[0] == 4352
    sig = GrootSignature(1, tuple(sizes), 10, False)
    ex._tune_vision_attention(sig)
    assert ex.ops.vision_attention_timings                      # the SDPA backend was timed at this shape
    gen = torch.Generator().manual_seed(0)
    views = [(torch.rand(3, h, w, generator=gen) * 2 - 1).to(cuda) for h, w in sizes]
    engine = StaticTables(m16, sig, cuda, step_tables=False, vision=vision)
    plain = StaticTables(m16, sig, cuda, step_tables=False)
    got = image_tokens(m16, engine, views, torch.bfloat16)
    hf16 = image_tokens(m16, plain, views, torch.bfloat16)
    ref = image_tokens(m32, StaticTables(m32, sig, cuda, step_tables=False), views, torch.float32)
    assert got.shape == hf16.shape == (sum(m16.cfg.image_tokens(h, w) for h, w in sizes), 2048)
    assert torch.isfinite(got).all()
    worst = _cosine(got, hf16).min().item()
    near, hf_near = _cosine(got, ref).mean().item(), _cosine(hf16, ref).mean().item()
    graph_e, out_e = warm_up_and_capture(cuda, lambda: image_tokens(m16, engine, views, torch.bfloat16), 2)
    graph_h, _ = warm_up_and_capture(cuda, lambda: image_tokens(m16, plain, views, torch.bfloat16), 2)
    graph_e.replay()
    torch.testing.assert_close(out_e, got)                      # the replay computes what the eager run did
    ms_e, ms_h = np.median(graph_replay_ms(graph_e, 30)), np.median(graph_replay_ms(graph_h, 30))
    print(f"GR00T vision {sizes} bf16: engine {ms_e:.3f} ms, transformers {ms_h:.3f} ms (graph replays; SDPA "
          f"backend {ex.ops.vision_attention_backend}); cosine to transformers' bf16 worst {worst:.5f}, mean to "
          f"fp32 engine {near:.5f} vs transformers {hf_near:.5f}")
    assert worst > MIN_TOKEN_COSINE
    assert near > hf_near - COSINE_MARGIN


def test_policy_options_reach_the_engine_vision(tmp_path):
    """Default options: the engine vision, folded, its MLP padded to vision_mlp_pad, the SDPA backend timed; the
    switch off: transformers' layers; fused_weights off: the LayerNorms unfolded; vision_mlp_pad 0: the width as
    it is. Every chunk is the fp32 reference's."""
    ckpt, images, state, noise, want = tiny_policy_case(tmp_path)
    for options, engine, folded, width in ((None, True, True, 128),
                                           (EngineOptions(groot_engine_vision=False), False, None, None),
                                           (EngineOptions(fused_weights=False), True, False, 128),
                                           (EngineOptions(vision_mlp_pad=0), True, True, 64)):
        pol = load_model(ckpt, embodiment="new_embodiment", device="cuda", dtype="float32", engine_options=options)
        vision = pol.executor._vision
        assert (vision is not None) == engine
        if engine:
            assert (vision.layers[0].ln1 is None) == folded and vision.layers[0].fc1.parts[0][0].shape[0] == width
        np.testing.assert_allclose(pol.predict(images, "pick up the cube", state, noise), want, rtol=1e-4, atol=1e-4)
        if engine:
            assert pol.executor.ops.vision_attention_timings        # timed at the first signature
        pol.close()
