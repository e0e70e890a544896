"""Benchmark the public API: flashrt_core.load_model(...).predict(images, prompt, state) end to end.

What a ROS node pays per call: input validation, prompt tokenization (cached), state normalization and
discretization, noise drawing, the executor (the graph engine on CUDA: staging, one graph replay with the
resize inside, one copy out) and unnormalization. Camera-sized uint8 frames (480x640) in host memory ->
actions in host memory. tools/benchmark_engine.py measures the engine alone; this is the number a user sees.
Each row names the prompt's token count and the text bucket it runs in: pi0.5's prompt carries the state as 32
numbers in text (142 tokens with the fixtures' tokenizer), far longer than the engine benchmark's 48.

    python tools/benchmark_policy_predict.py --checkpoint DIR [--views 2] [--calls 200] [--out docs/benchmarks/<date>]
        [--tuning-cache DIR]

--tuning-cache DIR (an empty directory) measures the load with the engine's tuning cache instead: three loads with
the GPU resize, the cache off, then on twice (the first measures and stores the picks, the second reads them; the
"tuning" column says which), so the load seconds show what the cache saves.

--host-unnormalize adds a load with the GPU resize whose actions are unnormalized on the host after the copy out
(gpu_unnormalize=False), beside the default that unnormalizes inside the graph: the A/B of that switch.

--spin-sweep 0 1 3 10 (any machine) times predict's host steps right after the thread spun that many ms: whether
they run slower the longer they have not run, whatever the thread did meanwhile.

--cpu-engine (a machine without a GPU) runs the graph engine's executor eagerly on the CPU (its plain-PyTorch ops)
instead of the reference path, so the host steps of the GPU path (the frames staged for predict_observation, the
actions unnormalized in the graph or on the host) can be timed here; its predict times are the CPU's, not a GPU's.

--host-trace N (on a GPU) profiles N more calls of each load and splits each into the host's work before the GPU,
the copy in, the wait for the graph launch, the replay, the copy out and the host after it (tools/host_trace.py):
where predict's time beyond the graph goes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flashrt_core  # noqa: E402
from flashrt_core.engine import EngineOptions  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host_trace import SEGMENTS, host_steps_us, spin_sweep_us, summarize, trace_calls  # noqa: E402

WARMUP_CALLS = 20


def percentiles(samples_s: list[float]) -> dict[str, float]:
    ms = np.asarray(samples_s) * 1e3
    return {"median_ms": float(np.median(ms)), "p90_ms": float(np.percentile(ms, 90)),
            "p99_ms": float(np.percentile(ms, 99)), "max_ms": float(ms.max())}


def cpu_engine_policy(policy, options: EngineOptions, gpu_preprocess: bool, gpu_unnormalize: bool):
    """The same checkpoint's Policy run by the graph engine's executor, eagerly on the CPU with its plain-PyTorch
    ops and the normalizer's action affine (as load_model gives it on a GPU); `policy` (the CPU reference path)
    keeps the model."""
    from flashrt_core.api import Policy
    from flashrt_core.engine import eager_cpu_dispatch
    from flashrt_core.engine import EngineExecutor

    if policy.device.type != "cpu" or policy.model is None:
        raise SystemExit("--cpu-engine needs --device cpu")
    cfg = policy.config
    engine = EngineExecutor(policy.model, cfg, policy.device, eager_cpu_dispatch(options), dtype=torch.float32,
                            action_affine=policy.normalizer.action_affine(cfg.max_action_dim))
    return Policy(policy.model, cfg, engine, policy.tokenizer, policy.normalizer, policy.device, policy.model_id,
                  gpu_preprocess, gpu_unnormalize)


def replay_median_ms(executor, bucket: int | None, calls: int) -> float | None:
    """GPU time of the captured graph that served the calls (the graph engine's entry of this text bucket),
    median of `calls` replays; None without one (the reference path, the CPU). predict minus this is what the
    host adds: validation, tokenization, staging the frames, the copies in and out."""
    entries = getattr(executor, "entries", {})
    graphs = [e.graph for key, e in entries.items() if key[3] == bucket and e.graph is not None]
    if len(graphs) != 1:
        return None
    from flashrt_core.engine.timing import graph_replay_ms
    return float(np.median(graph_replay_ms(graphs[0], calls)))


def _load_name(row: dict) -> str:
    """Where a load resizes the frames and unnormalizes the actions, for the tables' labels."""
    return (f"{'GPU' if row['gpu_preprocess'] else 'host'} resize, "
            f"actions unnormalized {'in the graph' if row['gpu_unnormalize'] else 'on the host'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="checkpoint directory (e.g. from flashrt_core.fixtures)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--views", type=int, default=2)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", default="", help="folder for JSON + markdown results; empty = print only")
    parser.add_argument("--tuning-cache", default="",
                        help="a directory: load with the tuning cache off, then on twice, instead of the two resizes")
    parser.add_argument("--host-unnormalize", action="store_true",
                        help="one more GPU-resize load that unnormalizes the actions on the host (A/B)")
    parser.add_argument("--spin-sweep", type=float, nargs="+", default=[], metavar="MS",
                        help="per load: predict's host steps timed right after the thread spun MS ms (0: back to "
                             "back), no GPU involved: do they slow down with the time since they last ran?")
    parser.add_argument("--cpu-engine", action="store_true",
                        help="no GPU: the graph engine's executor run eagerly on the CPU, for the GPU path's "
                             "host steps")
    parser.add_argument("--host-trace", type=int, default=0, metavar="N",
                        help="on a GPU: profile N more calls per load and split them into host and GPU segments")
    args = parser.parse_args(argv)

    # (GPU resize, tuning cache directory or "", unnormalize in the graph)
    loads = ([(True, "", True), (True, args.tuning_cache, True), (True, args.tuning_cache, True)]
             if args.tuning_cache else
             [(True, "", True)] + ([(True, "", False)] if args.host_unnormalize else []) + [(False, "", True)])
    rows = []
    for gpu_preprocess, cache, gpu_unnormalize in loads:
        options = EngineOptions.from_env(EngineOptions(tuning_cache=cache))
        t0 = time.perf_counter()
        policy = flashrt_core.load_model(args.checkpoint, device=args.device, gpu_preprocess=gpu_preprocess,
                                         gpu_unnormalize=gpu_unnormalize, engine_options=options)
        if args.cpu_engine:
            policy = cpu_engine_policy(policy, options, gpu_preprocess, gpu_unnormalize)
        load_s = time.perf_counter() - t0
        rng = np.random.default_rng(0)
        images = [rng.integers(0, 256, (480, 640, 3), dtype=np.uint8) for _ in range(args.views)]
        state = rng.uniform(-1, 1, policy.state_dim).astype(np.float32)
        prompt = "pick up the red cube and put it in the bowl"
        t0 = time.perf_counter()
        policy.predict(images, prompt, state)
        first_s = time.perf_counter() - t0
        for _ in range(WARMUP_CALLS):
            policy.predict(images, prompt, state)
        samples = []
        for _ in range(args.calls):
            t0 = time.perf_counter()
            policy.predict(images, prompt, state)
            samples.append(time.perf_counter() - t0)
        _, mask, _ = policy._encode_prompt_and_state(prompt, state)
        prompt_tokens = int(mask.sum())             # the state's numbers included (pi0.5)
        bucket = next((b for b in policy.text_buckets if b >= prompt_tokens), None)   # None: no graph engine
        replay = replay_median_ms(policy.executor, bucket, args.calls)
        trace = steps = None
        if args.host_trace and torch.cuda.is_available() and replay is not None:
            trace = summarize(trace_calls(lambda: policy.predict(images, prompt, state), args.host_trace))
            if gpu_preprocess:
                steps = host_steps_us(policy, images, prompt, state, args.calls)
        sweep = (spin_sweep_us(policy, images, prompt, state, args.spin_sweep, args.calls)
                 if args.spin_sweep else None)
        rows.append({"config": policy.config.name, "executor": getattr(policy.executor, "name", "?"),
                     "prompt_tokens": prompt_tokens, "text_bucket": bucket, "replay_median_ms": replay,
                     "host_trace_ms": trace, "host_steps_us": steps, "spin_sweep_us": sweep,
                     "gpu_preprocess": policy.gpu_preprocess, "gpu_unnormalize": policy.gpu_unnormalize,
                     "views": args.views, "horizon": policy.horizon,
                     "tuning": getattr(policy.executor, "tuning_source", "none"),
                     "calls": args.calls, "load_s": load_s, "first_call_s": first_s, **percentiles(samples)})
        policy.close()

    meta = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
            "python": platform.python_version(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "none (CPU)",
            "cpu": platform.processor() or platform.machine()}
    if torch.cuda.is_available():
        meta["cuda"] = torch.version.cuda
    lines = [f"# Policy.predict benchmark ({meta['gpu']})", "",
             f"{meta['date']}, torch {meta['torch']}, Python {meta['python']}. Public API, 480x640 uint8 frames "
             "in host memory -> actions in host memory, prompt tokenization cached after the first call.", "",
             "| config | executor | GPU resize | unnormalize | tuning | views | horizon | "
             "prompt tokens (bucket) | load s | first call s | median ms | p90 ms | p99 ms | max ms | "
             "graph replay ms |", "|---" * 15 + "|"]
    for r in rows:
        lines.append(f"| {r['config']} | {r['executor']} | {r['gpu_preprocess']} | "
                     f"{'graph' if r['gpu_unnormalize'] else 'host'} | {r['tuning']} | {r['views']} | "
                     f"{r['horizon']} | {r['prompt_tokens']} ({r['text_bucket'] or '-'}) | "
                     f"{r['load_s']:.1f} | {r['first_call_s']:.2f} | {r['median_ms']:.2f} | {r['p90_ms']:.2f} | "
                     f"{r['p99_ms']:.2f} | {r['max_ms']:.2f} | "
                     f"{'-' if r['replay_median_ms'] is None else format(r['replay_median_ms'], '.2f')} |")
    traced = [r for r in rows if r["host_trace_ms"]]
    if traced:
        lines += ["", f"Where a traced call's time goes (median ms of {args.host_trace} calls under torch.profiler, "
                  "which adds its own overhead; tools/host_trace.py):", "",
                  "| load | " + " | ".join(SEGMENTS) + " | call |", "|---" * (len(SEGMENTS) + 2) + "|"]
        for i, r in enumerate(rows):
            if r["host_trace_ms"]:
                t = r["host_trace_ms"]
                lines.append(f"| {i + 1} ({r['tuning']}, {_load_name(r)}) | "
                             + " | ".join(f"{t[n]:.3f}" for n in SEGMENTS)
                             + f" | {t['total']:.2f} |")
    for i, r in enumerate(rows):
        if r["host_steps_us"]:
            lines += ["", f"Load {i + 1} ({_load_name(r)}): the host steps of predict, each timed alone "
                      f"(median us of {args.calls}; tools/host_trace.py host_steps_us):", "",
                      "| " + " | ".join(r["host_steps_us"]) + " |", "|---" * len(r["host_steps_us"]) + "|",
                      "| " + " | ".join(f"{v:.1f}" for v in r["host_steps_us"].values()) + " |"]
    for i, r in enumerate(rows):
        if r["spin_sweep_us"]:
            names = list(next(iter(r["spin_sweep_us"].values())))
            lines += ["", f"Load {i + 1} ({'GPU' if r['gpu_preprocess'] else 'host'} resize): predict's host steps "
                      f"right after the thread spun (median us of {args.calls}; tools/host_trace.py "
                      "spin_sweep_us):",
                      "", "| spin ms | " + " | ".join(names) + " | sum |", "|---" * (len(names) + 2) + "|"]
            for wait, us in r["spin_sweep_us"].items():
                lines.append(f"| {wait:g} | " + " | ".join(f"{us[n]:.1f}" for n in names)
                             + f" | {sum(us.values()):.1f} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        tag = "h200" if "H200" in meta["gpu"] else ("cpu" if meta["gpu"].startswith("none") else "gpu")
        stem = out / f"policy_predict_{tag}_{meta['date'][:10]}{'_tuning_cache' if args.tuning_cache else ''}"
        stem.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
        stem.with_suffix(".md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
