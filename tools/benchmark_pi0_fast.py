"""Benchmark pi0-FAST's eager reference path: prefill ms, ms per decoded token, an N-token chunk end to end.

The reference executor (flashrt_core/model/pi0_fast.py) on random weights of a preset (full size "pi0fast" by
default, built in memory: timing does not depend on the values) or a checkpoint folder. Decoding is forced to
`--tokens` tokens (no EOS), so every run decodes the same count. Timed with a device synchronize around each
phase: prefill (vision + prompt into the KV cache, first logits), each decode step (one token through the
backbone and the tied LM head, its K/V appended), and Pi0FastModel.generate end to end.

    python tools/benchmark_pi0_fast.py [--config pi0fast | --checkpoint DIR] [--device cuda] [--dtype bfloat16]
        [--views 2] [--prompt-tokens 60] [--tokens 50] [--runs 5] [--out docs/benchmarks]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from flashrt_core.checkpoint import load_model_weights
from flashrt_core.config import ModelType, get_config
from flashrt_core.model import Pi0FastModel

NO_EOS = -1


def build_model(args, device: torch.device, dtype: torch.dtype):
    if args.checkpoint:
        from flashrt_core.checkpoint_config import resolve_config
        cfg, _ = resolve_config(args.config, Path(args.checkpoint))
        return cfg, load_model_weights(args.checkpoint, cfg, device, dtype), f"checkpoint {args.checkpoint}"
    cfg = get_config(args.config)
    torch.manual_seed(0)
    with torch.device(device):
        model = Pi0FastModel(cfg)
    return cfg, model.to(dtype).eval().requires_grad_(False), f"random {cfg.name} (in memory)"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(args) -> dict:
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    cfg, model, weights = build_model(args, device, dtype)
    if cfg.model_type != ModelType.PI0_FAST:
        raise SystemExit(f"{cfg.name} is no pi0fast config")
    gen = torch.Generator().manual_seed(0)
    size = cfg.vision.image_size
    pixels = (torch.rand(1, args.views, 3, size, size, generator=gen) * 2 - 1).to(device)
    image_masks = torch.ones(1, args.views, dtype=torch.bool, device=device)
    tokens = torch.randint(4, cfg.paligemma.vocab_size, (1, cfg.max_token_len), generator=gen).to(device)
    token_masks = (torch.arange(cfg.max_token_len) < args.prompt_tokens)[None].to(device)
    prefill_ms, step_ms, generate_ms = [], [], []
    with torch.inference_mode():
        for run_index in range(args.runs + 1):                     # the first run warms up and is dropped
            synchronize(device)
            start = time.perf_counter()
            embs, valid = model.embed_prefix(pixels, image_masks, tokens, token_masks)
            state, logits = model.prefill(embs, valid)
            synchronize(device)
            prefill = (time.perf_counter() - start) * 1e3
            steps = []
            for _ in range(args.tokens - 1):
                token = logits.argmax(dim=-1)
                start = time.perf_counter()
                logits = model.decode_step(state, token, cfg.fast.decode_position_offset)
                synchronize(device)
                steps.append((time.perf_counter() - start) * 1e3)
            start = time.perf_counter()
            out = model.generate(pixels, image_masks, tokens, token_masks, args.tokens, NO_EOS,
                                 cfg.fast.decode_position_offset)
            synchronize(device)
            total = (time.perf_counter() - start) * 1e3
            assert out.shape == (1, args.tokens)
            if run_index:
                prefill_ms.append(prefill)
                step_ms.extend(steps)
                generate_ms.append(total)
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "weights": weights, "config": cfg.name, "dtype": args.dtype,
        "views": args.views, "prompt_tokens": args.prompt_tokens, "prefix_tokens": int(valid.sum()),
        "tokens": args.tokens, "runs": args.runs,
        "prefill_ms_median": statistics.median(prefill_ms),
        "decode_ms_per_token_median": statistics.median(step_ms) if step_ms else None,
        "chunk_ms_median": statistics.median(generate_ms),
        "prefill_ms": prefill_ms, "chunk_ms": generate_ms,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="pi0fast", help="preset (random weights), or the checkpoint's config")
    parser.add_argument("--checkpoint", help="a pi0-FAST checkpoint folder instead of random weights")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--views", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=60, help="valid prompt tokens (of max_token_len)")
    parser.add_argument("--tokens", type=int, default=50, help="tokens decoded per chunk (no EOS)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", help="folder for the JSON result")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = run(args)
    print(f"pi0-FAST reference, {result['device']}, {result['config']} {result['dtype']}, {result['views']} views, "
          f"{result['prefix_tokens']} prefix tokens: prefill {result['prefill_ms_median']:.2f} ms, "
          f"{result['decode_ms_per_token_median']:.3f} ms per token, {result['tokens']}-token chunk "
          f"{result['chunk_ms_median']:.1f} ms (medians of {result['runs']} runs)")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stamp = result["date"][:10]
        path = out / f"pi0_fast_reference_{args.device.split(':')[0]}_{result['config']}_{stamp}.json"
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
