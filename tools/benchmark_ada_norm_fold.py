"""The adaRMSNorm folded into the decoder GEMMs around it (Op.ADA_NORM_FOLD), measured against the separate norm
kernels in one engine: the whole denoise of full-size pi0.5 (10 steps, 18 layers, 2 views, bf16), captured as a
graph, with every decoder GEMM forced to the shared-memory TMA kernels (kernels/flashrt_kernels/smem_gemm.py, where the fold
lives), for each launch policy (ops.LAUNCH_POLICIES) and split-K of the O / down GEMMs, fold on and off, the
configurations interleaved over several rounds. Then each half alone over the expert's 18 layers: the O GEMM with
norm_out against the O GEMM + ada_rms_norm, the gate/up GEMM with norm_in against the plain one. Also the cosine of
the actions, fold against no fold, same inputs.

    python3 tools/benchmark_ada_norm_fold.py --ckpt-root /tmp/full --out docs/benchmarks

Writes ada_norm_fold_<gpu>_<date>.json / .md into --out; prints the table last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flashrt_core.checkpoint import load_model_weights  # noqa: E402
from flashrt_core.config import get_config  # noqa: E402
from flashrt_core.engine import EngineOptions, build_executor  # noqa: E402
from flashrt_core.engine.ops import LAUNCH_POLICIES, Ops, SmemConfig  # noqa: E402
from tools.benchmark_engine import env_info, ensure_checkpoint  # noqa: E402
from tools.denoise_timing import (ab_cells, cosine, denoise_actions, denoise_inputs, denoise_ms,  # noqa: E402
                                  write_report)

SPLITS = {"o2_down4": (2, 4), "o4_down4": (4, 4), "o4_down8": (4, 8)}
POLICIES = ("all", "norms", "none")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt-root", default="/tmp/full")
    ap.add_argument("--out", default="docs/benchmarks")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--replays", type=int, default=30)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    cfg = get_config("pi05")
    model = load_model_weights(ensure_checkpoint(Path(args.ckpt_root), "pi05"), cfg, dev, torch.bfloat16)
    engine = build_executor(model, cfg, dev, "auto", EngineOptions(chain_tuning=False))
    ops: Ops = engine.ops
    if not ops.ada_fold:
        raise SystemExit(f"the fold cannot run here: dispatch {engine.dispatch.summary()}")
    inp = denoise_inputs(engine)
    ws = inp.ws
    g = torch.Generator(device=dev).manual_seed(1)

    def setup(policy: str, split: str, fold: bool) -> None:
        o, down = SPLITS[split]
        ops.decoder_impl.update(qkv=SmemConfig(1), gate_up=SmemConfig(1), o=SmemConfig(o), down=SmemConfig(down))
        ops.early_sites = LAUNCH_POLICIES[policy]
        ops.ada_fold = fold
        assert ops.ada_fold_applies(engine.suffix_len) == fold

    # the actions, fold against no fold (same noise, caches and picks)
    actions = {}
    for fold in (False, True):
        setup("all", "o2_down4", fold)
        actions[fold] = denoise_actions(engine, inp)
    cosine_fold = cosine(actions[False], actions[True])

    times: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for policy in POLICIES:
            for split in SPLITS:
                for fold in (False, True):
                    setup(policy, split, fold)
                    key = f"{policy}|{split}|{'fold' if fold else 'separate'}"
                    times.setdefault(key, []).append(denoise_ms(engine, inp, args.replays))

    # each half alone, over the expert's layers (no neighbours: what the kernel itself adds)
    setup("none", "o2_down4", True)
    layers = engine.weights.expert
    e = cfg.expert
    S = engine.suffix_len
    x_o = torch.randn(S, layers[0].o.parts[0][0].shape[1], device=dev, generator=g).to(torch.bfloat16)
    residual = torch.randn(S, e.width, device=dev, generator=g)
    vec = [torch.randn(e.width, device=dev, generator=g) for _ in range(3)]
    y = torch.empty(S, e.width, device=dev, dtype=torch.bfloat16)
    fold_buf = ws.ada_fold
    bias = engine.weights.ada_fold_bias()[1][0]
    halves = {}
    for split in (2, 4):
        ops.decoder_impl["o"] = SmemConfig(split)

        def separate_out():
            for lin in layers:
                ops.ada_norm(ops.decoder(x_o, lin.o, "o"), residual, vec[0], vec[1], vec[2], y, e.eps)

        def folded_out():
            for lin in layers:
                ops.decoder(x_o, lin.o, "o", norm_out=ops.k.NormOut(residual, vec[0], vec[1], fold_buf.xs[1],
                                                                    fold_buf.sq[1], fold_buf.counter[1]))
        halves[f"o s{split} + ada_rms_norm"] = Ops.graph_time_us(separate_out, 4, 15) / len(layers)
        halves[f"o s{split} norm_out"] = Ops.graph_time_us(folded_out, 4, 15) / len(layers)
    halves["gate_up"] = Ops.graph_time_us(lambda: [ops.decoder(y, lin.gate_up, "gate_up") for lin in layers],
                                          4, 15) / len(layers)
    norm_in = ops.k.NormIn(fold_buf.sq[1], bias[0], e.eps)
    halves["gate_up norm_in"] = Ops.graph_time_us(
        lambda: [ops.decoder(y, lin.gate_up, "gate_up", norm_in=norm_in) for lin in layers], 4, 15) / len(layers)

    info = env_info()
    result = {"env": info, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "denoise_ms": times, "halves_us_per_layer": halves, "actions_cosine_fold_vs_separate": cosine_fold,
              "rounds": args.rounds, "replays": args.replays}
    lines = [f"# adaRMSNorm fold vs separate norms: {torch.cuda.get_device_name()}", "",
             f"{json.dumps(info)}; {result['date']}. Full-size pi0.5, bf16, 2 views, horizon 10; every decoder GEMM "
             f"the shared-memory TMA kernel. Denoise graph replay, median of {args.replays} replays per capture, "
             f"{args.rounds} rounds interleaved (min / median over rounds). Actions cosine, fold vs separate: "
             f"{cosine_fold:.6f}.", "",
             "| launch policy | O / down split-K | separate (ms) | fold (ms) | fold - separate (ms) |",
             "|---|---|---|---|---|"]
    for policy in POLICIES:
        for split in SPLITS:
            lines.append(f"| {policy} | {split} | "
                         f"{ab_cells(times[f'{policy}|{split}|separate'], times[f'{policy}|{split}|fold'])} |")
    lines += ["", "| each half alone, 18 layers | us per layer |", "|---|---|"]
    lines += [f"| {k} | {v:.2f} |" for k, v in halves.items()]
    write_report(args.out, "ada_norm_fold", result, lines)


if __name__ == "__main__":
    main()
