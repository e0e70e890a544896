"""The pi0 / pi0.5 reference model: SigLIP vision tower, Gemma experts, policy glue."""

from flashrt_core.model.gemma import GemmaLayer, GemmaStack, KVCache, attention, joint_forward
from flashrt_core.model.pi_model import PiModel, PrefixCache, make_attention_mask, sincos_time_embedding
from flashrt_core.model.siglip import VisionTower

__all__ = ["GemmaLayer", "GemmaStack", "KVCache", "PiModel", "PrefixCache", "VisionTower", "attention",
           "joint_forward", "make_attention_mask", "sincos_time_embedding"]
