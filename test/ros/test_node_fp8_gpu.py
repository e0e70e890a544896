"""The policy node with precision fp8 on CUDA (the real loader, the embedded demo checkpoint): configure captures
the FP8 graphs in the warm-up without calibrating, the node publishes nothing until it has calibrated on its first
real observations and passed the gate, then publishes chunks. Skipped without a GPU."""

from __future__ import annotations

import pytest

from node_harness import NodeHarness, wait_until

pytestmark = [pytest.mark.ros, pytest.mark.gpu]

CHUNK_TIMEOUT_S = 120.0     # first forward passes on a fresh GPU process include compilation / capture


def test_node_calibrates_fp8_on_real_observations_before_publishing():
    h = NodeHarness({"device": "cuda", "precision": "fp8", "warmup_iterations": 1, "calibration_observations": 3,
                     "calibration_gate_observations": 1})
    try:
        assert h.lifecycle.change("configure")
        policy = h.node.policy
        assert policy.precision == "fp8" and not policy.fp8_calibrated
        assert any(entry.graph is not None for entry in policy.executor._entries.values())   # warm-up captured
        assert h.lifecycle.change("activate")
        h.wait_for_subscribers()
        h.send_instruction()
        assert wait_until(lambda: h.node._instruction is not None)
        for i in range(4):
            h.send_observation(h.now_ns())
            assert wait_until(lambda: policy.fp8_calibrated or h.node._calibration.observations
                              and len(h.node._calibration.observations) == i + 1, timeout_s=CHUNK_TIMEOUT_S)
        assert wait_until(lambda: policy.fp8_calibrated, timeout_s=CHUNK_TIMEOUT_S)
        assert not h.chunks and min(policy.calibration.gate_cosines) >= policy.calibration.gate
        h.send_observation(h.now_ns())
        assert wait_until(lambda: h.chunks, timeout_s=CHUNK_TIMEOUT_S)
        assert wait_until(lambda: h.diagnostics and h.latest_diagnostics()["fp8_calibration"].startswith(
            "FP8 calibrated on 3 observations"))
    finally:
        h.close()
