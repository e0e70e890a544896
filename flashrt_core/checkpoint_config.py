"""Which ModelConfig a checkpoint directory describes, and the robot dimensions it was trained with.

Resolution order (first match wins):
  1. an explicit `config` argument (preset name or ModelConfig);
  2. flashrt_config.json  {"config": preset, "overrides": {...}}  (written by flashrt_core.fixtures);
  3. config.json, in one of two layouts:
     - lerobot (a pi0 / pi05 policy: "type"): preset by type and the two Gemma variants, plus chunk_size ->
       action_horizon, tokenizer_max_length -> max_token_len, num_inference_steps -> num_steps, camera features
       -> view_names, normalization_mapping -> norm_mode, feature shapes -> state_dim / action_dim;
     - openpi's PyTorch conversion (examples/convert_jax_model_to_pytorch.py: "paligemma_variant",
       "action_expert_variant", "action_horizon", "action_dim", "precision"): it does not record pi0 vs pi0.5,
       so the model type comes from the weight names (time_mlp_in: pi0.5, state_proj: pi0); pi0.5 takes the
       discrete-state prompt, openpi's default (openpi's pi05_libero turns it off: override prompt_mode there);
  4. the preset whose tensor names and shapes the weights match (openpi's Orbax checkpoints and a bare
     model.safetensors record no config: the preset's action_horizon and prompt mode are assumed, so give the
     training config's with `flashrt-convert --set action_horizon=N`);
  5. the "pi05" preset.
The preset is the one whose model type and Gemma sizes match the variants (OPENPI_VARIANTS). state_dim /
action_dim are then taken from the norm stats unless they were set explicitly (a ModelConfig, or
flashrt_config.json overrides): released checkpoints carry the robot's dimensions only in their statistics.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from flashrt_core import normalization
from flashrt_core.config import (GEMMA_2B, GEMMA_300M, PRESETS, GemmaConfig, ModelConfig, ModelType, NormMode,
                                 PromptMode, get_config)
from flashrt_core.errors import CheckpointError

log = logging.getLogger(__name__)

DEFAULT_CONFIG = "pi05"
FLASHRT_CONFIG_FILE = "flashrt_config.json"
LEROBOT_CONFIG_FILE = "config.json"
NORM_STATS_KEY, NO_STATS = "norm_stats", "none"  # flashrt_config.json: the folder has no statistics on purpose
ROBOT_DIMS = frozenset({"state_dim", "action_dim"})
LEROBOT_IMAGE_PREFIX = "observation.images."
_LEROBOT_NORM = {"QUANTILES": NormMode.QUANTILE, "MEAN_STD": NormMode.ZSCORE}
# lerobot policy types -> model types (its config.json "type")
LEROBOT_TYPES = {"pi0": ModelType.PI0, "pi05": ModelType.PI05, "pi0_fast": ModelType.PI0_FAST}
# lerobot PI0FastConfig fields -> FastDecoding fields
_LEROBOT_FAST_FIELDS = {"max_decoding_steps": "max_decoding_steps", "fast_skip_tokens": "fast_skip_tokens"}
# openpi's Gemma variant names (src/openpi/models/gemma.py) -> sizes. LoRA variants have the base sizes (their
# adapters are separate tensors). "flashrt_tiny*" are the sizes of the tiny test presets, for fixtures.
OPENPI_VARIANTS: dict[str, GemmaConfig] = {
    "gemma_2b": GEMMA_2B, "gemma_2b_lora": GEMMA_2B, "gemma_300m": GEMMA_300M, "gemma_300m_lora": GEMMA_300M,
    "flashrt_tiny": PRESETS["pi05_tiny"].paligemma, "flashrt_tiny_expert": PRESETS["pi05_tiny"].expert,
}
DEFAULT_VARIANTS = ("gemma_2b", "gemma_300m")
OPENPI_CONVERTED_KEYS = frozenset({"paligemma_variant", "action_expert_variant", "action_horizon"})
# lerobot options this core does not implement: refused by name rather than run wrongly
_LEROBOT_UNSUPPORTED = ("use_relative_actions", "use_visual_memory", "use_proprioceptive_memory")
_LEROBOT_FIELDS = {"chunk_size": "action_horizon", "tokenizer_max_length": "max_token_len",
                   "num_inference_steps": "num_steps", "max_action_dim": "max_action_dim",
                   "min_period": "time_min_period", "max_period": "time_max_period"}


def resolve_config(config: str | ModelConfig | None, checkpoint_dir: Path) -> tuple[ModelConfig, frozenset[str]]:
    """(config, robot-dimension fields set explicitly) for a checkpoint directory; see the module docstring."""
    if isinstance(config, ModelConfig):
        return config.validate(), ROBOT_DIMS
    if config is not None:
        return get_config(config), frozenset()
    record_path = checkpoint_dir / FLASHRT_CONFIG_FILE
    if record_path.is_file():
        record = _read_json(record_path)
        try:
            overrides = record.get("overrides", {})
            return get_config(record["config"], **overrides), ROBOT_DIMS & set(overrides)
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"invalid {record_path}: {exc}") from exc
    config_path = checkpoint_dir / LEROBOT_CONFIG_FILE
    if config_path.is_file():
        record = _read_json(config_path)
        found = None
        if record.get("type") in LEROBOT_TYPES:
            found = lerobot_overrides(record, config_path)
        elif is_openpi_converted(record):
            from flashrt_core.checkpoint import model_type_of  # the weights say pi0 or pi0.5
            found = openpi_converted_overrides(record, model_type_of(checkpoint_dir), config_path)
        if found is not None:
            preset, overrides = found
            log.info("config from %s: %s %s", config_path, preset, overrides)
            try:
                return get_config(preset, **overrides), frozenset()
            except ValueError as exc:
                raise CheckpointError(f"unsupported {config_path}: {exc}") from exc
    from flashrt_core.checkpoint import preset_from_weights
    preset = preset_from_weights(checkpoint_dir)
    if preset is not None:
        log.info("%s records no config; its weights are those of preset %r (its action_horizon %d and prompt "
                 "mode are assumed)", checkpoint_dir, preset, PRESETS[preset].action_horizon)
        return get_config(preset), frozenset()
    log.info("%s has no %s; using config %r", checkpoint_dir, FLASHRT_CONFIG_FILE, DEFAULT_CONFIG)
    return get_config(DEFAULT_CONFIG), frozenset()


def declares_no_stats(checkpoint_dir: Path) -> bool:
    """Whether the folder's flashrt_config.json says it runs without statistics on purpose ("norm_stats": "none",
    written by `flashrt-convert --allow-no-stats`, e.g. for lerobot/pi05_base whose normalizer is empty)."""
    path = checkpoint_dir / FLASHRT_CONFIG_FILE
    return path.is_file() and _read_json(path).get(NORM_STATS_KEY) == NO_STATS


def _read_json(path: Path) -> dict:
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    if not isinstance(record, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return record


def is_openpi_converted(record: dict) -> bool:
    """Whether a config.json is the one openpi's convert_jax_model_to_pytorch.py writes."""
    return "type" not in record and OPENPI_CONVERTED_KEYS <= set(record)


def preset_for(model_type: ModelType | str, paligemma_variant: str, expert_variant: str, origin: Path) -> str:
    """The preset of this model type whose backbone and expert have the sizes of the two openpi variants."""
    sizes = []
    for field, variant in (("paligemma_variant", paligemma_variant), ("action_expert_variant", expert_variant)):
        if variant not in OPENPI_VARIANTS:
            raise CheckpointError(f"unsupported {origin}: {field} {variant!r}; known: {sorted(OPENPI_VARIANTS)}")
        sizes.append(OPENPI_VARIANTS[variant])
    for name, preset in PRESETS.items():
        if preset.model_type == model_type and [preset.paligemma, preset.expert] == sizes:
            return name
    raise CheckpointError(f"unsupported {origin}: no {model_type} preset has a {paligemma_variant} backbone and a "
                          f"{expert_variant} expert")


def openpi_converted_overrides(record: dict, model_type: ModelType, origin: Path) -> tuple[str, dict]:
    """openpi converted config.json (+ the model type its weights show) -> (preset name, ModelConfig overrides).
    Its "action_dim" is the model's padded width (max_action_dim), not the robot's."""
    preset = preset_for(model_type, record["paligemma_variant"], record["action_expert_variant"], origin)
    overrides = {"action_horizon": record["action_horizon"]}
    if "action_dim" in record:
        overrides["max_action_dim"] = record["action_dim"]
    return preset, overrides


def lerobot_overrides(record: dict, origin: Path) -> tuple[str, dict]:
    """lerobot PI0Config / PI05Config / PI0FastConfig fields -> (preset name, ModelConfig overrides)."""
    for option in _LEROBOT_UNSUPPORTED:
        if record.get(option):
            raise CheckpointError(f"unsupported {origin}: {option} is true (flashrt_core implements the policy "
                                  "without it)")
    preset = preset_for(LEROBOT_TYPES[record["type"]], record.get("paligemma_variant", DEFAULT_VARIANTS[0]),
                        record.get("action_expert_variant", DEFAULT_VARIANTS[1]), origin)
    overrides = {ours: record[theirs] for theirs, ours in _LEROBOT_FIELDS.items() if theirs in record}
    if record.get("max_state_dim", overrides.get("max_action_dim", 32)) != overrides.get("max_action_dim", 32):
        raise CheckpointError(f"unsupported {origin}: max_state_dim {record['max_state_dim']} differs from "
                              f"max_action_dim {overrides.get('max_action_dim', 32)}")
    resolution = record.get("image_resolution", [224, 224])
    if list(resolution) != [224, 224]:
        raise CheckpointError(f"unsupported {origin}: image_resolution {resolution} (the vision tower is 224x224)")
    inputs, outputs = record.get("input_features") or {}, record.get("output_features") or {}
    views = [key[len(LEROBOT_IMAGE_PREFIX):] for key in inputs if key.startswith(LEROBOT_IMAGE_PREFIX)]
    if views:
        overrides["view_names"] = views
    for field, feature in (("state_dim", inputs.get("observation.state")), ("action_dim", outputs.get("action"))):
        if feature and feature.get("shape"):
            overrides[field] = int(feature["shape"][0])
    modes = {(record.get("normalization_mapping") or {}).get(k) for k in ("STATE", "ACTION")} - {None}
    if modes:
        if len(modes) > 1 or not modes <= set(_LEROBOT_NORM):
            raise CheckpointError(f"unsupported {origin}: normalization_mapping {record['normalization_mapping']}")
        overrides["norm_mode"] = _LEROBOT_NORM[modes.pop()]
    if PRESETS[preset].model_type == ModelType.PI05:
        overrides["prompt_mode"] = PromptMode.DISCRETE_STATE  # lerobot's pi0.5 processor puts the state in the prompt
    if PRESETS[preset].model_type == ModelType.PI0_FAST:
        if record.get("temperature", 0.0) != 0.0:
            raise CheckpointError(f"unsupported {origin}: temperature {record['temperature']} (pi0-FAST decodes "
                                  "greedily)")
        overrides["fast"] = {"prompt_style": "lerobot", "decode_position_offset": 0,
                             **{ours: record[theirs] for theirs, ours in _LEROBOT_FAST_FIELDS.items()
                                if theirs in record}}
    return preset, overrides


def fit_robot_dims(config: ModelConfig, stats: normalization.NormStats | None, explicit: frozenset[str],
                   stats_origin: Path) -> ModelConfig:
    """Take state_dim / action_dim from the norm stats unless set explicitly; refuse stats narrower than them."""
    changes = {}
    features = (("state_dim", getattr(stats, "state", None)), ("action_dim", getattr(stats, "actions", None)))
    for field, feature in features:
        if feature is None:
            continue
        if field not in explicit:
            if feature.dim > config.max_action_dim:
                raise CheckpointError(f"norm stats in {stats_origin} cover {feature.dim} {field} values, more than "
                                      f"max_action_dim {config.max_action_dim}")
            changes[field] = feature.dim
        elif feature.dim < getattr(config, field):
            raise CheckpointError(f"config {field}={getattr(config, field)} but the norm stats in {stats_origin} "
                                  f"cover only {feature.dim} values")
    changes = {k: v for k, v in changes.items() if getattr(config, k) != v}
    if changes:
        log.info("robot dimensions from the norm stats of %s: %s", stats_origin, changes)
    return config.replace(**changes) if changes else config
