"""Random-weight GR00T N1.6 checkpoints in the released layout, for tests, demos and parity checks.

A fixture folder holds what a fine-tuned GR00T N1.6 checkpoint holds (groot_checkpoint, groot_statistics):
  config.json                                        model_type Gr00tN1d6 + the action-head sizes (and
                                                     "flashrt_preset": the preset that gives the rest)
  model-0000k-of-0000n.safetensors, model.safetensors.index.json   every tensor of weight_table, sharded
  processor_config.json, statistics.json, embodiment_id.json      views, joint groups, random statistics
  tokenizer.json                                     a small real word-level tokenizer (the Eagle tokenizer is
                                                     not shipped with checkpoints; see groot_inputs)
Weights are deterministic per (seed, tensor name): N(0, fan_in^-1/2) for matrices (fan_in = the input axis:
dim 1 of [out, in] Linear weights and of [embodiments, in, out] category weights), norm weights near 1, biases
and embeddings small.

CLI:  python -m flashrt_core.groot_fixtures OUT_DIR --config groot_n1.6_tiny --seed 0
"""

from __future__ import annotations

import argparse
import json
import math
import zlib
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from flashrt_core.groot_checkpoint import INDEX_FILE, weight_table
from flashrt_core.groot_checkpoint import TOKENIZER_FILE
from flashrt_core.groot_inputs import IMAGE_CLOSE, IMAGE_CONTEXT, IMAGE_OPEN
from flashrt_core.groot_statistics import EMBODIMENT_ID_FILE, EMBODIMENT_IDS, PROCESSOR_FILE, STATISTICS_FILE
from flashrt_core.model.groot.config import GrootConfig, get_groot_config, to_checkpoint_json
from flashrt_core.model.groot.model import GrootModel

DEFAULT_EMBODIMENT = "new_embodiment"
DEFAULT_VIEWS = ("front", "wrist")
DEFAULT_STATE = (("single_arm", 5), ("gripper", 1))
DEFAULT_ACTION = (("single_arm", 5), ("gripper", 1))
TEST_WORDS = ("pick", "up", "the", "red", "blue", "green", "cube", "block", "place", "it", "in", "on", "box",
              "bowl", "open", "close", "drawer", "door", "move", "left", "right", "to", "a", "and", "user")
SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", IMAGE_OPEN, IMAGE_CLOSE)
TEMPLATE_WORDS = ("system", "You", "are", "a", "helpful", "assistant", ".", "<", ">", "image", "1", "2", "3", "4")


def random_tensor(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    values = torch.randn(shape, generator=gen)
    if len(shape) == 1:
        is_norm = any(k in name for k in ("norm", "layer_norm", "vlln", "mlp1.0.")) and name.endswith("weight")
        return 1.0 + 0.1 * values if is_norm else 0.02 * values
    if name.endswith(("embed_tokens.weight", "position_embedding.weight")):
        return 0.02 * values
    if name.endswith(".b"):
        return 0.02 * values
    fan_in = shape[1] if len(shape) >= 2 else 1
    return values * fan_in ** -0.5


def random_groot_model(config: str | GrootConfig = "groot_n1.6_tiny", seed: int = 0,
                       dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> GrootModel:
    """A GrootModel holding the weights write_random_groot_checkpoint(config, seed) writes, built in memory (no
    files; each tensor made on the host, cast and moved one at a time), in eval mode."""
    cfg = get_groot_config(config)
    device = torch.device(device)
    weights = {n: random_tensor(n, shape, seed).to(device=device, dtype=dtype)
               for n, shape in weight_table(cfg).items()}
    with torch.device("meta"):
        model = GrootModel(cfg)
    model.load_state_dict(weights, strict=True, assign=True)
    model.backbone.model.materialize_buffers(device)
    return model.eval().requires_grad_(False)


def write_tokenizer(path: Path, image_token_index: int) -> Path:
    """A small real tokenizers word-level model with Eagle's chat and image markers as special tokens and
    <IMG_CONTEXT> at the model's image_token_index."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    vocab = {"[UNK]": 0}
    for word in TEST_WORDS + TEMPLATE_WORDS + SPECIAL_TOKENS:
        vocab.setdefault(word, len(vocab))
    if image_token_index < len(vocab):
        raise ValueError(f"image_token_index {image_token_index} collides with the test vocabulary ({len(vocab)})")
    vocab[IMAGE_CONTEXT] = image_token_index
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([AddedToken(t, special=True) for t in SPECIAL_TOKENS + (IMAGE_CONTEXT,)])
    tok.save(str(path))
    return path


def _group_stats(dim: int, rng: np.random.Generator) -> dict:
    lo = -1.0 - rng.random(dim)
    hi = 1.0 + rng.random(dim)
    return {"min": lo.tolist(), "max": hi.tolist(), "mean": ((lo + hi) / 2).tolist(),
            "std": (0.3 + rng.random(dim)).tolist(), "q01": (lo * 0.9).tolist(), "q99": (hi * 0.9).tolist()}


def write_processor_files(out: Path, cfg: GrootConfig, embodiments: dict[str, dict], seed: int) -> None:
    """processor_config.json, statistics.json, embodiment_id.json for `embodiments`:
    {tag: {"views": [...], "state": [(group, dim)], "action": [(group, dim)], "id": int}}."""
    rng = np.random.default_rng(seed)
    modality, stats, ids = {}, {}, {}
    for tag, spec in embodiments.items():
        modality[tag] = {
            "video": {"delta_indices": [0], "modality_keys": list(spec["views"])},
            "state": {"delta_indices": [0], "modality_keys": [g for g, _ in spec["state"]],
                      "mean_std_embedding_keys": None, "sin_cos_embedding_keys": None},
            "action": {"delta_indices": list(range(cfg.action_horizon)),
                       "modality_keys": [g for g, _ in spec["action"]], "mean_std_embedding_keys": None,
                       "action_configs": [{"rep": "ABSOLUTE", "type": "NON_EEF", "format": "DEFAULT",
                                           "state_key": None} for _ in spec["action"]]},
            "language": {"delta_indices": [0], "modality_keys": ["annotation.human.task_description"]}}
        stats[tag] = {"state": {g: _group_stats(d, rng) for g, d in spec["state"]},
                      "action": {g: _group_stats(d, rng) for g, d in spec["action"]}}
        ids[tag] = spec.get("id", EMBODIMENT_IDS.get(tag, 10))
    kwargs = {"modality_configs": modality, "model_name": "nvidia/Eagle-Block2A-2B-v2", "model_type": "eagle",
              "formalize_language": cfg.formalize_language, "max_state_dim": cfg.max_state_dim,
              "max_action_dim": cfg.max_action_dim, "max_action_horizon": cfg.action_horizon,
              "use_percentiles": False, "clip_outliers": True, "apply_sincos_state_encoding": False,
              "use_relative_action": False, "shortest_image_edge": cfg.shortest_image_edge,
              "crop_fraction": cfg.crop_fraction, "use_albumentations": True}
    (out / PROCESSOR_FILE).write_text(json.dumps({"processor_class": "Gr00tN1d6Processor",
                                                  "processor_kwargs": kwargs}, indent=2))
    (out / STATISTICS_FILE).write_text(json.dumps(stats, indent=2))
    (out / EMBODIMENT_ID_FILE).write_text(json.dumps({**EMBODIMENT_IDS, **ids}, indent=2))


def write_random_groot_checkpoint(out_dir: str | Path, config: str | GrootConfig = "groot_n1.6_tiny",
                                  seed: int = 0, shards: int = 2, embodiments: dict[str, dict] | None = None,
                                  dtype: torch.dtype = torch.float32, extra_tensors: dict | None = None) -> Path:
    """Write a random checkpoint in the released layout; returns the folder. extra_tensors (name -> tensor)
    are added to the last shard (known-unused names such as the vision pooling head, or test cases)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = get_groot_config(config)
    table = weight_table(cfg)
    names = list(table)
    tensors = {n: random_tensor(n, table[n], seed).to(dtype) for n in names}
    tensors.update(extra_tensors or {})
    names = list(tensors)
    per = math.ceil(len(names) / shards)
    weight_map, total = {}, 0
    for k in range(shards):
        chunk = names[k * per:(k + 1) * per]
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n].contiguous() for n in chunk}, str(out / fname), metadata={"format": "pt"})
        for n in chunk:
            weight_map[n] = fname
            total += tensors[n].numel() * tensors[n].element_size()
    (out / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                             indent=2))
    (out / "config.json").write_text(json.dumps({**to_checkpoint_json(cfg), "flashrt_preset": cfg.name}, indent=2))
    embodiments = embodiments or {DEFAULT_EMBODIMENT: {"views": DEFAULT_VIEWS, "state": DEFAULT_STATE,
                                                       "action": DEFAULT_ACTION}}
    write_processor_files(out, cfg, embodiments, seed)
    write_tokenizer(out / TOKENIZER_FILE, cfg.image_token_index)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--config", default="groot_n1.6_tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shards", type=int, default=2)
    args = parser.parse_args(argv)
    print(write_random_groot_checkpoint(args.out_dir, args.config, args.seed, args.shards))


if __name__ == "__main__":
    main()
