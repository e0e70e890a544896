"""Checkpoint layout and loading: ONE explicit table maps checkpoint tensor names to model parameters.

The layout is the openpi PyTorch conversion / lerobot one (REFERENCE.md section 1):
  paligemma_with_expert.paligemma.model.vision_tower.vision_model.*    SigLIP
  paligemma_with_expert.paligemma.model.multi_modal_projector.linear.*  projector
  paligemma_with_expert.paligemma.model.language_model.*                Gemma 2B backbone
  paligemma_with_expert.gemma_expert.model.*                            Gemma 300M action expert
  action_in_proj, action_out_proj, + state_proj, action_time_mlp_{in,out} (pi0) | time_mlp_{in,out} (pi0.5)
Names may carry a leading "model." (lerobot policy checkpoints) and may use the PaliGemma nesting of
transformers < 4.52 (`paligemma.language_model.model.*`, `paligemma.vision_tower.*`: LEGACY_PREFIXES).
`language_model.embed_tokens.weight` may be
absent, then the tied `paligemma.lm_head.weight` is used. `gemma_expert.lm_head.weight` is known and unused.
pi0-FAST (PI0_FAST_WEIGHT_TABLE) has the PaliGemma rows alone: lerobot's pi0_fast policies save exactly these
names (with "model."); openpi's converter does not convert pi0-FAST, and the same names without "model." are
accepted as for pi0 / pi0.5.
Anything else missing, unexpected or mis-shaped is a CheckpointError listing the names: never a warning.

Loading is memory-mapped (safetensors safe_open, no pickle) straight into a model built on the meta device,
so the weights exist once in memory (plus one tensor in flight while it is converted).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from flashrt_core.config import PRESETS, ModelConfig, ModelType
from flashrt_core.errors import CheckpointError
from flashrt_core.model import Pi0FastModel, PiModel
from flashrt_core.stopping import raise_if_stopped

log = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"
OPTIONAL_PREFIX = "model."
PALIGEMMA = "paligemma_with_expert.paligemma."
VISION = PALIGEMMA + "model.vision_tower.vision_model."
LANGUAGE = PALIGEMMA + "model.language_model."
EXPERT = "paligemma_with_expert.gemma_expert.model."
EMBED_TOKENS = LANGUAGE + "embed_tokens.weight"
TIED_LM_HEAD = PALIGEMMA + "lm_head.weight"
KNOWN_UNUSED = ("paligemma_with_expert.gemma_expert.lm_head.weight",)
# transformers < 4.52 nested PaliGemma differently (older lerobot pi0 checkpoints): old prefix -> current prefix.
LEGACY_PREFIXES = (
    (PALIGEMMA + "language_model.model.", LANGUAGE),
    (PALIGEMMA + "language_model.lm_head.", PALIGEMMA + "lm_head."),
    (PALIGEMMA + "vision_tower.", PALIGEMMA + "model.vision_tower."),
    (PALIGEMMA + "multi_modal_projector.", PALIGEMMA + "model.multi_modal_projector."),
)

SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}

Shape = Callable[[ModelConfig], tuple[int, ...]]


@dataclass(frozen=True)
class WeightRow:
    """One checkpoint tensor. "{i}" in both names is the layer index over `layers_of` (None: not per layer)."""

    checkpoint: str
    param: str
    shape: Shape
    layers_of: str | None = None  # "vision" | "paligemma" | "expert"
    only: ModelType | None = None  # row exists for this model type only
    keep_fp32: bool = False  # openpi keeps these in fp32 when the rest runs in bf16


def _linear(ckpt: str, param: str, out_dim: Shape, in_dim: Shape, bias: bool = True, **kw) -> list[WeightRow]:
    rows = [WeightRow(ckpt + ".weight", param + ".weight", lambda c: (out_dim(c)[0], in_dim(c)[0]), **kw)]
    if bias:
        rows.append(WeightRow(ckpt + ".bias", param + ".bias", out_dim, **kw))
    return rows


def _layer_norm(ckpt: str, param: str, width: Shape, **kw) -> list[WeightRow]:
    return [WeightRow(ckpt + ".weight", param + ".weight", width, **kw),
            WeightRow(ckpt + ".bias", param + ".bias", width, **kw)]


def _dim(fn: Callable[[ModelConfig], int]) -> Shape:
    return lambda c: (fn(c),)


VW = _dim(lambda c: c.vision.width)
VMLP = _dim(lambda c: c.vision.mlp_dim)
PW = _dim(lambda c: c.paligemma.width)
EW = _dim(lambda c: c.expert.width)
ACT = _dim(lambda c: c.max_action_dim)


def _gemma_rows(ckpt: str, param: str, layers_of: str, width: Shape,
                adaptive_only: ModelType | None) -> list[WeightRow]:
    """Rows of one Gemma stack. Norms: plain `weight`, or pi0.5 expert adaRMS `dense.{weight,bias}`."""
    cfg_of = (lambda c: c.paligemma) if layers_of == "paligemma" else (lambda c: c.expert)
    q_dim = _dim(lambda c: cfg_of(c).num_heads * cfg_of(c).head_dim)
    kv_dim = _dim(lambda c: cfg_of(c).num_kv_heads * cfg_of(c).head_dim)
    mlp = _dim(lambda c: cfg_of(c).mlp_dim)
    per_layer = dict(layers_of=layers_of)
    rows = []
    for name, out_dim, in_dim in (("self_attn.q_proj", q_dim, width), ("self_attn.k_proj", kv_dim, width),
                                  ("self_attn.v_proj", kv_dim, width), ("self_attn.o_proj", width, q_dim),
                                  ("mlp.gate_proj", mlp, width), ("mlp.up_proj", mlp, width),
                                  ("mlp.down_proj", width, mlp)):
        param_name = name.split(".")[1]
        rows += _linear(f"{ckpt}layers.{{i}}.{name}", f"{param}.layers.{{i}}.{param_name}", out_dim, in_dim,
                        bias=False, **per_layer)
    plain_only = None if adaptive_only is None else ModelType.PI0
    three_w = _dim(lambda c: 3 * cfg_of(c).width)
    for ckpt_norm, param_norm, layers in (
            (f"{ckpt}layers.{{i}}.input_layernorm", f"{param}.layers.{{i}}.input_layernorm", layers_of),
            (f"{ckpt}layers.{{i}}.post_attention_layernorm", f"{param}.layers.{{i}}.post_attention_layernorm",
             layers_of),
            (f"{ckpt}norm", f"{param}.norm", None)):
        rows.append(WeightRow(ckpt_norm + ".weight", param_norm + ".weight", width, layers, plain_only, True))
        if adaptive_only is not None:
            rows += _linear(ckpt_norm + ".dense", param_norm + ".dense", three_w, width, layers_of=layers,
                            only=adaptive_only, keep_fp32=True)
    return rows


WEIGHT_TABLE: tuple[WeightRow, ...] = tuple(
    [
        WeightRow(VISION + "embeddings.patch_embedding.weight", "vision.patch_embedding.weight",
                  lambda c: (c.vision.width, 3, c.vision.patch_size, c.vision.patch_size), keep_fp32=True),
        WeightRow(VISION + "embeddings.patch_embedding.bias", "vision.patch_embedding.bias", VW, keep_fp32=True),
        WeightRow(VISION + "embeddings.position_embedding.weight", "vision.position_embedding",
                  lambda c: (c.vision.num_patches, c.vision.width), keep_fp32=True),
    ]
    + _layer_norm(VISION + "encoder.layers.{i}.layer_norm1", "vision.layers.{i}.layer_norm1", VW, layers_of="vision")
    + [row for proj in ("q_proj", "k_proj", "v_proj", "out_proj")
       for row in _linear(f"{VISION}encoder.layers.{{i}}.self_attn.{proj}", f"vision.layers.{{i}}.self_attn.{proj}",
                          VW, VW, layers_of="vision")]
    + _layer_norm(VISION + "encoder.layers.{i}.layer_norm2", "vision.layers.{i}.layer_norm2", VW, layers_of="vision")
    + _linear(VISION + "encoder.layers.{i}.mlp.fc1", "vision.layers.{i}.mlp.fc1", VMLP, VW, layers_of="vision")
    + _linear(VISION + "encoder.layers.{i}.mlp.fc2", "vision.layers.{i}.mlp.fc2", VW, VMLP, layers_of="vision")
    + _layer_norm(VISION + "post_layernorm", "vision.post_layernorm", VW)
    + _linear(PALIGEMMA + "model.multi_modal_projector.linear", "vision.projector", PW, VW)
    + [WeightRow(EMBED_TOKENS, "embed_tokens.weight", lambda c: (c.paligemma.vocab_size, c.paligemma.width))]
    + _gemma_rows(LANGUAGE, "paligemma", "paligemma", PW, adaptive_only=None)
    + _gemma_rows(EXPERT, "expert", "expert", EW, adaptive_only=ModelType.PI05)
    + _linear("action_in_proj", "action_in_proj", EW, ACT)
    + _linear("action_out_proj", "action_out_proj", ACT, EW)
    + _linear("state_proj", "state_proj", EW, ACT, only=ModelType.PI0)
    + _linear("action_time_mlp_in", "action_time_mlp_in", EW, _dim(lambda c: 2 * c.expert.width), only=ModelType.PI0)
    + _linear("action_time_mlp_out", "action_time_mlp_out", EW, EW, only=ModelType.PI0)
    + _linear("time_mlp_in", "time_mlp_in", EW, EW, only=ModelType.PI05)
    + _linear("time_mlp_out", "time_mlp_out", EW, EW, only=ModelType.PI05)
)


# pi0-FAST is PaliGemma alone: the same names below paligemma_with_expert.paligemma. (lerobot's pi0_fast policy
# checkpoints, with "model."; the same names without it), no action expert and no action projections.
PI0_FAST_WEIGHT_TABLE: tuple[WeightRow, ...] = tuple(row for row in WEIGHT_TABLE
                                                      if row.checkpoint.startswith(PALIGEMMA))


def weight_table(config: ModelConfig) -> tuple[WeightRow, ...]:
    """The rows of the config's model type: WEIGHT_TABLE, or PI0_FAST_WEIGHT_TABLE for pi0fast."""
    return PI0_FAST_WEIGHT_TABLE if config.model_type == ModelType.PI0_FAST else WEIGHT_TABLE


@dataclass(frozen=True)
class WeightEntry:
    param: str
    shape: tuple[int, ...]
    keep_fp32: bool


def weight_entries(config: ModelConfig) -> dict[str, WeightEntry]:
    """Checkpoint name (without "model.") -> parameter name, shape, fp32 flag, expanded over layers."""
    depth = {"vision": config.vision.depth, "paligemma": config.paligemma.depth, "expert": config.expert.depth}
    entries = {}
    for row in weight_table(config):
        if row.only is not None and row.only != config.model_type:
            continue
        shape = tuple(row.shape(config))
        for i in range(depth[row.layers_of]) if row.layers_of else [None]:
            ckpt = row.checkpoint.format(i=i) if i is not None else row.checkpoint
            param = row.param.format(i=i) if i is not None else row.param
            entries[ckpt] = WeightEntry(param, shape, row.keep_fp32)
    return entries


def weight_spec(config: ModelConfig,
                dtype: torch.dtype = torch.bfloat16) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Checkpoint name -> (shape, dtype the tensor is held in when the model runs in `dtype`)."""
    return {name: (e.shape, torch.float32 if e.keep_fp32 else dtype) for name, e in weight_entries(config).items()}


def _names_listing(names: list[str], limit: int = 20) -> str:
    shown = ", ".join(sorted(names)[:limit])
    return shown + (f" ... (+{len(names) - limit} more)" if len(names) > limit else "")


def canonical_name(key: str, known: set[str]) -> str:
    """The spec name a file key stands for ("model." dropped, legacy PaliGemma layout renamed), if it is known."""
    bare = key[len(OPTIONAL_PREFIX):] if key.startswith(OPTIONAL_PREFIX) else key
    for old, new in LEGACY_PREFIXES:
        if bare.startswith(old):
            bare = new + bare[len(old):]
            break
    return bare if bare in known else key


def _resolve_names(file_keys: set[str], entries: dict[str, WeightEntry]) -> tuple[dict[str, str], list[str]]:
    """Map each spec name to the name in the file; report spec names that two file keys claim."""
    known = set(entries) | {TIED_LM_HEAD, *KNOWN_UNUSED}
    resolved: dict[str, str] = {}
    duplicates = []
    for key in sorted(file_keys):
        name = canonical_name(key, known)
        if name in resolved:
            duplicates.append(f"{resolved[name]} / {key}")
        resolved[name] = key
    return resolved, duplicates


class SafetensorsTensors:
    """The tensors of one model.safetensors, memory-mapped (safe_open, no pickle): names, shapes, tensors."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self._handle = safe_open(str(path), framework="pt", device="cpu")
        except Exception as exc:  # safetensors raises its own error types for corrupt headers
            raise CheckpointError(f"cannot read {path}: {exc}") from exc

    def keys(self) -> list[str]:
        return list(self._handle.keys())

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._handle.get_slice(key).get_shape())

    def dtype(self, key: str) -> torch.dtype:
        return SAFETENSORS_DTYPES[self._handle.get_slice(key).get_dtype()]

    def get(self, key: str) -> torch.Tensor:
        return self._handle.get_tensor(key)  # may be an unaligned view of the file mapping

    def close(self) -> None:
        self._handle = None

    def __enter__(self) -> SafetensorsTensors:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_tensors(checkpoint_dir: str | Path):
    """The checkpoint's tensors: model.safetensors (SafetensorsTensors), else openpi's Orbax params/
    (flashrt_core.orbax_params.OrbaxTensors, whose names are already WEIGHT_TABLE's). Raises CheckpointError
    naming what is missing."""
    directory = Path(checkpoint_dir)
    path = directory / WEIGHTS_FILE
    if path.is_file():
        return SafetensorsTensors(path)
    from flashrt_core import orbax_params  # tensorstore only for the layout that needs it
    if orbax_params.is_orbax_checkpoint(directory):
        return orbax_params.OrbaxTensors(directory)
    raise CheckpointError(f"checkpoint file missing: {path} (and no openpi Orbax {orbax_params.PARAMS_DIR}/ "
                          f"beside it)")


def model_type_of(checkpoint_dir: str | Path) -> ModelType:
    """pi0, pi0.5 or pi0-FAST, from the weight names: pi0.5 has time_mlp_in, pi0 has state_proj; PaliGemma's
    backbone without any action projection (action_in_proj) is pi0-FAST."""
    with open_tensors(checkpoint_dir) as tensors:
        names = {key[len(OPTIONAL_PREFIX):] if key.startswith(OPTIONAL_PREFIX) else key for key in tensors.keys()}
        where = tensors.path
    found = [t for t, marker in ((ModelType.PI05, "time_mlp_in.weight"), (ModelType.PI0, "state_proj.weight"))
             if marker in names]
    if not found and "action_in_proj.weight" not in names and LANGUAGE + "norm.weight" in names:
        return ModelType.PI0_FAST
    if len(found) != 1:
        raise CheckpointError(f"cannot tell pi0 from pi0.5 by the weights of {where}: it has "
                              f"{'both' if found else 'neither'} time_mlp_in.weight (pi0.5) and state_proj.weight "
                              "(pi0); pass config='pi05' or 'pi0'")
    return found[0]


def match_tensors(f, config: ModelConfig) -> dict[str, str]:
    """Checkpoint name of WEIGHT_TABLE -> the tensor's name in `f` (open_tensors), for every entry of `config`.
    Raises CheckpointError listing every missing, unexpected, mis-shaped or doubled tensor."""
    entries = weight_entries(config)
    path = f.path
    file_names, duplicates = _resolve_names(set(f.keys()), entries)
    if EMBED_TOKENS not in file_names and TIED_LM_HEAD in file_names:
        log.info("%s has no %s; using the tied %s", path, EMBED_TOKENS, TIED_LM_HEAD)
        file_names[EMBED_TOKENS] = file_names[TIED_LM_HEAD]
    missing = [name for name in entries if name not in file_names]
    unexpected = [name for name in file_names if name not in entries and name not in KNOWN_UNUSED
                  and name != TIED_LM_HEAD]
    misshaped = []
    for name, entry in entries.items():
        if name in file_names:
            found = f.shape(file_names[name])
            if found != entry.shape:
                misshaped.append(f"{file_names[name]} {found} (expected {entry.shape})")
    problems = []
    for label, names in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped),
                         ("given twice (with and without 'model.' or in two layouts)", duplicates)):
        if names:
            problems.append(f"{len(names)} {label}: {_names_listing(names)}")
    if problems:
        raise CheckpointError(f"{path} does not match config {config.name!r}: " + "; ".join(problems))
    return {name: file_names[name] for name in entries}


def check_weights(checkpoint_dir: str | Path, config: ModelConfig) -> dict[str, str]:
    """match_tensors on the checkpoint's tensors, without reading them: name -> name in the file."""
    with open_tensors(checkpoint_dir) as f:
        return match_tensors(f, config)


def preset_from_weights(checkpoint_dir: str | Path) -> str | None:
    """The preset whose every tensor name and shape the checkpoint's weights match (model type from the names),
    or None when there are no weights or none fits: for folders that record no config (openpi's Orbax
    checkpoints, a bare model.safetensors)."""
    try:
        model_type = model_type_of(checkpoint_dir)
    except CheckpointError:
        return None
    with open_tensors(checkpoint_dir) as f:
        for name, preset in PRESETS.items():
            if preset.model_type == model_type:
                try:
                    match_tensors(f, preset)
                    return name
                except CheckpointError:
                    continue
    return None


def load_model_weights(checkpoint_dir: str | Path, config: ModelConfig, device: torch.device | str = "cpu",
                       dtype: torch.dtype = torch.float32) -> PiModel | Pi0FastModel:
    """Build PiModel(config) (Pi0FastModel for pi0fast) on the meta device and fill it from the checkpoint's
    tensors (open_tensors).

    Every tensor is cast to `dtype`, except the rows marked keep_fp32 when `dtype` is a 16-bit type.
    Raises CheckpointError naming the file or every missing / unexpected / mis-shaped tensor.
    """
    entries = weight_entries(config)
    device = torch.device(device)
    with open_tensors(checkpoint_dir) as f:
        file_names = match_tensors(f, config)
        with torch.device("meta"):
            model = Pi0FastModel(config) if config.model_type == ModelType.PI0_FAST else PiModel(config)
        keep_fp32_ok = dtype in (torch.bfloat16, torch.float16)
        state = {}
        for i, (name, entry) in enumerate(entries.items()):
            raise_if_stopped(f"reading tensor {i + 1} of {len(entries)} of {checkpoint_dir}")
            target = torch.float32 if (entry.keep_fp32 and keep_fp32_ok) else dtype
            source = f.get(file_names[name])
            # Fresh (aligned) memory: numerics must not depend on where a tensor sat in the file.
            state[entry.param] = torch.empty(entry.shape, dtype=target, device=device).copy_(source)
            del source
    model.load_state_dict(state, strict=True, assign=True)
    model.requires_grad_(False)
    return model.eval()
