#!/usr/bin/env python3
"""What each text bucket costs: the engine's replay time against the length of its token buffer.

The graph engine runs the prefix over a fixed-length token buffer, the smallest of its text buckets
(`EngineOptions.text_buckets`, plus max_token_len) that holds the prompt; the padding slots are masked but still
computed. A prompt one token past a bucket pays for the next one. This measures that price: one engine with a
graph per bucket (every `--step` tokens by default), each bucket's graph filled exactly (its time depends on the
bucket, not on the token values), all graphs timed in turn (`interleaved_replay_ms`: the same clock and memory
drift for every bucket), plus each bucket's capture seconds (what warming it up costs at configure).

pi0.5's prompt carries the discretized state (32 numbers in text), so real pi0.5 prompts run past 128 tokens;
with the buckets (64, 128) they all pay for max_token_len (200). The table says what finer buckets would save.

    python tools/benchmark_text_buckets.py --ckpt-root /tmp/full --config pi05 --views 2 --out-dir docs/benchmarks/$(date +%F)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchmark_engine import engine_options, ensure_checkpoint, env_info, gpu_tag  # noqa: E402

from flashrt_core.checkpoint import load_model_weights  # noqa: E402
from flashrt_core.config import get_config  # noqa: E402
from flashrt_core.engine import EngineExecutor, detect_hardware, resolve  # noqa: E402
from flashrt_core.engine.fp8_calibration import calibrate_executor  # noqa: E402
from flashrt_core.engine.gate import random_observation  # noqa: E402
from flashrt_core.engine.timing import interleaved_replay_ms  # noqa: E402


def bucket_grid(step: int, max_len: int) -> list[int]:
    """step, 2 step, ... below max_len, then max_len (the engine always adds it)."""
    if step <= 0:
        raise ValueError(f"step must be positive, got {step}")
    return list(range(step, max_len, step)) + [max_len]


def bucket_rows(engine: EngineExecutor, cfg, views: int, rounds: int, reps: int) -> list[dict]:
    """One row per bucket: its prefix length, capture seconds and replay median (interleaved)."""
    rng = np.random.default_rng(views)
    graphs, captures = {}, {}
    for bucket in engine.text_buckets:
        obs = random_observation(cfg, rng, views=views, n_text=bucket, vocab=1024)
        if engine.fp8_calibration is not None and not engine.fp8_calibrated:
            calibrate_executor(engine, [obs])         # an FP8 engine's scales from the first bucket's observation
        engine.predict_observation(obs.images, obs.tokens, obs.token_mask, obs.state, obs.noise)
        key, entry = next((k, e) for k, e in engine.entries.items() if k[3] == bucket and len(k[1]) == views)
        graphs[bucket], captures[bucket] = entry.graph, engine.capture_seconds[key]
    times = interleaved_replay_ms(graphs, rounds, reps)
    return [{"bucket": b, "prefix_tokens": views * cfg.vision.num_patches + b, "replay_ms": times[b],
             "capture_s": captures[b]} for b in engine.text_buckets]


def markdown(env: dict, args, results: dict) -> str:
    lines = [f"# Text bucket cost ({env['gpu']})", "",
             f"{env['time_utc']}, driver {env['driver']}, torch {env['torch']}, CUDA {env['cuda']}, Triton "
             f"{env['triton']}. {args.config}, {args.views} views at the model's image size, horizon "
             f"{args.horizon}; one engine per precision with a graph per bucket; replay = median of "
             f"{args.rounds} interleaved rounds of {args.reps} replays (CUDA events).", ""]
    for prec, rows in results.items():
        base = rows[-1]["replay_ms"]
        lines += [f"## {prec}", "", "| bucket (tokens) | prefix tokens | replay ms | vs max_token_len bucket (ms) | "
                  "capture s |", "|---|---|---|---|---|"]
        lines += [f"| {r['bucket']} | {r['prefix_tokens']} | {r['replay_ms']:.3f} | {r['replay_ms'] - base:+.3f} | "
                  f"{r['capture_s']:.2f} |" for r in rows]
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt-root", default="/tmp/full")
    ap.add_argument("--config", default="pi05")
    ap.add_argument("--views", type=int, default=2)
    ap.add_argument("--horizon", type=int, default=10)
    ap.add_argument("--precisions", nargs="+", default=["bf16", "fp8"], help="as benchmark_engine's variants")
    ap.add_argument("--step", type=int, default=16, help="tokens between buckets")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--out-dir", type=Path, default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("benchmark_text_buckets needs a CUDA GPU")
    dev = torch.device("cuda")
    cfg = get_config(args.config).replace(action_horizon=args.horizon)
    args.text_buckets = bucket_grid(args.step, cfg.max_token_len)
    model = load_model_weights(ensure_checkpoint(Path(args.ckpt_root), args.config), cfg, dev, torch.bfloat16)
    env, results = env_info(), {}
    for prec in args.precisions:
        engine = EngineExecutor(model, cfg, dev, resolve(detect_hardware("auto", dev), engine_options(prec, args)))
        results[prec] = bucket_rows(engine, cfg, args.views, args.rounds, args.reps)
        del engine
        torch.cuda.empty_cache()
    text = markdown(env, args, results)
    print(text)
    if args.out_dir is not None:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        stem = args.out_dir / f"text_buckets_{gpu_tag(env['gpu'])}_{env['date']}"
        stem.with_suffix(".json").write_text(json.dumps({"env": env, "args": {k: str(v) for k, v in vars(args).items()},
                                                         "results": results}, indent=1))
        stem.with_suffix(".md").write_text(text + "\n")


if __name__ == "__main__":
    main()
