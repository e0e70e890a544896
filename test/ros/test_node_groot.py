"""The policy node serves GR00T N1.6 with the same topics: model_config and embodiment parameters, real rclpy over
loopback DDS, a random tiny GR00T checkpoint in the released layout."""

from __future__ import annotations

import numpy as np
import pytest

from flashrt_core.groot_fixtures import write_random_groot_checkpoint
from node_harness import NodeHarness, wait_until

CHUNK_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def groot_checkpoint(tmp_path_factory):
    return write_random_groot_checkpoint(tmp_path_factory.mktemp("groot_node") / "ckpt", "groot_n1.6_tiny", seed=5)


def test_node_publishes_groot_chunks(groot_checkpoint):
    h = NodeHarness({"checkpoint": str(groot_checkpoint), "model_config": "groot_n1.6_tiny",
                     "embodiment": "new_embodiment", "device": "cpu", "warmup_iterations": 1})
    try:
        assert h.lifecycle.change("configure") and h.lifecycle.change("activate")
        policy = h.node.policy
        assert (policy.horizon, policy.action_dim, policy.view_names) == (16, 6, ["front", "wrist"])
        h.wait_for_subscribers()
        h.send_instruction("pick up the red cube")
        assert wait_until(lambda: h.node._instruction is not None), "instruction not received"
        h.send_observation(h.now_ns())
        assert wait_until(lambda: len(h.chunks) >= 1, timeout_s=CHUNK_TIMEOUT_S), "no chunk"
        chunk = h.chunks[0]
        assert (chunk.horizon, chunk.action_dim) == (16, 6)
        assert list(chunk.view_names) == ["front", "wrist"]
        actions = np.asarray(chunk.actions, np.float32)
        assert actions.shape == (16 * 6,) and np.isfinite(actions).all()
        assert chunk.model_id.endswith(":new_embodiment")
    finally:
        h.close()


def test_real_time_chunking_fails_configure_naming_why(groot_checkpoint):
    h = NodeHarness({"checkpoint": str(groot_checkpoint), "model_config": "groot_n1.6_tiny",
                     "embodiment": "new_embodiment", "device": "cpu", "warmup_iterations": 1,
                     "rtc": "guided_identity"})
    try:
        assert not h.lifecycle.change("configure")
        assert h.node.policy is None
        assert wait_until(lambda: h.diagnostics and "not GR00T N1.6's action head" in h.latest_diagnostics()[
            "last_error"]), h.latest_diagnostics()["last_error"]
    finally:
        h.close()


def test_unknown_embodiment_fails_configure(groot_checkpoint):
    h = NodeHarness({"checkpoint": str(groot_checkpoint), "model_config": "groot_n1.6_tiny", "embodiment": "ur5",
                     "device": "cpu"})
    try:
        assert not h.lifecycle.change("configure")
        assert h.node.policy is None
    finally:
        h.close()
