"""flashrt-convert SRC DST: any checkpoint layout -> a self-contained flashrt folder the node loads fast.

SRC is a folder in any layout of flashrt_core.checkpoint_layout, or a hub id (flashrt_core.hub). DST receives

  model.safetensors    the tensors of WEIGHT_TABLE under their table names (no "model." prefix, no unused
                       lm_heads), in their dtypes (or cast with --dtype; the fp32 rows stay fp32)
  norm_stats.json      the statistics in openpi's format (from SRC, or --norm-stats FILE); with --allow-no-stats
                       and none found, flashrt_config.json says "norm_stats": "none" instead and the policy
                       runs unnormalized, as lerobot runs an empty normalizer
  tokenizer.model      the PaliGemma sentencepiece model (found as load_model finds it, or --tokenizer PATH)
  flashrt_config.json  the preset and every field that differs from it, so the folder needs no other config
  fast_tokenizer/      pi0-FAST only: the FAST tokenizer's files (found as load_model finds them, or
                       --fast-tokenizer DIR)

Every check of loading runs first (config, statistics, tokenizer, every tensor's name and shape), and the folder
is written beside DST and renamed into place only when complete. What is missing is named with how to supply
it; nothing is written then.

CLI:  flashrt-convert SRC DST [--tokenizer PATH] [--norm-stats FILE] [--asset-id ID] [--config PRESET]
                              [--set FIELD=VALUE ...] [--dtype bfloat16|float32] [--allow-no-stats] [--force]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from flashrt_core import hub, normalization
from flashrt_core.api import SUPPLY_TOKENIZER, find_tokenizer
from flashrt_core.checkpoint import WEIGHTS_FILE, match_tensors, open_tensors, weight_spec
from flashrt_core.checkpoint_config import (FLASHRT_CONFIG_FILE, NO_STATS, NORM_STATS_KEY, ROBOT_DIMS, fit_robot_dims,
                                           resolve_config)
from flashrt_core.checkpoint_layout import detect_layout
from flashrt_core.config import PRESETS, ModelConfig, ModelType
from flashrt_core.errors import CheckpointError
from flashrt_core.fixtures import NORM_STATS_FILE, TOKENIZER_FILE, write_safetensors_streaming
from flashrt_core.groot_checkpoint import is_groot_checkpoint
from flashrt_core.tokenizer import PromptTokenizer

log = logging.getLogger(__name__)

WRITABLE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
_STRUCTURE_FIELDS = ("name", "model_type", "vision", "paligemma", "expert")  # fixed by the preset


def config_record(config: ModelConfig, source: str, layout: str) -> dict:
    """flashrt_config.json for `config`: its preset and the fields that differ from it (the robot dims always)."""
    preset = PRESETS[config.name]
    overrides = {}
    for field in dataclasses.fields(ModelConfig):
        value = getattr(config, field.name)
        if field.name in _STRUCTURE_FIELDS or (value == getattr(preset, field.name) and field.name not in ROBOT_DIMS):
            continue
        if dataclasses.is_dataclass(value):                   # pi0-FAST's FastDecoding: the fields that differ
            base = getattr(preset, field.name)
            overrides[field.name] = {k: v for k, v in dataclasses.asdict(value).items()
                                     if base is None or getattr(base, k) != v}
            continue
        overrides[field.name] = list(value) if isinstance(value, tuple) else getattr(value, "value", value)
    return {"config": config.name, "overrides": overrides, "source": source, "source_layout": layout,
            "generator": "flashrt_core.checkpoint_convert"}


def read_stats_file(path: Path) -> normalization.NormStats:
    """--norm-stats: openpi's norm_stats.json, or a folder holding statistics in any layout."""
    if path.is_dir():
        stats = normalization.load_norm_stats(path)
        if stats is None:
            raise CheckpointError(f"--norm-stats {path}: {normalization.locate_norm_stats(path).note}")
        return stats
    if not path.is_file():
        raise CheckpointError(f"--norm-stats {path}: no such file")
    return normalization.load_openpi_file(path)


def convert(src: str | Path, dst: str | Path, *, tokenizer: str | Path | None = None,
            norm_stats: str | Path | None = None, asset_id: str | None = None, config: str | None = None,
            overrides: dict | None = None, dtype: torch.dtype | None = None, allow_no_stats: bool = False,
            force: bool = False, fast_tokenizer: str | Path | None = None) -> Path:
    """Write the flashrt folder of `src` at `dst` (see the module docstring); returns dst."""
    src_dir = hub.checkpoint_path(src)
    if src_dir.is_dir() and is_groot_checkpoint(src_dir):
        raise CheckpointError(f"{src_dir} is a GR00T N1.6 checkpoint: load_model reads its released layout as it "
                              "is (no conversion); `flashrt-inspect DIR` says what it holds and what it lacks")
    dst = Path(dst)
    if dst.exists() and any(dst.iterdir()) and not force:
        raise CheckpointError(f"{dst} exists and is not empty; choose a new folder or pass --force to replace it")
    layout = detect_layout(src_dir)
    cfg, explicit = resolve_config(config, src_dir)
    if overrides:
        try:
            cfg = cfg.replace(**overrides)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"--set {overrides}: {exc}") from exc
        explicit = explicit | (ROBOT_DIMS & set(overrides))
    if norm_stats is not None:
        stats, origin = read_stats_file(Path(norm_stats)), Path(norm_stats)
    else:
        stats, origin = normalization.load_norm_stats(src_dir, asset_id), src_dir
        if stats is None and not allow_no_stats:
            note = normalization.locate_norm_stats(src_dir, asset_id).note
            raise CheckpointError(f"{src_dir} has no normalization stats ({note}). To supply them, "
                                  f"{normalization.SUPPLY_STATS}; or pass --allow-no-stats to convert without "
                                  "(the policy then runs unnormalized)")
    cfg = fit_robot_dims(cfg, stats, explicit, origin)
    tokenizer_path = Path(tokenizer) if tokenizer is not None else None
    if tokenizer_path is None:
        tokenizer_path = find_tokenizer(src_dir)
    elif not tokenizer_path.is_file():
        raise CheckpointError(f"--tokenizer {tokenizer_path}: no such file. {SUPPLY_TOKENIZER}")
    vocab = PromptTokenizer(tokenizer_path).vocab_size
    if vocab > cfg.paligemma.vocab_size:
        raise CheckpointError(f"tokenizer {tokenizer_path} has {vocab} pieces, more than the model's vocab_size "
                              f"{cfg.paligemma.vocab_size}")
    fast_dir = None
    if cfg.model_type == ModelType.PI0_FAST:
        from flashrt_core.fast_tokenizer import FastTokenizer
        from flashrt_core.pi0_fast_policy import find_fast_tokenizer
        fast_dir = Path(fast_tokenizer) if fast_tokenizer is not None else find_fast_tokenizer(src_dir)
        FastTokenizer.load(fast_dir)                                # readable, or a CheckpointError naming it

    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp_", dir=dst.parent))
    try:
        with open_tensors(src_dir) as f:
            names = match_tensors(f, cfg)
            targets = weight_spec(cfg, dtype) if dtype is not None else {}
            plan = {}
            for name, (shape, _) in weight_spec(cfg).items():
                out_dtype = targets[name][1] if dtype is not None else f.dtype(names[name])
                plan[name] = (shape, out_dtype if out_dtype in WRITABLE_DTYPES else torch.float32, name)
            write_safetensors_streaming(tmp / WEIGHTS_FILE, plan, lambda name, shape, out: f.get(names[name]))
        if stats is not None:
            stats.save_openpi(tmp / NORM_STATS_FILE)
        shutil.copyfile(tokenizer_path, tmp / TOKENIZER_FILE)
        if fast_dir is not None:
            from flashrt_core.fast_tokenizer import PROCESSOR_CONFIG_FILE, TOKENIZER_FILE as FAST_FILE
            from flashrt_core.pi0_fast_policy import FAST_TOKENIZER_DIR
            (tmp / FAST_TOKENIZER_DIR).mkdir()
            for name in (FAST_FILE, PROCESSOR_CONFIG_FILE):
                shutil.copyfile(fast_dir / name, tmp / FAST_TOKENIZER_DIR / name)
        record = config_record(cfg, str(src), layout.value)
        if stats is None:
            record[NORM_STATS_KEY] = NO_STATS                      # load_model then runs it unnormalized
        (tmp / FLASHRT_CONFIG_FILE).write_text(json.dumps(record, indent=2) + "\n")
        if dst.exists():
            shutil.rmtree(dst)
        tmp.rename(dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("converted %s (%s, %s) to %s", src, layout.value, cfg.name, dst)
    return dst


def _parse_set(items: list[str]) -> dict:
    """FIELD=VALUE pairs; VALUE is JSON where it parses (numbers, lists), else the string."""
    overrides = {}
    for item in items:
        field, sep, raw = item.partition("=")
        if not sep or not field:
            raise CheckpointError(f"--set {item!r}: expected FIELD=VALUE, e.g. prompt_mode=no_state")
        try:
            overrides[field] = json.loads(raw)
        except json.JSONDecodeError:
            overrides[field] = raw
    return overrides


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flashrt-convert", description=(
        "Convert a pi0 / pi0.5 checkpoint (lerobot folder, openpi PyTorch conversion, openpi Orbax checkpoint, "
        "flashrt folder, or a hub id such as lerobot/pi05_base) into a self-contained folder: model.safetensors, "
        "norm_stats.json, tokenizer.model, flashrt_config.json."))
    parser.add_argument("src", help="checkpoint folder or hub id (org/name[@revision])")
    parser.add_argument("dst", help="the folder to write (new or empty; --force replaces it)")
    parser.add_argument("--tokenizer", help="PaliGemma sentencepiece model (tokenizer.model); default: as "
                        "load_model finds it (the folder, $FLASHRT_TOKENIZER, openpi's cache)")
    parser.add_argument("--norm-stats", help="openpi norm_stats.json (or a folder with statistics) to use")
    parser.add_argument("--asset-id", help="which assets/<asset_id>/norm_stats.json of an openpi checkpoint")
    parser.add_argument("--config", help="preset name (pi05, pi0, pi05_tiny, pi0_tiny, pi0fast, pi0fast_tiny) "
                        "instead of the folder's")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="change a config field, e.g. prompt_mode=no_state (openpi pi05_libero), "
                             "action_horizon=50, view_names='[\"base_0_rgb\"]'")
    parser.add_argument("--dtype", choices=sorted(DTYPES), help="cast the weights (default: keep the source's)")
    parser.add_argument("--allow-no-stats", action="store_true", help="convert a folder without statistics")
    parser.add_argument("--force", action="store_true", help="replace a non-empty DST")
    parser.add_argument("--fast-tokenizer", help="pi0-FAST: the FAST tokenizer folder (tokenizer.json, "
                        "processor_config.json); default: as load_model finds it")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        dst = convert(args.src, args.dst, tokenizer=args.tokenizer, norm_stats=args.norm_stats,
                      asset_id=args.asset_id, config=args.config, overrides=_parse_set(args.set),
                      dtype=DTYPES.get(args.dtype), allow_no_stats=args.allow_no_stats, force=args.force,
                      fast_tokenizer=args.fast_tokenizer)
    except CheckpointError as exc:
        print(f"flashrt-convert: {exc}", file=sys.stderr)
        return 1
    print(dst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
