"""The reference models: SigLIP vision tower, Gemma experts, pi0 / pi0.5 policy glue and pi0-FAST."""

from flashrt_core.model.gemma import GemmaLayer, GemmaStack, KVCache, attention, joint_forward
from flashrt_core.model.pi0_fast import DecodeState, Pi0FastModel
from flashrt_core.model.pi_model import PiModel, PrefixCache, make_attention_mask, sincos_time_embedding
from flashrt_core.model.siglip import VisionTower

__all__ = ["DecodeState", "GemmaLayer", "GemmaStack", "KVCache", "Pi0FastModel", "PiModel", "PrefixCache",
           "VisionTower", "attention", "joint_forward", "make_attention_mask", "sincos_time_embedding"]
