"""pi0-FAST on the engine (flashrt_core/engine/fast_decode.py) against the eager reference, on the CPU: the engine's
prefill and decode steps with the plain-PyTorch ops, fp32, tiny random weights, the same code the GPU captures.
The graph capture itself runs on a GPU (test/gpu/test_fast_decode_gpu.py)."""

import numpy as np
import pytest
import torch

import flashrt_core
from flashrt_core.checkpoint import load_model_weights
from flashrt_core.config import get_config
from flashrt_core.engine.dispatch import Dispatch, Op, eager_cpu_dispatch
from flashrt_core.engine.fast_decode import FastGraphExecutor
from flashrt_core.engine.options import EngineOptions
from flashrt_core.pi0_fast_fixtures import plant_output_tokens, write_random_fast_checkpoint
from flashrt_core.pi0_fast_policy import FastReferenceExecutor
from flashrt_core.tokenizer import EOS_ID
from test_pi0_fast import ACTION_DIM, IMAGES, PROMPT, STATE, STATE_DIM, planted_chain

NO_EOS = -1
FP32_LOGITS_ATOL = 1e-4       # fp32 on both sides; folded norms and merged GEMMs change the op order only
STEPS = 24


@pytest.fixture(scope="module")
def random_dir(tmp_path_factory):
    return write_random_fast_checkpoint(tmp_path_factory.mktemp("fast_engine"), seed=5, state_dim=STATE_DIM,
                                        action_dim=ACTION_DIM)


def _config(**fast):
    return get_config("pi0fast_tiny", state_dim=STATE_DIM, action_dim=ACTION_DIM,
                      fast={"max_decoding_steps": STEPS, **fast})


def _engine(model, cfg, eos_id=NO_EOS, **options):
    return FastGraphExecutor(model, cfg, "cpu", eager_cpu_dispatch(EngineOptions(**options)), eos_id=eos_id,
                             dtype=torch.float32)


def _inputs(cfg, views, n_text, seed=0):
    gen = torch.Generator().manual_seed(seed)
    size = cfg.vision.image_size
    pixels = torch.rand(1, len(cfg.view_names), 3, size, size, generator=gen) * 2 - 1
    masks = torch.tensor([[v in views for v in range(len(cfg.view_names))]])
    tokens = torch.randint(5, 1000, (1, cfg.max_token_len), generator=gen)
    return pixels, masks, tokens, torch.arange(cfg.max_token_len)[None] < n_text


@pytest.mark.parametrize("style, offset", [("openpi", 1), ("lerobot", 0)])
@pytest.mark.parametrize("views, n_text", [((0, 1, 2), 30), ((0, 2), 17), ((1,), 96)])
def test_engine_decodes_the_reference_tokens(random_dir, style, offset, views, n_text):
    cfg = _config(prompt_style=style, decode_position_offset=offset)
    model = load_model_weights(random_dir, cfg, "cpu", torch.float32)
    inputs = _inputs(cfg, views, n_text)
    with torch.inference_mode():
        ref = model.generate(*inputs, STEPS, NO_EOS, offset)
    out = _engine(model, cfg, text_buckets=(16, 32)).generate(*inputs)
    assert out.tolist() == ref.tolist()


def test_teacher_forced_logits_match_the_reference(random_dir):
    cfg = _config()
    model = load_model_weights(random_dir, cfg, "cpu", torch.float32)
    inputs = _inputs(cfg, (0, 1), 40, seed=1)
    forced = torch.randint(5, 1000, (STEPS - 1,), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        state, logits = model.prefill(*model.embed_prefix(*inputs))
        ref = [logits]
        for token in forced:
            ref.append(model.decode_step(state, token[None], cfg.fast.decode_position_offset))
    got = _engine(model, cfg).teacher_forced_logits(*inputs, forced)
    assert got.shape == (STEPS, cfg.paligemma.vocab_size)
    torch.testing.assert_close(got, torch.cat(ref), rtol=0, atol=FP32_LOGITS_ATOL)


@pytest.mark.parametrize("per_graph", [1, 5, 8, 23, 64])
def test_graph_sizes_cover_every_step_once_and_decode_the_same(random_dir, per_graph):
    cfg = _config()
    model = load_model_weights(random_dir, cfg, "cpu", torch.float32)
    engine = _engine(model, cfg, decode_graph_tokens=per_graph)
    steps = [s for r in engine.step_ranges() for s in r]
    assert steps == list(range(STEPS - 1)) and all(0 < len(r) <= per_graph for r in engine.step_ranges())
    inputs = _inputs(cfg, (0,), 20, seed=3)
    with torch.inference_mode():
        ref = model.generate(*inputs, STEPS, NO_EOS, cfg.fast.decode_position_offset)
    assert engine.generate(*inputs).tolist() == ref.tolist()


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    path = write_random_fast_checkpoint(tmp_path_factory.mktemp("fast_engine_planted"), seed=2,
                                        state_dim=STATE_DIM, action_dim=ACTION_DIM)
    policy = flashrt_core.load_model(path, device="cpu")
    _, fast_ids, out = planted_chain(policy)
    plant_output_tokens(path, policy.tokenizer.encode("\n", add_bos=False)[-1], out)
    return path, out


@pytest.mark.parametrize("per_graph", [1, 4, 64])
def test_the_policy_on_the_engine_stops_at_the_end_token(planted, per_graph):
    """The planted checkpoint writes a known action sequence and EOS: the engine's output is cut after the EOS
    like the reference's, whichever graph the EOS falls in, and the chunks are equal."""
    path, out = planted
    policy = flashrt_core.load_model(path, device="cpu")
    expected = policy.predict(IMAGES, PROMPT, STATE)
    assert isinstance(policy.executor, FastReferenceExecutor) and policy.last_tokens.tolist() == out
    engine = _engine(policy.model, policy.config, eos_id=EOS_ID, decode_graph_tokens=per_graph)
    launches = []
    decode = engine._decode
    engine._decode = lambda fw: launches.append(decode(fw)) or launches[-1]
    policy.executor = engine
    np.testing.assert_allclose(policy.predict(IMAGES, PROMPT, STATE), expected, rtol=1e-6, atol=1e-6)
    assert policy.last_tokens.tolist() == out
    ranges = engine.step_ranges()
    # the EOS is token len(out) - 1, written by step len(out) - 2: the eager engine stops after that launch
    eos_launch = 1 + next(i for i, r in enumerate(ranges) if len(out) - 2 in r)
    assert launches == [eos_launch + 1]
    if per_graph < len(out):
        assert launches[0] < len(ranges) + 1             # stopped before the last decode graph


def test_a_new_prompt_reuses_the_workspace_and_gives_its_own_tokens(random_dir):
    cfg = _config()
    model = load_model_weights(random_dir, cfg, "cpu", torch.float32)
    engine = _engine(model, cfg, text_buckets=(32,))
    for seed, n_text in ((4, 20), (5, 27)):
        inputs = _inputs(cfg, (0, 1, 2), n_text, seed=seed)
        with torch.inference_mode():
            ref = model.generate(*inputs, STEPS, NO_EOS, cfg.fast.decode_position_offset)
        assert engine.generate(*inputs).tolist() == ref.tolist()
        (fw,) = engine._entries.values()
        assert int(fw.n_valid) == 3 * cfg.vision.num_patches + n_text
        assert fw.ws.tokens.tolist() == inputs[2][0, :32].tolist()


def test_engine_refusals_name_the_problem(random_dir):
    cfg = _config()
    model = load_model_weights(random_dir, cfg, "cpu", torch.float32)
    with pytest.raises(ValueError, match="decode_graph_tokens must be an int from 1 to 64"):
        EngineOptions(decode_graph_tokens=0)
    cpu = eager_cpu_dispatch()
    fp8 = Dispatch(cpu.hardware, cpu.options, {**cpu.choice, Op.GEMM_PREFIX: "fp8"})
    with pytest.raises(ValueError, match="weight-only FP8 weights in the Triton few-row GEMM"):
        FastGraphExecutor(model, cfg, "cpu", fp8, eos_id=EOS_ID)
    with pytest.raises(ValueError, match="serves pi0fast configs"):
        FastGraphExecutor(model, get_config("pi05_tiny"), "cpu", eager_cpu_dispatch(), eos_id=EOS_ID)
    inputs = _inputs(cfg, (), 10)
    with pytest.raises(flashrt_core.errors.InputError, match="at least one view"):
        _engine(model, cfg).generate(*inputs)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        flashrt_core.load_model(random_dir, config=cfg, device="cpu", hardware="h200")


def test_weight_only_fp8_keeps_each_row_within_e4m3s_rounding():
    """fp8.weight_only_fp8: one scale per output row (its amax onto E4M3's largest value), the bf16 weights kept;
    dequantized rows are within E4M3's relative rounding (3 mantissa bits: 2^-4) of the weights."""
    from flashrt_core.engine.fp8 import FP8_MAX, weight_only_fp8
    from flashrt_core.engine.weights import Linear
    g = torch.Generator().manual_seed(0)
    w = torch.randn(40000, 64, generator=g) * torch.logspace(-3, 1, 40000)[:, None]   # rows of very different size
    lin = weight_only_fp8(Linear([(w.clone(), None)]), torch.float8_e4m3fn)
    q, scale = lin.w8
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (40000,) and torch.equal(lin.parts[0][0], w)
    torch.testing.assert_close(q.float().abs().amax(dim=1), torch.full((40000,), FP8_MAX[torch.float8_e4m3fn]))
    back = q.float() * scale[:, None]
    big = w.abs() > w.abs().amax(dim=1, keepdim=True) * 2 ** -6                       # E4M3's normal range
    assert ((back - w).abs()[big] <= w.abs()[big] * 2 ** -4).all()
    with pytest.raises(ValueError, match="has a bias"):
        weight_only_fp8(Linear([(w, torch.zeros(40000))]), torch.float8_e4m3fn)
