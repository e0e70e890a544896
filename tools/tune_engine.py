#!/usr/bin/env python3
"""Prepare the engine's tuning cache from the best of several measured loads, then check that a load from it runs
as fast.

The load-time tuning (the decoder GEMMs in the captured denoiser, the launch policy, the prefix and vision
attention) ends in other picks from one load to the next: on the H200, twelve engines of pi0.5
ended in four launch policies, and two engines with the same options differed by up to ~0.4 ms per predict
(2026-12-01). A robot's node reads its picks from the tuning cache
(flashrt_ros parameter engine_tuning_cache), so whichever load wrote the entry decides every later start. This
command loads the policy --loads times with the tuning measured, captures each load's graph for the same camera
frames and prompt, times all those graphs in turn (interleaved rounds: the same clock and memory drift for each),
and stores the fastest load's picks under the engine's own key in --tuning-cache. Then it loads once more from
that entry and times its graph: whether the stored picks give the stored time again, or the spread between loads
comes from something the picks do not hold.

    python tools/tune_engine.py --checkpoint DIR --tuning-cache DIR [--loads 3] [--views 2] [--fp8]
        [--image-hw 480 640] [--out FILE.json]

The engine options are EngineOptions' defaults with the FLASHRT_* environment applied (as the node's), --fp8 on
top; the key of the entry covers them, so a node started with other options measures instead of reading it. Needs
a CUDA GPU: the tuning and the graphs exist only there.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flashrt_core  # noqa: E402
from flashrt_core.engine import EngineOptions  # noqa: E402

PROMPT = "pick up the red block and put it in the bowl"


def load(checkpoint: str, fp8: bool, tuning_cache: str):
    """The policy loaded on the GPU with the tuning measured ("" cache) or read from `tuning_cache`."""
    options = EngineOptions.from_env(EngineOptions(fp8=fp8, tuning_cache=tuning_cache))
    return flashrt_core.load_model(checkpoint, device="cuda", engine_options=options)


def captured_graph(policy, images, state) -> torch.cuda.CUDAGraph:
    """One predict on the frames (which captures the graph for their shapes and the prompt's text bucket) and
    that graph. An FP8 policy is calibrated on the same frames first."""
    if policy.fp8 and not policy.fp8_calibrated:
        policy.calibrate([(images, PROMPT, state)])
    policy.predict(images, PROMPT, state)
    graphs = [entry.graph for entry in policy.executor.entries.values() if entry.graph is not None]
    if len(graphs) != 1:
        raise RuntimeError(f"expected one captured graph after one predict, found {len(graphs)}")
    return graphs[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="checkpoint directory (with tokenizer and norm stats)")
    parser.add_argument("--tuning-cache", required=True, help="directory the entry is stored in (the node's "
                        "engine_tuning_cache)")
    parser.add_argument("--loads", type=int, default=3, help="measured loads to choose from (>= 2)")
    parser.add_argument("--views", type=int, default=2, help="camera views per call")
    parser.add_argument("--image-hw", type=int, nargs=2, default=[480, 640], metavar=("H", "W"),
                        help="camera frame size (resized inside the graph)")
    parser.add_argument("--fp8", action="store_true", help="the FP8 engine (EngineOptions.fp8)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds")
    parser.add_argument("--reps", type=int, default=30, help="replays per graph and round")
    parser.add_argument("--out", default="", help="JSON file for the results; empty = print only")
    args = parser.parse_args(argv)
    if args.loads < 2:
        parser.error(f"--loads must be at least 2 to choose between loads, got {args.loads}")
    if not torch.cuda.is_available():
        print("tune_engine: needs a CUDA GPU (the load-time tuning and the graphs run only there)", file=sys.stderr)
        return 2
    from flashrt_core.engine import EngineExecutor
    from flashrt_core.engine.timing import graph_replay_ms, interleaved_replay_ms
    from flashrt_core.engine.tuning_cache import TuningCache

    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (*args.image_hw, 3), dtype=np.uint8) for _ in range(args.views)]
    policies, graphs, loads, state = [], {}, [], None
    for i in range(args.loads):
        t0 = time.perf_counter()
        policy = load(args.checkpoint, args.fp8, "")
        engine = policy.executor
        if not isinstance(engine, EngineExecutor) or not engine.use_graph or engine.tuning_source != "measured":
            raise SystemExit(f"tune_engine: load {i} did not give a graph engine that measured its tuning "
                             f"({getattr(engine, 'name', engine)}, tuning {getattr(engine, 'tuning_source', None)})")
        if state is None:
            state = rng.uniform(-1, 1, policy.state_dim).astype(np.float32)
        graphs[i] = captured_graph(policy, images, state)
        loads.append({"load": i, "load_s": time.perf_counter() - t0, "picks": engine.tuning_picks(),
                      "key": engine.tuning_key(engine.dtype)})
        policies.append(policy)
        print(f"load {i}: {loads[-1]['load_s']:.1f} s, picks {loads[-1]['picks']}", flush=True)
    if any(entry["key"] != loads[0]["key"] for entry in loads):
        raise SystemExit("tune_engine: the loads have different tuning keys (options changed between them?)")
    times = interleaved_replay_ms(graphs, args.rounds, args.reps)
    for entry in loads:
        entry["replay_ms"] = times[entry["load"]]
    best = min(times, key=times.get)
    cache = TuningCache(args.tuning_cache)
    path = cache.store(loads[best]["key"], loads[best]["picks"],
                       {"tune_engine": {"replay_ms": {str(i): t for i, t in times.items()}, "kept": best}})
    if path is None:
        raise SystemExit(f"tune_engine: could not write the entry into {args.tuning_cache}")
    del graphs, policies, policy, engine        # the loads' engines and graphs freed before the load from the cache
    torch.cuda.empty_cache()

    t0 = time.perf_counter()
    again = load(args.checkpoint, args.fp8, args.tuning_cache)
    reload_s = time.perf_counter() - t0
    if again.executor.tuning_source != "cache" or again.executor.tuning_picks() != loads[best]["picks"]:
        raise SystemExit(f"tune_engine: the load from {path} did not use the stored picks "
                         f"(tuning {again.executor.tuning_source}, picks {again.executor.tuning_picks()})")
    reloaded = float(np.median(graph_replay_ms(captured_graph(again, images, state), args.rounds * args.reps)))

    gpu = torch.cuda.get_device_name()
    print(f"\n{gpu}, torch {torch.__version__}, {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}; "
          f"{'FP8' if args.fp8 else 'bf16'}, {args.views} views {args.image_hw[0]}x{args.image_hw[1]}")
    print("| load | launch policy | replay median (ms, interleaved) | load (s) |")
    print("|---|---|---|---|")
    for entry in loads:
        mark = " (stored)" if entry["load"] == best else ""
        print(f"| {entry['load']}{mark} | {entry['picks'].get('launch_policy')} | {entry['replay_ms']:.3f} | "
              f"{entry['load_s']:.1f} |")
    print(f"| from the cache | {again.executor.tuning_picks().get('launch_policy')} | {reloaded:.3f} (alone) | "
          f"{reload_s:.1f} |")
    print(f"stored: {path}")
    if args.out:
        result = {"gpu": gpu, "torch": torch.__version__, "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(),
                  "fp8": args.fp8, "views": args.views, "image_hw": args.image_hw, "prompt": PROMPT,
                  "loads": [{k: v for k, v in e.items() if k != "key"} for e in loads], "kept": best,
                  "entry": str(path), "reloaded": {"replay_ms": reloaded, "load_s": reload_s}}
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
