"""pi0-FAST's graph engine on a GPU (flashrt_core/engine/fast_decode.py), full size, random weights: the replayed
graphs decode the same tokens as the same ops launched eagerly, and the bf16 engine's logits, teacher-forced on the
fp32 reference's greedy tokens, stay within the gate of the fp32 reference model's, in bf16 and with weight-only FP8
decoding. The planted-chunk test in
test/core/test_pi0_fast.py runs load_model's engine end to end with the end token. Skips without CUDA."""

from __future__ import annotations

import pytest
import torch

from flashrt_core.config import get_config
from flashrt_core.engine import EngineOptions, detect_hardware, resolve
from flashrt_core.engine.fast_decode import FastGraphExecutor
from flashrt_core.engine.gate import cosine
from flashrt_core.model import Pi0FastModel

pytestmark = pytest.mark.gpu

NO_EOS = -1
STEPS = 24
# engine vs fp32 reference, per decoding step's logits over the 257,152-token vocabulary: bf16, and weight-only FP8
# (the pi engine's FP8 gate)
FAST_LOGITS_COSINE = 0.999
FAST_LOGITS_COSINE_FP8 = 0.998


@pytest.fixture(scope="module")
def models():
    cfg = get_config("pi0fast", fast={"max_decoding_steps": STEPS})
    torch.manual_seed(0)
    with torch.device("cuda"):
        reference = Pi0FastModel(cfg).eval().requires_grad_(False)          # fp32
    half = Pi0FastModel(cfg).to("cuda", torch.bfloat16).eval().requires_grad_(False)
    half.load_state_dict({k: v.to(torch.bfloat16) for k, v in reference.state_dict().items()})
    return cfg, reference, half


def _inputs(cfg, views=2, n_text=60, seed=0):
    gen = torch.Generator().manual_seed(seed)
    size = cfg.vision.image_size
    pixels = torch.rand(1, 3, 3, size, size, generator=gen) * 2 - 1
    masks = torch.arange(3)[None] < views
    tokens = torch.randint(4, cfg.paligemma.vocab_size, (1, cfg.max_token_len), generator=gen)
    return tuple(t.cuda() for t in (pixels, masks, tokens, torch.arange(cfg.max_token_len)[None] < n_text))


def _engine(cfg, model, **options):
    dispatch = resolve(detect_hardware("auto", torch.device("cuda")), EngineOptions(**options))
    return FastGraphExecutor(model, cfg, torch.device("cuda"), dispatch, eos_id=NO_EOS)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_graphs_decode_what_the_eager_ops_decode(models, fp8):
    cfg, _, half = models
    graph = _engine(cfg, half, fp8=fp8)
    eager = _engine(cfg, half, cuda_graph=False, fp8=fp8)
    assert graph.use_graph and not eager.use_graph
    for seed, n_text in ((0, 60), (1, 23)):
        inputs = _inputs(cfg, n_text=n_text, seed=seed)
        first = graph.generate(*inputs)
        assert first.shape == (1, STEPS)
        assert graph.generate(*inputs).tolist() == first.tolist() == eager.generate(*inputs).tolist()


@pytest.mark.parametrize("fp8, gate", [(False, FAST_LOGITS_COSINE), (True, FAST_LOGITS_COSINE_FP8)],
                         ids=["bf16", "fp8"])
def test_logits_pass_the_gate_against_the_fp32_reference(models, fp8, gate):
    cfg, reference, half = models
    inputs = _inputs(cfg, seed=2)
    with torch.inference_mode():
        greedy = reference.generate(*inputs, STEPS, NO_EOS, cfg.fast.decode_position_offset)[0]
        state, logits = reference.prefill(*reference.embed_prefix(*inputs))
        want = [logits]
        for token in greedy[:-1]:
            want.append(reference.decode_step(state, token[None], cfg.fast.decode_position_offset))
    engine = _engine(cfg, half, fp8=fp8)
    assert engine.name.endswith("fp8" if fp8 else "bfloat16")
    got = engine.teacher_forced_logits(*inputs, greedy[:-1])
    cosines = [cosine(a.cpu().numpy(), b.float().cpu().numpy()) for a, b in zip(got, want)]
    print(f"{engine.name} teacher-forced logits cosine per step:", " ".join(f"{c:.5f}" for c in cosines))
    assert min(cosines) >= gate, cosines
