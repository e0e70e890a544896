"""Each pi0.5 expert layer in one persistent launch (Op.DENOISE_LAYER, kernels/flashrt_kernels/denoise_layer.py) against the tuned
chain of separate kernels, in one engine: the whole denoise of full-size pi0.5 (10 steps, 2 views, horizon 10,
bf16) captured as a graph three ways, interleaved over several rounds: the separate kernels the load-time tuning
picked ("separate", the default), the layer kernel with grid barriers between its phases and its L2 weight
prefetch ("grid_prefetch"), without the prefetch ("grid") and as a launch per phase ("phases"); the cosine of
the actions of each against the separate path, same inputs, and the count of barriers that gave up waiting
(must be 0).

Weights: a full-size checkpoint (--ckpt-root, written there when missing), or with --random-init the model's
parameters drawn on the GPU (tools/denoise_timing.py random_model).

    python3 tools/benchmark_denoise_layer.py --random-init --out docs/benchmarks
    python3 tools/benchmark_denoise_layer.py --phase-breakdown --out docs/benchmarks

Writes denoise_layer_<gpu>_<date>.json / .md into --out; prints the table last. --phase-breakdown instead times
the kernel alone on random inputs at the expert's shapes (10 rows, 560 prefix keys), each phase as a launch of its
own and the whole layer with its barriers, for several tile configurations (denoise_layer_phases_*).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flashrt_core.engine import EngineOptions, build_executor  # noqa: E402
from tools.benchmark_engine import env_info  # noqa: E402
from tools.denoise_timing import (ab_cells, add_ab_args, cosine, denoise_actions, denoise_inputs,  # noqa: E402
                                  denoise_ms, pi05_model, random_layer_case, write_report)

# the engine's forms: ops.denoise_layer, and for the layer kernel's configurations written after session 15
# (ops.denoise_layer_config / ops.denoise_layer_splits) "grid" with them
FORMS = ("separate", "grid_prefetch", "grid", "phases", "grid+merge_in_attention", "grid+per_sm2",
         "grid+per_sm2+merge_in_attention+preload")


# Session 15 measured the defaults against 128 / 512-wide K steps for QKV and gate/up and 4 / 16 key splits
# (docs/benchmarks/denoise_layer_phases_h200_2026-12-01_v3.md); these are the forms written after it.
_TWO_PER_SM = {"bn_o": 32, "bn_gu": 16, "bn_d": 32, "per_sm": 2, "splits": 16}
_FLAGS = {"merge_in_attention": {"merge_in_attention": True}, "per_sm2": _TWO_PER_SM, "preload": {"preload": True}}


def config_change(flags: str) -> dict:
    """LayerConfig fields (and "splits", the scratch's key splits) of "+"-joined flags, e.g. "per_sm2+preload"."""
    change: dict = {}
    for flag in filter(None, flags.split("+")):
        change.update(_FLAGS[flag])
    return change


BREAKDOWN_CONFIGS = {name or "default": config_change(name) for name in
                     ("", "merge_in_attention", "per_sm2", "per_sm2+merge_in_attention",
                      "per_sm2+merge_in_attention+preload")}


def phase_breakdown(out_dir: str, launches: int = 18, replays: int = 20) -> None:
    """Each phase of kernels/flashrt_kernels/denoise_layer.py alone, and the whole layer (grid barriers, with and without the L2
    prefetch), us per launch: `launches` launches captured in one graph, median of `replays` replays."""
    import numpy as np

    from flashrt_core.engine.graph_executor import graph_replay_ms
    from flashrt_core.engine.kernel_import import load_kernels
    K = load_kernels()
    S, P, W, H, dh, F = 10, 560, 1024, 8, 256, 4096
    residual, x_prev, tables, weights, kc, vc, pos, cos, sin, key_bias, visible = random_layer_case(
        S, P, W, H, dh, F, True, 3, "cuda", torch.bfloat16)
    x_out = torch.empty_like(residual)
    results: dict[str, dict[str, float]] = {}
    inside: dict[str, dict[str, float]] = {}
    for name, change in BREAKDOWN_CONFIGS.items():
        change = dict(change)
        splits = change.pop("splits", 8)
        cfg = K.LayerConfig(**{**K.LayerConfig.fit(W, F, dh).__dict__, **change})
        scratch = K.DenoiseLayerScratch.allocate(S, W, H, dh, F, launches=launches, dtype=torch.bfloat16,
                                                 device="cuda", splits=splits)
        row = {}
        forms = [(p, dict(grid_sync=False, phases=(i, i))) for i, p in enumerate(K.DENOISE_LAYER_PHASES)]
        forms += [("layer, a launch per phase", dict(grid_sync=False)), ("layer, grid", dict(grid_sync=True)),
                  ("layer, grid + prefetch", dict(grid_sync=True, prefetch=True))]
        for label, kw in forms:
            def run(base=0):
                for j in range(launches):
                    K.denoise_layer(residual, x_prev, x_out, tables, weights, kc, vc, pos, cos, sin, key_bias,
                                    visible, scratch, base + j, H, dh ** -0.5, cfg=cfg, **kw)
            scratch.counters.zero_()
            run()                                      # compile and warm up
            torch.cuda.synchronize()
            scratch.counters.zero_()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                scratch.counters.zero_()
                run()
            row[label] = float(np.median(graph_replay_ms(graph, replays))) * 1000 / launches
            del graph
        row["barrier errors"] = int(scratch.errors.item())
        results[name] = row
        # inside one grid launch: the critical path per phase and barrier from the programs' time stamps
        programs = K.grid_programs(W, H, dh, F, splits, cfg, torch.cuda.get_device_properties(0).multi_processor_count)
        stamps = torch.zeros(programs, 16, device="cuda", dtype=torch.int64)
        per_launch = []
        for j in range(replays):
            scratch.counters.zero_()
            K.denoise_layer(residual, x_prev, x_out, tables, weights, kc, vc, pos, cos, sin, key_bias, visible,
                            scratch, 0, H, dh ** -0.5, cfg=cfg, grid_sync=True, stamps=stamps)
            torch.cuda.synchronize()
            per_launch.append(K.phase_stamps_us(stamps, cfg.merge_in_attention))
        inside[name] = {k: float(np.median([p[k] for p in per_launch])) for k in per_launch[0]}
        print(name, row, inside[name], flush=True)
    info = env_info()
    labels = list(next(iter(results.values())))
    lines = [f"# kernels/flashrt_kernels/denoise_layer.py, phase by phase: {torch.cuda.get_device_name()}", "",
             f"{info}. pi0.5's expert layer at 10 rows, 560 prefix keys, random bf16 inputs; us per launch (a graph "
             f"of {launches} launches, median of {replays} replays). Configurations: LayerConfig.fit with "
             f"{BREAKDOWN_CONFIGS}.", "",
             "| phase | " + " | ".join(results) + " |", "|---|" + "---|" * len(results)]
    for label in labels:
        lines.append(f"| {label} | " + " | ".join(f"{results[c][label]:.2f}" if isinstance(results[c][label], float)
                                                  else str(results[c][label]) for c in results) + " |")
    lines += ["", "Inside one grid launch (launched alone, its programs' global-timer stamps; median of "
              f"{replays} launches), us of critical path per phase (from the last program's release of the barrier "
              "before it to the last arrival at the barrier after it) and per barrier (last arrival to last "
              "release); the timer's resolution is the GPU's:", "",
              "| | " + " | ".join(inside) + " |", "|---|" + "---|" * len(inside)]
    for key in dict.fromkeys(k for row in inside.values() for k in row):
        lines.append(f"| {key} | " + " | ".join(f"{inside[c][key]:.2f}" if key in inside[c] else "" for c in inside)
                     + " |")
    write_report(out_dir, "denoise_layer_phases", {"env": info, "us_per_launch": results,
                                                   "inside_grid_launch_us": inside}, lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_ab_args(ap)
    ap.add_argument("--chain-tuning-passes", type=int, default=1)
    ap.add_argument("--phase-breakdown", action="store_true")
    args = ap.parse_args()
    if args.phase_breakdown:
        phase_breakdown(args.out)
        return
    dev = torch.device("cuda")
    cfg, model, weights = pi05_model(args, dev)
    engine = build_executor(model, cfg, dev, "auto",
                            EngineOptions(denoise_layer=True, chain_tuning_passes=args.chain_tuning_passes,
                                          overrides={"denoise_layer": "grid_prefetch"}))
    ops = engine.ops
    if ops.denoise_layer != "grid_prefetch":
        raise SystemExit(f"the persistent layer kernel cannot run here: dispatch {engine.dispatch.summary()}")
    from flashrt_core.engine.kernel_import import load_kernels
    K = load_kernels()
    fitted = K.LayerConfig.fit(cfg.expert.width, cfg.expert.mlp_dim, cfg.expert.head_dim).__dict__
    inputs = {}

    def use(form: str):
        """Set the engine's ops to `form`; its denoise inputs (one workspace per scratch shape, same seed)."""
        base, _, flags = form.partition("+")
        ops.denoise_layer = base
        change = config_change(flags)
        splits = change.pop("splits", 8)
        ops.denoise_layer_config = K.LayerConfig(**{**fitted, **change}) if change else None
        ops.denoise_layer_splits = splits
        if splits not in inputs:              # a workspace whose scratch has that many key splits (made while a
            ops.denoise_layer = "grid"         # layer form is set: the separate form's workspace would have none)
            inputs[splits] = denoise_inputs(engine, seed=1)
            ops.denoise_layer = base
        return inputs[splits]

    actions, times = {}, {form: [] for form in FORMS}
    for form in FORMS:
        actions[form] = denoise_actions(engine, use(form))
    cosines = {form: cosine(actions["separate"], actions[form]) for form in FORMS[1:]}
    for _ in range(args.rounds):
        for form in FORMS:
            times[form].append(denoise_ms(engine, use(form), args.replays))
    errors = sum(int(inp.ws.denoise_layer.errors.item()) for inp in inputs.values())

    info = env_info()
    picks = {k: str(v) for k, v in ops.decoder_impl.items()}
    result = {"env": info, "weights": weights,
              "denoise_ms": times, "actions_cosine_vs_separate": cosines, "barrier_errors": errors,
              "separate_picks": picks, "launch_policy": ops.launch_policy, "rounds": args.rounds,
              "replays": args.replays}
    lines = [f"# Persistent expert layers vs the separate kernels: {torch.cuda.get_device_name()}", "",
             f"{info}. Full-size pi0.5 ({result['weights']}), bf16, 2 views, horizon 10. Denoise graph replay "
             f"(10 steps x 18 layers), median of {args.replays} replays per capture, {args.rounds} rounds "
             f"interleaved (min / median over rounds). Separate path: the load-time tuning's picks {picks}, launch "
             f"policy {ops.launch_policy}. Actions cosine against the separate path: "
             + ", ".join(f"{k} {v:.6f}" for k, v in cosines.items()) + f"; barriers that gave up: {errors}.", "",
             "| form | separate (ms) | form (ms) | form - separate (ms) |", "|---|---|---|---|"]
    for form in FORMS[1:]:
        lines.append(f"| {form} | {ab_cells(times['separate'], times[form])} |")
    write_report(args.out, "denoise_layer", result, lines)


if __name__ == "__main__":
    main()
