"""GR00T N1.6 checkpoint layout: an explicit name table, sharded safetensors reading, strict checks.

A released GR00T N1.6 checkpoint folder (Gr00tN1d6.save_pretrained + its processor) holds
  config.json                       model_type "Gr00tN1d6" and the action-head sizes (groot.config)
  model-0000k-of-0000n.safetensors  the weights, sharded, with
  model.safetensors.index.json      {"metadata": {...}, "weight_map": {tensor name: shard file}}
                                    (a small checkpoint may be one model.safetensors instead)
  processor_config.json, statistics.json, embodiment_id.json      (groot_statistics)
Tensor names (weight_table lists every one with its shape):
  backbone.model.vision_model.vision_model.*     SigLIP2 vision encoder
  backbone.model.mlp1.{0,1,3}.*                  projector
  backbone.model.language_model.model.*          Qwen3, layers 0 .. select_layer-1
  action_head.{model,state_encoder,action_encoder,action_decoder,vlln,position_embedding}.*
Known and unused (accepted, not loaded): the SigLIP2 pooling head, the tied lm_head, LLM layers at or past
select_layer, the training-time state mask_token. Anything else missing, unexpected or mis-shaped is a
CheckpointError listing the names. Reading is memory-mapped through safetensors' safe_open (no pickle).
Also here, because they read only files (no transformers, no Pillow): whether a folder is a GR00T checkpoint
(is_groot_checkpoint), the GrootConfig its config.json gives (resolve_groot_config), and where Eagle's tokenizer
is (find_tokenizer).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from pathlib import Path

import torch
from safetensors import safe_open

from flashrt_core.errors import CheckpointError
from flashrt_core.engine.options import read_path
from flashrt_core.model.groot.config import MODEL_TYPE, GrootConfig, from_checkpoint_json, get_groot_config
from flashrt_core.stopping import raise_if_stopped

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
DEFAULT_CONFIG = "groot_n1.6"
PRESET_KEY = "flashrt_preset"         # config.json key naming the preset (fixtures write it)
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_ENV = "FLASHRT_GROOT_TOKENIZER"
SUPPLY_TOKENIZER = ("GR00T N1.6 checkpoints do not ship Eagle's Qwen3 tokenizer: it is in the Isaac-GR00T source, "
                    "gr00t/model/modules/nvidia/Eagle-Block2A-2B-v2; pass tokenizer=THAT_FOLDER, set "
                    f"{TOKENIZER_ENV}, or copy the folder's tokenizer files into the checkpoint folder")
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
VISION = "backbone.model.vision_model.vision_model."
PROJECTOR = "backbone.model.mlp1."
LLM = "backbone.model.language_model.model."
HEAD = "action_head."
KNOWN_UNUSED = (re.compile(re.escape(VISION) + r"head\..+"),
                re.compile(re.escape("backbone.model.language_model.lm_head.weight")),
                re.compile(re.escape(HEAD) + r"mask_token"))
_LLM_LAYER = re.compile(re.escape(LLM) + r"layers\.(\d+)\..+")


def is_groot_checkpoint(checkpoint_dir: Path) -> bool:
    """Whether the folder's config.json names GR00T N1.6 (model_type Gr00tN1d6). It reads that one file and needs
    none of GR00T's optional dependencies, so load_model tells the model families apart without them."""
    path = checkpoint_dir / CONFIG_FILE
    if not path.is_file():
        return False
    try:
        return json.loads(path.read_text()).get("model_type") == MODEL_TYPE
    except (json.JSONDecodeError, AttributeError):
        return False


def resolve_groot_config(config, checkpoint_dir: Path) -> GrootConfig:
    """The preset (by name or object; else config.json's "flashrt_preset", which fixtures write; else
    groot_n1.6) with the checkpoint's config.json applied."""
    path = checkpoint_dir / CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: a GR00T N1.6 checkpoint has config.json (model_type "
                              f"{MODEL_TYPE!r})")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("model_type") != MODEL_TYPE:
        found = raw.get("model_type", raw.get("type")) if isinstance(raw, dict) else type(raw).__name__
        raise CheckpointError(f"{path} names model_type {found!r}, not GR00T N1.6's {MODEL_TYPE!r}: this is no "
                              "GR00T checkpoint (a pi0 / pi0.5 folder loads with config=None or its own preset)")
    base = get_groot_config(config if config is not None else raw.get(PRESET_KEY, DEFAULT_CONFIG))
    try:
        return from_checkpoint_json(base, raw)
    except ValueError as exc:
        raise CheckpointError(f"{path}: {exc}") from exc


def find_tokenizer(checkpoint_dir: Path, tokenizer: str | Path | None) -> Path:
    candidates = [Path(tokenizer)] if tokenizer is not None else []
    candidates += [checkpoint_dir / TOKENIZER_FILE]
    if (checkpoint_dir / "tokenizer_config.json").is_file():
        candidates.append(checkpoint_dir)
    if read_path(TOKENIZER_ENV):
        candidates.append(Path(read_path(TOKENIZER_ENV)))
    for path in candidates:
        if path.exists():
            return path
    raise CheckpointError("GR00T tokenizer not found; tried " + ", ".join(map(str, candidates))
                          + f". {SUPPLY_TOKENIZER}")


def _linear(table: dict, name: str, out_dim: int, in_dim: int, bias: bool = True) -> None:
    table[name + ".weight"] = (out_dim, in_dim)
    if bias:
        table[name + ".bias"] = (out_dim,)


def _norm(table: dict, name: str, dim: int, bias: bool = True) -> None:
    table[name + ".weight"] = (dim,)
    if bias:
        table[name + ".bias"] = (dim,)


def weight_table(cfg: GrootConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the model loads: checkpoint name -> shape."""
    t: dict[str, tuple[int, ...]] = {}
    v, q, d = cfg.vision, cfg.llm, cfg.dit
    w = v.width
    _linear(t, VISION + "embeddings.patch_embedding", w, 3 * v.patch_size * v.patch_size)
    t[VISION + "embeddings.position_embedding.weight"] = (v.num_positions, w)
    for i in range(v.depth):
        p = f"{VISION}encoder.layers.{i}."
        _norm(t, p + "layer_norm1", w)
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            _linear(t, p + "self_attn." + proj, w, w)
        _norm(t, p + "layer_norm2", w)
        _linear(t, p + "mlp.fc1", v.mlp_dim, w)
        _linear(t, p + "mlp.fc2", w, v.mlp_dim)
    _norm(t, VISION + "post_layernorm", w)
    _norm(t, PROJECTOR + "0", 4 * w)
    _linear(t, PROJECTOR + "1", q.width, 4 * w)
    _linear(t, PROJECTOR + "3", q.width, q.width)
    t[LLM + "embed_tokens.weight"] = (q.vocab_size, q.width)
    for i in range(q.num_layers):
        p = f"{LLM}layers.{i}."
        _linear(t, p + "self_attn.q_proj", q.num_heads * q.head_dim, q.width, bias=False)
        _linear(t, p + "self_attn.k_proj", q.num_kv_heads * q.head_dim, q.width, bias=False)
        _linear(t, p + "self_attn.v_proj", q.num_kv_heads * q.head_dim, q.width, bias=False)
        _linear(t, p + "self_attn.o_proj", q.width, q.num_heads * q.head_dim, bias=False)
        _norm(t, p + "self_attn.q_norm", q.head_dim, bias=False)
        _norm(t, p + "self_attn.k_norm", q.head_dim, bias=False)
        _linear(t, p + "mlp.gate_proj", q.mlp_dim, q.width, bias=False)
        _linear(t, p + "mlp.up_proj", q.mlp_dim, q.width, bias=False)
        _linear(t, p + "mlp.down_proj", q.width, q.mlp_dim, bias=False)
        _norm(t, p + "input_layernorm", q.width, bias=False)
        _norm(t, p + "post_attention_layernorm", q.width, bias=False)
    _norm(t, LLM + "norm", q.width, bias=False)

    inner, dit = d.inner_dim, HEAD + "model."
    _linear(t, dit + "timestep_encoder.timestep_embedder.linear_1", inner, 256)
    _linear(t, dit + "timestep_encoder.timestep_embedder.linear_2", inner, inner)
    for i in range(d.num_layers):
        p = f"{dit}transformer_blocks.{i}."
        kv = inner if (d.interleave_self_attention and i % 2 == 1) else cfg.backbone_embedding_dim
        _linear(t, p + "norm1.linear", 2 * inner, inner)
        _linear(t, p + "attn1.to_q", inner, inner)
        _linear(t, p + "attn1.to_k", inner, kv)
        _linear(t, p + "attn1.to_v", inner, kv)
        _linear(t, p + "attn1.to_out.0", inner, inner)
        _linear(t, p + "ff.net.0.proj", 4 * inner, inner)
        _linear(t, p + "ff.net.2", inner, 4 * inner)
    _linear(t, dit + "proj_out_1", 2 * inner, inner)
    _linear(t, dit + "proj_out_2", d.output_dim, inner)

    e, h, emb = cfg.max_num_embodiments, cfg.hidden_size, cfg.input_embedding_dim

    def cat_linear(name: str, in_dim: int, out_dim: int) -> None:
        t[name + ".W"] = (e, in_dim, out_dim)
        t[name + ".b"] = (e, out_dim)

    cat_linear(HEAD + "state_encoder.layer1", cfg.max_state_dim, h)
    cat_linear(HEAD + "state_encoder.layer2", h, emb)
    cat_linear(HEAD + "action_encoder.W1", cfg.max_action_dim, emb)
    cat_linear(HEAD + "action_encoder.W2", 2 * emb, emb)
    cat_linear(HEAD + "action_encoder.W3", emb, emb)
    cat_linear(HEAD + "action_decoder.layer1", h, h)
    cat_linear(HEAD + "action_decoder.layer2", h, cfg.max_action_dim)
    if cfg.use_vlln:
        _norm(t, HEAD + "vlln", cfg.backbone_embedding_dim)
    if cfg.add_pos_embed:
        t[HEAD + "position_embedding.weight"] = (cfg.max_seq_len, emb)
    return t


def is_known_unused(name: str, cfg: GrootConfig) -> bool:
    if any(p.fullmatch(name) for p in KNOWN_UNUSED):
        return True
    layer = _LLM_LAYER.fullmatch(name)
    return layer is not None and int(layer.group(1)) >= cfg.llm.num_layers


def shard_map(checkpoint_dir: Path) -> dict[str, Path]:
    """tensor name -> safetensors file: from model.safetensors.index.json, else the single model.safetensors."""
    index = checkpoint_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{index} is not a safetensors index (needs a 'weight_map' object): {exc}") from exc
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise CheckpointError(f"{index}: 'weight_map' must map tensor names to shard file names")
        files = {f: checkpoint_dir / f for f in set(weight_map.values())}
        missing = sorted(f for f, p in files.items() if not p.is_file())
        if missing:
            raise CheckpointError(f"{index} names shard files that are not in {checkpoint_dir}: {missing}")
        return {name: files[f] for name, f in weight_map.items()}
    single = checkpoint_dir / SINGLE_FILE
    if single.is_file():
        with _opened(single) as f:
            return {name: single for name in f.keys()}
    raise CheckpointError(f"{checkpoint_dir} has no GR00T weights: expected {INDEX_FILE} with its "
                          f"model-*-of-*.safetensors shards, or {SINGLE_FILE}")


@contextlib.contextmanager
def _opened(path: Path):
    """safe_open(path) with a corrupt or unreadable file as a CheckpointError naming it (safetensors raises its
    own error types for a bad header)."""
    try:
        handle = safe_open(path, framework="pt")
    except Exception as exc:
        raise CheckpointError(f"cannot read {path}: {exc}") from exc
    with handle as f:
        yield f


def _short(names: list[str], n: int = 8) -> str:
    return ", ".join(names[:n]) + (f" ... ({len(names)} in all)" if len(names) > n else "")


def check_names(found: dict[str, tuple[int, ...]], cfg: GrootConfig, where: str) -> list[str]:
    """Strict comparison of a checkpoint's {name: shape} with weight_table(cfg). Returns the ignored names."""
    table = weight_table(cfg)
    missing = sorted(set(table) - set(found))
    ignored = sorted(n for n in found if n not in table and is_known_unused(n, cfg))
    unexpected = sorted(n for n in found if n not in table and n not in ignored)
    bad = sorted(f"{n}: checkpoint {tuple(found[n])}, {cfg.name} expects {table[n]}"
                 for n in table if n in found and tuple(found[n]) != table[n])
    problems = []
    if missing:
        problems.append(f"missing tensors: {_short(missing)}")
    if unexpected:
        problems.append(f"unexpected tensors: {_short(unexpected)}")
    if bad:
        problems.append(f"shape mismatches: {_short(bad, 4)}")
    if problems:
        raise CheckpointError(f"{where} does not match the GR00T layout of config {cfg.name!r}: "
                              + "; ".join(problems))
    return ignored


def read_shapes(checkpoint_dir: Path) -> tuple[dict[str, Path], dict[str, tuple[int, ...]], set[str]]:
    """From the shards' headers: tensor name -> file, tensor name -> shape, and the dtypes they hold (safetensors'
    names: "BF16", "F32", ...), each shard checked against the index."""
    files = shard_map(checkpoint_dir)
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: set[str] = set()
    for path in sorted(set(files.values())):
        with _opened(path) as f:
            held = set(f.keys())
            for name in held:
                tensor = f.get_slice(name)
                shapes[name] = tuple(tensor.get_shape())
                dtypes.add(tensor.get_dtype())
        listed = {n for n, p in files.items() if p == path}
        absent = sorted(listed - held)
        if absent:
            raise CheckpointError(f"{checkpoint_dir / INDEX_FILE} maps tensors to {path.name} that it does not "
                                  f"hold: {_short(absent)}")
        extra = sorted(held - listed)
        if extra:
            raise CheckpointError(f"{path} holds tensors that {INDEX_FILE} does not list: {_short(extra)}")
    return files, shapes, dtypes


def load_state_dict(checkpoint_dir: str | Path, cfg: GrootConfig, dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """The checked tensors of weight_table(cfg), cast to `dtype` on `device` (known-unused ones left out)."""
    checkpoint_dir = Path(checkpoint_dir)
    files, shapes, _ = read_shapes(checkpoint_dir)
    ignored = check_names(shapes, cfg, str(checkpoint_dir))
    if ignored:
        log.info("%s: %d known, unused tensors not loaded (%s)", checkpoint_dir, len(ignored), _short(ignored, 3))
    table = weight_table(cfg)
    out: dict[str, torch.Tensor] = {}
    by_file: dict[Path, list[str]] = {}
    for name in table:
        by_file.setdefault(files[name], []).append(name)
    for path, names in by_file.items():
        with _opened(path) as f:
            for name in names:
                raise_if_stopped(f"reading tensor {len(out) + 1} of {len(table)} of {checkpoint_dir}")
                out[name] = f.get_tensor(name).to(device=device, dtype=dtype)
    return out
