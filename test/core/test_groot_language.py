"""GR00T N1.6's language model on the engine's ops (engine/groot_language.py, EngineOptions.groot_engine_language),
with the ops' plain-PyTorch implementations on the CPU (fp32, tiny preset): its features equal transformers' Qwen3
layers' for an unpadded prompt, on the real tokens' rows of a right-padded prompt (run causally, with no mask)
and of a prompt with padding in its middle (run with the mask), and for two prompts in a batch; the whole chunk is
the reference
executor's; the merged weights share the model's storage; the switch turns it off; a Qwen3 checkpoint with biases is
refused."""

import pytest
import torch
from test_groot_graph import TINY, inputs

from flashrt_core.engine import EngineOptions, eager_cpu_dispatch
from flashrt_core.engine.groot_graph import GrootGraphExecutor
from flashrt_core.engine.groot_language import EngineLanguage, prepare_language
from flashrt_core.engine.weights import Linear
from flashrt_core.engine.groot_static import GrootSignature, StaticTables, image_tokens, language_features
from flashrt_core.engine.ops import Ops
from flashrt_core.groot_fixtures import random_groot_model
from flashrt_core.groot_policy import GrootReferenceExecutor, build_groot_executor


@pytest.fixture(scope="module")
def model():
    return random_groot_model(TINY, seed=5)


def _features(model, args, language: EngineLanguage | None) -> torch.Tensor:
    views, ids, mask = args[:3]
    sig = GrootSignature.of(views, ids, mask)
    tables = StaticTables(model, sig, torch.device("cpu"), language=language)
    with torch.inference_mode():
        vit = image_tokens(model, tables, views, torch.float32)
        return language_features(model, tables, vit, ids, mask)


def _batch_of_two(model, sizes, text):
    """Two prompts of the same length (different ids and views) as one batch of 2."""
    a, b = inputs(model, sizes, text, seed=7), inputs(model, sizes, text, seed=8)
    return [*a[0], *b[0]], torch.cat([a[1], b[1]]), torch.cat([a[2], b[2]])


@pytest.mark.parametrize("sizes, text, pad", [([(56, 56)], 5, 0), ([(56, 84), (56, 56)], 9, 3)])
def test_features_equal_the_transformers_layers(model, sizes, text, pad):
    args = inputs(model, sizes, text, seed=1, pad=pad)
    lang = prepare_language(model, Ops(eager_cpu_dispatch()))
    got, want = _features(model, args, lang), _features(model, args, None)
    assert got.shape == want.shape == (1, args[1].shape[1], model.cfg.llm.width)
    real = args[2][0]
    torch.testing.assert_close(got[:, real], want[:, real], rtol=1e-5, atol=1e-5)
    assert not torch.equal(got, want)          # different ops: the engine path is not transformers' code
    assert want.abs().max() > 0.5
    assert GrootSignature.of(*args[:3]).right_padded == (pad > 0)


def test_padding_inside_the_prompt_runs_with_the_mask(model):
    """A prompt whose padding is not all at its end (a masked token between real ones): the engine reads the mask,
    and its real tokens' features are transformers'; run causally without it, the tokens after the hole differ."""
    views, ids, mask, *_ = inputs(model, [(56, 56)], 9, seed=3)
    mask[0, 4] = False
    sig = GrootSignature.of(views, ids, mask)
    assert sig.padded and not sig.right_padded
    lang = prepare_language(model, Ops(eager_cpu_dispatch()))
    got, want = _features(model, (views, ids, mask), lang), _features(model, (views, ids, mask), None)
    torch.testing.assert_close(got[:, mask[0]], want[:, mask[0]], rtol=1e-5, atol=1e-5)
    unmasked = _features(model, (views, ids, torch.ones_like(mask)), lang)
    assert (unmasked[:, 5:] - want[:, 5:]).abs().max() > 1e-3


def test_batch_of_two_prompts(model):
    views, ids, mask = _batch_of_two(model, [(56, 56)], 6)
    lang = prepare_language(model, Ops(eager_cpu_dispatch()))
    got = _features(model, (views, ids, mask), lang)
    torch.testing.assert_close(got, _features(model, (views, ids, mask), None), rtol=1e-5, atol=1e-5)
    assert (got[0] - got[1]).abs().max() > 1e-2     # each prompt its own rows


def test_chunk_equals_the_reference_and_the_switch_turns_it_off(model):
    ref = GrootReferenceExecutor(model, torch.device("cpu"))
    on = GrootGraphExecutor(model, "cpu", capture=False)
    off = GrootGraphExecutor(model, "cpu", capture=False, engine_language=False)
    for seed, pad in ((1, 0), (2, 3)):
        args = inputs(model, [(56, 84), (56, 56)], 9, seed=seed, pad=pad)
        torch.testing.assert_close(on.sample_actions(*args), ref.sample_actions(*args), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(off.sample_actions(*args), ref.sample_actions(*args), rtol=1e-5, atol=1e-5)
    assert all(isinstance(e.tables.language, EngineLanguage) for e in on.entries.values())
    assert all(e.tables.language is None for e in off.entries.values())
    built = build_groot_executor(model, torch.device("cpu"), hardware="auto")     # the CPU runs the reference
    assert isinstance(built, GrootReferenceExecutor)
    assert EngineOptions().groot_engine_language
    assert not EngineOptions(fast_paths=False).enabled("groot_engine_language")


def test_merged_weights_share_the_models_storage(model):
    lang = prepare_language(model, Ops(eager_cpu_dispatch()))
    layer = model.backbone.model.language_model.model.layers[0]
    (qkv, _), = lang.layers[0].qkv.parts
    (gate_up, _), = lang.layers[0].gate_up.parts
    att, mlp = layer.self_attn, layer.mlp
    assert qkv.shape[0] == att.q_proj.out_features + 2 * att.k_proj.out_features
    for module, start, merged in ((att.q_proj, 0, qkv), (att.k_proj, att.q_proj.out_features, qkv),
                                  (mlp.gate_proj, 0, gate_up), (mlp.up_proj, mlp.gate_proj.out_features, gate_up)):
        assert module.weight.untyped_storage().data_ptr() == merged.untyped_storage().data_ptr()
        torch.testing.assert_close(module.weight, merged[start:start + module.out_features], rtol=0, atol=0)
    again = prepare_language(model, Ops(eager_cpu_dispatch()))        # a second executor: the same storage
    assert again.layers[0].qkv.parts[0][0].data_ptr() == qkv.data_ptr()
    assert again.layers[0].gate_up.parts[0][0].data_ptr() == gate_up.data_ptr()
    assert len(lang.layers) == model.cfg.llm.num_layers
    assert lang.layers[0].head_norm.shape == (2, model.cfg.llm.head_dim)


def test_biases_are_refused():
    biased = random_groot_model(TINY, seed=6)
    proj = biased.backbone.model.language_model.model.layers[1].self_attn.k_proj
    proj.bias = torch.nn.Parameter(torch.zeros(proj.out_features))
    with pytest.raises(ValueError, match="no biases.*groot_engine_language off"):
        prepare_language(biased, Ops(eager_cpu_dispatch()))
