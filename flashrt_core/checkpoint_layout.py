"""Which of the known layouts a checkpoint folder is in, by the files it holds.

- flashrt: flashrt_config.json (written by flashrt-convert and the fixtures), model.safetensors, norm_stats.json,
  tokenizer.model.
- lerobot: config.json with "type": "pi0" / "pi05" / "pi0_fast"; model.safetensors (names with "model."); statistics in
  policy_*processor*.safetensors, named by policy_preprocessor.json / policy_postprocessor.json.
- openpi_pytorch: config.json with paligemma_variant, action_expert_variant and action_horizon (openpi's
  converter); model.safetensors; statistics in assets/<asset_id>/norm_stats.json.
- openpi_jax: params/ in Orbax's layout (flashrt_core.orbax_params); statistics in assets/<asset_id>/.
- safetensors: model.safetensors alone, with whatever statistics lie beside it.

None of them but flashrt holds the PaliGemma tokenizer (flashrt_core.api.find_tokenizer says where it is looked for).
"""

from __future__ import annotations

import enum
import json
from pathlib import Path

from flashrt_core.checkpoint import WEIGHTS_FILE
from flashrt_core.checkpoint_config import (FLASHRT_CONFIG_FILE, LEROBOT_CONFIG_FILE, LEROBOT_TYPES,
                                           is_openpi_converted)
from flashrt_core.errors import CheckpointError

ORBAX_PARAMS_DIR = "params"
ORBAX_MARKERS = ("manifest.ocdbt", "_METADATA")  # what an Orbax params/ folder holds


class Layout(enum.StrEnum):
    FLASHRT = "flashrt"
    LEROBOT = "lerobot"
    OPENPI_PYTORCH = "openpi_pytorch"
    OPENPI_JAX = "openpi_jax"
    SAFETENSORS = "safetensors"


DESCRIPTIONS = {
    Layout.FLASHRT: "flashrt folder (flashrt_config.json, model.safetensors, norm_stats.json, tokenizer.model)",
    Layout.LEROBOT: "lerobot policy folder (config.json, model.safetensors, policy pre/postprocessor)",
    Layout.OPENPI_PYTORCH: "openpi checkpoint converted to PyTorch (config.json, model.safetensors, assets/)",
    Layout.OPENPI_JAX: "openpi JAX checkpoint (Orbax params/, assets/)",
    Layout.SAFETENSORS: "bare model.safetensors",
}


def detect_layout(directory: str | Path) -> Layout:
    """The layout of a checkpoint folder; CheckpointError when it is none of them."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint directory not found: {directory}")
    if (directory / FLASHRT_CONFIG_FILE).is_file():
        return Layout.FLASHRT
    config_path = directory / LEROBOT_CONFIG_FILE
    if config_path.is_file():
        try:
            record = json.loads(config_path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"cannot read {config_path}: {exc}") from exc
        if isinstance(record, dict) and record.get("type") in LEROBOT_TYPES:
            return Layout.LEROBOT
        if isinstance(record, dict) and is_openpi_converted(record):
            return Layout.OPENPI_PYTORCH
    if (directory / WEIGHTS_FILE).is_file():
        return Layout.SAFETENSORS
    if (directory / ORBAX_PARAMS_DIR).is_dir():
        return Layout.OPENPI_JAX
    if any((directory / marker).is_file() for marker in ORBAX_MARKERS):
        raise CheckpointError(f"{directory} is the {ORBAX_PARAMS_DIR}/ folder of an openpi checkpoint: pass the folder "
                              f"above it ({directory.parent}), which holds {ORBAX_PARAMS_DIR}/ and assets/")
    contents = sorted(p.name for p in directory.iterdir())[:20]
    raise CheckpointError(f"{directory} is no pi0 / pi0.5 checkpoint folder: it has neither {WEIGHTS_FILE} nor an "
                          f"openpi {ORBAX_PARAMS_DIR}/ directory (contents: {contents})")
