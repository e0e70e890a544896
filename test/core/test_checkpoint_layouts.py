"""Every checkpoint layout users have, written offline from the same random weights and statistics
(flashrt_core.fixture_layouts), loads to bit-identical action chunks on the reference path, directly and after
flashrt-convert; and each layout's traps are refused or reported by name."""

import json

import numpy as np
import pytest

from flashrt_core.api import load_model
from flashrt_core.checkpoint_convert import convert
from flashrt_core.checkpoint_layout import Layout, detect_layout
from flashrt_core.errors import CheckpointError
from flashrt_core.fixture_layouts import FIXTURE_ASSET_ID, tokenizer_for_tests, write_layout

LAYOUTS = [Layout.FLASHRT, Layout.OPENPI_PYTORCH, Layout.LEROBOT, Layout.OPENPI_JAX]
STATE_DIM, ACTION_DIM = 8, 7
HORIZON = {"pi05_tiny": 10, "pi0_tiny": 50}
RNG = np.random.default_rng(11)
IMAGES = [RNG.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(3)]
STATE = np.linspace(-0.8, 0.9, STATE_DIM)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tokenizer_for_tests(tmp_path_factory.mktemp("tok") / "tokenizer.model")


@pytest.fixture(scope="module", params=["pi05_tiny", "pi0_tiny"])
def written(request, tmp_path_factory):
    """config -> {layout: folder}, every layout from seed 5."""
    base = tmp_path_factory.mktemp(request.param)
    return request.param, {layout: write_layout(base / layout.value, layout, request.param, seed=5,
                                                state_dim=STATE_DIM, action_dim=ACTION_DIM) for layout in LAYOUTS}


def chunk(folder, tokenizer, config):
    noise = np.random.default_rng(3).standard_normal((HORIZON[config], 32)).astype(np.float32)
    policy = load_model(folder, device="cpu", hardware="reference", tokenizer=tokenizer)
    try:
        assert policy.config.name == config and (policy.state_dim, policy.action_dim) == (STATE_DIM, ACTION_DIM)
        return policy.predict(IMAGES, "put the bowl on the plate", state=STATE, noise=noise)
    finally:
        policy.close()


def test_every_layout_gives_bit_identical_chunks(written, tokenizer, tmp_path):
    config, folders = written
    assert {layout: detect_layout(folder) for layout, folder in folders.items()} == {l: l for l in LAYOUTS}
    reference = chunk(folders[Layout.FLASHRT], tokenizer, config)
    assert reference.shape == (HORIZON[config], ACTION_DIM) and np.isfinite(reference).all()
    for layout in LAYOUTS[1:]:
        np.testing.assert_array_equal(chunk(folders[layout], tokenizer, config), reference, err_msg=layout.value)
        converted = convert(folders[layout], tmp_path / layout.value, tokenizer=tokenizer)
        np.testing.assert_array_equal(chunk(converted, None, config), reference, err_msg=f"{layout.value} converted")


def test_openpi_pytorch_folder_is_what_the_converter_writes(written):
    _, folders = written
    folder = folders[Layout.OPENPI_PYTORCH]
    record = json.loads((folder / "config.json").read_text())
    assert set(record) == {"action_dim", "action_horizon", "paligemma_variant", "action_expert_variant", "precision"}
    assert (folder / "assets" / FIXTURE_ASSET_ID / "norm_stats.json").is_file()
    assert not (folder / "tokenizer.model").exists() and not (folder / "flashrt_config.json").exists()


def test_lerobot_empty_normalizer_is_refused_with_the_reason_and_runs_when_allowed(tmp_path, tokenizer):
    folder = write_layout(tmp_path / "base", Layout.LEROBOT, seed=5, empty_normalizer=True)
    with pytest.raises(CheckpointError) as info:
        load_model(folder, device="cpu", tokenizer=tokenizer)
    message = str(info.value)
    for text in ("normalizer_processor", "hold no statistics", "identity", "norm_stats.json", "--norm-stats",
                 "require_norm_stats=False"):
        assert text in message, message
    policy = load_model(folder, device="cpu", tokenizer=tokenizer, require_norm_stats=False)
    assert policy.normalizer.stats is None and (policy.state_dim, policy.action_dim) == (STATE_DIM, ACTION_DIM)
    policy.close()


def test_lerobot_options_flashrt_does_not_implement_are_refused(tmp_path, tokenizer):
    folder = write_layout(tmp_path / "relative", Layout.LEROBOT, seed=5)
    record = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**record, "use_relative_actions": True}))
    with pytest.raises(CheckpointError, match="use_relative_actions is true"):
        load_model(folder, device="cpu", tokenizer=tokenizer)


def test_a_missing_tokenizer_says_where_to_get_it(written, monkeypatch, tmp_path):
    _, folders = written
    monkeypatch.setenv("HOME", str(tmp_path))            # no openpi download cache
    monkeypatch.delenv("FLASHRT_TOKENIZER", raising=False)
    with pytest.raises(CheckpointError) as info:
        load_model(folders[Layout.LEROBOT], device="cpu")
    for text in ("tokenizer model not found", "google/paligemma-3b-pt-224", "paligemma_tokenizer.model",
                 "tokenizer=PATH", "FLASHRT_TOKENIZER", "flashrt-convert"):
        assert text in str(info.value)



def test_the_params_folder_itself_is_named_and_its_parent_suggested(written):
    _, folders = written
    with pytest.raises(CheckpointError, match="is the params/ folder of an openpi checkpoint: pass the folder above"):
        detect_layout(folders[Layout.OPENPI_JAX] / "params")
