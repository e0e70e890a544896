"""GR00T N1.6's Euler steps around the fused DiT with the embodiment in the signature (engine/groot_step_ends.py,
EngineOptions.groot_step_ends), with the ops' plain-PyTorch implementations on the CPU (fp32, tiny preset): the
chunk is the reference executor's for one observation, for another embodiment (a signature of its own), for a
batch of two observations of one embodiment, and for a batch of two embodiments (which keeps the gathers); the
tables hold the embodiment's own weights and the folded encoder; the predict reads no value on the host; the switch
turns it off."""

import pytest
import torch
from test_groot_graph import TINY, inputs

from flashrt_core.engine import EngineOptions, eager_cpu_dispatch
from flashrt_core.engine.groot_fused_dit import prepare_fused_dit
from flashrt_core.engine.groot_graph import GrootGraphExecutor
from flashrt_core.engine.groot_static import GrootSignature, StaticTables, predict
from flashrt_core.engine.groot_step_ends import EmbodimentWeights
from flashrt_core.engine.ops import Ops
from flashrt_core.errors import InputError
from flashrt_core.groot_fixtures import random_groot_model
from flashrt_core.groot_policy import GrootReferenceExecutor


@pytest.fixture(scope="module")
def model():
    return random_groot_model(TINY, seed=5)


def _batch_of_two(model, embodiments):
    """Two observations (different views, prompts of one length, states and noise) of `embodiments` as one batch."""
    a, b = inputs(model, [(56, 84)], 9, seed=7), inputs(model, [(56, 84)], 9, seed=8)
    return ([*a[0], *b[0]], torch.cat([a[1], b[1]]), torch.cat([a[2], b[2]]), torch.cat([a[3], b[3]]),
            torch.tensor(embodiments), torch.cat([a[5], b[5]]))


def test_chunk_equals_the_reference_per_embodiment(model):
    """One graph signature per embodiment; each gives the reference's chunk, and the embodiments' chunks differ."""
    ref = GrootReferenceExecutor(model, torch.device("cpu"))
    static = GrootGraphExecutor(model, "cpu", capture=False)
    assert static.step_ends
    chunks = {}
    for embodiment in (3, 5, 3):
        views, ids, mask, state, _, noise = inputs(model, [(56, 84), (56, 56)], 9, seed=1, pad=3)
        args = (views, ids, mask, state, torch.tensor([embodiment]), noise)
        chunks[embodiment] = static.sample_actions(*args)
        torch.testing.assert_close(chunks[embodiment], ref.sample_actions(*args), rtol=1e-5, atol=1e-5)
    assert sorted(sig.embodiment for sig in static.entries) == [3, 5]
    assert all(entry.tables.embodiment is not None for entry in static.entries.values())
    assert (chunks[3] - chunks[5]).abs().max() > 1e-3


@pytest.mark.parametrize("embodiments, shared", [([3, 3], 3), ([3, 6], None)])
def test_a_batch_of_two(model, embodiments, shared):
    """Two observations of one embodiment run the step ends; of two embodiments, the gathers (no embodiment in the
    signature). Both give the reference's chunk."""
    ref = GrootReferenceExecutor(model, torch.device("cpu"))
    static = GrootGraphExecutor(model, "cpu", capture=False)
    args = _batch_of_two(model, embodiments)
    got = static.sample_actions(*args)
    assert got.shape == (2, 16, 16)
    torch.testing.assert_close(got, ref.sample_actions(*args), rtol=1e-5, atol=1e-5)
    (sig, entry), = static.entries.items()
    assert sig.embodiment == shared and (entry.tables.embodiment is None) == (shared is None)


def test_the_tables_hold_the_embodiments_weights(model):
    """State encoder and decoder: the model's weights of the embodiment (views, no copy); the encoder's first two
    GEMMs folded per step; W3's bias and the positions in the residual stream's start."""
    head = model.action_head
    args = inputs(model, [(56, 84)], 9, seed=7)
    sig = GrootSignature.of(*args[:3], [6])
    assert sig.embodiment == 6
    fused = prepare_fused_dit(head, Ops(eager_cpu_dispatch()))
    tables = StaticTables(model, sig, torch.device("cpu"), True, fused)
    weights = tables.embodiment
    assert isinstance(weights, EmbodimentWeights) and weights.steps == tables.steps.steps
    (b1, w1), (b2, w2) = weights.decoder
    assert w2.data_ptr() == head.action_decoder.layer2.W[6].data_ptr() and torch.equal(b1, head.action_decoder.layer1.b[6])
    assert weights.state[0][1].data_ptr() == head.state_encoder.layer1.W[6].data_ptr()
    enc = head.action_encoder
    d = enc.hidden_size
    actions = torch.randn(16, enc.W1.W.shape[1])
    for k, tau in enumerate(tables.steps.tau):            # cat([actions @ W1 + b1, tau_k]) @ W2 + b2, folded
        want = torch.cat([actions @ enc.W1.W[6] + enc.W1.b[6], tau[0]], dim=-1) @ enc.W2.W[6] + enc.W2.b[6]
        torch.testing.assert_close(actions @ weights.enc12 + weights.enc12_bias[k], want, rtol=1e-5, atol=1e-5)
    assert len(weights.enc12_bias) == tables.steps.steps
    assert (weights.enc12_bias[0] - weights.enc12_bias[-1]).abs().max() > 1e-3      # each step its own timestep
    assert torch.equal(weights.enc3.parts[0][0], enc.W3.W[6].t())
    torch.testing.assert_close(weights.action_rows, enc.W3.b[6] + tables.steps.positions[0], rtol=0, atol=0)


def test_the_predict_reads_no_value_on_the_host():
    """On the meta device every host read of a tensor's value raises: with the embodiment's tables the predict runs
    through (the embodiment ids are read when the signature is made, before the graph)."""
    model = random_groot_model(TINY, seed=1)
    args = inputs(model, [(56, 84), (56, 56)], 5, seed=0, pad=2)
    fused = prepare_fused_dit(model.action_head, Ops(eager_cpu_dispatch()))
    tables = StaticTables(model, GrootSignature.of(*args[:3], args[4].tolist()), torch.device("cpu"), True, fused).to("meta")
    assert tables.embodiment is not None
    meta = model.to("meta")
    tables.fused = prepare_fused_dit(meta.action_head, fused.ops)
    views, *rest = args
    with torch.inference_mode():
        out = predict(meta, tables, [v.to("meta") for v in views], *(t.to("meta") for t in rest))
    assert out.shape == (1, 16, 16) and out.is_meta


def test_the_switch(model):
    """step_ends=False (EngineOptions.groot_step_ends off): no embodiment in the signature, the weights gathered in
    the predict, the same chunk by other rounding; without the fused DiT there are no step ends."""
    args = inputs(model, [(56, 56)], 5, seed=2)
    on = GrootGraphExecutor(model, "cpu", capture=False)
    off = GrootGraphExecutor(model, "cpu", capture=False, step_ends=False)
    unfused = GrootGraphExecutor(model, "cpu", capture=False, fused_dit=False)
    assert not off.step_ends and not unfused.step_ends
    got, want = on.sample_actions(*args), off.sample_actions(*args)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.equal(got, want)
    unfused.sample_actions(*args)
    for ex in (off, unfused):
        (sig, entry), = ex.entries.items()
        assert sig.embodiment is None and entry.tables.embodiment is None
    assert EngineOptions().groot_step_ends
    assert not EngineOptions.from_env(env={"FLASHRT_GROOT_STEP_ENDS": "0"}).enabled("groot_step_ends")
    assert not EngineOptions(fast_paths=False).enabled("groot_step_ends")


def test_an_embodiment_id_out_of_range_is_refused_by_name(model):
    """An id past the checkpoint's projectors is an InputError before anything runs (the gathers would index out of
    bounds on the device), with the step ends on and off."""
    views, ids, mask, state, _, noise = inputs(model, [(56, 56)], 5, seed=0)
    count = model.cfg.max_num_embodiments
    for step_ends in (True, False):
        ex = GrootGraphExecutor(model, "cpu", capture=False, step_ends=step_ends)
        for bad in (count, -1):
            with pytest.raises(InputError, match=rf"embodiment_id \[{bad}\] out of range: the checkpoint has {count}"):
                ex.sample_actions(views, ids, mask, state, torch.tensor([bad]), noise)
        assert not ex.entries
