"""One random-weight checkpoint written in each layout users have (flashrt_core.checkpoint_layout), offline.

Every layout holds the same tensors (fixtures.write_random_weights: deterministic per seed and name, the same
dtypes) and the same statistics, rounded to float32 so that lerobot's float32 safetensors and openpi's JSON hold
the same numbers. Loading any of them must therefore give bit-identical action chunks on the reference path
(test/core/test_checkpoint_layouts.py). Only the flashrt layout holds a tokenizer, as with released checkpoints;
`tokenizer_for_tests` writes one beside the others.

  flashrt         fixtures.write_random_checkpoint (flashrt_config.json, norm_stats.json, tokenizer.model)
  openpi_pytorch  model.safetensors without "model.", no lm_heads; config.json as openpi's converter writes it
                  (action_dim, action_horizon, paligemma_variant, action_expert_variant, precision);
                  assets/<asset_id>/norm_stats.json
  lerobot         model.safetensors with "model."; config.json of a PI05Config / PI0Config;
                  policy_preprocessor.json / policy_postprocessor.json whose normalizer steps name their
                  statistics files (the normalizer at step 3, after a relative-actions step, as newer lerobot
                  versions save it); `empty_normalizer=True`: steps without statistics (lerobot/pi05_base)
  openpi_jax      params/ in Orbax's OCDBT layout through tensorstore (flashrt_core.orbax_params)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from flashrt_core import fixtures, normalization
from flashrt_core.checkpoint import WEIGHTS_FILE
from flashrt_core.checkpoint_config import OPENPI_VARIANTS
from flashrt_core.checkpoint_layout import Layout
from flashrt_core.config import ModelConfig, NormMode, get_config

FIXTURE_ASSET_ID = "fixture_robot"
LEROBOT_NORMALIZER_STEP = 3
_LEROBOT_NORM_NAMES = {NormMode.QUANTILE: "QUANTILES", NormMode.ZSCORE: "MEAN_STD"}


def float32_stats(stats: normalization.NormStats) -> normalization.NormStats:
    """The statistics rounded to float32 values (held as float64): stored alike in JSON and in float32 files."""
    def rounded(feature):
        return normalization.FeatureStats(**{name: None if (v := getattr(feature, name)) is None
                                             else v.astype(np.float32).astype(np.float64)
                                             for name in normalization.STAT_NAMES})
    return normalization.NormStats(**{key: rounded(feature) for key, feature in stats.items()})


def openpi_variants(config: ModelConfig) -> tuple[str, str]:
    """openpi's variant names of the config's backbone and expert (checkpoint_config.OPENPI_VARIANTS)."""
    names = []
    for sizes in (config.paligemma, config.expert):
        matches = [name for name, known in OPENPI_VARIANTS.items() if known == sizes and "lora" not in name]
        if not matches:
            raise ValueError(f"no openpi variant has the sizes {sizes}")
        names.append(matches[0])
    return names[0], names[1]


def write_layout(out_dir: str | Path, layout: Layout | str, config: str = "pi05_tiny", seed: int = 0,
                 state_dim: int = 8, action_dim: int = 7, empty_normalizer: bool = False) -> Path:
    """Write one random checkpoint in `layout` into out_dir (created); returns out_dir."""
    layout = Layout(layout)
    out = Path(out_dir)
    cfg = get_config(config, state_dim=state_dim, action_dim=action_dim)
    stats = float32_stats(normalization.random_norm_stats(state_dim, action_dim, seed))
    if layout is Layout.FLASHRT:
        fixtures.write_random_checkpoint(out, config, seed, overrides={"state_dim": state_dim,
                                                                        "action_dim": action_dim})
        stats.save_openpi(out / fixtures.NORM_STATS_FILE)
        return out
    out.mkdir(parents=True, exist_ok=True)
    if layout is Layout.OPENPI_PYTORCH:
        fixtures.write_random_weights(out / WEIGHTS_FILE, cfg, seed, prefix_model=False, include_lm_heads=False)
        _write_openpi_converted_config(out, cfg)
        stats.save_openpi(out / "assets" / FIXTURE_ASSET_ID)
    elif layout is Layout.LEROBOT:
        fixtures.write_random_weights(out / WEIGHTS_FILE, cfg, seed, prefix_model=True)
        _write_lerobot_config(out, cfg)
        _write_lerobot_processors(out, None if empty_normalizer else stats)
    elif layout is Layout.OPENPI_JAX:
        from flashrt_core import orbax_params
        orbax_params.write_random_params(out, cfg, seed)
        stats.save_openpi(out / "assets" / FIXTURE_ASSET_ID)
    else:
        raise ValueError(f"no fixture writer for layout {layout.value!r}: a bare model.safetensors needs its config "
                         "given to load_model")
    return out


def tokenizer_for_tests(out_path: str | Path, config: str = "pi05_tiny") -> Path:
    """A small real sentencepiece model with PaliGemma's special ids, the one the flashrt fixtures hold."""
    vocab = min(fixtures.TEST_TOKENIZER_VOCAB, get_config(config).paligemma.vocab_size)
    from flashrt_core.tokenizer import train_test_tokenizer
    return train_test_tokenizer(out_path, vocab_size=vocab)


def _write_openpi_converted_config(out: Path, cfg: ModelConfig) -> None:
    paligemma, expert = openpi_variants(cfg)
    record = {"action_dim": cfg.max_action_dim, "action_horizon": cfg.action_horizon, "paligemma_variant": paligemma,
              "action_expert_variant": expert, "precision": "bfloat16"}
    (out / "config.json").write_text(json.dumps(record, indent=2))


def _write_lerobot_config(out: Path, cfg: ModelConfig) -> None:
    paligemma, expert = openpi_variants(cfg)
    norm = _LEROBOT_NORM_NAMES[cfg.norm_mode]
    record = {
        "type": cfg.model_type.value, "paligemma_variant": paligemma, "action_expert_variant": expert,
        "dtype": "float32", "n_obs_steps": 1, "chunk_size": cfg.action_horizon, "n_action_steps": cfg.action_horizon,
        "max_state_dim": cfg.max_action_dim, "max_action_dim": cfg.max_action_dim,
        "num_inference_steps": cfg.num_steps, "tokenizer_max_length": cfg.max_token_len,
        "image_resolution": [224, 224], "use_relative_actions": False,
        "input_features": {**{f"observation.images.{view}": {"type": "VISUAL", "shape": [3, 224, 224]}
                              for view in cfg.view_names},
                           "observation.state": {"type": "STATE", "shape": [cfg.state_dim]}},
        "output_features": {"action": {"type": "ACTION", "shape": [cfg.action_dim]}},
        "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": norm, "ACTION": norm},
    }
    (out / "config.json").write_text(json.dumps(record, indent=2))


def _write_lerobot_processors(out: Path, stats: normalization.NormStats | None) -> None:
    """policy_preprocessor.json / policy_postprocessor.json with their steps, and the statistics files they name."""
    pre_steps = [{"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
                 {"registry_name": "to_batch_processor", "config": {}},
                 {"registry_name": "relative_actions_processor", "config": {"enabled": False}},
                 {"registry_name": "normalizer_processor", "config": {"eps": 1e-8}},
                 {"registry_name": "pi05_prepare_state_tokenizer_processor_step", "config": {"max_state_dim": 32}},
                 {"registry_name": "tokenizer_processor", "config": {"tokenizer_name": "google/paligemma-3b-pt-224"}},
                 {"registry_name": "device_processor", "config": {"device": "cpu"}}]
    post_steps = [{"registry_name": "unnormalizer_processor", "config": {"eps": 1e-8}},
                  {"registry_name": "absolute_actions_processor", "config": {"enabled": False}},
                  {"registry_name": "device_processor", "config": {"device": "cpu"}}]
    if stats is not None:
        tmp = out / ".stats"
        written = stats.save_lerobot(tmp)           # normalizer (state + actions), unnormalizer (actions)
        for steps, name, index, source in ((pre_steps, "policy_preprocessor", LEROBOT_NORMALIZER_STEP, written[0]),
                                           (post_steps, "policy_postprocessor", 0, written[1])):
            state_file = f"{name}_step_{index}_{steps[index]['registry_name']}.safetensors"
            steps[index]["state_file"] = state_file
            shutil.move(source, out / state_file)
        tmp.rmdir()
    for name, steps in (("policy_preprocessor", pre_steps), ("policy_postprocessor", post_steps)):
        (out / f"{name}.json").write_text(json.dumps({"name": name, "steps": steps}, indent=2))

