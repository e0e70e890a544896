#!/usr/bin/env python3
"""Where a predict's GPU time goes, kernel by kernel, on the critical path of one CUDA-graph replay.

With programmatic dependent launch a kernel starts before the one ahead of it has finished and then waits, so its
own duration (end - start) counts time spent waiting. What a kernel adds to the predict is its critical-path
increment: its end minus the latest end of every kernel that started before it. The increments of all kernels sum
to the replay's span. This tool profiles replays of the engine's captured predict (torch.profiler / CUPTI records
each kernel of a graph replay, and its copy and memset nodes, which count like kernels here), and prints per
kernel name: launches, summed increment, median increment, and median duration; then the kernel sequences of one
vision layer (layer 13) and one denoising layer (step 5, layer 9) with each kernel's increment.

    python tools/profile_engine_timeline.py --ckpt-root /tmp/full --config pi05 --views 2 --out timeline.json

--image-hw 480 640 profiles camera-sized frames, resized inside the graph (what Policy.predict runs): the kernels
before the vision tower's first norm are the resize's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchmark_engine import PROMPT_TOKENS, engine_options, ensure_checkpoint  # noqa: E402

from flashrt_core.checkpoint import load_model_weights  # noqa: E402
from flashrt_core.config import get_config  # noqa: E402
from flashrt_core.engine import DEFAULT_TEXT_BUCKETS, EngineExecutor, detect_hardware, resolve  # noqa: E402
from flashrt_core.engine.fp8_calibration import calibrate_executor  # noqa: E402
from flashrt_core.engine.gate import random_observation  # noqa: E402


def critical_path(kernels: list[tuple[str, float, float]]) -> list[tuple[str, float, float]]:
    """[(name, start_us, end_us)] in any order -> [(name, increment_us, duration_us)] in start order, where
    increment = end - the latest end among the kernels that started earlier (0 if it ends before that; the
    first kernel's whole duration). The increments sum to the span from the first start to the last end."""
    out, latest = [], None
    for name, start, end in sorted(kernels, key=lambda k: k[1]):
        increment = end - start if latest is None else max(0.0, end - latest)
        out.append((name, increment, end - start))
        latest = end if latest is None else max(latest, end)
    return out


def short(name: str) -> str:
    return name if len(name) <= 60 else name[:57] + "..."


def denoise_layer_span(names: list[str], steps: int, depth: int, step: int = 5,
                       layer: int = 9) -> tuple[int, int] | None:
    """[first, end) indices of one denoising layer in a replay's launches: from the layer's first norm (the last
    norm launch before its attention) to the next layer's. The prefix's attention launches come before the
    denoiser's `steps * depth`. None when the replay has too few."""
    attn = [i for i, name in enumerate(names) if "attn_split" in name]
    first = len(attn) - steps * depth
    if first < 0 or step >= steps or layer + 1 >= depth:
        return None

    def norm_before(i: int) -> int:
        return max(j for j in range(i) if "norm" in names[j])
    return norm_before(attn[first + step * depth + layer]), norm_before(attn[first + step * depth + layer + 1])


def profile_replay(graph: torch.cuda.CUDAGraph, replays: int) -> list[list[tuple[str, float, float]]]:
    from torch.profiler import ProfilerActivity, profile
    graph.replay()
    torch.cuda.synchronize()
    runs = []
    for _ in range(replays):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            graph.replay()
            torch.cuda.synchronize()
        # kernels and the graph's copy / memset nodes: a memset node on the critical path (a library's zeroed
        # workspace, say) shows as its own row instead of as a gap before the next kernel
        runs.append([(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                     if e.device_type.name == "CUDA"])
    return runs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt-root", default="/tmp/full")
    ap.add_argument("--config", default="pi05")
    ap.add_argument("--views", type=int, default=2)
    ap.add_argument("--horizon", type=int, default=10)
    ap.add_argument("--precision", default="bf16", help="as benchmark_engine's variants: bf16, fp8, bf16-no_pdl")
    ap.add_argument("--replays", type=int, default=5)
    ap.add_argument("--text-buckets", nargs="*", type=int, default=list(DEFAULT_TEXT_BUCKETS),
                    help="the engine's text buckets (default: the engine's own)")
    ap.add_argument("--image-hw", nargs=2, type=int, default=None, metavar=("H", "W"),
                    help="camera frames of this size (resized inside the graph), not the model's 224 x 224")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("profile_engine_timeline needs a CUDA GPU")
    dev = torch.device("cuda")
    ckpt = ensure_checkpoint(Path(args.ckpt_root), args.config)
    cfg = get_config(args.config).replace(action_horizon=args.horizon)
    model = load_model_weights(ckpt, cfg, dev, torch.bfloat16)
    opts = engine_options(args.precision, args)
    eng = EngineExecutor(model, cfg, dev, resolve(detect_hardware("auto", dev), opts))
    obs = random_observation(cfg, np.random.default_rng(args.views), views=args.views, n_text=PROMPT_TOKENS,
                             image_hw=tuple(args.image_hw) if args.image_hw else None, vocab=1024)
    if eng.fp8_calibration is not None:
        calibrate_executor(eng, [obs])                # an FP8 engine's scales from the profiled observation
    eng.predict_observation(obs.images, obs.tokens, obs.token_mask, obs.state, obs.noise)
    entry = next(e for k, e in eng.entries.items() if len(k[1]) == args.views)
    runs = [critical_path(k) for k in profile_replay(entry.graph, args.replays)]
    n = len(runs[0])
    if any(len(r) != n for r in runs):
        sys.exit(f"kernel counts differ between replays: {[len(r) for r in runs]}")
    # per kernel position: the median increment / duration over the replays
    inc = np.median(np.array([[k[1] for k in r] for r in runs]), axis=0)
    dur = np.median(np.array([[k[2] for k in r] for r in runs]), axis=0)
    names = [k[0] for k in runs[0]]
    by_name: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        by_name.setdefault(name, []).append(i)
    table = sorted(({"name": name, "count": len(ix), "increment_us": float(inc[ix].sum()),
                     "median_increment_us": float(np.median(inc[ix])), "median_duration_us": float(np.median(dur[ix]))}
                    for name, ix in by_name.items()), key=lambda r: -r["increment_us"])
    def kernels_between(a: int, b: int) -> list[dict]:
        return [{"name": names[i], "increment_us": float(inc[i]), "duration_us": float(dur[i])} for i in range(a, b)]
    span = denoise_layer_span(names, cfg.num_steps, cfg.expert.depth) if cfg.expert.depth > 10 else None
    layer = kernels_between(*span) if span else []
    # one vision layer: the predict's first norm launches are the vision tower's, two per layer (LayerNorm 1 and 2)
    norms = [i for i, name in enumerate(names) if "residual_norm" in name]
    vision_layer = []
    if len(norms) > 2 * cfg.vision.depth and cfg.vision.depth > 13:
        vision_layer = kernels_between(norms[26], norms[28])
    # what runs before the vision tower's first norm: the preprocessing (the resize of camera frames, the patch rows)
    # and the patch embedding
    before_vision = kernels_between(0, norms[0]) if norms else []
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    total = float(inc.sum())
    print(f"{env['gpu']}, torch {env['torch']}, {env['time_utc']}; {args.config} {args.views} views h{args.horizon} "
          f"{args.precision}: {n} kernels, critical path {total / 1e3:.3f} ms (median of {args.replays} replays)")
    print(f"before the vision tower (preprocessing, patch embedding): {len(before_vision)} kernels, "
          f"{sum(r['increment_us'] for r in before_vision):.1f} us")
    print("| kernel | launches | increment sum (us) | median increment (us) | median duration (us) |")
    print("|---|---|---|---|---|")
    for r in table[:25]:
        print(f"| {short(r['name'])} | {r['count']} | {r['increment_us']:.1f} | {r['median_increment_us']:.2f} | "
              f"{r['median_duration_us']:.2f} |")
    for title, rows in (("before the vision tower", before_vision), ("one vision layer (layer 13)", vision_layer),
                        ("one denoising layer (step 5, layer 9)", layer)):
        if not rows:
            continue
        print(f"\n{title}, in launch order:")
        print("| kernel | increment (us) | duration (us) |")
        print("|---|---|---|")
        for r in rows:
            print(f"| {short(r['name'])} | {r['increment_us']:.2f} | {r['duration_us']:.2f} |")
        print(f"| layer total | {sum(r['increment_us'] for r in rows):.2f} | |")
    if args.out is not None:
        args.out.write_text(json.dumps({"env": env, "args": {k: str(v) for k, v in vars(args).items()},
                                        "critical_path_ms": total / 1e3, "kernels": n, "by_name": table,
                                        "vision_layer": vision_layer, "layer": layer,
                                        "before_vision": before_vision}, indent=1))


if __name__ == "__main__":
    main()
