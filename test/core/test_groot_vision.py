"""GR00T N1.6's vision tower on the engine's ops (engine/groot_vision.py, EngineOptions.groot_engine_vision), run with
the plain-PyTorch implementations of the ops on the CPU (fp32, tiny preset): the image tokens are the transformers
path's and the reference model's for 1, 2 and 3 views of one or two sizes, folded or not, with the MLP padded or
not; the chunk is the reference executor's with the switch on, with and without the fused DiT; the switch off runs
transformers' layers; the block row order is the pixel unshuffle's; the engine predict reads no value on the host."""

import contextlib

import pytest
import torch
import torch.nn.functional as F
from test_groot_graph import TINY, inputs

from flashrt_core.engine import EngineOptions, eager_cpu_dispatch
from flashrt_core.engine.groot_graph import GrootGraphExecutor
from flashrt_core.engine.groot_static import GrootSignature, StaticTables, embed_dtype, image_tokens, predict
from flashrt_core.engine.groot_vision import (GrootVision, block_columns, block_order, position_table,
                                              prepare_groot_vision)
from flashrt_core.engine.ops import Ops
from flashrt_core.groot_fixtures import random_groot_model
from flashrt_core.groot_policy import GrootReferenceExecutor

FP32_TOL = dict(rtol=1e-5, atol=1e-5)      # same math in fp32, other op order (folded norms, merged Q/K/V)
SIZES = [[(56, 56)], [(56, 56), (56, 56)], [(56, 84), (56, 56)], [(56, 56), (84, 56), (56, 56)]]


@pytest.fixture(scope="module")
def model():
    return random_groot_model(TINY, seed=5)


@contextlib.contextmanager
def _encoder_calls(model):
    """A list that grows by one at each call of transformers' first Siglip2 encoder layer inside the block."""
    calls = []
    hook = model.backbone.model.vision_model.vision_model.encoder.layers[0].register_forward_hook(
        lambda *_: calls.append(1))
    try:
        yield calls
    finally:
        hook.remove()


@pytest.mark.parametrize("sizes", SIZES)
@pytest.mark.parametrize("fold, mlp_pad", [(True, 0), (True, 48), (False, 0)])
def test_engine_tokens_are_the_transformers_tokens(model, sizes, fold, mlp_pad):
    views = inputs(model, sizes, 5, seed=1)[0]
    sig = GrootSignature.of(*inputs(model, sizes, 5, seed=1)[:3])
    vision = prepare_groot_vision(model, Ops(eager_cpu_dispatch()), fold=fold, mlp_pad=mlp_pad)
    width = vision.layers[0].fc1.parts[0][0].shape[0]
    assert width == (96 if mlp_pad else 64) and (vision.layers[0].ln1 is None) == fold
    assert (vision.proj_ln is None) == fold and len(vision.layers[0].qkv.parts) == (1 if fold else 3)
    engine = StaticTables(model, sig, torch.device("cpu"), vision=vision)
    plain = StaticTables(model, sig, torch.device("cpu"))
    assert engine.vision is vision and plain.vision is None
    with torch.inference_mode():
        got = image_tokens(model, engine, views, embed_dtype(model))
        want = image_tokens(model, plain, views, embed_dtype(model))
        hf = model.backbone.model.all_image_tokens(views, torch.float32)
    assert got.shape == want.shape == (sum(model.cfg.image_tokens(h, w) for h, w in sizes), model.cfg.llm.width)
    torch.testing.assert_close(got, want, **FP32_TOL)
    torch.testing.assert_close(got, hf, **FP32_TOL)
    assert not torch.equal(got, want)                  # other ops: equal up to rounding, not the same code


@pytest.mark.parametrize("fused_dit", [True, False])
@pytest.mark.parametrize("sizes, text, pad", [([(56, 56)], 5, 0), ([(56, 84), (56, 56)], 9, 3),
                                              ([(84, 84), (84, 84)], 17, 0)])
def test_chunk_with_the_engine_vision_is_the_references(model, sizes, text, pad, fused_dit):
    ref = GrootReferenceExecutor(model, torch.device("cpu"))
    ex = GrootGraphExecutor(model, "cpu", capture=False, fused_dit=fused_dit)
    assert isinstance(ex._vision, GrootVision) and ex._vision.ops is ex.ops
    assert ex._vision.layers[0].fc1.parts[0][0].shape[0] == EngineOptions().vision_mlp_pad     # 64 padded
    assert (ex._fused.ops is ex.ops) if fused_dit else ex._fused is None
    for seed in (1, 2):                                               # a second call: same signature, new values
        args = inputs(model, sizes, text, seed=seed, pad=pad)
        with _encoder_calls(model) as calls:
            got = ex.sample_actions(*args)
        assert calls == []                                            # transformers' layers did not run
        torch.testing.assert_close(got, ref.sample_actions(*args), **FP32_TOL)
    (entry,) = ex.entries.values()
    assert entry.tables.vision is ex._vision


def test_the_switch(model):
    """engine_vision=False (EngineOptions.groot_engine_vision off) prepares nothing and runs transformers' layers,
    with the fused DiT on or off; both give the reference's chunk."""
    args = inputs(model, [(56, 84), (56, 56)], 9, seed=4)
    want = GrootReferenceExecutor(model, torch.device("cpu")).sample_actions(*args)
    for fused_dit in (True, False):
        off = GrootGraphExecutor(model, "cpu", capture=False, fused_dit=fused_dit, engine_vision=False,
                                 engine_language=False)
        assert off._vision is None and (off.ops is not None) == fused_dit
        with _encoder_calls(model) as calls:
            torch.testing.assert_close(off.sample_actions(*args), want, **FP32_TOL)
        (entry,) = off.entries.values()
        assert entry.tables.vision is None and entry.tables.vision_positions == {}
        assert len(calls) == 2                                        # one batch per view size
    assert EngineOptions().groot_engine_vision
    assert not EngineOptions.from_env(env={"FLASHRT_GROOT_ENGINE_VISION": "0"}).enabled("groot_engine_vision")
    assert not EngineOptions(fast_paths=False).enabled("groot_engine_vision")


def test_block_order_is_the_pixel_unshuffle():
    """Rows in block order, four at a time side by side, are pixel_unshuffle's rows with their columns permuted by
    block_columns; the rows of the image tokens come out in raster order."""
    gen = torch.Generator().manual_seed(0)
    for gh, gw, c in ((4, 6, 5), (6, 4, 3), (2, 2, 7)):
        grid = torch.randn(2, c, gh, gw, generator=gen)
        raster = grid.flatten(2).transpose(1, 2)                                          # (2, gh*gw, c)
        want = F.pixel_unshuffle(grid, 2).flatten(2).transpose(1, 2)                      # (2, gh*gw/4, 4c)
        blocks = raster[:, block_order(gh, gw)].reshape(2, gh * gw // 4, 4 * c)
        assert torch.equal(blocks, want[..., block_columns(c)])
        assert sorted(block_order(gh, gw).tolist()) == list(range(gh * gw))


def test_position_table_is_the_hf_embeddings_addend(model):
    """The patch GEMM's addend: the HF embedding's resized position embedding plus the patch bias, in block order."""
    sig = GrootSignature(1, ((56, 84), (56, 84)), 30, False)
    vision = prepare_groot_vision(model, Ops(eager_cpu_dispatch()))
    tables = StaticTables(model, sig, torch.device("cpu"), vision=vision)
    emb = model.backbone.model.vision_model.vision_model.embeddings
    patches = torch.zeros(2, 4 * 6, 3 * 14 * 14)
    with torch.no_grad():
        hf = emb(patches, torch.tensor([[4, 6], [4, 6]]))                                 # pos + bias
    torch.testing.assert_close(tables.vision_positions[(56, 84)], hf[0, block_order(4, 6)], rtol=0, atol=1e-6)
    torch.testing.assert_close(position_table(vision, tables.vision_pos[(56, 84)], 4, 6),
                               tables.vision_positions[(56, 84)], rtol=0, atol=0)
    assert vision.patch_w.shape[1] % 8 == 0 and vision.patch_w[:, 3 * 14 * 14:].abs().sum() == 0


def test_the_engine_vision_predict_reads_no_value_on_the_host():
    """On the meta device every host read of a tensor's value raises: the predict with the engine vision runs
    through."""
    model = random_groot_model(TINY, seed=1)
    args = inputs(model, [(56, 84), (56, 56), (56, 84)], 5, seed=0, pad=2)
    ops = Ops(eager_cpu_dispatch())
    tables = StaticTables(model, GrootSignature.of(*args[:3]), torch.device("cpu"),
                          vision=prepare_groot_vision(model, ops)).to("meta")
    meta = model.to("meta")
    tables.vision = prepare_groot_vision(meta, ops)                     # the weights on the meta device too
    views, *rest = args
    with torch.inference_mode():
        out = predict(meta, tables, [v.to("meta") for v in views], *(t.to("meta") for t in rest))
    assert out.shape == (1, 16, 16) and out.is_meta
