"""The denoise of an EngineExecutor alone, captured as a CUDA graph: what the A/B benchmark of the denoiser's
fused step ends (tools/benchmark_denoise_step.py) times and compares. The chain tuning's capture
(EngineExecutor.capture_denoise), on a 2-view workspace of the tuning's text bucket
(EngineExecutor.tuning_text_bucket) with random K/V caches. And the full-size pi0.5 it loads: a checkpoint, or its
parameters drawn on the GPU (add_ab_args, pi05_model)."""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from flashrt_core.engine.forward import Workspace
from flashrt_core.engine.timing import graph_replay_ms


def add_ab_args(ap) -> None:
    """The denoise A/B tools' arguments: --ckpt-root (a full-size checkpoint there, written when missing),
    --random-init (no checkpoint), --out (the report's directory), --rounds and --replays (interleaved timing)."""
    ap.add_argument("--ckpt-root", default="/tmp/full")
    ap.add_argument("--random-init", action="store_true")
    ap.add_argument("--out", default=f"docs/benchmarks/{datetime.date.today().isoformat()}")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--replays", type=int, default=30)


def random_model(cfg, dev):
    """PiModel(cfg) with every parameter drawn on the GPU in bf16 (normal, std 0.02): the timing does not depend
    on the values, and the load takes seconds instead of a checkpoint write."""
    from flashrt_core.model import PiModel
    with torch.device("meta"):
        model = PiModel(cfg)
    model = model.to_empty(device=dev).to(torch.bfloat16)
    g = torch.Generator(device=dev).manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02, generator=g)
        for b in model.buffers():
            if b.is_floating_point():
                b.normal_(0.0, 0.02, generator=g)
    return model.eval()


def pi05_model(args, dev):
    """Full-size pi0.5 in bf16 on dev, as add_ab_args asked: (config, model, a label of the weights)."""
    from flashrt_core.config import get_config
    cfg = get_config("pi05")
    if args.random_init:
        return cfg, random_model(cfg, dev), "random init, std 0.02"
    from flashrt_core.checkpoint import load_model_weights
    from tools.benchmark_engine import ensure_checkpoint
    return cfg, load_model_weights(ensure_checkpoint(Path(args.ckpt_root), "pi05"), cfg, dev, torch.bfloat16), \
        "checkpoint"


@dataclass
class DenoiseInputs:
    ws: Workspace
    key_bias: torch.Tensor          # (P,) all keys visible
    n_valid: torch.Tensor           # (1,) = P
    noise: torch.Tensor             # pinned noise, copied into ws.noise before each compared run


def denoise_inputs(engine, seed: int = 0) -> DenoiseInputs:
    dev = engine.device
    ws = engine.make_entry((0, 1), None, engine.tuning_text_bucket).ws
    P = ws.k_cache.shape[2] - engine.suffix_len
    g = torch.Generator(device=dev).manual_seed(seed)
    ws.k_cache.normal_(generator=g)
    ws.v_cache.normal_(generator=g)
    return DenoiseInputs(ws, torch.zeros(P, device=dev), torch.full((1,), P, device=dev, dtype=torch.int64),
                         torch.randn(ws.noise.shape, device=dev, generator=g))


def denoise_graph(engine, inp: DenoiseInputs) -> torch.cuda.CUDAGraph:
    """The engine's denoise capture (EngineExecutor.capture_denoise: a warm-up run, the capture, one replay),
    finished."""
    graph = engine.capture_denoise(inp.ws, inp.key_bias, inp.n_valid)
    torch.cuda.synchronize()
    return graph


def denoise_actions(engine, inp: DenoiseInputs) -> torch.Tensor:
    """The normalized actions of one replay from the pinned noise, with the engine's current settings."""
    graph = denoise_graph(engine, inp)
    inp.ws.noise.copy_(inp.noise)
    graph.replay()
    torch.cuda.synchronize()
    return inp.ws.actions.clone()


def denoise_ms(engine, inp: DenoiseInputs, replays: int) -> float:
    """Median replay time of the denoise captured with the engine's current settings."""
    graph = denoise_graph(engine, inp)
    return float(np.median(graph_replay_ms(graph, replays)))


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.flatten().double(), b.flatten().double()
    return float(a @ b / a.norm() / b.norm())


def ab_cells(base: list[float], variant: list[float]) -> str:
    """Markdown cells of two per-round time lists (ms): base min / median, variant min / median, the medians'
    difference."""
    b, v = float(np.median(base)), float(np.median(variant))
    return f"{min(base):.3f} / {b:.3f} | {min(variant):.3f} / {v:.3f} | {v - b:+.3f}"


def write_report(out_dir: str | Path, name: str, result: dict, lines: list[str]) -> None:
    """result as <name>_<gpu>_<date>.json and lines as the .md beside it in out_dir; the table printed last."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name().split()[-1].lower()
    stem = out / f"{name}_{gpu}_{datetime.date.today().isoformat()}"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
