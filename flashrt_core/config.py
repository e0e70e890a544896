"""Model configuration: frozen dataclasses with named presets (real sizes and tiny CPU test sizes).

`get_config("pi05")` returns the pi0.5 architecture at the sizes of the released checkpoints
(SigLIP So400m/14 + Gemma 2B + Gemma 300M action expert); `"pi05_tiny"` / `"pi0_tiny"` keep the same
structure with a few narrow layers so CPU tests run a full prediction in milliseconds.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field


class ModelType(enum.StrEnum):
    PI0 = "pi0"
    PI05 = "pi05"
    PI0_FAST = "pi0fast"  # PaliGemma decoding FAST action tokens (flashrt_core/model/pi0_fast.py)


class PromptMode(enum.StrEnum):
    """How a pi0.5 prompt carries the robot state (pi0 always feeds the state as a continuous token)."""

    DISCRETE_STATE = "discrete_state"  # "Task: {text}, State: {bins};\nAction: "
    NO_STATE = "no_state"  # openpi pi05_libero: pi0-style prompt, state unused
    LEROBOT_NO_STATE = "lerobot_no_state"  # lerobot without state: "Task: {text};\nAction: "


class NormMode(enum.StrEnum):
    QUANTILE = "quantile"  # (x - q01) / (q99 - q01 + 1e-6) * 2 - 1     (pi0.5)
    ZSCORE = "zscore"  # (x - mean) / (std + 1e-6)                      (pi0)


VIEW_NAMES = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
PI0_FAST_VIEW_NAMES = ("base_0_rgb", "base_1_rgb", "wrist_0_rgb")  # openpi's Pi0FASTConfig.inputs_spec


def _check(condition: bool, name: str, value: object, requirement: str) -> None:
    if not condition:
        raise ValueError(f"invalid config field {name}={value!r}: {requirement}")


@dataclass(frozen=True)
class VisionConfig:
    """SigLIP vision tower: pre-LN ViT without CLS token or pooling head."""

    width: int = 1152
    depth: int = 27
    num_heads: int = 16
    mlp_dim: int = 4304
    image_size: int = 224
    patch_size: int = 14
    eps: float = 1e-6

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads

    def validate(self, prefix: str = "vision") -> None:
        for name in ("width", "depth", "num_heads", "mlp_dim", "image_size", "patch_size"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value > 0, f"{prefix}.{name}", value, "must be a positive int")
        _check(self.width % self.num_heads == 0, f"{prefix}.width", self.width,
               f"must be divisible by num_heads={self.num_heads}")
        _check(self.image_size % self.patch_size == 0, f"{prefix}.image_size", self.image_size,
               f"must be divisible by patch_size={self.patch_size}")
        _check(self.eps > 0, f"{prefix}.eps", self.eps, "must be > 0")


@dataclass(frozen=True)
class GemmaConfig:
    """One Gemma transformer (the 2B backbone or the 300M action expert)."""

    width: int = 2048
    depth: int = 18
    num_heads: int = 8
    num_kv_heads: int = 1
    head_dim: int = 256
    mlp_dim: int = 16384
    vocab_size: int = 257152  # only meaningful for the backbone (embed_tokens)
    eps: float = 1e-6
    rope_max_wavelength: float = 10_000.0

    def layer_gemm_shapes(self) -> dict[str, tuple[int, int]]:
        """(N, K) of a layer's four GEMMs as the engine merges them: QKV (the query heads, then K and V), the
        attention output, gate/up (both halves, 2 x mlp_dim rows) and down."""
        q = self.num_heads * self.head_dim
        return {"qkv": (q + 2 * self.num_kv_heads * self.head_dim, self.width), "o": (self.width, q),
                "gate_up": (2 * self.mlp_dim, self.width), "down": (self.width, self.mlp_dim)}

    def validate(self, prefix: str) -> None:
        for name in ("width", "depth", "num_heads", "num_kv_heads", "head_dim", "mlp_dim", "vocab_size"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value > 0, f"{prefix}.{name}", value, "must be a positive int")
        _check(self.num_heads % self.num_kv_heads == 0, f"{prefix}.num_heads", self.num_heads,
               f"must be a multiple of num_kv_heads={self.num_kv_heads}")
        _check(self.head_dim % 2 == 0, f"{prefix}.head_dim", self.head_dim, "must be even (split-half RoPE)")
        _check(self.eps > 0, f"{prefix}.eps", self.eps, "must be > 0")


FAST_PROMPT_STYLES = ("openpi", "lerobot")


@dataclass(frozen=True)
class FastDecoding:
    """pi0-FAST decoding (openpi's Pi0FAST.sample_actions and FASTTokenizer; flashrt_core/pi0_fast_policy.py)."""

    max_decoding_steps: int = 256  # tokens decoded at most after the prefix (openpi's default)
    fast_skip_tokens: int = 128  # FAST token t is PaliGemma id vocab - 1 - fast_skip_tokens - t
    # openpi feeds the first decoded token at position prefix_len + 1 (position prefix_len stays unused);
    # 0 gives contiguous positions (transformers' generate, lerobot)
    decode_position_offset: int = 1
    relaxed_decoding: bool = False  # pad / cut the DCT coefficients to horizon x dim instead of refusing
    # "openpi": lower-cased instruction; "lerobot" (its pi0_fast policy): the instruction as given, BOS after the
    # prompt (decoding starts from it), contiguous positions (set decode_position_offset 0 with it)
    prompt_style: str = "openpi"

    def validate(self, prefix: str = "fast") -> None:
        _check(self.prompt_style in FAST_PROMPT_STYLES, f"{prefix}.prompt_style", self.prompt_style,
               f"must be one of {list(FAST_PROMPT_STYLES)}")
        for name in ("max_decoding_steps", "fast_skip_tokens", "decode_position_offset"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value >= (1 if name == "max_decoding_steps" else 0),
                   f"{prefix}.{name}", value, "must be a non-negative int (max_decoding_steps positive)")


GEMMA_2B = GemmaConfig()
GEMMA_300M = GemmaConfig(width=1024, mlp_dim=4096)


@dataclass(frozen=True)
class ModelConfig:
    name: str
    model_type: ModelType
    vision: VisionConfig = field(default_factory=VisionConfig)
    paligemma: GemmaConfig = GEMMA_2B
    expert: GemmaConfig = GEMMA_300M
    action_horizon: int = 10
    max_action_dim: int = 32
    max_token_len: int = 200
    num_steps: int = 10
    view_names: tuple[str, ...] = VIEW_NAMES
    prompt_mode: PromptMode = PromptMode.DISCRETE_STATE
    norm_mode: NormMode = NormMode.QUANTILE
    state_dim: int = 32
    action_dim: int = 32
    time_min_period: float = 4e-3
    time_max_period: float = 4.0
    fast: FastDecoding | None = None  # set for pi0fast only

    def validate(self) -> ModelConfig:
        """Raise ValueError naming the first bad field; return self so presets can be checked inline."""
        _check(isinstance(self.name, str) and bool(self.name), "name", self.name, "must be a non-empty str")
        _check(self.model_type in tuple(ModelType), "model_type", self.model_type,
               f"must be one of {[m.value for m in ModelType]}")
        _check(self.prompt_mode in tuple(PromptMode), "prompt_mode", self.prompt_mode,
               f"must be one of {[m.value for m in PromptMode]}")
        _check(self.norm_mode in tuple(NormMode), "norm_mode", self.norm_mode,
               f"must be one of {[m.value for m in NormMode]}")
        _check((self.fast is not None) == (self.model_type == ModelType.PI0_FAST), "fast", self.fast,
               "must be a FastDecoding for pi0fast and None otherwise")
        if self.fast is not None:
            self.fast.validate("fast")
        self.vision.validate("vision")
        self.paligemma.validate("paligemma")
        self.expert.validate("expert")
        for name in ("num_heads", "num_kv_heads", "head_dim"):
            _check(getattr(self.paligemma, name) == getattr(self.expert, name), f"expert.{name}",
                   getattr(self.expert, name), f"must equal paligemma.{name} (joint attention)")
        for name in ("action_horizon", "max_action_dim", "max_token_len", "num_steps", "state_dim", "action_dim"):
            value = getattr(self, name)
            _check(isinstance(value, int) and value > 0, name, value, "must be a positive int")
        _check(self.state_dim <= self.max_action_dim, "state_dim", self.state_dim,
               f"must be <= max_action_dim={self.max_action_dim}")
        _check(self.action_dim <= self.max_action_dim, "action_dim", self.action_dim,
               f"must be <= max_action_dim={self.max_action_dim}")
        _check(len(self.view_names) > 0 and len(set(self.view_names)) == len(self.view_names), "view_names",
               self.view_names, "must be a non-empty tuple of distinct names")
        _check(self.expert.width % 2 == 0, "expert.width", self.expert.width, "must be even (sin/cos time embedding)")
        _check(0 < self.time_min_period < self.time_max_period, "time_min_period", self.time_min_period,
               f"must be in (0, time_max_period={self.time_max_period})")
        return self

    def replace(self, **changes) -> ModelConfig:
        """A validated copy with some fields changed (strings are converted to the enum fields' types)."""
        for name, enum_type in (("model_type", ModelType), ("prompt_mode", PromptMode), ("norm_mode", NormMode)):
            if name in changes and isinstance(changes[name], str):
                changes[name] = _to_enum(enum_type, name, changes[name])
        if "view_names" in changes:
            changes["view_names"] = tuple(changes["view_names"])
        if isinstance(changes.get("fast"), dict):
            changes["fast"] = dataclasses.replace(self.fast or FastDecoding(), **changes["fast"])
        return dataclasses.replace(self, **changes).validate()


def _to_enum(enum_type: type[enum.StrEnum], name: str, value: str) -> enum.StrEnum:
    try:
        return enum_type(value)
    except ValueError:
        raise ValueError(f"invalid config field {name}={value!r}: must be one of "
                         f"{[m.value for m in enum_type]}") from None


_TINY_VISION = VisionConfig(width=32, depth=2, num_heads=2, mlp_dim=64, image_size=224, patch_size=56)
_TINY_GEMMA = GemmaConfig(width=64, depth=2, num_heads=4, num_kv_heads=1, head_dim=16, mlp_dim=128, vocab_size=1024)
_TINY_EXPERT = GemmaConfig(width=32, depth=2, num_heads=4, num_kv_heads=1, head_dim=16, mlp_dim=64, vocab_size=1024)

PRESETS: dict[str, ModelConfig] = {
    "pi05": ModelConfig(name="pi05", model_type=ModelType.PI05, action_horizon=10, max_token_len=200,
                        prompt_mode=PromptMode.DISCRETE_STATE, norm_mode=NormMode.QUANTILE),
    "pi0": ModelConfig(name="pi0", model_type=ModelType.PI0, action_horizon=50, max_token_len=48,
                       norm_mode=NormMode.ZSCORE),
    "pi05_tiny": ModelConfig(name="pi05_tiny", model_type=ModelType.PI05, vision=_TINY_VISION,
                             paligemma=_TINY_GEMMA, expert=_TINY_EXPERT, action_horizon=10, max_token_len=200,
                             prompt_mode=PromptMode.DISCRETE_STATE, norm_mode=NormMode.QUANTILE),
    # pi0-FAST: openpi's Pi0FASTConfig (max_token_len 250) with pi0_fast_droid's horizon; its three views
    "pi0fast": ModelConfig(name="pi0fast", model_type=ModelType.PI0_FAST, action_horizon=10, max_token_len=250,
                           view_names=PI0_FAST_VIEW_NAMES, norm_mode=NormMode.QUANTILE, fast=FastDecoding()),
    "pi0fast_tiny": ModelConfig(name="pi0fast_tiny", model_type=ModelType.PI0_FAST, vision=_TINY_VISION,
                                paligemma=_TINY_GEMMA, expert=_TINY_EXPERT, action_horizon=10, max_token_len=96,
                                view_names=PI0_FAST_VIEW_NAMES, norm_mode=NormMode.QUANTILE,
                                fast=FastDecoding(max_decoding_steps=64)),
    "pi0_tiny": ModelConfig(name="pi0_tiny", model_type=ModelType.PI0, vision=_TINY_VISION,
                            paligemma=_TINY_GEMMA, expert=_TINY_EXPERT, action_horizon=50, max_token_len=48,
                            norm_mode=NormMode.ZSCORE),
}


def get_config(name: str | ModelConfig, **overrides) -> ModelConfig:
    """Preset by name (or a ModelConfig passed through), with optional field overrides; always validated."""
    if isinstance(name, ModelConfig):
        base = name
    elif name in PRESETS:
        base = PRESETS[name]
    else:
        raise ValueError(f"unknown model config {name!r}; presets: {sorted(PRESETS)}")
    return base.replace(**overrides) if overrides else base.validate()
