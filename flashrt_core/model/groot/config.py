"""GR00T N1.6 configuration: frozen dataclasses with the released sizes and a tiny CPU preset.

GR00T N1.6 (NVIDIA Isaac-GR00T, `Gr00tN1d6`) is an Eagle vision-language backbone (a SigLIP2 vision encoder,
pixel-unshuffle + MLP projector, and a Qwen3 LLM truncated after `select_layer` layers whose final RMSNorm output
is the backbone feature) and a flow-matching DiT action head with embodiment-specific state / action encoders and
an action decoder (one weight slice per embodiment id). The released sizes (config.json of the checkpoint and of
the bundled Eagle-Block2A-2B-v2 model):

  vision  SigLIP2 1152 wide, 27 layers, 16 heads, MLP 4304, patch 14, 256 position embeddings (16 x 16)
  LLM     Qwen3-1.7B 2048 wide, 16 heads (8 KV), head_dim 128, MLP 6144, kept layers = select_layer (16)
  DiT     32 layers, 32 heads x 48 = 1536, output 1024, cross-attention to the 2048-wide backbone features
          (even blocks; AlternateVLDiT: every 4th block attends to text tokens, the other even blocks to image
          tokens), odd blocks self-attention, AdaLayerNorm on the diffusion timestep
  images  shortest edge 256, centre crop 0.95, shortest edge 256, sides rounded to multiples of 28
          (the processor's eval transform and Eagle's smart_resize): 224 x 224 -> 252 x 252 -> 81 tokens
  head    state / action dims padded to max_state_dim / max_action_dim, horizon 16, 4 Euler steps,
          timesteps discretized to 1000 buckets, 32 embodiment slots

`from_checkpoint_json` reads the action-head fields of a checkpoint's config.json over a preset; the backbone
sizes come from the preset (released checkpoints do not restate them) and are checked against the tensors.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

MODEL_TYPE = "Gr00tN1d6"          # config.json "model_type" of a GR00T N1.6 checkpoint


def _positive(owner: str, **values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"invalid config field {owner}.{name}={value!r}: must be a positive int")


@dataclass(frozen=True)
class Siglip2Config:
    width: int = 1152
    depth: int = 27
    num_heads: int = 16
    mlp_dim: int = 4304
    patch_size: int = 14
    num_positions: int = 256          # position_embedding rows: a (sqrt x sqrt) grid, resized to each image
    eps: float = 1e-6

    def validate(self) -> None:
        _positive("vision", width=self.width, depth=self.depth, num_heads=self.num_heads, mlp_dim=self.mlp_dim,
                  patch_size=self.patch_size, num_positions=self.num_positions)
        if self.width % self.num_heads:
            raise ValueError(f"vision.width={self.width} must be divisible by num_heads={self.num_heads}")
        if int(self.num_positions ** 0.5) ** 2 != self.num_positions:
            raise ValueError(f"vision.num_positions={self.num_positions} must be a square")


@dataclass(frozen=True)
class Qwen3Config:
    width: int = 2048
    num_layers: int = 16              # kept layers (= GR00T's select_layer; the released LLM has 28)
    num_heads: int = 16
    num_kv_heads: int = 8
    head_dim: int = 128
    mlp_dim: int = 6144
    vocab_size: int = 151680
    rope_theta: float = 1_000_000.0
    eps: float = 1e-6

    def validate(self) -> None:
        _positive("llm", width=self.width, num_layers=self.num_layers, num_heads=self.num_heads,
                  num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, mlp_dim=self.mlp_dim,
                  vocab_size=self.vocab_size)
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"llm.num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")


@dataclass(frozen=True)
class DiTConfig:
    num_layers: int = 32
    num_heads: int = 32
    head_dim: int = 48
    output_dim: int = 1024
    interleave_self_attention: bool = True
    alternate_vl: bool = True          # AlternateVLDiT (N1.6 default) vs plain DiT
    attend_text_every_n_blocks: int = 2
    eps: float = 1e-5

    @property
    def inner_dim(self) -> int:
        return self.num_heads * self.head_dim

    def validate(self) -> None:
        _positive("dit", num_layers=self.num_layers, num_heads=self.num_heads, head_dim=self.head_dim,
                  output_dim=self.output_dim, attend_text_every_n_blocks=self.attend_text_every_n_blocks)
        if self.alternate_vl and not self.interleave_self_attention:
            raise ValueError("dit.alternate_vl needs interleave_self_attention=True (as the reference asserts)")


@dataclass(frozen=True)
class GrootConfig:
    name: str
    vision: Siglip2Config = field(default_factory=Siglip2Config)
    llm: Qwen3Config = field(default_factory=Qwen3Config)
    dit: DiTConfig = field(default_factory=DiTConfig)
    backbone_embedding_dim: int = 2048
    hidden_size: int = 1024
    input_embedding_dim: int = 1536
    max_state_dim: int = 128
    max_action_dim: int = 128
    action_horizon: int = 16
    num_inference_timesteps: int = 4
    num_timestep_buckets: int = 1000
    max_num_embodiments: int = 32
    max_seq_len: int = 1024
    add_pos_embed: bool = True
    use_vlln: bool = True
    image_token_index: int = 151669
    downsample_ratio: float = 0.5
    formalize_language: bool = True
    shortest_image_edge: int = 256     # processor defaults; a checkpoint's processor_config.json overrides them
    crop_fraction: float = 0.95

    model_family = "groot"

    @property
    def image_factor(self) -> int:
        """Image sides are multiples of this (2 x 2 patches per image token)."""
        return 2 * self.vision.patch_size

    def image_tokens(self, height: int, width: int) -> int:
        """Image tokens of a processed image of this size (one per 2 x 2 patches)."""
        return (height // self.image_factor) * (width // self.image_factor)

    def validate(self) -> GrootConfig:
        self.vision.validate()
        self.llm.validate()
        self.dit.validate()
        _positive(self.name, backbone_embedding_dim=self.backbone_embedding_dim, hidden_size=self.hidden_size,
                  input_embedding_dim=self.input_embedding_dim, max_state_dim=self.max_state_dim,
                  max_action_dim=self.max_action_dim, action_horizon=self.action_horizon,
                  num_inference_timesteps=self.num_inference_timesteps,
                  num_timestep_buckets=self.num_timestep_buckets, max_num_embodiments=self.max_num_embodiments,
                  max_seq_len=self.max_seq_len)
        if self.backbone_embedding_dim != self.llm.width:
            raise ValueError(f"backbone_embedding_dim={self.backbone_embedding_dim} must equal llm.width="
                             f"{self.llm.width} (the DiT cross-attends to the LLM's hidden states)")
        if self.dit.inner_dim != self.input_embedding_dim:
            raise ValueError(f"dit heads x head_dim = {self.dit.inner_dim} must equal input_embedding_dim="
                             f"{self.input_embedding_dim}")
        if self.dit.output_dim != self.hidden_size:
            raise ValueError(f"dit.output_dim={self.dit.output_dim} must equal hidden_size={self.hidden_size} "
                             "(the action decoder's input)")
        if self.downsample_ratio != 0.5:
            raise ValueError(f"downsample_ratio={self.downsample_ratio}: only 0.5 (2 x 2 pixel unshuffle) is built")
        if not 0 < self.crop_fraction <= 1 or self.shortest_image_edge < self.image_factor:
            raise ValueError(f"crop_fraction={self.crop_fraction} must be in (0, 1] and shortest_image_edge="
                             f"{self.shortest_image_edge} at least {self.image_factor}")
        if self.action_horizon + 1 > self.max_seq_len:
            raise ValueError(f"action_horizon={self.action_horizon} exceeds max_seq_len={self.max_seq_len}")
        return self

    def replace(self, **changes) -> GrootConfig:
        return dataclasses.replace(self, **changes).validate()


# The action-head fields a checkpoint's config.json carries, by their names there.
CHECKPOINT_FIELDS = ("backbone_embedding_dim", "hidden_size", "input_embedding_dim", "max_state_dim",
                     "max_action_dim", "action_horizon", "num_inference_timesteps", "num_timestep_buckets",
                     "max_num_embodiments", "max_seq_len", "add_pos_embed", "use_vlln", "formalize_language")

_TINY_VISION = Siglip2Config(width=32, depth=2, num_heads=2, mlp_dim=64, patch_size=14, num_positions=16)
_TINY_LLM = Qwen3Config(width=48, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=12, mlp_dim=96,
                        vocab_size=512)
_TINY_DIT = DiTConfig(num_layers=4, num_heads=4, head_dim=8, output_dim=40)

PRESETS: dict[str, GrootConfig] = {
    "groot_n1.6": GrootConfig(name="groot_n1.6"),
    "groot_n1.6_tiny": GrootConfig(name="groot_n1.6_tiny", vision=_TINY_VISION, llm=_TINY_LLM, dit=_TINY_DIT,
                                   backbone_embedding_dim=48, hidden_size=40, input_embedding_dim=32,
                                   max_state_dim=16, max_action_dim=16, max_num_embodiments=32, max_seq_len=64,
                                   image_token_index=500, shortest_image_edge=56),
}


def is_groot_config(config) -> bool:
    return isinstance(config, GrootConfig) or (isinstance(config, str) and config in PRESETS)


def get_groot_config(name: str | GrootConfig, **overrides) -> GrootConfig:
    base = name if isinstance(name, GrootConfig) else PRESETS.get(name)
    if base is None:
        raise ValueError(f"unknown GR00T config {name!r}; presets: {sorted(PRESETS)}")
    return base.replace(**overrides) if overrides else base.validate()


def from_checkpoint_json(base: GrootConfig, raw: dict) -> GrootConfig:
    """`base` with the action-head fields of a checkpoint's config.json (model_type Gr00tN1d6) applied."""
    if raw.get("model_type") not in (None, MODEL_TYPE):
        raise ValueError(f"config.json model_type={raw.get('model_type')!r} is not {MODEL_TYPE!r}")
    changes = {k: raw[k] for k in CHECKPOINT_FIELDS if k in raw}
    dit = raw.get("diffusion_model_cfg") or {}
    dit_changes = {}
    for src, dst in (("num_layers", "num_layers"), ("num_attention_heads", "num_heads"),
                     ("attention_head_dim", "head_dim"), ("output_dim", "output_dim"),
                     ("interleave_self_attention", "interleave_self_attention")):
        if src in dit:
            dit_changes[dst] = dit[src]
    if "use_alternate_vl_dit" in raw:
        dit_changes["alternate_vl"] = bool(raw["use_alternate_vl_dit"])
    if "attend_text_every_n_blocks" in raw:
        dit_changes["attend_text_every_n_blocks"] = raw["attend_text_every_n_blocks"]
    if dit_changes:
        changes["dit"] = dataclasses.replace(base.dit, **dit_changes)
    if "select_layer" in raw:
        changes["llm"] = dataclasses.replace(changes.get("llm", base.llm), num_layers=int(raw["select_layer"]))
    return base.replace(**changes)


def to_checkpoint_json(cfg: GrootConfig) -> dict:
    """The config.json a GR00T N1.6 checkpoint of these sizes carries (the fields this package reads)."""
    out = {"model_type": MODEL_TYPE, "architectures": ["Gr00tN1d6"], "model_name": "nvidia/Eagle-Block2A-2B-v2",
           "select_layer": cfg.llm.num_layers, "use_alternate_vl_dit": cfg.dit.alternate_vl,
           "attend_text_every_n_blocks": cfg.dit.attend_text_every_n_blocks,
           "diffusion_model_cfg": {"positional_embeddings": None, "num_layers": cfg.dit.num_layers,
                                   "num_attention_heads": cfg.dit.num_heads,
                                   "attention_head_dim": cfg.dit.head_dim, "norm_type": "ada_norm",
                                   "dropout": 0.2, "final_dropout": True, "output_dim": cfg.dit.output_dim,
                                   "interleave_self_attention": cfg.dit.interleave_self_attention}}
    out.update({k: getattr(cfg, k) for k in CHECKPOINT_FIELDS})
    return out
