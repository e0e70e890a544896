"""What each kind of kernel costs the denoise's critical path: the denoise captured as its own graph with one kind
of its per-layer kernels left out, against the whole denoise, in one process.

The denoise is a chain of ~8 dependent kernels per expert layer (adaRMSNorm, QKV GEMM, attention key splits and
their merge, O GEMM, adaRMSNorm, gate/up GEMM with GeGLU, down GEMM) over 10 steps x 18 layers, each launched with
PDL so that it loads its weights while the one ahead runs. A kernel's own duration under PDL includes its wait for
the one ahead, so a profile does not say what a kernel adds to the chain; leaving it out does. What the denoise
saves without a kind of kernel is the most that fusing that kind away (into the kernels around it) can save: the
bound a fusion design is weighed against before it is built.

Each ablation replaces the left-out ops by a buffer of the shape they return (their values from the whole
denoise's warm-up), so the kernels after them run on the same shapes; the actions of an ablated graph are
meaningless and are not read. Ablations (`--ablations`, default all):

    norms           both adaRMSNorms of every layer (the first layer's first norm runs in the step's input kernel)
    attention_merge the merge of the attention's key splits (the split kernel's partials are left unmerged)
    attention       the attention's split and merge kernels (the QKV GEMM stays)
    qkv, o, gate_up, down   that GEMM of every layer
    gemms           all four GEMMs (the chain of norms and attention left)
    norms_attention the norms and the attention (the chain of the four GEMMs left)

    python tools/benchmark_denoise_ablation.py --ckpt-root /tmp/full [--config pi05] [--views 2] [--horizon 10]
        [--precision bf16|fp8] [--reps 50] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashrt_core.engine.forward import denoise, prefix, vision  # noqa: E402
from flashrt_core.engine.kernel_import import load_kernels  # noqa: E402
from flashrt_core.engine.ops import Ops  # noqa: E402
from flashrt_core.engine.timing import graph_replay_ms  # noqa: E402

GEMM_KINDS = ("qkv", "o", "gate_up", "down")
ABLATIONS: dict[str, tuple[str, ...]] = {
    "norms": ("norms",),
    "attention_merge": ("attention_merge",),
    "attention": ("attention",),
    **{kind: (kind,) for kind in GEMM_KINDS},
    "gemms": GEMM_KINDS,
    "norms_attention": ("norms", "attention"),
}
PARTS = frozenset(part for parts in ABLATIONS.values() for part in parts)


class Ablation:
    """Leaves `parts` (names from PARTS) out of an Ops' denoiser layers while active (a context manager that
    restores the Ops and the kernels module on exit). The ops' results are recorded by an active Ablation with no
    parts (`Ablation(ops, ())`, run once over the same forward first): a left-out op returns its recorded result,
    the last eager one of that op and shape."""

    def __init__(self, ops: Ops, parts: tuple[str, ...], recorded: dict | None = None):
        unknown = set(parts) - PARTS
        if unknown:
            raise ValueError(f"unknown ablation parts {sorted(unknown)}; known: {sorted(PARTS)}")
        self.ops, self.parts = ops, tuple(parts)
        self.recorded = {} if recorded is None else recorded
        self.left_out: dict[str, int] = {part: 0 for part in parts}      # calls left out, per part
        self._stack = contextlib.ExitStack()

    def _recorded(self, name: str, shape_key: tuple) -> torch.Tensor:
        try:
            return self.recorded[(name, shape_key)]
        except KeyError:
            raise RuntimeError(f"ablation: no recorded result of {name} at {shape_key}; run the forward once under "
                               f"Ablation(ops, ()) with the same recorded dict first") from None

    def _record(self, key: tuple, out: torch.Tensor) -> None:
        # eager results only: a tensor made during a capture lives in that graph's memory pool
        if not (out.is_cuda and torch.cuda.is_current_stream_capturing()):
            self.recorded[key] = out

    def __enter__(self) -> "Ablation":
        ops, parts = self.ops, self.parts
        real_decoder, real_attention, real_norm = ops.decoder, ops.decoder_attention, ops.ada_norm

        def decoder(x, lin, kind, impl=None):
            key = ("decoder", (kind, tuple(x.shape)))
            if kind in parts:
                self.left_out[kind] += 1
                return self._recorded(*key)
            out = real_decoder(x, lin, kind, impl)
            self._record(key, out)
            return out

        def decoder_attention(x, lin, pos, cos, sin, q_out, k_cache, v_cache, mask, heads, q_scale):
            key = ("decoder_attention", (tuple(x.shape), heads))
            if "attention" in parts:
                self.left_out["attention"] += 1
                ops.decoder(x, lin, "qkv")                # the QKV GEMM stays (unless "qkv" is left out too)
                return self._recorded(*key)
            out = real_attention(x, lin, pos, cos, sin, q_out, k_cache, v_cache, mask, heads, q_scale)
            self._record(key, out)
            return out

        def ada_norm(x, residual, gate, scale1p, shift, out, eps=1e-6, site="other", row_variant=None):
            if "norms" in parts and site in ("norm1", "norm2"):
                self.left_out["norms"] += 1
                return out
            return real_norm(x, residual, gate, scale1p, shift, out, eps, site=site, row_variant=row_variant)

        for name, fn in (("decoder", decoder), ("decoder_attention", decoder_attention), ("ada_norm", ada_norm)):
            setattr(ops, name, fn)
            self._stack.callback(ops.__dict__.pop, name)
        if "attention_merge" in parts:
            attention = sys.modules[load_kernels().__name__ + ".attention"]
            real_merge = attention.merge_splits

            def merge_splits(acc, ml, out, pdl=False):
                self.left_out["attention_merge"] += 1
                return out

            attention.merge_splits = merge_splits
            self._stack.callback(setattr, attention, "merge_splits", real_merge)
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()


def denoise_graph_ms(engine, key: tuple, parts: tuple[str, ...], recorded: dict, reps: int) -> tuple[float, dict]:
    """(median ms of `reps` replays, calls left out per part in one denoise) of the denoise of signature `key`
    captured as its own graph with `parts` left out."""
    entry = engine.entries[key]
    ws, w, ops = entry.ws, engine.weights, engine.ops
    tokens = vision(ws, w, ops)
    bias, n_valid = prefix(ws, w, ops, tokens)
    with Ablation(ops, parts, recorded) as ablation:
        denoise(ws, w, ops, bias, n_valid)              # eager warm-up (and the record, with no parts)
        torch.cuda.synchronize()
        left_out = dict(ablation.left_out)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            denoise(ws, w, ops, bias, n_valid)
    ms = float(statistics.median(graph_replay_ms(graph, reps)))
    del graph
    return ms, left_out


def measure(engine, key: tuple, ablations: list[str], reps: int, layers: int) -> dict:
    """{"whole": ms, "ablations": {name: {"ms", "saved_ms", "saved_us_per_layer", "left_out"}}}."""
    recorded: dict = {}
    whole, _ = denoise_graph_ms(engine, key, (), recorded, reps)
    print(f"| whole denoise | {whole:.3f} | | |", flush=True)
    rows = {}
    for name in ablations:
        ms, left_out = denoise_graph_ms(engine, key, ABLATIONS[name], recorded, reps)
        saved = whole - ms
        rows[name] = {"ms": ms, "saved_ms": saved, "saved_us_per_layer": saved / layers * 1e3, "left_out": left_out}
        print(f"| without {name} | {ms:.3f} | {saved:.3f} | {saved / layers * 1e3:.2f} |", flush=True)
    again, _ = denoise_graph_ms(engine, key, (), recorded, reps)
    print(f"| whole denoise, again | {again:.3f} | | |", flush=True)
    return {"whole_ms": whole, "whole_again_ms": again, "ablations": rows}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt-root", required=True, help="full-size checkpoints (made there if missing)")
    parser.add_argument("--config", default="pi05", choices=("pi05", "pi0"))
    parser.add_argument("--views", type=int, default=2)
    parser.add_argument("--horizon", type=int, default=10)
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp8"))
    parser.add_argument("--ablations", nargs="+", default=list(ABLATIONS), choices=list(ABLATIONS))
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--out", help="folder for the JSON result")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmark_denoise_ablation.py needs a CUDA GPU")
    from flashrt_core.checkpoint import load_model_weights
    from flashrt_core.config import get_config
    from flashrt_core.engine import EngineExecutor, EngineOptions, detect_hardware, resolve
    from flashrt_core.engine.fp8_calibration import calibrate_executor
    from flashrt_core.engine.gate import random_observation
    from tools.benchmark_engine import PROMPT_TOKENS, ensure_checkpoint, env_info, write_result

    dev = torch.device("cuda")
    ckpt = ensure_checkpoint(Path(args.ckpt_root), args.config)
    cfg = get_config(args.config).replace(action_horizon=args.horizon)
    model = load_model_weights(ckpt, cfg, dev, torch.bfloat16)
    opts = EngineOptions.from_env(EngineOptions(fp8=args.precision == "fp8"))
    engine = EngineExecutor(model, cfg, dev, resolve(detect_hardware("auto", dev), opts))
    obs = random_observation(cfg, np.random.default_rng(args.views), views=args.views, n_text=PROMPT_TOKENS,
                             vocab=1024)
    if engine.fp8_calibration is not None:
        calibrate_executor(engine, [obs])
    engine.predict_observation(obs.images, obs.tokens, obs.token_mask, obs.state, obs.noise)
    key = next(k for k in engine.entries if len(k[1]) == args.views)
    layers = len(engine.weights.dts) * len(engine.weights.expert)
    print(f"{args.config} {args.precision}, {args.views} views, horizon {args.horizon}: {layers} expert layers, "
          f"{torch.cuda.get_device_name()}; decoder GEMMs {dict(engine.ops.decoder_impl)}")
    print("| denoise graph | ms | saved ms | saved us per layer |\n|---|---|---|---|", flush=True)
    results = measure(engine, key, args.ablations, args.reps, layers)
    result = {**env_info(), "command": "python tools/benchmark_denoise_ablation.py " + " ".join(argv),
              "config": args.config, "precision": args.precision, "views": args.views, "horizon": args.horizon,
              "layers": layers, "reps": args.reps, "dispatch": engine.dispatch.summary(),
              "decoder_gemm": {k: str(v) for k, v in engine.ops.decoder_impl.items()}, **results}
    if args.out:
        write_result(args.out, result, "denoise_ablation", args.config, args.precision)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
