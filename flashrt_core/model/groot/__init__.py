"""GR00T N1.6 (NVIDIA Isaac-GR00T): the second model family, on the eager reference path.

config.py       sizes (released and tiny presets), config.json reading
backbone.py     Eagle: SigLIP2 + projector + Qwen3 truncated at select_layer (transformers modules)
dit.py          the flow-matching DiT
action_head.py  embodiment-specific state / action encoders and decoder around the DiT
sampler.py      the Euler flow-matching sampler
model.py        backbone + action head under the checkpoints' names
"""

from flashrt_core.model.groot.config import PRESETS, GrootConfig, get_groot_config, is_groot_config

__all__ = ["PRESETS", "GrootConfig", "get_groot_config", "is_groot_config"]
