"""The denoise of an EngineExecutor alone, captured as a CUDA graph: what the A/B benchmarks of the denoiser's
fusions (tools/benchmark_ada_norm_fold.py, tools/benchmark_denoise_step.py, tools/benchmark_denoise_layer.py)
time and compare. The chain tuning's capture (EngineExecutor.capture_denoise), on a 2-view workspace of the
tuning's text bucket (EngineExecutor.tuning_text_bucket) with random K/V caches. And the full-size pi0.5 they
load: a checkpoint, or its parameters drawn on the GPU (add_ab_args, pi05_model); and random inputs of one
expert layer for kernels/flashrt_kernels/denoise_layer.py alone (random_layer_case)."""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from flashrt_core.engine.forward import Workspace
from flashrt_core.engine.graph_executor import graph_replay_ms


def add_ab_args(ap) -> None:
    """The denoise A/B tools' arguments: --ckpt-root (a full-size checkpoint there, written when missing),
    --random-init (no checkpoint), --out (the report's directory), --rounds and --replays (interleaved timing)."""
    ap.add_argument("--ckpt-root", default="/tmp/full")
    ap.add_argument("--random-init", action="store_true")
    ap.add_argument("--out", default="docs/benchmarks")
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


def random_layer_case(S: int, P: int, W: int, H: int, dh: int, F: int, has_x: bool, seed: int,
                      device: torch.device | str, dtype: torch.dtype):
    """Random pi0.5 expert-layer inputs: weights ~ 1/sqrt(fan-in), a residual of scale ~3, ada tables near their
    trained ranges, a prefix with some keys masked, K/V caches of P prefix rows (+ S rows the layer writes); the
    weights and caches in `dtype`. kernels/flashrt_kernels/denoise_layer.py's argument order: (residual, x_prev, tables, weights,
    k_cache, v_cache, pos, cos, sin, key_bias, visible). Shared by its GPU test and tools/benchmark_denoise_layer.py."""
    from flashrt_core.engine.kernel_import import load_kernels
    K = load_kernels()
    g = torch.Generator(device=device).manual_seed(seed)
    bf = dtype

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, device=device, generator=g) * scale

    weights = K.LayerWeights(qkv=rnd((H + 2) * dh, W, scale=W ** -0.5).to(bf),
                             o=rnd(W, H * dh, scale=(H * dh) ** -0.5).to(bf),
                             gate_up=rnd(2 * F, W, scale=W ** -0.5).to(bf), down=rnd(W, F, scale=F ** -0.5).to(bf))
    shift_1, shift_2 = rnd(W, scale=0.3), rnd(W, scale=0.3)
    tables = K.LayerTables(gate0=rnd(W, scale=0.5) if has_x else None, scale1p_1=1 + rnd(W, scale=0.2),
                           shift_1=shift_1, gate1=rnd(W, scale=0.5), scale1p_2=1 + rnd(W, scale=0.2),
                           shift_2=shift_2, bias_qkv=K.fold_shift(shift_1, weights.qkv),
                           bias_gu=K.fold_shift(shift_2, weights.gate_up))
    residual = rnd(S, W, scale=3.0)
    x_prev = rnd(S, W) if has_x else None
    k_cache, v_cache = rnd(P + S + 3, dh).to(bf), rnd(P + S + 3, dh).to(bf)
    key_bias = torch.where(torch.rand(P, device=device, generator=g) > 0.2, 0.0, float("-inf"))
    key_bias[0] = 0.0
    n_valid = int((key_bias == 0).sum())
    pos = (n_valid + torch.arange(S, device=device)).to(torch.int64)
    cos, sin = K.rope_tables(P + S + 8, dh, device=device)
    visible = torch.full((S,), S, device=device, dtype=torch.int32)
    visible[0] = 1                                                     # one token sees fewer suffix keys
    return residual, x_prev, tables, weights, k_cache, v_cache, pos, cos, sin, key_bias, visible


@dataclass
class DenoiseInputs:
    ws: Workspace
    key_bias: torch.Tensor          # (P,) all keys visible
    n_valid: torch.Tensor           # (1,) = P
    noise: torch.Tensor             # pinned noise, copied into ws.noise before each compared run


def denoise_inputs(engine, seed: int = 0) -> DenoiseInputs:
    dev = engine.device
    ws = engine._make_entry((0, 1), None, engine.tuning_text_bucket).ws
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
