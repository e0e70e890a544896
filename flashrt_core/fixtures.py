"""Random-weight checkpoints in the real (lerobot / openpi PyTorch) layout, for tests, demos and benchmarks.

A fixture directory holds what a real checkpoint directory holds:
  model.safetensors    every tensor of checkpoint.weight_spec, named as in released checkpoints
                       (optionally with the "model." prefix, without embed_tokens, with the two lm_heads)
  norm_stats.json      openpi layout (or lerobot stats, norm_stats="lerobot")
  tokenizer.model      a small real sentencepiece model (PaliGemma special ids)
  flashrt_config.json  {"config": preset name, "overrides": {...}, ...} read by flashrt_core.load_model

Weights are N(0, fan_in^-1/2) for matrices (~0.02 at real widths), Gemma norm weights near 0 so (1 + w) ~ 1,
LayerNorm weights near 1, adaRMS modulation small with its gate bias at 1 so gated residuals pass signal.
The safetensors file is streamed tensor by tensor (header first), so a full-size checkpoint (4.1 G parameters
with the lm_heads) needs RAM for its largest tensor three times (~4.2 GB in bf16: the fp32 draw and two slots of
the cast, so one is written while the next is cast), not for the whole model.

CLI:  python -m flashrt_core.fixtures OUT_DIR --config pi05 --seed 0
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import math
import zlib
from pathlib import Path

import torch

from flashrt_core import normalization, tokenizer
from flashrt_core.checkpoint import (EMBED_TOKENS, KNOWN_UNUSED, OPTIONAL_PREFIX, TIED_LM_HEAD, WEIGHTS_FILE,
                                     weight_spec)
from flashrt_core.checkpoint_config import FLASHRT_CONFIG_FILE
from flashrt_core.config import ModelConfig, get_config

log = logging.getLogger(__name__)

CONFIG_FILE = FLASHRT_CONFIG_FILE
NORM_STATS_FILE = "norm_stats.json"
TOKENIZER_FILE = "tokenizer.model"
TEST_TOKENIZER_VOCAB = 1024
_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


def _random_tensor(name: str, shape: tuple[int, ...], seed: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Deterministic per (seed, name): the order of generation does not matter. fp32; filled into `out` (fp32, of
    `shape`) where given, which write_safetensors_streaming reuses for every tensor: a fresh allocation of each
    (up to 2 GB for the embedding) cost more in page faults than drawing the numbers did."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    fan_in = math.prod(shape[1:]) if len(shape) > 1 else 1
    values = torch.empty(shape) if out is None else out

    def normal(std: float) -> torch.Tensor:
        return values.normal_(generator=gen).mul_(std)         # torch.randn(shape, generator=gen) * std

    if ".dense." in name:  # pi0.5 adaRMS modulation: [scale; shift; gate]
        if name.endswith(".weight"):
            return normal(0.1 * fan_in**-0.5)
        bias = normal(0.02)
        bias[2 * shape[0] // 3:] += 1.0  # gate ~ 1
        return bias
    if name.endswith(("layernorm.weight", "norm.weight")) and "vision_model" not in name:
        return normal(0.02)  # Gemma RMSNorm: scaled by (1 + w)
    if "vision_model" in name and ("layer_norm" in name or "post_layernorm" in name):
        return normal(0.02).add_(1.0) if name.endswith(".weight") else normal(0.02)
    if name.endswith("embed_tokens.weight") or name.endswith("lm_head.weight"):
        return normal(shape[1] ** -0.5)  # text embeddings are scaled by sqrt(width) in the model
    if name.endswith("position_embedding.weight") or name.endswith(".bias"):
        return normal(0.02)
    return normal(fan_in**-0.5)


def _tensor_plan(config: ModelConfig, dtype: torch.dtype, drop_embed_tokens: bool,
                 include_lm_heads: bool) -> dict[str, tuple[tuple[int, ...], torch.dtype, str]]:
    """Name -> (shape, dtype, name whose random values it takes); lm_head is tied to embed_tokens."""
    plan = {name: (shape, dt, name) for name, (shape, dt) in weight_spec(config, dtype).items()}
    if include_lm_heads or drop_embed_tokens:
        plan[TIED_LM_HEAD] = (plan[EMBED_TOKENS][0], dtype, EMBED_TOKENS)
    if include_lm_heads:
        plan[KNOWN_UNUSED[0]] = ((config.paligemma.vocab_size, config.expert.width), dtype, KNOWN_UNUSED[0])
    if drop_embed_tokens:
        del plan[EMBED_TOKENS]
    return plan


def write_safetensors_streaming(path: Path, plan: dict[str, tuple[tuple[int, ...], torch.dtype, str]],
                                make_tensor) -> None:
    """Write a safetensors file whose tensors come from make_tensor(source_name, shape, out) one at a time: fp32
    values of `shape`, in `out` (an fp32 buffer of that shape, reused) or in a tensor it returns.

    Each tensor is drawn into one fp32 buffer, cast into one of two buffer slots (per file dtype, of that dtype's
    largest tensor) and written from it, without a copy, by a writer thread while the next one is drawn and cast
    into the other slot. Full-size pi0.5 (4.1 G parameters, 8.3 GB in bf16) on the 2-core development machine:
    37-46 s over five runs (peak RSS 3.9 GB), where three fresh allocations per tensor (draw, cast, bytes for the
    write), drawing and writing in turn took 73 s, most of it page faults (2026-12-02); the same bytes."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (shape, dtype, _) in plan.items():
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        header[name] = {"dtype": _SAFETENSORS_DTYPES[dtype], "shape": list(shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)  # data section 8-byte aligned
    largest: dict[torch.dtype, int] = {}
    for shape, dtype, _ in plan.values():
        largest[dtype] = max(largest.get(dtype, 0), math.prod(shape))
    drawn_values = torch.empty(max(largest.values(), default=0))          # fp32 draws, cast into a slot at once
    slots = [{dtype: torch.empty(n, dtype=dtype) for dtype, n in largest.items()} for _ in range(2)]
    written: list[concurrent.futures.Future | None] = [None, None]         # each slot's last write
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f, concurrent.futures.ThreadPoolExecutor(1) as writer:
        f.write(len(header_bytes).to_bytes(8, "little"))
        f.write(header_bytes)
        drawn = 0
        for shape, dtype, source in plan.values():
            n = math.prod(shape)
            if n == 0:
                continue
            k = drawn % 2
            drawn += 1
            if written[k] is not None:
                written[k].result()                              # its last tensor is in the file: reuse it
            values = make_tensor(source, shape, drawn_values[:n].view(shape))
            data = slots[k][dtype][:n].view(shape).copy_(values)
            written[k] = writer.submit(f.write, data.view(-1).view(torch.uint8).numpy())   # in plan order
        for future in written:
            if future is not None:
                future.result()
    tmp.replace(path)


def write_random_weights(path: Path, config: ModelConfig, seed: int, prefix_model: bool = True,
                         drop_embed_tokens: bool = False, dtype: torch.dtype = torch.bfloat16,
                         include_lm_heads: bool = True) -> dict:
    """model.safetensors alone: every tensor of the config's weight spec, deterministic per (seed, name);
    returns the plan written (name -> shape, dtype, source name)."""
    plan = _tensor_plan(config, dtype, drop_embed_tokens, include_lm_heads)
    if prefix_model:
        plan = {OPTIONAL_PREFIX + name: value for name, value in plan.items()}
    write_safetensors_streaming(path, plan, lambda name, shape, values: _random_tensor(name, shape, seed, values))
    return plan


def write_random_checkpoint(out_dir: str | Path, config: str | ModelConfig = "pi05_tiny", seed: int = 0,
                            norm_stats: str = "openpi", prefix_model: bool = True, drop_embed_tokens: bool = False,
                            dtype: torch.dtype = torch.bfloat16, include_lm_heads: bool = True,
                            overrides: dict | None = None) -> Path:
    """Write a complete random checkpoint directory; returns its path.

    config: preset name (or ModelConfig whose .name is a preset) plus `overrides` of fields
    (e.g. {"state_dim": 8, "action_dim": 7}), recorded in flashrt_config.json so load_model rebuilds it.
    prefix_model: names start with "model." (lerobot policy checkpoints) or not (openpi conversion).
    """
    if norm_stats not in ("openpi", "lerobot"):
        raise ValueError(f"norm_stats must be 'openpi' or 'lerobot', got {norm_stats!r}")
    if dtype not in _SAFETENSORS_DTYPES:
        raise ValueError(f"dtype must be one of {list(_SAFETENSORS_DTYPES)}, got {dtype}")
    overrides = dict(overrides or {})
    cfg = get_config(config, **overrides)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    plan = write_random_weights(out / WEIGHTS_FILE, cfg, seed, prefix_model, drop_embed_tokens, dtype,
                                include_lm_heads)

    stats = normalization.random_norm_stats(cfg.state_dim, cfg.action_dim, seed)
    if norm_stats == "openpi":
        stats.save_openpi(out / NORM_STATS_FILE)
    else:
        stats.save_lerobot(out)
    tokenizer.train_test_tokenizer(out / TOKENIZER_FILE, vocab_size=min(TEST_TOKENIZER_VOCAB, cfg.paligemma.vocab_size))
    record = {"config": cfg.name, "overrides": overrides, "seed": seed, "generator": "flashrt_core.fixtures",
              "random_weights": True}
    (out / CONFIG_FILE).write_text(json.dumps(record, indent=2) + "\n")
    log.info("wrote random %s checkpoint (seed %d, %d tensors) to %s", cfg.name, seed, len(plan), out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Write a random-weight pi0/pi0.5 checkpoint in the real layout.")
    parser.add_argument("out_dir")
    parser.add_argument("--config", default="pi05_tiny", help="preset: pi05, pi0, pi05_tiny, pi0_tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--norm-stats", choices=("openpi", "lerobot"), default="openpi")
    parser.add_argument("--no-model-prefix", action="store_true", help="omit the leading 'model.' of names")
    parser.add_argument("--dtype", choices=("bfloat16", "float32", "float16"), default="bfloat16")
    parser.add_argument("--state-dim", type=int)
    parser.add_argument("--action-dim", type=int)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    overrides = {k: v for k, v in (("state_dim", args.state_dim), ("action_dim", args.action_dim)) if v is not None}
    path = write_random_checkpoint(args.out_dir, args.config, args.seed, norm_stats=args.norm_stats,
                                   prefix_model=not args.no_model_prefix, dtype=getattr(torch, args.dtype),
                                   overrides=overrides)
    print(path)


if __name__ == "__main__":
    main()
