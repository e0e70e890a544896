"""Which ModelConfig a checkpoint directory describes, and the robot dimensions it was trained with.

Resolution order (first match wins):
  1. an explicit `config` argument (preset name or ModelConfig);
  2. flashrt_config.json  {"config": preset, "overrides": {...}}  (written by flashrt_core.fixtures);
  3. lerobot's config.json of a pi0 / pi05 policy: preset by "type", plus chunk_size -> action_horizon,
     tokenizer_max_length -> max_token_len, num_inference_steps -> num_steps, camera features -> view_names,
     normalization_mapping -> norm_mode, feature shapes -> state_dim / action_dim;
  4. the "pi05" preset.
state_dim / action_dim are then taken from the norm stats unless they were set explicitly (a ModelConfig, or
flashrt_config.json overrides): released checkpoints carry the robot's dimensions only in their statistics.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from flashrt_core import normalization
from flashrt_core.config import ModelConfig, NormMode, PromptMode, get_config
from flashrt_core.errors import CheckpointError

log = logging.getLogger(__name__)

DEFAULT_CONFIG = "pi05"
FLASHRT_CONFIG_FILE = "flashrt_config.json"
LEROBOT_CONFIG_FILE = "config.json"
ROBOT_DIMS = frozenset({"state_dim", "action_dim"})
LEROBOT_IMAGE_PREFIX = "observation.images."
_LEROBOT_NORM = {"QUANTILES": NormMode.QUANTILE, "MEAN_STD": NormMode.ZSCORE}
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
    lerobot_path = checkpoint_dir / LEROBOT_CONFIG_FILE
    if lerobot_path.is_file():
        record = _read_json(lerobot_path)
        if record.get("type") in ("pi0", "pi05"):
            preset, overrides = lerobot_overrides(record, lerobot_path)
            log.info("config from %s: %s %s", lerobot_path, preset, overrides)
            try:
                return get_config(preset, **overrides), frozenset()
            except ValueError as exc:
                raise CheckpointError(f"unsupported {lerobot_path}: {exc}") from exc
    log.info("%s has no %s; using config %r", checkpoint_dir, FLASHRT_CONFIG_FILE, DEFAULT_CONFIG)
    return get_config(DEFAULT_CONFIG), frozenset()


def _read_json(path: Path) -> dict:
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    if not isinstance(record, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return record


def lerobot_overrides(record: dict, origin: Path) -> tuple[str, dict]:
    """lerobot PI0Config / PI05Config fields -> (preset name, ModelConfig overrides)."""
    preset = record["type"]
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
    if preset == "pi05":
        overrides["prompt_mode"] = PromptMode.DISCRETE_STATE  # lerobot's pi0.5 processor puts the state in the prompt
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
