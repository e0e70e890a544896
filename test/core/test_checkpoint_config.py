"""Config resolution for checkpoint directories: explicit, flashrt_config.json, lerobot config.json, default."""

import json

import pytest

from flashrt_core.checkpoint_config import fit_robot_dims, resolve_config
from flashrt_core.config import NormMode, PromptMode, get_config
from flashrt_core.errors import CheckpointError
from flashrt_core.normalization import random_norm_stats

# A lerobot 0.4+ PI05Policy config.json, trimmed to the fields that matter here (LIBERO-like features).
LEROBOT_PI05 = {
    "type": "pi05", "chunk_size": 10, "n_action_steps": 10, "max_state_dim": 32, "max_action_dim": 32,
    "num_inference_steps": 10, "tokenizer_max_length": 200, "image_resolution": [224, 224],
    "input_features": {"observation.images.image": {"type": "VISUAL", "shape": [3, 256, 256]},
                       "observation.images.image2": {"type": "VISUAL", "shape": [3, 256, 256]},
                       "observation.state": {"type": "STATE", "shape": [8]}},
    "output_features": {"action": {"type": "ACTION", "shape": [7]}},
    "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "QUANTILES", "ACTION": "QUANTILES"},
}


def write(directory, name, record):
    directory.mkdir(exist_ok=True)
    (directory / name).write_text(json.dumps(record))
    return directory


def test_order_explicit_then_flashrt_then_lerobot_then_default(tmp_path):
    cfg, explicit = resolve_config(None, tmp_path)
    assert cfg.name == "pi05" and not explicit
    write(tmp_path, "config.json", LEROBOT_PI05)
    cfg, explicit = resolve_config(None, tmp_path)
    assert (cfg.name, cfg.action_horizon, cfg.view_names) == ("pi05", 10, ("image", "image2"))
    assert (cfg.state_dim, cfg.action_dim, cfg.norm_mode, cfg.prompt_mode) == \
        (8, 7, NormMode.QUANTILE, PromptMode.DISCRETE_STATE)
    assert not explicit  # the norm stats still decide the robot dims
    write(tmp_path, "flashrt_config.json", {"config": "pi0_tiny", "overrides": {"action_dim": 6}})
    cfg, explicit = resolve_config(None, tmp_path)
    assert (cfg.name, cfg.action_dim) == ("pi0_tiny", 6) and explicit == {"action_dim"}
    cfg, explicit = resolve_config("pi05_tiny", tmp_path)
    assert cfg.name == "pi05_tiny" and not explicit
    cfg, explicit = resolve_config(get_config("pi0", state_dim=14), tmp_path)
    assert cfg.state_dim == 14 and explicit == {"state_dim", "action_dim"}


def test_lerobot_pi0_uses_zscore_and_its_horizon(tmp_path):
    record = dict(LEROBOT_PI05, type="pi0", chunk_size=50, tokenizer_max_length=48,
                  normalization_mapping={"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"})
    cfg, _ = resolve_config(None, write(tmp_path, "config.json", record))
    assert (cfg.model_type, cfg.action_horizon, cfg.max_token_len, cfg.norm_mode) == ("pi0", 50, 48, NormMode.ZSCORE)


@pytest.mark.parametrize("change,message", [
    ({"image_resolution": [448, 448]}, "image_resolution"),
    ({"max_state_dim": 64}, "max_state_dim 64"),
    ({"normalization_mapping": {"STATE": "MIN_MAX", "ACTION": "MIN_MAX"}}, "normalization_mapping"),
    ({"chunk_size": 0}, "action_horizon=0"),
])
def test_unsupported_lerobot_configs_are_named(tmp_path, change, message):
    write(tmp_path, "config.json", dict(LEROBOT_PI05, **change))
    with pytest.raises(CheckpointError, match=message):
        resolve_config(None, tmp_path)


def test_broken_config_files_are_named(tmp_path):
    (tmp_path / "flashrt_config.json").write_text("{oops")
    with pytest.raises(CheckpointError, match="flashrt_config.json"):
        resolve_config(None, tmp_path)
    write(tmp_path, "flashrt_config.json", {"config": "pi9"})
    with pytest.raises(CheckpointError, match="unknown model config 'pi9'"):
        resolve_config(None, tmp_path)


def test_robot_dims_follow_the_stats_unless_explicit(tmp_path):
    stats = random_norm_stats(8, 7, seed=0)
    cfg = fit_robot_dims(get_config("pi05"), stats, frozenset(), tmp_path)
    assert (cfg.state_dim, cfg.action_dim) == (8, 7)
    cfg = fit_robot_dims(get_config("pi05", action_dim=6), stats, frozenset({"action_dim"}), tmp_path)
    assert (cfg.state_dim, cfg.action_dim) == (8, 6)  # fewer robot dims than the stats cover is fine
    with pytest.raises(CheckpointError, match="config action_dim=9 but the norm stats"):
        fit_robot_dims(get_config("pi05", action_dim=9), stats, frozenset({"action_dim"}), tmp_path)
    assert fit_robot_dims(get_config("pi05"), None, frozenset(), tmp_path).state_dim == 32


# openpi's examples/convert_jax_model_to_pytorch.py writes exactly these fields.
OPENPI_CONVERTED = {"action_dim": 32, "action_horizon": 15, "paligemma_variant": "gemma_2b",
                    "action_expert_variant": "gemma_300m", "precision": "bfloat16"}


def test_openpi_converted_config_takes_its_type_from_the_weights(tmp_path):
    from flashrt_core.fixture_layouts import write_layout
    pi0 = write_layout(tmp_path / "pi0", "openpi_pytorch", "pi0_tiny", seed=1)
    cfg, explicit = resolve_config(None, pi0)
    assert (cfg.name, cfg.action_horizon, cfg.norm_mode) == ("pi0_tiny", 50, NormMode.ZSCORE) and not explicit
    full = write(tmp_path / "full", "config.json", OPENPI_CONVERTED)
    with pytest.raises(CheckpointError, match="model.safetensors"):    # no weights: pi0 or pi0.5 is unknown
        resolve_config(None, full)


def test_openpi_converted_config_fields(tmp_path):
    from flashrt_core.checkpoint_config import openpi_converted_overrides
    from flashrt_core.config import ModelType
    preset, overrides = openpi_converted_overrides(OPENPI_CONVERTED, ModelType.PI05, tmp_path)
    assert (preset, overrides) == ("pi05", {"action_horizon": 15, "max_action_dim": 32})
    assert openpi_converted_overrides(dict(OPENPI_CONVERTED, paligemma_variant="gemma_2b_lora"), ModelType.PI0,
                                      tmp_path)[0] == "pi0"
    with pytest.raises(CheckpointError, match="paligemma_variant 'gemma_7b'; known:"):
        openpi_converted_overrides(dict(OPENPI_CONVERTED, paligemma_variant="gemma_7b"), ModelType.PI05, tmp_path)
    with pytest.raises(CheckpointError, match="no pi05 preset has a gemma_300m backbone"):
        openpi_converted_overrides(dict(OPENPI_CONVERTED, paligemma_variant="gemma_300m"), ModelType.PI05, tmp_path)


def test_lerobot_variants_pick_the_preset(tmp_path):
    write(tmp_path, "config.json", dict(LEROBOT_PI05, paligemma_variant="flashrt_tiny",
                                        action_expert_variant="flashrt_tiny_expert"))
    assert resolve_config(None, tmp_path)[0].name == "pi05_tiny"


def test_weights_name_the_preset_where_nothing_else_does(tmp_path):
    from flashrt_core.fixtures import write_random_weights
    write_random_weights(tmp_path / "model.safetensors", get_config("pi0_tiny"), seed=0)
    assert resolve_config(None, tmp_path)[0].name == "pi0_tiny"
