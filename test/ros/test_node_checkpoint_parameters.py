"""The node's checkpoint parameters over real rclpy and DDS: checkpoint takes a hub id, read offline from a
huggingface_hub cache laid out as huggingface_hub lays it out (test_hub.populate_cache); asset_id picks which
assets/<asset_id>/norm_stats.json of an openpi checkpoint with several holds the statistics
(flashrt_core.load_model(asset_id=...)); without it the configure fails naming the choice."""

from __future__ import annotations

import numpy as np
import pytest
from rclpy.parameter import Parameter

from flashrt_core.checkpoint_layout import Layout
from flashrt_core.fixture_layouts import FIXTURE_ASSET_ID, tokenizer_for_tests, write_layout
from flashrt_core.normalization import random_norm_stats
from node_harness import NodeHarness, wait_until
from test_hub import populate_cache

pytestmark = pytest.mark.ros


def test_asset_id_picks_the_statistics_of_an_openpi_checkpoint_with_several(tmp_path, monkeypatch):
    checkpoint = write_layout(tmp_path / "pi05_openpi", Layout.OPENPI_PYTORCH, state_dim=8, action_dim=7)
    other = random_norm_stats(8, 7, seed=5)
    other.save_openpi(checkpoint / "assets" / "other_robot")
    monkeypatch.setenv("FLASHRT_TOKENIZER", str(tokenizer_for_tests(tmp_path / "tokenizer.model")))
    h = NodeHarness({"checkpoint": str(checkpoint), "device": "cpu"})
    try:
        assert not h.lifecycle.change("configure")
        assert wait_until(lambda: h.diagnostics and "choose one with asset_id" in h.latest_diagnostics()["last_error"])
        assert h.node.set_parameters([Parameter("asset_id", value="other_robot")])[0].successful
        assert h.lifecycle.change("configure")
        np.testing.assert_allclose(h.node.policy.normalizer.stats.state.mean, other.state.mean, rtol=1e-6)
        assert h.lifecycle.change("cleanup")
        assert h.node.set_parameters([Parameter("asset_id", value=FIXTURE_ASSET_ID)])[0].successful
        assert h.lifecycle.change("configure")
        assert not np.allclose(h.node.policy.normalizer.stats.state.mean, other.state.mean)
    finally:
        h.close()


def test_checkpoint_takes_a_hub_id_from_huggingface_hubs_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants
    folder = write_layout(tmp_path / "folder", Layout.LEROBOT, state_dim=8, action_dim=7, seed=6)
    populate_cache(tmp_path / "cache", "fixture-org/pi05_tiny_lerobot", folder)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("FLASHRT_TOKENIZER", str(tokenizer_for_tests(tmp_path / "tokenizer.model")))
    h = NodeHarness({"checkpoint": "fixture-org/pi05_tiny_lerobot", "device": "cpu"})
    try:
        assert h.lifecycle.change("configure")
        assert h.node.policy.model_id.endswith(":fixture-org/pi05_tiny_lerobot")
        assert h.node.policy.action_dim == 7
    finally:
        h.close()
