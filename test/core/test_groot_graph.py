"""GR00T N1.6's static predict (engine/groot_static.py), which the graph executor captures, run eagerly on the CPU
(fp32, tiny preset): the reference executor's chunk for 1 and 2 views, two image sizes, two prompt lengths and a
padded prompt; a second call of one signature reads its own inputs; the policy's executor choice and its errors."""

import dataclasses

import numpy as np
import pytest
import torch

from flashrt_core import load_model
from flashrt_core.engine import EngineOptions
from flashrt_core.engine.groot_graph import GrootGraphExecutor
from flashrt_core.engine.groot_static import GrootSignature, StaticTables, predict, scatter_image_tokens
from flashrt_core.errors import InputError
from flashrt_core.groot_fixtures import random_groot_model, write_random_groot_checkpoint
from flashrt_core.groot_policy import GrootPolicy, GrootReferenceExecutor, build_groot_executor
from flashrt_core.model.groot.config import get_groot_config

TINY = "groot_n1.6_tiny"


@pytest.fixture(scope="module")
def model():
    return random_groot_model(TINY, seed=5)


def inputs(model, sizes, text: int, seed: int, pad: int = 0):
    """Views of `sizes`, a prompt of `text` random ids then each view's image slots (plus `pad` padding ids at
    the end, masked), state, embodiment 3, noise."""
    cfg = model.cfg
    gen = torch.Generator().manual_seed(seed)
    views = [torch.rand(3, h, w, generator=gen) * 2 - 1 for h, w in sizes]
    pieces = [torch.randint(0, cfg.image_token_index, (text,), generator=gen)]
    for h, w in sizes:
        pieces += [torch.tensor([7]), torch.full((cfg.image_tokens(h, w),), cfg.image_token_index), torch.tensor([8])]
    pieces.append(torch.zeros(pad, dtype=torch.long))
    ids = torch.cat(pieces)[None]
    mask = torch.ones_like(ids, dtype=torch.bool)
    if pad:
        mask[0, -pad:] = False
    state = torch.rand(1, 1, cfg.max_state_dim, generator=gen) * 2 - 1
    noise = torch.randn(1, cfg.action_horizon, cfg.max_action_dim, generator=gen)
    return views, ids, mask, state, torch.tensor([3]), noise


@pytest.mark.parametrize("step_tables", [True, False])
@pytest.mark.parametrize("sizes, text, pad", [
    ([(56, 56)], 5, 0), ([(56, 56)], 17, 0), ([(56, 84)], 9, 0),
    ([(56, 84), (56, 56)], 5, 0), ([(84, 84), (84, 84)], 17, 0), ([(56, 56), (56, 84)], 9, 3)])
def test_static_path_equals_the_reference(model, sizes, text, pad, step_tables):
    ref = GrootReferenceExecutor(model, torch.device("cpu"))
    static = GrootGraphExecutor(model, "cpu", capture=False, step_tables=step_tables)
    first = inputs(model, sizes, text, seed=1, pad=pad)
    expect = ref.sample_actions(*first)
    got = static.sample_actions(*first)
    assert got.shape == (1, 16, 16)
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-5)
    second = inputs(model, sizes, text, seed=2, pad=pad)              # same signature, other values
    again = static.sample_actions(*second)
    assert len(static.entries) == 1                                   # no new signature
    torch.testing.assert_close(again, ref.sample_actions(*second), rtol=1e-5, atol=1e-5)
    assert (again - got).abs().max() > 1e-3                           # the buffers were refreshed


def test_plain_dit_without_cross_masks():
    """The plain DiT (alternate_vl off: cross-attention sees every backbone token, no mask) on the static path."""
    base = get_groot_config(TINY)
    plain = random_groot_model(base.replace(dit=dataclasses.replace(base.dit, alternate_vl=False)), seed=2)
    args = inputs(plain, [(56, 56), (56, 84)], 7, seed=4)
    expect = GrootReferenceExecutor(plain, torch.device("cpu")).sample_actions(*args)
    got = GrootGraphExecutor(plain, "cpu", capture=False).sample_actions(*args)
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-5)


def test_signatures(model):
    static = GrootGraphExecutor(model, "cpu", capture=False)
    for sizes, text in (([(56, 56)], 5), ([(56, 56)], 6), ([(56, 84)], 5), ([(56, 56)], 5)):
        static.sample_actions(*inputs(model, sizes, text, seed=3))
    assert sorted((s.view_sizes, s.prompt_len) for s in static.entries) == [
        (((56, 56),), 5 + 6), (((56, 56),), 6 + 6), (((56, 84),), 5 + 8)]
    padded = GrootSignature.of(*inputs(model, [(56, 56)], 5, 0, pad=2)[:3])
    assert padded.padded and padded.prompt_len == 5 + 6 + 2
    assert not GrootSignature.of(*inputs(model, [(56, 56)], 5, 0)[:3]).padded


def test_position_embeddings_are_the_hf_modules(model):
    """The precomputed SigLIP2 position embeddings equal what the HF embedding adds inside its forward."""
    sig = GrootSignature(1, ((56, 84), (56, 84)), 30, False)
    tables = StaticTables(model, sig, torch.device("cpu"))
    emb = model.backbone.model.vision_model.vision_model.embeddings
    patches = torch.zeros(2, 4 * 6, 3 * 14 * 14)
    with torch.no_grad():
        hf = emb(patches, torch.tensor([[4, 6], [4, 6]])) - emb.patch_embedding(patches)
    torch.testing.assert_close(tables.vision_pos[(56, 84)], hf, rtol=0, atol=1e-6)
    assert tables.image_tokens == 12 and tables.causal is None
    cos, sin = model.backbone.model.language_model.model.rotary_emb(torch.zeros(1), torch.arange(30)[None])
    assert torch.equal(tables.rope[0], cos) and torch.equal(tables.rope[1], sin)


@pytest.mark.parametrize("step_tables", [True, False])
@pytest.mark.parametrize("pad", [0, 2])
def test_the_static_predict_reads_no_value_on_the_host(pad, step_tables):
    """What a CUDA graph needs: on the meta device every host read of a tensor's value (.item(), bool(), .tolist(),
    nonzero, masked_scatter's count) raises; the static predict runs through, the reference does not."""
    model = random_groot_model(TINY, seed=1)
    args = inputs(model, [(56, 84), (56, 56)], 5, seed=0, pad=pad)
    tables = StaticTables(model, GrootSignature.of(*args[:3]), torch.device("cpu"), step_tables).to("meta")
    assert (tables.steps is not None) == step_tables
    meta = model.to("meta")
    views, *rest = args
    on_meta = ([v.to("meta") for v in views], *(t.to("meta") for t in rest))
    with torch.inference_mode():
        out = predict(meta, tables, *on_meta)
        assert out.shape == (1, 16, 16) and out.is_meta
        with pytest.raises(RuntimeError, match="cannot be called on meta tensors"):
            meta.predict_normalized(*on_meta)


def test_scatter_is_masked_scatter():
    gen = torch.Generator().manual_seed(0)
    embeds = torch.randn(2, 9, 4, generator=gen)
    slots = torch.rand(2, 9, generator=gen) > 0.5
    tokens = torch.randn(int(slots.sum()), 4, generator=gen)
    expect = embeds.masked_scatter(slots[..., None], tokens)
    assert torch.equal(scatter_image_tokens(embeds, slots, tokens), expect)


def test_input_errors(model):
    static = GrootGraphExecutor(model, "cpu", capture=False)
    views, ids, mask, state, emb, noise = inputs(model, [(56, 56)], 5, seed=0)
    ids[0, 0] = model.cfg.image_token_index
    with pytest.raises(InputError, match="5 image-token slots for 4 image tokens"):
        static.sample_actions(views, ids, mask, state, emb, noise)
    assert not static.entries
    views, ids, mask, state, emb, noise = inputs(model, [(50, 56)], 5, seed=0)
    with pytest.raises(ValueError, match="50x56 is not a multiple of 28"):
        static.sample_actions(views, ids, mask, state, emb, noise)
    with pytest.raises(ValueError, match="graph capture needs a CUDA device"):
        GrootGraphExecutor(model, "cpu", capture=True)
    with pytest.raises(ValueError, match="phase graphs are CUDA graphs"):
        static.phase_times()
    with pytest.raises(ValueError, match="phase graphs are CUDA graphs"):
        static.phase_graphs()


def test_executor_choice(model):
    cpu = torch.device("cpu")
    assert isinstance(build_groot_executor(model, cpu, "auto"), GrootReferenceExecutor)
    assert isinstance(build_groot_executor(model, cpu, "reference", EngineOptions()), GrootReferenceExecutor)
    with pytest.raises(ValueError, match="hardware='sm90' needs a CUDA device"):
        build_groot_executor(model, cpu, "sm90")
    with pytest.raises(ValueError, match="unknown hardware 'tpu'"):
        build_groot_executor(model, cpu, "tpu")


def test_policy_on_the_static_path_predicts_the_reference_chunk(tmp_path):
    """GrootPolicy's inputs through the graph executor's staging (host tensors, one copy) give the same actions."""
    ckpt = write_random_groot_checkpoint(tmp_path / "c", TINY, seed=6)
    policy = load_model(ckpt, embodiment="new_embodiment", device="cpu")
    assert policy.executor.name == "reference"
    static = GrootPolicy(policy.model, policy.config, policy.embodiment, policy.tokenizer, policy.device,
                         policy.model_id, GrootGraphExecutor(policy.model, "cpu", capture=False))
    rng = np.random.default_rng(0)
    for hw in ((72, 96), (72, 96), (60, 60)):
        images = {v: rng.integers(0, 256, (*hw, 3), dtype=np.uint8) for v in policy.view_names}
        state = rng.uniform(-1, 1, policy.state_dim)
        noise = rng.standard_normal((16, 16)).astype(np.float32)
        np.testing.assert_allclose(static.predict(images, "pick up the cube", state, noise),
                                   policy.predict(images, "pick up the cube", state, noise), rtol=1e-5, atol=1e-5)
    assert len(static.executor.entries) == 2
    with pytest.raises(ValueError, match="hardware='sm90' needs a CUDA device"):
        load_model(ckpt, embodiment="new_embodiment", device="cpu", hardware="sm90")


def test_padded_prompts_share_a_graph_and_keep_the_chunk(model):
    """groot_prompt_multiple: prompts of 5 and 9 text tokens pad (masked) to one multiple of 16 and one signature,
    and the prompt whose length is that multiple (nothing to pad) takes the same signature; each gives the chunk of
    its own prompt on the reference."""
    ref = GrootReferenceExecutor(model, torch.device("cpu"))
    static = GrootGraphExecutor(model, "cpu", capture=False, prompt_multiple=16)
    sizes = [(56, 56), (56, 84)]
    length = inputs(model, sizes, 5, seed=0)[1].shape[1]
    exact = 5 + (-length) % 16
    assert exact > 9
    for text in (5, 9, exact):
        args = inputs(model, sizes, text, seed=text)
        torch.testing.assert_close(static.sample_actions(*args), ref.sample_actions(*args), rtol=1e-5, atol=1e-5)
    (sig,) = static.entries
    assert sig.prompt_len == length + exact - 5 and sig.prompt_len % 16 == 0 and sig.padded


def test_prompts_stay_as_they_come_where_the_dit_does_not_mask_them():
    """The plain DiT's cross-attention sees every backbone token: padding would change its chunk, so none is added."""
    base = get_groot_config(TINY)
    plain = random_groot_model(base.replace(dit=dataclasses.replace(base.dit, alternate_vl=False)), seed=2)
    static = GrootGraphExecutor(plain, "cpu", capture=False, prompt_multiple=16)
    assert static.prompt_multiple == 0
    args = inputs(plain, [(56, 56)], 5, seed=4)
    static.sample_actions(*args)
    (sig,) = static.entries
    assert sig.prompt_len == args[1].shape[1] and not sig.padded


def test_the_warm_up_makes_the_graph_of_every_instruction_length_up_to_its_bound(tmp_path):
    """GrootPolicy.warm_up_text_buckets on the graph executor (eager here; its signatures are the graphs a GPU
    captures): one signature per multiple of the prompt padding that an instruction of up to the bound lands in;
    after it, no instruction within the bound makes a new signature, and one beyond it does. The reference executor has nothing to warm."""
    ckpt = write_random_groot_checkpoint(tmp_path / "c", TINY, seed=6)
    base = load_model(ckpt, embodiment="new_embodiment", device="cpu")
    assert base.warm_up_text_buckets({}, "pick up the cube") == []            # the reference executor
    executor = GrootGraphExecutor(base.model, "cpu", capture=False, prompt_multiple=16)
    policy = GrootPolicy(base.model, base.config, base.embodiment, base.tokenizer, base.device, base.model_id,
                         executor)
    rng = np.random.default_rng(0)
    images = {v: rng.integers(0, 256, (72, 96, 3), dtype=np.uint8) for v in policy.view_names}
    state = rng.uniform(-1, 1, policy.state_dim)

    def prompt_len(instruction: str) -> int:
        return policy.prepare_inputs(images, instruction, state)[1].shape[1]
    bound = 40
    shortest = prompt_len("a")
    warmed = policy.warm_up_text_buckets(images, "pick up the cube", state, max_instruction_tokens=bound)
    lengths = range(shortest, shortest + bound)
    assert warmed == sorted({-(-n // 16) * 16 for n in lengths}) and len(warmed) >= 3
    made = set(executor.entries)
    assert {(s.prompt_len, s.padded) for s in made} == {(n, True) for n in warmed}
    words = ["pick", "up", "the", "red", "cube", "and", "place", "it", "in", "the", "bin"] * 6
    within = [" ".join(words[:k]) for k in range(1, len(words)) if prompt_len(" ".join(words[:k])) in lengths]
    assert len({prompt_len(text) for text in within}) >= 10
    for text in within:
        policy.predict(images, text, state)
        assert set(executor.entries) == made, text
    beyond = next(" ".join(words[:k]) for k in range(1, len(words))
                  if prompt_len(" ".join(words[:k])) > -(-(shortest + bound - 1) // 16) * 16)
    policy.predict(images, beyond, state)
    assert len(executor.entries) == len(made) + 1
