#!/usr/bin/env python3
"""Engine benchmark: reference eager, reference under torch.compile (time-limited), graph engine, in ONE run.

For each config (pi05, pi0), number of views (1/2/3) and horizon (10/50) on full-size random weights:
  predict()  wall time, uint8 images + tokens in host memory -> unnormalized actions in host memory
  replay     the graph replay alone (CUDA events)
  kernels    CUDA kernels launched by one predict (torch.profiler)
  phases     vision / prefix / denoise, each captured as its own graph and replayed (CUDA events)
plus the accuracy gate (cosine vs the fp32 reference, same weights and noise) per config.
Writes <out-dir>/engine_<gpu>_<date>.json (updated after every measurement) and .md.

  python tools/benchmark_engine.py --ckpt-root /tmp/ckpt --out-dir docs/benchmarks/$(date +%F)
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import json
import logging
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashrt_core.checkpoint import load_model_weights  # noqa: E402
from flashrt_core.config import get_config  # noqa: E402
from flashrt_core.engine import (DEFAULT_TEXT_BUCKETS, EngineExecutor, EngineOptions, build_executor,  # noqa: E402
                                 detect_hardware, resolve)
from flashrt_core.engine.fp8_calibration import calibrate_executor  # noqa: E402
from flashrt_core.engine.gate import GATE_BF16, GATE_FP8, cosine, random_observation, reference_actions  # noqa: E402
from flashrt_core.engine.kernel_import import load_kernels  # noqa: E402
from flashrt_core.engine.timing import graph_replay_ms  # noqa: E402
from flashrt_core.executor import ReferenceExecutor  # noqa: E402
from flashrt_core.fixtures import CONFIG_FILE, write_random_checkpoint  # noqa: E402

log = logging.getLogger("benchmark_engine")
PROMPT_TOKENS = 48          # valid prompt tokens (REFERENCE.md floor assumes ~48)
TARGET_MEDIAN_MS = {"bf16": 8.0, "fp8": 6.0}


def stats_ms(samples: list[float]) -> dict:
    a = np.asarray(samples)
    return {"n": len(a), "median": float(np.median(a)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "max": float(a.max()), "mean": float(a.mean())}


def wall_times(fn, warmup: int, calls: int) -> dict:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()                                   # returns host data: includes the sync
        out.append((time.perf_counter() - t0) * 1e3)
    return stats_ms(out)


def replay_times(graph: torch.cuda.CUDAGraph, calls: int) -> dict:
    return stats_ms(graph_replay_ms(graph, calls))


def kernel_profile(fn, top: int = 12) -> dict:
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"
               and not e.name.startswith(("Memcpy", "Memset"))]
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name[:90], []).append(e.device_time_total / 1e3)   # device_time_total is in us
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {"kernels": len(kernels), "kernel_ms_total": float(sum(sum(v) for v in by_name.values())),
            "top": [{"name": n, "count": len(v), "ms": float(sum(v))} for n, v in ranked]}


class Results:
    def __init__(self, path: Path):
        self.path = path
        self.data = {"env": env_info(), "rows": [], "gates": [], "errors": [], "notes": []}

    def add(self, kind: str, item: dict) -> None:
        self.data[kind].append(item)
        self.path.write_text(json.dumps(self.data, indent=1))


def gpu_tag(gpu: str) -> str:
    """The GPU's short name in result file names: "h200" for an NVIDIA H200."""
    return "h200" if "H200" in gpu else gpu.lower().replace(" ", "_").replace("nvidia_", "")


def env_info() -> dict:
    import triton
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        driver = "unknown"
    return {"gpu": torch.cuda.get_device_name(), "driver": driver, "torch": torch.__version__,
            "cuda": torch.version.cuda, "triton": triton.__version__, "date": datetime.date.today().isoformat(),
            "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def result_header(tool: str, argv: list[str]) -> dict:
    """The fields every micro-benchmark's result opens with: when, on what (GPU, driver, torch, CUDA, Triton), and
    the command (`python tools/<tool> <argv>`)."""
    env = env_info()
    return {"date": env["time_utc"], "device": env["gpu"], "torch": env["torch"], "cuda": env["cuda"],
            "driver": env["driver"], "triton": env["triton"], "command": f"python tools/{tool} " + " ".join(argv)}


def require_cuda_build(tool: str) -> None:
    """Exit with the reason when a benchmark of a CUDA C++ kernel (kernels/flashrt_kernels/cuda/) cannot run here:
    no CUDA GPU, or no nvcc to build the kernel."""
    if not torch.cuda.is_available():
        raise SystemExit(f"{tool} needs a CUDA GPU")
    if not load_kernels().cuda_build_available():
        raise SystemExit(f"{tool} needs nvcc (the CUDA toolkit) to build its kernel")


def write_result(out_dir: str | Path, result: dict, *name_parts: str) -> Path:
    """result as JSON in out_dir (made if missing), named <parts joined by _>_<the result's date>.json; -> its path
    (printed too)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{'_'.join(name_parts)}_{result['date'][:10]}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(path)
    return path


def ensure_checkpoint(root: Path, name: str) -> Path:
    path = root / name
    if not (path / CONFIG_FILE).is_file():
        t0 = time.perf_counter()
        write_random_checkpoint(path, name, seed=0)
        log.info("generated %s in %.0f s", path, time.perf_counter() - t0)
    return path


def reference_predict(ref: ReferenceExecutor, obs, compiled=None):
    """The reference path as Policy runs it: host preprocessing to float pixels, H2D, sample, copy out."""
    fn = compiled or ref.sample_actions
    cfg, dev = ref.config, ref.device
    from flashrt_core.preprocess import prepare_images
    pixels, masks = prepare_images(obs.images, cfg.view_names, cfg.vision.image_size)
    state = torch.from_numpy(obs.state)[None].to(dev) if cfg.model_type == "pi0" else None
    out = fn(torch.from_numpy(pixels)[None].to(dev), torch.from_numpy(masks)[None].to(dev),
             torch.from_numpy(obs.tokens)[None].to(dev), torch.from_numpy(obs.token_mask)[None].to(dev), state,
             torch.from_numpy(obs.noise)[None].to(dev))
    return out.float().cpu().numpy()


def engine_options(prec: str, args) -> EngineOptions:
    """bf16 | fp8 (per-tensor static scales on the backbone's MLP), env switches applied;
    a suffix "-no_<switch>" turns that EngineOptions switch off, "-with_<switch>" turns one on, and
    "-<option>=<int>" sets an integer option (A/B rows: "bf16-no_pdl", "fp8-no_fp8_fused_quant",
    "bf16-chain_tuning_passes=1")."""
    prec, *suffixes = prec.split("-")
    switches = {}
    for suffix in suffixes:
        if "=" in suffix:                       # an integer option: "bf16-chain_tuning_passes=1"
            name, _, value = suffix.partition("=")
            switches[name] = int(value)
            continue
        state, _, switch = suffix.partition("_")
        if state not in ("no", "with") or not switch:
            raise ValueError(f"variant suffix must be no_<switch> or with_<switch>, got {suffix!r}")
        switches[switch] = state == "with"
    if prec not in ("bf16", "fp8"):
        raise ValueError(f"precision must be bf16 or fp8, got {prec!r}")
    return EngineOptions.from_env(EngineOptions(fp8=prec == "fp8", text_buckets=tuple(args.text_buckets),
                                                **switches))


def engine_row(engine: EngineExecutor, obs, args, meta: dict) -> dict:
    if engine.fp8_calibration is not None and not engine.fp8_calibrated:
        calibrate_executor(engine, [obs])             # an FP8 engine's scales from the timed observation
    run = lambda: engine.predict_observation(obs.images, obs.tokens, obs.token_mask, obs.state, obs.noise,  # noqa
                                             unnormalize=True)
    row = dict(meta)
    row["predict_ms"] = wall_times(run, args.warmup, args.calls)
    entry = next(e for k, e in engine.entries.items() if k[0] == "uint8" and len(k[1]) == meta["views"])
    row["replay_ms"] = replay_times(entry.graph, args.calls)
    key = next(k for k in engine.entries if k[0] == "uint8" and len(k[1]) == meta["views"])
    row["phases_ms"] = engine.phase_times(key)       # before the profiler pass: no profiler cost can carry into them
    row["profile"] = kernel_profile(run)
    row["capture_s"] = {str(k): v for k, v in engine.capture_seconds.items()}
    row["text_bucket"] = key[3]                      # the token buffer the prompt ran in
    row["decoder_gemm"] = {"choice": {k: str(v) for k, v in engine.ops.decoder_impl.items()},
                           "launch_policy": engine.ops.launch_policy,
                           "tuning_source": engine.tuning_source,       # "measured" or "cache" (tuning_cache)
                           "failures": engine.ops.decoder_failures,
                           "prefix_attention": {"choice": engine.ops.prefix_attention_impl,
                                                "timings_us": engine.ops.prefix_attention_timings},
                           "vision_attention": {"choice": engine.ops.vision_attention_backend,
                                                "timings_us": engine.ops.vision_attention_timings},
                           "timings_us": engine.ops.decoder_timings,
                           "chain_timings_ms": engine.decoder_chain_timings}
    return row


COMPILED_STAGES = ("embed_prefix", "fill_prefix_cache", "denoise_step")


def _owned_outputs(fn):
    """fn with its tensor outputs cloned. Under mode="max-autotune" inductor replays each compiled region as a CUDA
    graph whose outputs live in that graph's static buffers; with regional compilation the same graph serves every
    layer, so the next layer's replay overwrites the previous layer's output while it is still in use (the first
    layers-scope run on the H200 stopped there: "accessing tensor output of CUDAGraphs that has been overwritten
    by a subsequent run"). One copy per region output makes each output the caller's own."""
    def own(out):
        if isinstance(out, torch.Tensor):
            return out.clone()
        if isinstance(out, (tuple, list)):
            return type(out)(own(o) for o in out)
        return out

    @functools.wraps(fn)
    def run(*args, **kwargs):
        return own(fn(*args, **kwargs))
    return run


def compile_reference(ref: ReferenceExecutor, mode: str, scope: str, backend: str | None = None):
    """The reference's sample_actions under torch.compile; same signature, run it under torch.no_grad().

    scope "whole": the whole sample_actions, the 10 Euler steps unrolled into one graph (did not finish compiling
    in 420 s on the H200). scope "stages": the model's three stages compiled one by one (COMPILED_STAGES);
    the denoise step is traced once and reused by the 10 Euler steps, which stay a Python loop, as in the eager
    reference (did not finish in 390 s). scope "layers": PyTorch's regional compilation, each transformer layer
    compiled on its own (SigLIP layers whole, Gemma layers as their qkv and finish halves around the joint
    attention), so identical layers share one compiled graph and the glue between them stays eager; each region's
    outputs are cloned (`_owned_outputs`).
    backend: e.g. "eager" to check the capture without inductor (tests); None = inductor with ``mode``.
    The undecorated method is used: inference_mode inside a compiled region fails in AOT autograd.
    """
    options = {"mode": mode} if backend is None else {"backend": backend}
    sample = functools.partial(ReferenceExecutor.sample_actions.__wrapped__, ref)
    if scope == "whole":
        return torch.compile(sample, **options)
    if scope == "layers":                   # regional compilation: one graph per kind of layer, reused by all
        model = ref.model
        for layer in model.vision.layers:
            layer.forward = _owned_outputs(torch.compile(layer.forward, **options))
        for stack in (model.paligemma, model.expert):
            for layer in stack.layers:      # a Gemma layer runs as qkv(), joint attention, finish()
                layer.qkv = _owned_outputs(torch.compile(layer.qkv, **options))
                layer.finish = _owned_outputs(torch.compile(layer.finish, **options))
        return sample
    if scope != "stages":
        raise ValueError(f"compile scope must be 'whole', 'stages' or 'layers', got {scope!r}")
    for name in COMPILED_STAGES:            # instance attributes shadow the methods sample_actions calls
        setattr(ref.model, name, torch.compile(getattr(ref.model, name), **options))
    return sample


def inductor_cache_counts() -> dict:
    """This process's counts of inductor's cache lookups (fxgraph_cache_hit / _miss / _bypass and the like): whether
    a compile child reused the graphs an earlier cell compiled on the machine (inductor's on-disk cache)."""
    from torch._dynamo.utils import counters
    return {key: n for key, n in sorted(counters["inductor"].items()) if "cache" in key}


def compile_child(args) -> None:
    """Runs in a subprocess (killed by the parent at its time limit): reference under torch.compile."""
    torch._logging.set_logs(dynamo=logging.INFO)         # progress on stderr: the parent keeps its tail
    cfg = get_config(args.config_name).replace(action_horizon=args.horizon)
    model = load_model_weights(Path(args.ckpt_root) / args.config_name, get_config(args.config_name), "cuda",
                               torch.bfloat16)
    model.config = cfg
    ref = ReferenceExecutor(model, cfg, torch.device("cuda"))
    compiled = compile_reference(ref, args.compile_mode, args.compile_scope)
    torch.set_grad_enabled(False)
    obs = random_observation(cfg, np.random.default_rng(0), views=args.views, n_text=PROMPT_TOKENS, vocab=1024)
    t0 = time.perf_counter()
    reference_predict(ref, obs, compiled)
    first = time.perf_counter() - t0
    log.info("compiled (%s, scope %s): first call %.1f s", args.compile_mode, args.compile_scope, first)
    result = {"first_call_s": first, "compile_scope": args.compile_scope, "inductor_cache": inductor_cache_counts()}
    Path(args.child_out).write_text(json.dumps(result))
    result["predict_ms"] = wall_times(lambda: reference_predict(ref, obs, compiled), 3, args.compile_calls)
    Path(args.child_out).write_text(json.dumps(result))


def compile_variant(args) -> str:
    scope = "" if args.compile_scope == "whole" else f"_{args.compile_scope}"
    return f"reference_compile_{args.compile_mode}{scope}"


def compile_cells(args) -> list[tuple[str, int, int]]:
    """The (config, views, horizon) cells the compiled reference is timed at: pi0.5 at 2 views and horizon 10 (the
    targets' cell), or with --compile-grid every cell of the run (--configs x --views x --horizons), the horizons
    of a view count one after the other: their vision tower and prefix have the same shapes, so the later cell
    can take those graphs from inductor's on-disk cache (in one measured compilation ~150 of 187 s were the vision
    tower's and the prefix's layers, ~35 s the expert's)."""
    if not args.compile_grid:
        return [("pi05", 2, 10)]
    return [(name, views, horizon) for name in args.configs for views in args.views for horizon in args.horizons]


def run_compile_cells(args, res: Results, t_start: float) -> None:
    """The compile child for each of compile_cells, each within --compile-timeout and what is left of
    --deadline-s (a cell with under 60 s left gets a row that says so)."""
    for name, views, horizon in compile_cells(args):
        timeout = args.compile_timeout
        if args.deadline_s is not None:
            timeout = int(min(timeout, args.deadline_s - (time.perf_counter() - t_start) - 15))
        if timeout < 60:
            res.add("rows", {"config": name, "variant": compile_variant(args), "views": views,
                             "horizon": horizon, "error": f"not run: {timeout} s left of the run's deadline"})
            continue
        ensure_checkpoint(Path(args.ckpt_root), name)
        run_compile(args, res, name, views, horizon, timeout)


def run_compile(args, res: Results, name: str, views: int, horizon: int, timeout: int) -> None:
    """The compile child of one cell, killed after timeout seconds; its row (times, or why not) into res."""
    cell = f"{name}_v{views}_h{horizon}"
    out = Path(args.out_dir) / f".compile_{cell}.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--compile-child", "--config-name", name, "--views", str(views), "--horizon",
           str(horizon), "--ckpt-root", args.ckpt_root, "--child-out", str(out), "--compile-mode", args.compile_mode,
           "--compile-calls", str(args.compile_calls), "--compile-scope", args.compile_scope]
    meta = {"config": name, "variant": compile_variant(args), "views": views, "horizon": horizon}
    child_log = Path(args.out_dir) / f"compile_{cell}_{args.compile_scope}.log"   # dynamo/inductor progress
    t0 = time.perf_counter()
    with open(child_log, "w") as log_file:
        try:
            proc = subprocess.run(cmd, timeout=timeout, stdout=log_file, stderr=subprocess.STDOUT)
            if proc.returncode != 0:
                meta["error"] = f"exit {proc.returncode}, see {child_log.name}"
        except subprocess.TimeoutExpired:
            meta["did_not_finish_s"] = timeout
    text = child_log.read_text(errors="replace")
    # where a killed compile was: frames dynamo started ("[frame/recompile]" tags) and GEMMs inductor autotuned
    meta["progress"] = {"frames_started": sorted(set(re.findall(r"\[(\d+)/\d+\]", text)), key=int),
                        "gemms_autotuned": text.count("AUTOTUNE "), "log": child_log.name}
    meta["log_tail"] = text[-3000:]
    meta["wall_s"] = time.perf_counter() - t0
    if out.is_file():
        meta.update(json.loads(out.read_text()))
        out.unlink()
    res.add("rows", meta)


def bench_config(args, res: Results, name: str) -> None:
    ckpt = ensure_checkpoint(Path(args.ckpt_root), name)
    base = get_config(name)
    dev = torch.device("cuda")
    hw = detect_hardware("auto", dev)
    precisions = ["bf16"] + (["fp8"] if name in args.fp8_configs else [])
    ab_variants = ([f"bf16-no_{switch}" for switch in args.ab_switches_off] + [f"bf16-{o}" for o in args.ab_options]
                   + [f"{prec}-no_{switch}" for switch in args.ab_fp8_switches_off for prec in precisions
                      if prec.startswith("fp8")]
                   + [f"{prec}-{o}" for o in args.ab_fp8_options for prec in precisions if prec.startswith("fp8")]
                   + [f"{prec}-with_{switch}" for switch in args.ab_switches_on for prec in precisions])
    if args.references_only:
        precisions, ab_variants = [], []
    # accuracy gate: the fp32 reference vs the engine built from the same fp32 weights
    if args.gate and precisions:
        model32 = load_model_weights(ckpt, base, dev, torch.float32)
        ref32 = ReferenceExecutor(model32, base, dev)
        for prec in precisions:
            try:
                opts = engine_options(prec, args)
                eng = build_executor(model32, base, dev, "auto", opts)     # the public path
                if not isinstance(eng, EngineExecutor) or not eng.name.endswith(prec):
                    raise RuntimeError(f"build_executor gave {getattr(eng, 'name', eng)} for {prec}")
                cos = []
                if prec.startswith("fp8"):        # scales from the first gate observation
                    calibrate_executor(eng, [random_observation(base, np.random.default_rng(100), views=1, n_text=12,
                                                                vocab=1024)])
                for seed in range(args.gate_observations):
                    obs = random_observation(base, np.random.default_rng(100 + seed), views=1 + seed % 3,
                                             n_text=12 + 17 * seed, vocab=1024)
                    got = eng.predict_observation(obs.images, obs.tokens, obs.token_mask, obs.state, obs.noise)
                    cos.append(cosine(got, reference_actions(ref32, obs)))
                thr = GATE_FP8 if prec.startswith("fp8") else GATE_BF16
                res.add("gates", {"config": name, "precision": prec, "cosines": cos, "min": min(cos),
                                  "threshold": thr, "pass": min(cos) >= thr})
                del eng
            except Exception:  # noqa: BLE001  keep the other numbers
                res.add("errors", {"where": f"gate {name} {prec}", "trace": traceback.format_exc()})
        del ref32, model32
        gc.collect()
        torch.cuda.empty_cache()
    model = load_model_weights(ckpt, base, dev, torch.bfloat16)
    from flashrt_core.normalization import Normalizer, load_norm_stats
    affine = Normalizer(load_norm_stats(ckpt), base.norm_mode.value).action_affine(base.max_action_dim)
    for prec in precisions + ab_variants:
        shared = None
        for horizon in args.horizons:
            cfg = base.replace(action_horizon=horizon)
            try:
                opts = engine_options(prec, args)
                eng = EngineExecutor(model, cfg, dev, resolve(hw, opts), action_affine=affine, weights=shared)
                shared = eng.weights
            except Exception:  # noqa: BLE001
                res.add("errors", {"where": f"engine {name} {prec} h{horizon}", "trace": traceback.format_exc()})
                continue
            for views in args.views:
                meta = {"config": name, "variant": f"engine_{prec}", "views": views, "horizon": horizon,
                        "executor": eng.name, "dispatch": eng.dispatch.summary()}
                try:
                    obs = random_observation(cfg, np.random.default_rng(views), views=views, n_text=PROMPT_TOKENS,
                                             image_hw=tuple(args.image_hw), vocab=1024)
                    res.add("rows", engine_row(eng, obs, args, meta))
                except Exception:  # noqa: BLE001
                    res.add("errors", {"where": str(meta), "trace": traceback.format_exc()})
            del eng
            torch.cuda.empty_cache()
        del shared
    for horizon in args.horizons:
        cfg = base.replace(action_horizon=horizon)
        model.config = cfg
        ref = ReferenceExecutor(model, cfg, dev)
        for views in args.views:
            meta = {"config": name, "variant": "reference_eager_bf16", "views": views, "horizon": horizon}
            try:
                obs = random_observation(cfg, np.random.default_rng(views), views=views, n_text=PROMPT_TOKENS,
                                         image_hw=tuple(args.image_hw), vocab=1024)
                meta["predict_ms"] = wall_times(lambda: reference_predict(ref, obs), 2, args.reference_calls)
                meta["profile"] = kernel_profile(lambda: reference_predict(ref, obs), top=5)
                res.add("rows", meta)
            except Exception:  # noqa: BLE001
                res.add("errors", {"where": str(meta), "trace": traceback.format_exc()})
    model.config = base
    del model
    gc.collect()
    torch.cuda.empty_cache()


def targets(rows: list[dict], gates: list[dict] | None = None) -> list[str]:
    """One line per issue-4 target, from the measured rows (missing measurements are said so). An FP8 variant
    counts only with its accuracy gate passed."""
    pick = lambda variant: next((r for r in rows if r["config"] == "pi05" and r["views"] == 2  # noqa: E731
                                 and r["horizon"] == 10 and "predict_ms" in r
                                 and (r["variant"] == variant or (variant.startswith("reference")
                                                                  and r["variant"].startswith(variant)))), None)
    out = []
    eager, comp = pick("reference_eager"), pick("reference_compile")
    measured = [r["variant"][len("engine_"):] for r in rows if r["variant"].startswith("engine_")
                and "-" not in r["variant"]]       # A/B variants ("-no_pdl") have no target
    for prec in ["bf16"] + [p for p in dict.fromkeys(measured) if p != "bf16"]:
        eng = pick(f"engine_{prec}")
        if eng is None:
            out.append(f"- engine {prec}: not measured in this run")
            continue
        med, p99 = eng["predict_ms"]["median"], eng["predict_ms"]["p99"]
        goal = TARGET_MEDIAN_MS["fp8" if prec.startswith("fp8") else prec]
        gate = next((g for g in gates or [] if g["config"] == "pi05" and g["precision"] == prec), None)
        gated = "" if gate is None else f" (accuracy gate {'passed' if gate['pass'] else 'FAILED'}, {gate['min']:.5f})"
        out.append(f"- engine {prec}{gated} median predict {med:.2f} ms vs target <= {goal} ms: "
                   f"{'met' if med <= goal and (gate is None or gate['pass']) else 'MISSED'}; p99 {p99:.2f} ms = {p99 / med:.3f} x median "
                   f"(target <= 1.1: {'met' if p99 <= 1.1 * med else 'MISSED'})")
        if eager:
            x = eager["predict_ms"]["median"] / med
            out.append(f"  - vs eager reference {eager['predict_ms']['median']:.1f} ms: {x:.1f}x "
                       f"(target >= 10x: {'met' if x >= 10 else 'MISSED'})")
        if comp:
            x = comp["predict_ms"]["median"] / med
            out.append(f"  - vs torch.compile reference {comp['predict_ms']['median']:.1f} ms: {x:.1f}x "
                       f"(target >= 3x: {'met' if x >= 3 else 'MISSED'})")
        else:
            out.append("  - vs torch.compile: no compiled timing in this run (see its row)")
    return out


MODEL_NAMES = {"pi05": "pi0.5"}     # a config's name in prose tables (the README's grid)


def reference_kind(row: dict) -> str | None:
    """"eager" for a reference_eager_* row, "compile" for a reference_compile_* row, else None."""
    v = row["variant"]
    return "eager" if v.startswith("reference_eager") else "compile" if v.startswith("reference_compile") else None


def last_rows_per_cell(rows: list[dict], per_run: bool = False) -> dict[tuple, dict]:
    """(config, views, horizon, kind) -> the last timed row of that kind in the cell, kind "engine_bf16",
    "engine_fp8", "eager" (reference_eager_*) or "compile" (reference_compile_*); A/B variants and rows without a
    time left out. A merged result's later run wins (grid_table, speedup_table). per_run: the key ends with the
    row's run too ("source"; None outside a merged result), the last row of each run."""
    last = {}
    for r in rows:
        v = r["variant"]
        kind = v if v in ("engine_bf16", "engine_fp8") else reference_kind(r)
        if kind and "predict_ms" in r:
            last[(r["config"], r["views"], r["horizon"], kind) + ((r.get("source"),) if per_run else ())] = r
    return last


def grid_table(rows: list[dict]) -> list[str]:
    """The engine's predict() medians as one markdown table: a row per model and view count, a column per horizon,
    each cell "bf16 / FP8" in ms ("-" for a precision not measured there); a cell measured in several runs (a
    merged result) shows the last. The README's grid is this table of the merged runs (a test keeps them equal)."""
    cells = {key: r["predict_ms"]["median"] for key, r in last_rows_per_cell(rows).items()
             if key[3] in ("engine_bf16", "engine_fp8")}
    if not cells:
        return []
    horizons = sorted({key[2] for key in cells})
    lines = ["| model, views | " + " | ".join(f"horizon {h}" for h in horizons) + " |",
             "|---" * (1 + len(horizons)) + "|"]
    for config in dict.fromkeys(key[0] for key in cells):
        for views in sorted({key[1] for key in cells if key[0] == config}):
            medians = [" / ".join(f"{cells[(config, views, h, v)]:.2f}" if (config, views, h, v) in cells else "-"
                                  for v in ("engine_bf16", "engine_fp8")) for h in horizons]
            lines.append(f"| {MODEL_NAMES.get(config, config)}, {views} | " + " | ".join(medians) + " |")
    return lines


def speedup_table(rows: list[dict]) -> list[str]:
    """The engine's predict() median (bf16 / FP8) against the eager and the torch.compile references', as times
    faster, one row per cell that has a reference row; a cell measured in several runs takes the last engine row of
    each precision (as grid_table) and, of each reference kind, the row of the engine bf16 row's run where that run
    timed one (a ratio within one run, as the issue asks), else the last. In a merged result a ratio whose
    reference ran in another run than the engine row is marked "\\*" (an escaped star): the machines of two runs
    may differ."""
    last = last_rows_per_cell(rows)
    per_run = last_rows_per_cell(rows, per_run=True)
    cells = {key[:3] for key in last if key[3] in ("eager", "compile")}
    if not cells:
        return []
    configs = list(dict.fromkeys(r["config"] for r in rows))
    lines = ["| model, views, horizon | eager reference | engine x eager, bf16 / FP8 | torch.compile reference | "
             "engine x compile, bf16 / FP8 |", "|---|---|---|---|---|"]
    marked = False
    for cell in sorted(cells, key=lambda c: (configs.index(c[0]), c[1], c[2])):
        cols = []
        eng_bf16 = last.get((*cell, "engine_bf16"))
        for ref_kind in ("eager", "compile"):
            ref = (per_run.get((*cell, ref_kind, eng_bf16.get("source"))) if eng_bf16 else None) \
                or last.get((*cell, ref_kind))
            if ref is None:
                cols += ["-", "-"]
                continue
            ratios = []
            for prec in ("engine_bf16", "engine_fp8"):
                eng = last.get((*cell, prec))
                if eng is None:
                    ratios.append("-")
                    continue
                other = eng.get("source") != ref.get("source")
                marked |= other
                ratios.append(f"{ref['predict_ms']['median'] / eng['predict_ms']['median']:.1f}x"
                              + ("\\*" if other else ""))
            cols += [f"{ref['predict_ms']['median']:.1f} ms", " / ".join(ratios)]
        config, views, horizon = cell
        lines.append(f"| {MODEL_NAMES.get(config, config)}, {views}, {horizon} | " + " | ".join(cols) + " |")
    if marked:
        lines += ["", "\\* the reference ran in another run than the engine row (another machine, maybe)."]
    return lines


def compile_times(rows: list[dict]) -> list[str]:
    """A line per compiled-reference row that reached its first call: how long that call took (the compilation of
    its regions; in a merged result, then the run it came from) and inductor's cache lookups in its child (rows
    written by older versions of this tool have none)."""
    out = []
    for r in rows:
        if r["variant"].startswith("reference_compile") and "first_call_s" in r:
            caches = r.get("inductor_cache")
            out.append(f"- {MODEL_NAMES.get(r['config'], r['config'])}, {r['views']} view{'s' * (r['views'] != 1)}, "
                       f"horizon {r['horizon']}: {r['first_call_s']:.1f} s"
                       + (f" ({r['source']})" if "source" in r else "")
                       + ("" if caches is None else "; inductor's caches: " + (
                           ", ".join(f"{key} {n}" for key, n in caches.items()) or "no lookups")))
    return out


def error_line(text: str) -> str:
    """The line of a traceback that names the exception (else its last line), shortened for a table cell."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    named = [ln for ln in lines if "Error" in ln.split(":")[0] or "Exception" in ln.split(":")[0]]
    return ((named or lines or ["?"])[-1])[:110].replace("|", "/")


MERGE_ENV_FIELDS = ("gpu", "driver", "torch", "cuda", "triton")


def merge_results(paths: list[Path]) -> dict:
    """One result from the JSONs of several runs of this tool on one machine's software (a grid too long for one
    device call): their rows, gates, errors and notes in order, each row with the run it
    came from ("source": the file's stem). Runs on another GPU, driver, torch, CUDA or Triton are refused."""
    if len(paths) < 2:
        raise ValueError("--merge needs two or more result files")
    runs = [(Path(p).stem, json.loads(Path(p).read_text())) for p in paths]
    first_env = runs[0][1]["env"]
    merged = {"env": dict(first_env), "rows": [], "gates": [], "errors": [], "notes": [],
              "args": {"merged_from": [name for name, _ in runs],
                       "text_buckets": runs[0][1].get("args", {}).get("text_buckets", "?")}}
    for name, d in runs:
        for field in MERGE_ENV_FIELDS:
            if d["env"].get(field) != first_env.get(field):
                raise ValueError(f"--merge: {name} ran on {field} {d['env'].get(field)!r}, {runs[0][0]} on "
                                 f"{first_env.get(field)!r}")
        merged["rows"] += [dict(r, source=name) for r in d["rows"]]
        for kind in ("gates", "errors", "notes"):
            merged[kind] += d.get(kind, [])
    times = sorted(d["env"]["time_utc"] for _, d in runs)
    merged["env"]["time_utc"] = f"{times[0]} to {times[-1]}"
    return merged


def write_markdown(res: Results, path: Path) -> None:
    d = res.data
    env = d["env"]
    merged = d["args"].get("merged_from")
    lines = [f"# Engine benchmark: {env['gpu']}", "",
             f"GPU {env['gpu']}, driver {env['driver']}, torch {env['torch']} (CUDA {env['cuda']}), triton "
             f"{env['triton']}, {env['time_utc']} UTC. Full-size random weights; prompt {PROMPT_TOKENS} tokens "
             f"(text buckets {d['args'].get('text_buckets', '?')}); "
             "predict() = uint8 images in host memory -> unnormalized actions in host memory."
             + (f" Merged from {len(merged)} runs (each row's run in its last column): {', '.join(merged)}."
                if merged else ""), "",
             "## Accuracy gate (cosine vs fp32 reference, same weights and noise)", "",
             "| config | precision | min cosine | threshold | pass | per observation |", "|---|---|---|---|---|---|"]
    for g in d["gates"]:
        lines.append(f"| {g['config']} | {g['precision']} | {g['min']:.5f} | {g['threshold']} | {g['pass']} | "
                     f"{', '.join(f'{c:.5f}' for c in g['cosines'])} |")
    if not d["gates"]:
        lines += ["", "Not measured in this run (--no-gate): the same gates run as GPU tests "
                  "(test/gpu/test_engine_gpu.py test_accuracy_gate_full_size, tools/device_engine_checks.sh)."]
    lines += ["", "## Latency (ms)", "",
              "| config | variant | views | horizon | predict median | p90 | p99 | max | replay median | replay p99 |"
              " kernels/call | vision / prefix / denoise (phase graphs) |" + (" run |" if merged else ""),
              "|---" * (13 if merged else 12) + "|"]
    run = (lambda r: f" {r.get('source', '')} |") if merged else (lambda r: "")
    for r in d["rows"]:
        p = r.get("predict_ms")
        if p is None:
            why = (f"did not finish in {r['did_not_finish_s']} s" if "did_not_finish_s" in r
                   else error_line(r.get("error", "?")))
            if "progress" in r:
                prog = r["progress"]
                why += (f" (dynamo frames started: {', '.join(prog['frames_started']) or 'none'}; "
                        f"{prog['gemms_autotuned']} GEMMs autotuned; {prog['log']})")
            lines.append(f"| {r['config']} | {r['variant']} | {r['views']} | {r['horizon']} | {why} | | | | | | | |"
                         + run(r))
            continue
        rp = r.get("replay_ms", {})
        ph = r.get("phases_ms")
        phs = " / ".join(f"{ph[k]:.2f}" for k in ("vision", "prefix", "denoise")) if ph else ""
        lines.append(f"| {r['config']} | {r['variant']} | {r['views']} | {r['horizon']} | {p['median']:.2f} | "
                     f"{p['p90']:.2f} | {p['p99']:.2f} | {p['max']:.2f} | {rp.get('median', float('nan')):.2f} | "
                     f"{rp.get('p99', float('nan')):.2f} | {r.get('profile', {}).get('kernels', '')} | {phs} |"
                     + run(r))
    grid = grid_table(d["rows"])
    if grid:
        lines += ["", "## The grid: predict() medians (ms), bf16 / FP8", ""] + grid
    speedups = speedup_table(d["rows"])
    if speedups:
        lines += ["", "## Speed-up per cell: the engine's predict() median against the references'", ""] + speedups
    compiled = compile_times(d["rows"])
    if compiled:
        lines += ["", "## The compiled reference's first call (its compilation), per cell", ""] + compiled
    lines += ["", "## Targets (issue 4: pi0.5, 2 views, 10 steps, horizon 10)", ""] + targets(d["rows"], d["gates"])
    if d["errors"]:
        lines += ["", "## Errors", ""]
        lines += [f"- {e['where']}: `{e['trace'].strip().splitlines()[-1]}`" for e in d["errors"]]
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="*", default=["pi05", "pi0"],
                    help="configs to time the engine on; none (with --compile) = only the compile child, e.g. to "
                         "fill inductor's caches on a machine before the measured run")
    ap.add_argument("--views", nargs="+", type=int, default=[1, 2, 3])
    ap.add_argument("--horizons", nargs="+", type=int, default=[10, 50])
    ap.add_argument("--calls", type=int, default=200, help="timed engine calls (after --warmup)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--reference-calls", type=int, default=20)
    ap.add_argument("--image-hw", nargs=2, type=int, default=[224, 224])
    ap.add_argument("--text-buckets", nargs="*", type=int, default=list(DEFAULT_TEXT_BUCKETS),
                    help="the engine's text buckets (default: the engine's own)")
    ap.add_argument("--fp8-configs", nargs="*", default=[], help="configs also run with the FP8 engine")
    ap.add_argument("--ab-switches-off", nargs="*", default=[],
                    help="EngineOptions switches (e.g. pdl) each measured off too, bf16, as 'engine_bf16-no_<name>'")
    ap.add_argument("--ab-options", nargs="*", default=[],
                    help="bf16 A/B rows with an integer EngineOptions field set, e.g. chain_tuning_passes=1")
    ap.add_argument("--ab-switches-on", nargs="*", default=[],
                    help="EngineOptions switches each measured on too, for every precision, "
                         "as 'engine_<precision>-with_<name>'")
    ap.add_argument("--ab-fp8-switches-off", nargs="*", default=[],
                    help="EngineOptions switches turned off in extra FP8 rows (fp8-no_<switch>), e.g. fp8_fused_quant")
    ap.add_argument("--ab-fp8-options", nargs="*", default=[],
                    help="extra FP8 rows with variant suffixes as --ab-options takes them, e.g. chain_tuning_passes=1 "
                         "or no_smem_gemm-no_pdl_early_trigger")
    ap.add_argument("--deadline-s", type=float, default=None,
                    help="wall-clock budget of the whole run; the compile variant gets what is left")
    ap.add_argument("--no-gate", dest="gate", action="store_false")
    ap.add_argument("--gate-observations", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="also torch.compile of the reference (pi05, 2 views, h10; "
                    "every cell with --compile-grid)")
    ap.add_argument("--compile-grid", action="store_true",
                    help="with --compile: time the compiled reference at every cell of the run (--configs x --views x "
                         "--horizons), each within --compile-timeout and --deadline-s, not only pi0.5 at 2 views, h10")
    ap.add_argument("--references-only", action="store_true",
                    help="no engine rows and no gate: the eager reference rows (and the compiled ones with "
                         "--compile) of cells whose engine rows another run measured (--merge joins the runs)")
    ap.add_argument("--compile-first", action="store_true", help="run the compile child before the engine rows")
    ap.add_argument("--compile-mode", default="max-autotune")
    ap.add_argument("--compile-scope", choices=("layers", "stages", "whole"), default="layers",
                    help="layers: each transformer layer compiled (regional compilation; identical layers share a "
                         "graph); stages: embed_prefix, fill_prefix_cache and denoise_step compiled one by one (the "
                         "denoise step traced once for all Euler steps); whole: all of sample_actions in one graph")
    ap.add_argument("--compile-timeout", type=int, default=240)
    ap.add_argument("--compile-calls", type=int, default=20)
    ap.add_argument("--ckpt-root", default="/tmp/flashrt_ckpt")
    ap.add_argument("--out-dir", default=str(Path(__file__).resolve().parents[1] / "docs" / "benchmarks"))
    ap.add_argument("--tag", default=None, help="file name tag (default: gpu short name)")
    ap.add_argument("--compile-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--config-name", help=argparse.SUPPRESS)
    ap.add_argument("--horizon", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    ap.add_argument("--merge", nargs="+", metavar="JSON",
                    help="no GPU run: merge these result files of one machine's runs into one table "
                         "(engine_<tag>_<date of the first>.json/.md in --out-dir; --tag names it)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.merge:
        res = Results.__new__(Results)
        res.data = merge_results([Path(p) for p in args.merge])
        stem = f"engine_{args.tag or gpu_tag(res.data['env']['gpu'])}_{res.data['env']['date']}"
        out_dir = Path(args.out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"{stem}.json").write_text(json.dumps(res.data, indent=1))
        write_markdown(res, out_dir / f"{stem}.md")
        print((out_dir / f"{stem}.md").read_text())
        return
    if args.compile_child:
        args.views = args.views[0]
        compile_child(args)
        return
    if not torch.cuda.is_available():
        raise SystemExit("benchmark_engine needs a CUDA GPU")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name()
    tag = args.tag or gpu_tag(gpu)
    stem = f"engine_{tag}_{datetime.date.today().isoformat()}"
    t_start = time.perf_counter()
    res = Results(out_dir / f"{stem}.json")
    res.data["args"] = {k: v for k, v in vars(args).items() if not k.startswith(("compile_child", "child"))}
    if args.compile and args.compile_first:      # its time limit is known up front; the engine rows follow
        run_compile_cells(args, res, t_start)
    for name in args.configs:
        try:
            bench_config(args, res, name)
        except Exception:  # noqa: BLE001
            res.add("errors", {"where": f"config {name}", "trace": traceback.format_exc()})
        write_markdown(res, out_dir / f"{stem}.md")
    if args.compile and not args.compile_first:
        run_compile_cells(args, res, t_start)
    write_markdown(res, out_dir / f"{stem}.md")
    print((out_dir / f"{stem}.md").read_text())


if __name__ == "__main__":
    main()
