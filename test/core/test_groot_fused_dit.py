"""GR00T N1.6's DiT on the engine's fused ops (engine/groot_fused_dit.py, EngineOptions.groot_fused_dit), run with
the plain-PyTorch implementations of the ops on the CPU (fp32, tiny preset): the chunk is the reference
executor's for 1 and 2 views, two prompt lengths and a padded prompt, and the plain DiT's; the switch turns it off;
the prepared weights are the model's; the cross masks are SDPA's own conversion; the fused predict reads no value
on the host."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from test_groot_graph import TINY, inputs

from flashrt_core.engine import EngineOptions, eager_cpu_dispatch
from flashrt_core.engine.groot_fused_dit import (MASK_ALIGN, FusedDit, additive_masks, context_projections,
                                                 prepare_fused_dit)
from flashrt_core.engine.groot_graph import GrootGraphExecutor
from flashrt_core.engine.groot_static import GrootSignature, StaticTables, predict
from flashrt_core.engine.ops import Ops
from flashrt_core.groot_fixtures import random_groot_model
from flashrt_core.groot_policy import GrootReferenceExecutor
from flashrt_core.model.groot.config import get_groot_config


@pytest.fixture(scope="module")
def model():
    return random_groot_model(TINY, seed=5)


@pytest.mark.parametrize("sizes, text, pad", [
    ([(56, 56)], 5, 0), ([(56, 56)], 17, 0), ([(56, 84), (56, 56)], 5, 0), ([(84, 84), (84, 84)], 17, 0),
    ([(56, 56), (56, 84)], 9, 3)])
def test_fused_dit_equals_the_reference(model, sizes, text, pad):
    ref = GrootReferenceExecutor(model, torch.device("cpu"))
    fused = GrootGraphExecutor(model, "cpu", capture=False)
    assert fused.fused_dit
    for seed in (1, 2):                                                 # a second call: same signature, new values
        args = inputs(model, sizes, text, seed=seed, pad=pad)
        torch.testing.assert_close(fused.sample_actions(*args), ref.sample_actions(*args), rtol=1e-5, atol=1e-5)
    (entry,) = fused.entries.values()
    assert isinstance(entry.tables.fused, FusedDit)


def test_fused_dit_differs_from_the_unfused_path_by_rounding_only(model):
    """Both paths give the reference's chunk, by different ops: the fused one is not the unfused code."""
    args = inputs(model, [(56, 84), (56, 56)], 9, seed=3)
    on = GrootGraphExecutor(model, "cpu", capture=False).sample_actions(*args)
    off = GrootGraphExecutor(model, "cpu", capture=False, fused_dit=False).sample_actions(*args)
    torch.testing.assert_close(on, off, rtol=1e-5, atol=1e-5)
    assert not torch.equal(on, off)


def test_head_attention_gives_sdpas_chunk(model):
    """groot_head_attention: the attention from the Q/K/V GEMM's output in place (Ops.head_attention; its
    plain-PyTorch reference on the CPU) gives the chunk of SDPA with the transpose copy, cross masks included."""
    on = GrootGraphExecutor(model, "cpu", capture=False)
    off = GrootGraphExecutor(model, "cpu", capture=False, head_attention=False)
    assert on._fused.head_attention and not off._fused.head_attention
    for seed, pad in ((1, 0), (2, 3)):
        args = inputs(model, [(56, 84), (56, 56)], 9, seed=seed, pad=pad)
        torch.testing.assert_close(on.sample_actions(*args), off.sample_actions(*args), rtol=1e-5, atol=1e-5)


def test_plain_dit_without_cross_masks():
    base = get_groot_config(TINY)
    plain = random_groot_model(base.replace(dit=dataclasses.replace(base.dit, alternate_vl=False)), seed=2)
    args = inputs(plain, [(56, 56), (56, 84)], 7, seed=4)
    expect = GrootReferenceExecutor(plain, torch.device("cpu")).sample_actions(*args)
    torch.testing.assert_close(GrootGraphExecutor(plain, "cpu", capture=False).sample_actions(*args), expect,
                               rtol=1e-5, atol=1e-5)


def test_the_switch(model):
    """fused_dit=False (EngineOptions.groot_fused_dit off) runs the step tables' sampler; the fused DiT needs the
    step tables, so step_tables=False turns it off too."""
    args = inputs(model, [(56, 56)], 5, seed=0)
    ref = GrootReferenceExecutor(model, torch.device("cpu")).sample_actions(*args)
    for kwargs, fused, tables in (({"fused_dit": False}, False, True),
                                  ({"step_tables": False}, False, False),
                                  ({"step_tables": False, "fused_dit": False}, False, False)):
        ex = GrootGraphExecutor(model, "cpu", capture=False, **kwargs)
        assert ex.fused_dit is fused and ex.step_tables is tables
        torch.testing.assert_close(ex.sample_actions(*args), ref, rtol=1e-5, atol=1e-5)
        (entry,) = ex.entries.values()
        assert entry.tables.fused is None and (entry.tables.steps is not None) == tables
    assert EngineOptions().groot_fused_dit
    assert not EngineOptions.from_env(env={"FLASHRT_GROOT_FUSED_DIT": "0"}).enabled("groot_fused_dit")
    assert not EngineOptions(fast_paths=False).enabled("groot_fused_dit")
    with pytest.raises(ValueError, match="the fused DiT reads the step tables"):
        StaticTables(model, GrootSignature.of(*args[:3]), torch.device("cpu"), step_tables=False,
                     fused=prepare_fused_dit(model.action_head, Ops(eager_cpu_dispatch())))


def test_prepared_weights_are_the_models(model):
    """Self-attention blocks: [Q; K; V] merged in one GEMM; cross-attention blocks: Q alone; the other GEMMs share
    the model's tensors (no copy)."""
    dit = model.action_head.model
    fused = prepare_fused_dit(model.action_head, Ops(eager_cpu_dispatch()))
    assert len(fused.blocks) == len(dit.transformer_blocks) and fused.inner == dit.cfg.inner_dim
    for fb, block in zip(fused.blocks, dit.transformer_blocks):
        attn = block.attn1
        assert fb.cross == block.is_cross
        (w, b), = fb.qkv.parts
        mods = (attn.to_q,) if block.is_cross else (attn.to_q, attn.to_k, attn.to_v)
        assert torch.equal(w, torch.cat([m.weight for m in mods])) and torch.equal(b, torch.cat([m.bias for m in mods]))
        for lin, module in ((fb.out, attn.to_out[0]), (fb.ff1, block.ff.net[0].proj), (fb.ff2, block.ff.net[2])):
            assert lin.parts[0][0].data_ptr() == module.weight.data_ptr()
        assert fb.ada_eps == block.norm1.eps and fb.ff_eps == block.eps
    assert {fb.cross for fb in fused.blocks} == {True, False}


def test_the_fused_predict_reads_no_value_on_the_host():
    """On the meta device every host read of a tensor's value raises: the fused predict runs through."""
    model = random_groot_model(TINY, seed=1)
    args = inputs(model, [(56, 84), (56, 56)], 5, seed=0, pad=2)
    fused = prepare_fused_dit(model.action_head, Ops(eager_cpu_dispatch()))
    tables = StaticTables(model, GrootSignature.of(*args[:3]), torch.device("cpu"), True, fused).to("meta")
    meta = model.to("meta")
    tables.fused = prepare_fused_dit(meta.action_head, fused.ops)     # the weights on the meta device too
    views, *rest = args
    with torch.inference_mode():
        out = predict(meta, tables, [v.to("meta") for v in views], *(t.to("meta") for t in rest))
    assert out.shape == (1, 16, 16) and out.is_meta


def test_additive_masks_are_sdpas_conversion():
    """0 / -inf in K's dtype, rows aligned in memory, one buffer per mask kind; SDPA gives the bool mask's result."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 5, 8, generator=gen)
    k, v = torch.randn(2, 3, 21, 8, generator=gen), torch.randn(2, 3, 21, 8, generator=gen)
    mask = (torch.rand(2, 21, generator=gen) > 0.4)[:, None, None, :]
    mask[..., 0] = True                                              # every row sees a key
    kv = additive_masks({0: (k, v, mask), 2: (k, v, mask), 1: (k, v, None)})
    add = kv[0][2]
    assert kv[2][2] is add and kv[1][2] is None
    assert add.dtype == k.dtype and add.shape == mask.shape and add.stride(-2) % MASK_ALIGN == 0
    assert torch.equal(add == 0, mask) and torch.isinf(add[~mask]).all() and (add[~mask] < 0).all()
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=add),
                               F.scaled_dot_product_attention(q, k, v, attn_mask=mask), rtol=0, atol=0)


def test_cross_blocks_take_their_kv_from_one_merged_gemm(model):
    """Every cross-attention block's K / V of the backbone features come from one GEMM over the merged weights: the
    blocks' own to_k / to_v products, their weights views into the merged tensor (one copy in memory)."""
    fused = prepare_fused_dit(model.action_head, Ops(eager_cpu_dispatch()))
    blocks = model.action_head.model.transformer_blocks
    cross = [i for i, block in enumerate(blocks) if block.is_cross]
    assert cross and sorted(fused.context_offsets) == cross
    (w, bias), = fused.context.parts
    assert w.shape[0] == 2 * fused.inner * len(cross) and bias is not None
    context = torch.randn(2, 9, model.cfg.backbone_embedding_dim, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        got = context_projections(fused, context)
        for idx in cross:
            attn = blocks[idx].attn1
            torch.testing.assert_close(got[idx][0], attn.to_k(context), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(got[idx][1], attn.to_v(context), rtol=1e-5, atol=1e-5)
            assert attn.to_v.weight.untyped_storage().data_ptr() == w.untyped_storage().data_ptr()


def test_the_gemm_tuning_switch(model, monkeypatch):
    """groot_tune_with_norm (the DiT's split-K GEMMs timed with their norm, engine/groot_dit_gemms.py) is on by
    default, has its variable, and the executor hands it to every pick of a launch configuration; on the CPU the
    few-row GEMMs take the first candidate either way (nothing is timed), so both give one chunk."""
    import flashrt_core.engine.groot_dit_gemms as dit_gemms_module

    assert EngineOptions().groot_tune_with_norm
    assert not EngineOptions.from_env(env={"FLASHRT_GROOT_TUNE_WITH_NORM": "0"}).enabled("groot_tune_with_norm")
    assert not EngineOptions(fast_paths=False).enabled("groot_tune_with_norm")
    picks_with_norm = []
    pick_config = dit_gemms_module.pick_config

    def recording_pick_config(ops, lins, kind, rows, dtype, with_norm):
        picks_with_norm.append(with_norm)
        return pick_config(ops, lins, kind, rows, dtype, with_norm)

    monkeypatch.setattr(dit_gemms_module, "pick_config", recording_pick_config)
    args = inputs(model, [(56, 56)], 5, seed=2)
    on = GrootGraphExecutor(model, "cpu", capture=False)
    assert picks_with_norm and all(picks_with_norm)
    picks_with_norm.clear()
    off = GrootGraphExecutor(model, "cpu", capture=False, tune_with_norm=False)
    assert picks_with_norm and not any(picks_with_norm)
    assert set(map(str, on._fused.few_row.values())) == set(map(str, off._fused.few_row.values()))
    torch.testing.assert_close(on.sample_actions(*args), off.sample_actions(*args), rtol=0, atol=0)
