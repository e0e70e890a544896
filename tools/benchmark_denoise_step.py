"""The fused denoising-step ends (Op.FUSED_DENOISE_STEP, kernels/flashrt_kernels/denoise_step.py) against the separate kernels, in one
engine: the whole denoise of full-size pi0.5 (10 steps, 2 views, horizon 10, bf16) captured as a graph, every
decoder GEMM on the shared-memory TMA kernels (split-K 2 for O, 4 for down) under each launch policy, fused and
separate interleaved over several rounds; and the cosine of the actions, fused against separate, same inputs.

Weights: a full-size checkpoint (--ckpt-root, written there when missing), or with --random-init the model's
parameters filled in place on the GPU (normal, std 0.02: the timing does not depend on the values, and the load
takes seconds instead of a checkpoint write).

    python3 tools/benchmark_denoise_step.py --random-init --out docs/benchmarks/$(date +%F)

Writes denoise_step_<gpu>_<date>.json / .md into --out; prints the table last.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flashrt_core.engine import EngineOptions, build_executor  # noqa: E402
from flashrt_core.engine.kernel_configs import LAUNCH_POLICIES, SmemConfig  # noqa: E402
from tools.benchmark_engine import env_info  # noqa: E402
from tools.denoise_timing import (ab_cells, add_ab_args, cosine, denoise_actions, denoise_inputs,  # noqa: E402
                                  denoise_ms, pi05_model, write_report)

POLICIES = ("all", "norms", "none")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_ab_args(ap)
    args = ap.parse_args()
    dev = torch.device("cuda")
    cfg, model, weights = pi05_model(args, dev)
    engine = build_executor(model, cfg, dev, "auto", EngineOptions(chain_tuning=False, fused_denoise_step=True))
    ops = engine.ops
    if not ops.fused_denoise_step:
        raise SystemExit(f"the fused step ends cannot run here: dispatch {engine.dispatch.summary()}")
    ops.decoder_impl.update(qkv=SmemConfig(1), gate_up=SmemConfig(1), o=SmemConfig(2), down=SmemConfig(4))
    inp = denoise_inputs(engine, seed=1)
    actions = {}
    for fused in (False, True):
        ops.fused_denoise_step, ops.early_sites = fused, LAUNCH_POLICIES["all"]
        actions[fused] = denoise_actions(engine, inp)
    cos = cosine(actions[False], actions[True])

    times: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for policy in POLICIES:
            for fused in (False, True):
                ops.fused_denoise_step, ops.early_sites = fused, LAUNCH_POLICIES[policy]
                key = f"{policy}|{'fused' if fused else 'separate'}"
                times.setdefault(key, []).append(denoise_ms(engine, inp, args.replays))

    info = env_info()
    result = {"env": info, "weights": weights,
              "denoise_ms": times, "actions_cosine_fused_vs_separate": cos, "rounds": args.rounds,
              "replays": args.replays}
    lines = [f"# Fused denoising-step ends vs separate kernels: {torch.cuda.get_device_name()}", "",
             f"{json.dumps(info)}. Full-size pi0.5 ({result['weights']}), bf16, 2 views, horizon 10; decoder GEMMs "
             f"on the TMA kernels (O split 2, down split 4). Denoise graph replay, median of {args.replays} "
             f"replays per capture, {args.rounds} rounds interleaved (min / median over rounds). Actions cosine, "
             f"fused vs separate: {cos:.6f}.", "",
             "| launch policy | separate (ms) | fused (ms) | fused - separate (ms) |", "|---|---|---|---|"]
    for policy in POLICIES:
        lines.append(f"| {policy} | {ab_cells(times[f'{policy}|separate'], times[f'{policy}|fused'])} |")
    write_report(args.out, "denoise_step", result, lines)


if __name__ == "__main__":
    main()
