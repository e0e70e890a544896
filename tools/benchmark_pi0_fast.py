"""Benchmark pi0-FAST in one process: the eager reference and the graph engine on the same weights and inputs.

Reference (flashrt_core/model/pi0_fast.py), timed with a device synchronize around each phase: prefill (vision +
prompt into the KV cache, first logits), each decode step (one token through the backbone and the tied LM head, its
K/V appended), and Pi0FastModel.generate end to end.
Engine (flashrt_core/engine/fast_decode.py, graphs on a GPU, its ops launched eagerly on the CPU): the prefill
graph's and each decode graph's GPU time (CUDA events; ms per token = a decode graph's time / its steps), and
FastGraphExecutor.generate end to end (host wall time: inputs in, tokens back on the host).
Fidelity: the engine's logits teacher-forced on the reference's greedy tokens against the reference's (cosine per
step, worst and mean) and how many leading greedy tokens agree.
Random weights of a preset (full size "pi0fast" by default, built in memory: timing does not depend on the
values) or a checkpoint folder. Decoding is forced to `--tokens` tokens (no end token), so every run decodes the
same count.

    python tools/benchmark_pi0_fast.py [--config pi0fast | --checkpoint DIR] [--device cuda] [--dtype bfloat16]
        [--views 2] [--prompt-tokens 60] [--tokens 50] [--runs N] [--out docs/benchmarks]
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashrt_core.checkpoint import load_model_weights  # noqa: E402
from flashrt_core.config import ModelType, get_config  # noqa: E402
from flashrt_core.engine import EngineOptions, detect_hardware, eager_cpu_dispatch, resolve  # noqa: E402
from flashrt_core.engine.fast_decode import FastGraphExecutor, lm_head  # noqa: E402
from flashrt_core.engine.gate import cosine  # noqa: E402
from flashrt_core.engine.timing import graph_replay_ms, graph_time_us  # noqa: E402
from flashrt_core.model import Pi0FastModel  # noqa: E402
from tools.benchmark_engine import env_info, write_result  # noqa: E402

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
    cfg = cfg.replace(fast={"max_decoding_steps": args.tokens})
    gen = torch.Generator().manual_seed(0)
    size = cfg.vision.image_size
    pixels = (torch.rand(1, args.views, 3, size, size, generator=gen) * 2 - 1).to(device)
    image_masks = torch.ones(1, args.views, dtype=torch.bool, device=device)
    tokens = torch.randint(4, cfg.paligemma.vocab_size, (1, cfg.max_token_len), generator=gen).to(device)
    token_masks = (torch.arange(cfg.max_token_len) < args.prompt_tokens)[None].to(device)
    inputs = (pixels, image_masks, tokens, token_masks)
    reference, ref_tokens, ref_logits = run_reference(args, cfg, model, inputs)
    engine = run_engine(args, cfg, model, dtype, inputs, ref_tokens, ref_logits)
    engine_fp8 = (run_engine(args, cfg, model, dtype, inputs, ref_tokens, ref_logits, fp8=True)
                  if device.type == "cuda" else None)
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "driver": env_info()["driver"] if device.type == "cuda" else None,
        "command": "python tools/benchmark_pi0_fast.py " + " ".join(args.argv),
        "weights": weights, "config": cfg.name, "dtype": args.dtype,
        "views": args.views, "prompt_tokens": args.prompt_tokens, "prefix_tokens": int(args.views
                                                                                      * cfg.vision.num_patches
                                                                                      + args.prompt_tokens),
        "tokens": args.tokens, "runs": args.runs, "reference": reference, "engine": engine,
        "engine_fp8": engine_fp8,
    }


def run_reference(args, cfg, model, inputs) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """-> (timings, its greedy tokens (n,), its logits teacher-forced on them (n, vocab) fp32)"""
    device = inputs[0].device
    prefill_ms, step_ms, generate_ms = [], [], []
    with torch.inference_mode():
        for run_index in range(args.runs + 1):                     # the first run warms up and is dropped
            synchronize(device)
            start = time.perf_counter()
            embs, valid = model.embed_prefix(*inputs)
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
            out = model.generate(*inputs, args.tokens, NO_EOS, cfg.fast.decode_position_offset)
            synchronize(device)
            total = (time.perf_counter() - start) * 1e3
            assert out.shape == (1, args.tokens)
            if run_index:
                prefill_ms.append(prefill)
                step_ms.extend(steps)
                generate_ms.append(total)
        embs, valid = model.embed_prefix(*inputs)
        state, logits = model.prefill(embs, valid)
        forced = [logits.float()]
        for token in out[0, :-1]:
            forced.append(model.decode_step(state, token[None], cfg.fast.decode_position_offset).float())
    timings = {"prefill_ms_median": statistics.median(prefill_ms),
               "decode_ms_per_token_median": statistics.median(step_ms) if step_ms else None,
               "chunk_ms_median": statistics.median(generate_ms),
               "prefill_ms": prefill_ms, "chunk_ms": generate_ms}
    return timings, out[0], torch.cat(forced)


def run_engine(args, cfg, model, dtype, inputs, ref_tokens, ref_logits, fp8: bool = False) -> dict:
    """The engine's timings and fidelity; fp8: weight-only FP8 decoding (EngineOptions.fp8)."""
    device = inputs[0].device
    if device.type == "cuda":
        options = EngineOptions.from_env()
        dispatch = resolve(detect_hardware("auto", device), replace(options, fp8=True) if fp8 else options)
    else:
        dispatch = eager_cpu_dispatch(EngineOptions.from_env())
    engine = FastGraphExecutor(model, cfg, device, dispatch, eos_id=NO_EOS, dtype=dtype)
    chunk_ms, prefill_ms, token_ms = [], [], []
    out = engine.generate(*inputs)                                  # captures the graphs (GPU) and warms up
    for _ in range(args.runs):
        synchronize(device)
        start = time.perf_counter()
        out = engine.generate(*inputs)
        chunk_ms.append((time.perf_counter() - start) * 1e3)
    assert out.shape == (1, args.tokens)
    (fw,) = engine._entries.values()
    if fw.graphs:
        steps = [len(r) for r in engine.step_ranges()]
        for _ in range(args.runs):
            times = [graph_replay_ms(g, 1)[0] for g in fw.graphs]
            prefill_ms.append(times[0])
            token_ms.extend(t / n for t, n in zip(times[1:], steps) if n == engine.graph_tokens)
    head_ms = _lm_head_ms(engine) if fw.graphs else None
    kernels = _kernel_us_per_token(engine, fw) if fw.graphs and args.profile else None
    forced = engine.teacher_forced_logits(*inputs, ref_tokens[:-1])
    cosines = [cosine(a.cpu().numpy(), b.cpu().numpy()) for a, b in zip(forced, ref_logits)]
    agree = int(np.argmin(np.append(out[0].numpy() == ref_tokens.cpu().numpy(), False)))
    return {"name": engine.name, "decode_graph_tokens": engine.graph_tokens,
            "capture_s": sum(engine.capture_seconds.values()),
            "prefill_ms_median": statistics.median(prefill_ms) if prefill_ms else None,
            "decode_ms_per_token_median": statistics.median(token_ms) if token_ms else None,
            "chunk_ms_median": statistics.median(chunk_ms), "chunk_ms": chunk_ms,
            "lm_head_argmax_ms": head_ms, "kernel_us_per_token": kernels,
            "decoder_gemms": {k: str(v) for k, v in engine.ops.decoder_impl.items()},
            "logits_cosine_min": min(cosines), "logits_cosine_mean": float(np.mean(cosines)),
            "greedy_tokens_agreeing": agree}


def _kernel_us_per_token(engine, fw, top: int = 14) -> dict[str, float]:
    """GPU us per decoded token of each kernel (by name) in one replay of the first decode graph (torch.profiler),
    the `top` largest and the rest summed: where a token's time goes."""
    from torch.profiler import ProfilerActivity, profile
    graph, steps = fw.graphs[1], len(engine.step_ranges()[0])
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for event in prof.events():
        if event.device_type.name == "CUDA":
            totals[event.name[:70]] = totals.get(event.name[:70], 0.0) + event.device_time / steps
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])
    table = dict(ranked[:top])
    table["(other kernels)"] = sum(v for _, v in ranked[top:])
    table["(sum of kernels)"] = sum(totals.values())
    return table


def _lm_head_ms(engine, reps: int = 20) -> float:
    """GPU ms of one step's tied LM head (the engine's: bf16, or its FP8 copy) and argmax, captured alone: the part
    of a token's time that is not the backbone's layers."""
    w = engine.weights
    y = torch.randn(1, w.lm_head.shape[1], device=w.lm_head.device, dtype=engine.dtype)
    return graph_time_us(lambda: lm_head(w, engine.ops, y).argmax(dim=-1), reps=reps, replays=5) / 1e3


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
    parser.add_argument("--profile", action="store_true", help="the engine's kernels per token (torch.profiler)")
    parser.add_argument("--out", help="folder for the JSON result")
    return parser


def main(argv: list[str] | None = None) -> int:
    import sys
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    result = run(args)
    ref, eng = result["reference"], result["engine"]
    print(f"pi0-FAST, {result['device']}, {result['config']} {result['dtype']}, {result['views']} views, "
          f"{result['prefix_tokens']} prefix tokens, {result['tokens']}-token chunk (medians of {result['runs']} "
          "runs)")
    print(f"{'':10} {'prefill ms':>11} {'ms/token':>9} {'chunk ms':>9}")
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    rows = [("reference", ref), ("engine", eng)] + ([("engine FP8", result["engine_fp8"])]
                                                    if result["engine_fp8"] else [])
    for name, row in rows:
        print(f"{name:10} {fmt(row['prefill_ms_median'], '11.2f')} {fmt(row['decode_ms_per_token_median'], '9.3f')} "
              f"{row['chunk_ms_median']:9.1f}")
    if eng["lm_head_argmax_ms"] is not None:
        print(f"engine: LM head + argmax {eng['lm_head_argmax_ms']:.3f} ms of each token; decoder GEMMs "
              f"{eng['decoder_gemms']}")
    for name, us in (eng["kernel_us_per_token"] or {}).items():
        print(f"  {us:8.1f} us/token  {name}")
    for name, row in rows[1:]:
        print(f"{name} logits vs reference, teacher-forced: cosine min {row['logits_cosine_min']:.5f} mean "
              f"{row['logits_cosine_mean']:.5f}; greedy tokens agreeing {row['greedy_tokens_agreeing']}/"
              f"{result['tokens']}")
    if args.out:
        write_result(args.out, result, "pi0_fast", args.device.split(":")[0], result["config"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
