"""The policy node on CUDA: GPU memory in diagnostics, chunks, memory released by cleanup (skipped without a GPU)."""

from __future__ import annotations

import gc

import pytest

from test.ros.node_harness import NodeHarness, wait_until

pytestmark = [pytest.mark.ros, pytest.mark.gpu]

CHUNK_TIMEOUT_S = 120.0     # first forward passes on a fresh GPU process include compilation / capture


def test_node_on_cuda_reports_gpu_memory_and_cleanup_releases_it():
    import torch
    h = NodeHarness({"device": "cuda", "warmup_iterations": 2})      # the real loader, embedded demo checkpoint
    try:
        before = torch.cuda.memory_allocated()
        assert h.lifecycle.change("configure")
        assert str(h.node.policy.device).startswith("cuda")
        loaded = torch.cuda.memory_allocated()
        assert loaded > before
        assert wait_until(lambda: h.diagnostics and h.latest_diagnostics()["gpu_memory"].startswith("allocated"))
        assert h.lifecycle.change("activate")
        h.wait_for_subscribers()
        h.send_instruction()
        assert wait_until(lambda: h.node._instruction is not None)
        h.send_observation(h.now_ns())
        assert wait_until(lambda: len(h.chunks) == 1, timeout_s=CHUNK_TIMEOUT_S)
        chunk = h.chunks[0]
        assert chunk.inference_time > 0 and chunk.staleness >= chunk.inference_time
        assert h.lifecycle.change("deactivate") and h.lifecycle.change("cleanup")
        gc.collect()
        assert torch.cuda.memory_allocated() < loaded
    finally:
        h.close()
