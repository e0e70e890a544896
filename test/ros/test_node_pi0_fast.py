"""pi0-FAST in the policy node over real DDS: chunks carry the decoded chunk with its full horizon, and an output
that decodes to no chunk counts as an inference error without stopping the node."""

from __future__ import annotations

import numpy as np
import pytest

import flashrt_core
from flashrt_core.pi0_fast_fixtures import plant_output_tokens, write_random_fast_checkpoint
from flashrt_core.fast_tokenizer import smooth_chunks
from node_harness import ActiveHarnesses, wait_until

pytestmark = pytest.mark.ros

CHUNK_TIMEOUT_S = 60.0
STATE_DIM, ACTION_DIM = 8, 7


def planted_policy(directory):
    """A pi0-FAST policy whose greedy decode writes the FAST tokens of a known chunk; returns it and the chunk
    (unnormalized) it must predict."""
    path = write_random_fast_checkpoint(directory, seed=2, state_dim=STATE_DIM, action_dim=ACTION_DIM)
    policy = flashrt_core.load_model(path, device="cpu")
    for seed in range(1000, 1200):
        fast_ids = policy.codec.fast.encode(smooth_chunks(1, policy.horizon, ACTION_DIM, seed=seed)[0])
        out = policy.codec.output_tokens(fast_ids)
        if len(set(out)) == len(out):
            break
    plant_output_tokens(path, policy.tokenizer.encode("\n", add_bos=False)[-1], out)
    policy = flashrt_core.load_model(path, device="cpu")
    chunk = policy.normalizer.unnormalize_actions(policy.codec.fast.decode(fast_ids, policy.horizon, ACTION_DIM),
                                                  ACTION_DIM)
    return policy, chunk


@pytest.fixture
def harness_of():
    harnesses = ActiveHarnesses()
    yield lambda policy: harnesses.make(policy=policy, instruction=True)
    harnesses.close()


def test_pi0_fast_chunks_over_dds(harness_of, tmp_path):
    policy, expected = planted_policy(tmp_path / "planted")
    h = harness_of(policy)
    h.send_observation(h.now_ns())
    assert wait_until(lambda: len(h.chunks) == 1, timeout_s=CHUNK_TIMEOUT_S)
    chunk = h.chunks[0]
    assert (chunk.horizon, chunk.action_dim) == (policy.horizon, ACTION_DIM)
    assert list(chunk.view_names) == ["base_0_rgb", "base_1_rgb"]
    np.testing.assert_allclose(np.asarray(chunk.actions, np.float32).reshape(policy.horizon, ACTION_DIM), expected,
                               rtol=1e-6, atol=1e-6)
    assert chunk.model_id == policy.model_id and 0 < chunk.inference_time <= chunk.staleness
    # /diagnostics: the executor and the tokens decoded for the chunk, beside the staleness of every policy
    assert wait_until(lambda: h.diagnostics and h.latest_diagnostics().get("decoded_tokens") == str(
        len(policy.last_tokens)), timeout_s=CHUNK_TIMEOUT_S)
    values = h.latest_diagnostics()
    assert values["executor"] == "reference" and float(values["staleness_median_s"]) >= chunk.inference_time


def test_an_undecodable_output_is_an_inference_error_and_the_node_goes_on(harness_of, tmp_path):
    path = write_random_fast_checkpoint(tmp_path / "random", seed=1, state_dim=STATE_DIM, action_dim=ACTION_DIM)
    h = harness_of(flashrt_core.load_model(path, device="cpu"))   # random weights: no action sequence
    for count in (1, 2):
        h.send_observation(h.now_ns())
        assert wait_until(lambda: h.statuses and h.statuses[-1].inference_errors == count,
                          timeout_s=CHUNK_TIMEOUT_S)
    errors = {status.last_error for status in h.statuses}
    assert any("no 'Action: ' marker" in error for error in errors), errors
    assert not h.chunks and h.lifecycle.state() == "active"
