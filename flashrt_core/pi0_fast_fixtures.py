"""Random-weight pi0-FAST checkpoints for tests and demos, offline.

`write_random_fast_checkpoint` writes what fixtures.write_random_checkpoint writes (model.safetensors in the
PaliGemma layout of checkpoint.PI0_FAST_WEIGHT_TABLE, norm_stats.json, tokenizer.model, flashrt_config.json)
plus fast_tokenizer/ (tokenizer.json, processor_config.json: a small BPE trained on synthetic smooth chunks,
fast_tokenizer.write_fast_tokenizer). prefix_model=True names the tensors as lerobot's pi0_fast policy does
("model.paligemma_with_expert.paligemma..."), False without "model."; drop_embed_tokens keeps only the tied
lm_head.weight.

Random weights decode random tokens, which are no action sequence. `plant_output_tokens` rewrites a checkpoint
so that greedy decoding writes a chosen sequence after the prompt (a real chain, computed by the real model):
attention outputs and every MLP but layer 0's are zeroed, so each position sees only its own token; the chain's
tokens get orthonormal embeddings (of a larger norm than the other rows), and layer 0's MLP maps token
chain[i] to chain[i + 1] with one hidden unit each (gate = up = the token's direction, down = the next token's).
The chain starts at the prompt's last token ("\\n") and needs distinct tokens, at most the model width.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from flashrt_core import fixture_layouts, fixtures, normalization
from flashrt_core.checkpoint import EMBED_TOKENS, LANGUAGE, OPTIONAL_PREFIX, TIED_LM_HEAD, WEIGHTS_FILE
from flashrt_core.config import ModelType, get_config
from flashrt_core.fast_tokenizer import write_fast_tokenizer
from flashrt_core.pi0_fast_policy import FAST_TOKENIZER_DIR

DEFAULT_FAST_VOCAB = 512
PLANT_GAIN = 8.0  # the next token's weight in the residual stream, relative to the current token's


def write_random_fast_checkpoint(out_dir: str | Path, config: str = "pi0fast_tiny", seed: int = 0,
                                 state_dim: int = 8, action_dim: int = 7, prefix_model: bool = True,
                                 drop_embed_tokens: bool = False, dtype: torch.dtype = torch.bfloat16,
                                 fast_vocab_size: int = DEFAULT_FAST_VOCAB, layout: str = "flashrt") -> Path:
    """A complete random pi0-FAST checkpoint folder; returns its path. layout "lerobot": a lerobot pi0_fast policy
    folder instead (config.json of type "pi0_fast", names with "model.", statistics named by its processors,
    no tokenizer.model), with the same tensors and statistics."""
    cfg = get_config(config, state_dim=state_dim, action_dim=action_dim)
    if cfg.model_type != ModelType.PI0_FAST:
        raise ValueError(f"{config!r} is no pi0fast config")
    if layout == "lerobot":
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        fixtures.write_random_weights(out / WEIGHTS_FILE, cfg, seed, prefix_model=True,
                                      drop_embed_tokens=drop_embed_tokens, dtype=dtype, include_lm_heads=False)
        _write_lerobot_fast_config(out, cfg)
        stats = fixture_layouts.float32_stats(normalization.random_norm_stats(state_dim, action_dim, seed))
        fixture_layouts._write_lerobot_processors(out, stats)
    elif layout == "flashrt":
        out = fixtures.write_random_checkpoint(out_dir, config, seed, prefix_model=prefix_model,
                                               drop_embed_tokens=drop_embed_tokens, dtype=dtype,
                                               include_lm_heads=False,
                                               overrides={"state_dim": state_dim, "action_dim": action_dim})
    else:
        raise ValueError(f"layout must be 'flashrt' or 'lerobot', got {layout!r}")
    write_fast_tokenizer(out / FAST_TOKENIZER_DIR, cfg.action_horizon, action_dim, vocab_size=fast_vocab_size,
                         seed=seed)
    return out


def _write_lerobot_fast_config(out: Path, cfg) -> None:
    """config.json of lerobot's PI0FastConfig for `cfg` (MEAN_STD statistics, lerobot's default for pi0_fast)."""
    paligemma, expert = fixture_layouts.openpi_variants(cfg)
    record = {
        "type": "pi0_fast", "paligemma_variant": paligemma, "action_expert_variant": expert, "dtype": "float32",
        "chunk_size": cfg.action_horizon, "n_action_steps": cfg.action_horizon, "max_state_dim": cfg.max_action_dim,
        "max_action_dim": cfg.max_action_dim, "max_action_tokens": 256, "tokenizer_max_length": cfg.max_token_len,
        "max_decoding_steps": cfg.fast.max_decoding_steps, "fast_skip_tokens": cfg.fast.fast_skip_tokens,
        "temperature": 0.0, "use_kv_cache": True, "image_resolution": [224, 224],
        "text_tokenizer_name": "google/paligemma-3b-pt-224", "action_tokenizer_name": "lerobot/fast-action-tokenizer",
        "input_features": {**{f"observation.images.{view}": {"type": "VISUAL", "shape": [3, 224, 224]}
                              for view in cfg.view_names},
                           "observation.state": {"type": "STATE", "shape": [cfg.state_dim]}},
        "output_features": {"action": {"type": "ACTION", "shape": [cfg.action_dim]}},
        "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
    }
    (out / "config.json").write_text(json.dumps(record, indent=2))


def plant_output_tokens(checkpoint_dir: str | Path, start_token: int, chain: list[int]) -> Path:
    """Rewrite the checkpoint's weights so that greedy decoding after a prompt ending in `start_token` writes
    `chain` (see the module docstring). Returns the weights file."""
    path = Path(checkpoint_dir) / WEIGHTS_FILE
    tensors = load_file(str(path))
    prefix = OPTIONAL_PREFIX if any(k.startswith(OPTIONAL_PREFIX) for k in tensors) else ""
    names = [prefix + EMBED_TOKENS, prefix + TIED_LM_HEAD]
    table_name = next((n for n in names if n in tensors), None)
    if table_name is None:
        raise ValueError(f"{path} holds no token embedding ({' or '.join(names)})")
    nodes = [start_token, *chain]
    table = tensors[table_name].float()
    vocab, width = table.shape
    if len(set(nodes)) != len(nodes) or len(nodes) > width or not all(0 <= t < vocab for t in nodes):
        raise ValueError(f"the chain needs distinct token ids in [0, {vocab}), at most {width} of them")
    gen = torch.Generator().manual_seed(0)
    basis, _ = torch.linalg.qr(torch.randn(width, width, generator=gen, dtype=torch.float64))
    directions = basis[:, :len(nodes)].T.float()                                       # [K, W] orthonormal
    row_norm = float(table.norm(dim=1).mean())
    table *= 0.25                                                                         # the others stay small
    table[nodes] = directions * row_norm
    for name in names:
        if name in tensors:
            tensors[name] = table.to(tensors[name].dtype)
    layers = sorted({int(k[len(prefix + LANGUAGE + "layers."):].split(".")[0]) for k in tensors
                     if k.startswith(prefix + LANGUAGE + "layers.")})
    for i in layers:
        layer = f"{prefix}{LANGUAGE}layers.{i}."
        for name in (layer + "self_attn.o_proj.weight", layer + "mlp.down_proj.weight"):
            tensors[name] = torch.zeros_like(tensors[name])
        for name in (layer + "input_layernorm.weight", layer + "post_attention_layernorm.weight"):
            tensors[name] = torch.zeros_like(tensors[name])
    tensors[prefix + LANGUAGE + "norm.weight"] = torch.zeros_like(tensors[prefix + LANGUAGE + "norm.weight"])
    layer0 = f"{prefix}{LANGUAGE}layers.0.mlp."
    gate = torch.zeros_like(tensors[layer0 + "gate_proj.weight"], dtype=torch.float32)       # [M, W]
    down = torch.zeros_like(tensors[layer0 + "down_proj.weight"], dtype=torch.float32)       # [W, M]
    if len(nodes) - 1 > gate.shape[0]:
        raise ValueError(f"the chain is longer than the MLP width {gate.shape[0]}")
    # the MLP sees the token's direction scaled to rms 1 (|x| = sqrt(W)): gelu(sqrt(W) * 1) * sqrt(W) * down
    unit = float(torch.nn.functional.gelu(torch.tensor(width**0.5), approximate="tanh")) * width**0.5
    residual = row_norm * width**0.5                                                      # the embedding's scale
    for j in range(len(nodes) - 1):
        gate[j] = directions[j]
        down[:, j] = directions[j + 1] * (PLANT_GAIN * residual / unit)
    tensors[layer0 + "gate_proj.weight"] = gate.to(tensors[layer0 + "gate_proj.weight"].dtype)
    tensors[layer0 + "up_proj.weight"] = gate.to(tensors[layer0 + "up_proj.weight"].dtype)
    tensors[layer0 + "down_proj.weight"] = down.to(tensors[layer0 + "down_proj.weight"].dtype)
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


def fast_tokens_of(chunk: np.ndarray, checkpoint_dir: str | Path) -> list[int]:
    """The FAST tokens of a chunk under the checkpoint's fast_tokenizer/ (for building planted outputs)."""
    from flashrt_core.fast_tokenizer import FastTokenizer
    return FastTokenizer.load(Path(checkpoint_dir) / FAST_TOKENIZER_DIR).encode(chunk)
