#!/usr/bin/env python3
"""What real-time chunking costs in the graph engine: the replay of one predict's graph per RTC mode beside the
plain graph, on full-size random weights, every row in one process, and each conditioned chunk's cosine against the
reference sampler (the eager reference path, fp32, the same weights, observation, noise and previous chunk), with
that sampler's wall time.

    python tools/benchmark_rtc.py [--model pi05] [--views 2] [--delay 4] [--rounds 5] [--reps 20] [--out DIR]

Modes: every one of rtc_blend.ENGINE_MODES. The graph of a mode is captured at its first predict; the timing is
interleaved (timing.interleaved_replay_ms: the graphs replayed in turn, rotated each round), so drift hits all
alike. The previous chunk is the plain chunk of the same observation shifted by `--delay` rows, as a robot's
pending actions are; guided modes use the soft mask to the end of the chunk (rtc.prefix_weights, exp schedule).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashrt_core.checkpoint import load_model_weights  # noqa: E402
from flashrt_core.config import get_config  # noqa: E402
from flashrt_core.engine import EngineOptions, build_executor  # noqa: E402
from flashrt_core.engine.gate import cosine, random_observation, reference_inputs  # noqa: E402
from flashrt_core.engine.rtc_blend import ENGINE_MODES  # noqa: E402
from flashrt_core.engine.timing import interleaved_replay_ms  # noqa: E402
from flashrt_core.executor import ReferenceExecutor  # noqa: E402
from flashrt_core.rtc import SOFT_MASK_MODES, RtcPlan, prefix_weights  # noqa: E402
from tools.benchmark_engine import ensure_checkpoint, env_info, write_result  # noqa: E402


def plan_for(mode: str, previous: np.ndarray, delay: int) -> RtcPlan:
    """The previous chunk shifted by `delay` rows (row i of the new chunk = row i + delay of the old one)."""
    horizon = previous.shape[0]
    target = np.zeros_like(previous)
    target[:horizon - delay] = previous[delay:]
    soft = mode in SOFT_MASK_MODES
    weights = prefix_weights(delay, horizon - delay if soft else delay, horizon, "exp" if soft else "zeros")
    return RtcPlan(mode, torch.from_numpy(target)[None], weights, delay)


def reference_chunk(model, obs, plan: RtcPlan) -> tuple[np.ndarray, float]:
    """The reference sampler's chunk and the wall time of its second call (ms; the first warms up)."""
    cfg, dev = model.config, next(model.parameters()).device
    reference = ReferenceExecutor(model, cfg, dev)
    args = (*reference_inputs(cfg, obs, dev), plan.to(dev))
    for _ in range(2):
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            out = reference.sample_actions_rtc(*args)
        torch.cuda.synchronize()
        elapsed = (time.perf_counter() - start) * 1e3
    return out[0].float().cpu().numpy(), elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="pi05", choices=["pi05", "pi0"])
    parser.add_argument("--views", type=int, default=2)
    parser.add_argument("--delay", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--ckpt-root", type=Path, default=Path.home() / ".cache" / "flashrt" / "full")
    parser.add_argument("--out", help="write the result JSON into this folder")
    args = parser.parse_args()

    cfg = get_config(args.model)
    ckpt = ensure_checkpoint(args.ckpt_root, args.model)
    model = load_model_weights(ckpt, cfg, "cuda", torch.float32)
    engine = build_executor(model, cfg, torch.device("cuda"), "auto", EngineOptions(chain_tuning_passes=1))
    obs = random_observation(cfg, np.random.default_rng(0), views=args.views, n_text=20, vocab=1024)
    inputs = (obs.images, obs.tokens, obs.token_mask, obs.state, obs.noise)
    plain = engine.predict_observation(*inputs)
    rows = {}
    for mode in ENGINE_MODES:
        plan = plan_for(mode, plain, args.delay)
        chunk = engine.predict_observation(*inputs, rtc=plan)
        want, reference_ms = reference_chunk(model, obs, plan)
        rows[mode] = {"cosine_vs_reference": cosine(chunk, want), "reference_fp32_ms": round(reference_ms, 1),
                      "capture_s": round(engine.capture_seconds[next(k for k in engine.entries
                                                                     if k[-1] == ("rtc", mode))], 2)}
    graphs = {("plain" if not isinstance(key[-1], tuple) else key[-1][1]): entry.graph
              for key, entry in engine.entries.items()}
    times = interleaved_replay_ms(graphs, args.rounds, args.reps)
    rows = {"plain": {}, **rows}
    for name, row in rows.items():
        row["replay_ms"] = round(times[name], 3)
        row["over_plain_ms"] = round(times[name] - times["plain"], 3)
    result = {**env_info(), "benchmark": "rtc_cost", "model": args.model, "views": args.views,
              "horizon": cfg.action_horizon, "num_steps": cfg.num_steps, "delay": args.delay, "rows": rows,
              "command": "python tools/benchmark_rtc.py " + " ".join(sys.argv[1:])}
    print(f"\nRTC in the graph engine, {args.model} bf16, {args.views} views, horizon {cfg.action_horizon}, "
          f"delay {args.delay} ({result['gpu']}, torch {result['torch']}, {result['date']})")
    print(f"{'mode':<16} {'replay ms':>10} {'+ms':>8} {'cosine':>9} {'reference fp32 ms':>18}")
    for name, row in rows.items():
        cos, ref = row.get("cosine_vs_reference"), row.get("reference_fp32_ms")
        print(f"{name:<16} {row['replay_ms']:>10.3f} {row['over_plain_ms']:>8.3f} "
              f"{'' if cos is None else f'{cos:.6f}':>9} {'' if ref is None else f'{ref:.1f}':>18}")
    if args.out:
        write_result(args.out, result, "rtc_cost", args.model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
