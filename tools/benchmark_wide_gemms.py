#!/usr/bin/env python3
"""Benchmark of the wide GEMMs (hundreds of rows) of the vision tower and the prefix, each form the engine could run.

A timeline of a bf16 replay (tools/profile_engine_timeline.py, 2026-11-30) put the vision tower at
~25 % of the H200's dense bf16 peak: its 512-row GEMMs take 10-12 us each, whatever their FLOPs. This tool times
every wide GEMM shape of pi0.5 (vision: QKV, O, fc1 with its tanh GELU, fc2 at 256 rows per view; prefix: QKV, O,
gate/up with its GeGLU, down at 256 rows per view + 64 text slots) in the forms below, each captured `--reps` times
in a CUDA graph and replayed (GPU time per call, no launch overhead):

    linear          F.linear(x, w, b): what ops.linear runs (cuBLASLt, bias in the epilogue)
    linear_nobias   F.linear(x, w) then x += b: the bias as its own kernel
    addmm           torch.addmm(b, x, w.t())
    epilogue        fc1 only: torch._addmm_activation(b, x, w.t(), use_gelu=True), ops.linear_gelu's path;
                    gate/up only: F.linear then the engine's Triton GeGLU kernel (kernels/flashrt_kernels/geglu.py)
    fp8             torch._scaled_mm, E4M3 weights and activations, per-tensor static scales (quantization of x not
                    timed: the engine's FP8 path quantizes in the kernel ahead where it can)
    fp8_fast        the same with use_fast_accum: the tensor cores accumulate the whole K loop (no fp32 promotion
                    every few K steps; faster alone, no gain in the engine: docs/engine.md, "Tried and rejected")
    fp8_row         torch._scaled_mm with a scale per row of x and per row of W ((M, 1) and (1, N) fp32), x
                    quantized ahead (not timed): the form per-row FP8 on the prefix's attention projections would
                    run; they stay bf16 (docs/engine.md, "Tried and rejected")
    inductor        torch.compile(mode="max-autotune-no-cudagraphs") of the same function (linear, + GELU for fc1,
                    + GeGLU for gate/up): Inductor's Triton GEMM templates with fused epilogues, autotuned against
                    cuBLAS; whether a Triton GEMM beats the library at these shapes (--no-inductor skips it)
    fp8_inductor    the fp8_fast GEMM under the same torch.compile: Inductor's Triton scaled-mm templates against
                    cuBLASLt's FP8 kernel, which runs the 576-row gate/up with its GeGLU at 590-650 TFLOP/s
                    on the H200, a third of its dense FP8 peak

    python tools/benchmark_wide_gemms.py --views 2 --out docs/benchmarks/<date>/wide_gemms_<gpu>.json

Prints a markdown table (us per call and TFLOP/s); the JSON holds the same with GPU, driver and versions.
On a machine without CUDA, `--device cpu` runs every form once on small shapes (a check that the tool works).
A hand-written tiled Triton GEMM lost to cuBLAS by 1.3-3.4x at every shape on the H200 and is not among the forms
(docs/engine.md, "Tried and rejected").
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashrt_core.config import get_config  # noqa: E402


@dataclass(frozen=True)
class Shape:
    tower: str          # "vision" | "prefix"
    name: str           # qkv | o | fc1 | fc2 | gate_up | down
    rows: int
    n: int              # output features (gate_up: gate and up together)
    k: int
    epilogue: str       # "" | "gelu" | "geglu"

    @property
    def flops(self) -> float:
        return 2.0 * self.rows * self.n * self.k


def wide_shapes(config: str, views: int, text_slots: int, scale: int = 1,
                pad_vision_mlp: tuple[int, ...] = ()) -> list[Shape]:
    """The wide GEMMs of one predict at `views` views (scale > 1 divides every size, for the CPU check).
    pad_vision_mlp: for each multiple m, the vision fc1 / fc2 again with the MLP width (SigLIP's 4304, not a
    multiple of 64) rounded up to m, named fc1_pad<width> / fc2_pad<width>, each width once: zero rows of fc1 and
    zero columns of fc2 would compute the same, so this asks whether cuBLAS runs the padded shapes faster."""
    cfg = get_config(config)
    v, g = cfg.vision, cfg.paligemma
    rv = views * v.num_patches // scale
    rp = (views * v.num_patches + text_slots) // scale
    vw, vm, gw, gm = v.width // scale, v.mlp_dim // scale, g.width // scale, g.mlp_dim // scale
    q, kv = g.num_heads * g.head_dim // scale, g.num_kv_heads * g.head_dim // scale
    return [Shape("vision", "qkv", rv, 3 * vw, vw, ""), Shape("vision", "o", rv, vw, vw, ""),
            Shape("vision", "fc1", rv, vm, vw, "gelu"), Shape("vision", "fc2", rv, vw, vm, ""),
            Shape("prefix", "qkv", rp, q + 2 * kv, gw, ""), Shape("prefix", "o", rp, gw, q, ""),
            Shape("prefix", "gate_up", rp, 2 * gm, gw, "geglu"), Shape("prefix", "down", rp, gw, gm, "")] + [
        shape for padded in sorted({-(-v.mlp_dim // m) * m for m in pad_vision_mlp} - {v.mlp_dim})
        for shape in (Shape("vision", f"fc1_pad{padded}", rv, padded // scale, vw, "gelu"),
                      Shape("vision", f"fc2_pad{padded}", rv, vw, padded // scale, ""))]


def _geglu_torch(y: torch.Tensor) -> torch.Tensor:
    gate, up = y.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def _quantize_rows_torch(t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """t (R, C) -> (E4M3 rows, (R, 1) fp32 scales), each row by its own amax."""
    scale = t.float().abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / torch.finfo(dtype).max
    return (t.float() / scale).to(dtype), scale


def forms(shape: Shape, device: torch.device, inductor: bool) -> dict[str, Callable[[], torch.Tensor]]:
    """name -> a call computing the shape's GEMM (and its epilogue where it has one) on fixed random inputs."""
    g = torch.Generator(device=device).manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    x = torch.randn(shape.rows, shape.k, device=device, generator=g).to(dtype)
    w = (torch.randn(shape.n, shape.k, device=device, generator=g) * shape.k ** -0.5).to(dtype)
    has_bias = shape.tower == "vision"            # SigLIP's linears have biases, Gemma's do not
    b = torch.randn(shape.n, device=device, generator=g).to(dtype) if has_bias else None
    after = {"": lambda y: y, "gelu": lambda y: F.gelu(y, approximate="tanh"), "geglu": _geglu_torch}[shape.epilogue]

    def plain() -> torch.Tensor:
        return after(F.linear(x, w, b))

    out: dict[str, Callable[[], torch.Tensor]] = {"linear": plain}
    if has_bias:
        def nobias() -> torch.Tensor:
            y = F.linear(x, w)
            y += b
            return after(y)
        out["linear_nobias"] = nobias
        out["addmm"] = lambda: after(torch.addmm(b, x, w.t()))
    if shape.epilogue == "gelu" and device.type == "cuda":
        out["epilogue"] = lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True)
    from flashrt_core.engine.kernel_import import load_kernels, triton_available
    if shape.epilogue == "geglu" and device.type == "cuda" and triton_available():
        kern = load_kernels()
        act = torch.empty(shape.rows, shape.n // 2, device=device, dtype=dtype)
        out["epilogue"] = lambda: kern.geglu(F.linear(x, w), act)
    if device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9):
        fp8 = torch.float8_e4m3fn
        sx = (x.float().abs().max() / torch.finfo(fp8).max).reshape(())
        sw = (w.float().abs().max() / torch.finfo(fp8).max).reshape(())
        xq, wq = (x.float() / sx).to(fp8), (w.float() / sw).to(fp8)
        out["fp8"] = lambda: after(torch._scaled_mm(xq, wq.t(), scale_a=sx, scale_b=sw, bias=b,
                                                    out_dtype=torch.bfloat16))
        out["fp8_fast"] = lambda: after(torch._scaled_mm(xq, wq.t(), scale_a=sx, scale_b=sw, bias=b,
                                                         out_dtype=torch.bfloat16, use_fast_accum=True))
        wq_rows, sw_rows = _quantize_rows_torch(w, fp8)
        xq_rows, sx_rows = _quantize_rows_torch(x, fp8)
        out["fp8_row"] = lambda: after(torch._scaled_mm(xq_rows, wq_rows.t(), scale_a=sx_rows, scale_b=sw_rows.t(),
                                                        bias=b, out_dtype=torch.bfloat16))
    if inductor and device.type == "cuda":
        compiled = torch.compile(plain, mode="max-autotune-no-cudagraphs", dynamic=False)
        out["inductor"] = compiled
        if "fp8" in out:        # Inductor's Triton scaled-mm templates (persistent TMA on Hopper) against cuBLASLt
            scaled = torch.compile(lambda: torch._scaled_mm(xq, wq.t(), scale_a=sx, scale_b=sw, bias=b,
                                                            out_dtype=torch.bfloat16, use_fast_accum=True),
                                   mode="max-autotune-no-cudagraphs", dynamic=False)
            out["fp8_inductor"] = lambda: after(scaled())
    return out


def time_us(fn: Callable[[], torch.Tensor], device: torch.device, reps: int, replays: int) -> float:
    """GPU time per call: `reps` calls captured in one CUDA graph, median over `replays` replays (CUDA: events);
    on the CPU the median wall time of `replays` calls."""
    if device.type != "cuda":
        samples = []
        for _ in range(max(1, replays)):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e6)
        return float(sorted(samples)[len(samples) // 2])
    from flashrt_core.engine.timing import graph_replay_ms, side_stream
    stream = side_stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()                                   # compiles / autotunes outside the capture
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    graph.replay()
    samples = graph_replay_ms(graph, replays)
    return float(sorted(samples)[len(samples) // 2]) * 1e3 / reps


def cosine(got: torch.Tensor, want: torch.Tensor) -> float:
    """Cosine of two outputs, flattened, in fp32 on their device."""
    got, want = got.float().flatten(), want.float().flatten()
    return float(torch.dot(got, want) / (got.norm() * want.norm()).clamp_min(1e-30))


def check(fn: Callable[[], torch.Tensor], reference: torch.Tensor, name: str) -> float:
    """Cosine of a form's output against the plain form's: every form computes the same thing."""
    cos = cosine(fn(), reference)
    if not cos > 0.99:
        raise RuntimeError(f"{name}: output differs from F.linear (cosine {cos:.5f})")
    return cos


def run(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    scale = 1 if device.type == "cuda" else 16
    rows = []
    for shape in wide_shapes(args.config, args.views, args.text_slots, scale, tuple(args.pad_vision_mlp)):
        calls = forms(shape, device, args.inductor)
        reference = calls["linear"]()
        for name, fn in calls.items():
            try:
                cos = check(fn, reference, f"{shape.tower} {shape.name} {name}")
                us = time_us(fn, device, args.reps, args.replays)
            except Exception as error:            # a form this GPU or torch build cannot run: recorded, not fatal
                rows.append({"tower": shape.tower, "gemm": shape.name, "form": name, "error": str(error)[:300]})
                continue
            rows.append({"tower": shape.tower, "gemm": shape.name, "rows": shape.rows, "n": shape.n, "k": shape.k,
                         "epilogue": shape.epilogue, "form": name, "us": us, "cosine": cos,
                         "tflops": shape.flops / us * 1e-6})
    env = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "cuda": torch.version.cuda,
           "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        pass
    return {"env": env, "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}


def table(result: dict) -> str:
    lines = [f"{result['env']['device']}, torch {result['env']['torch']}, {result['env']['time_utc']}",
             "| tower | GEMM | rows x N x K | form | us per call | TFLOP/s |", "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['tower']} | {r['gemm']} | | {r['form']} | failed: {r['error'][:60]} | |")
        else:
            lines.append(f"| {r['tower']} | {r['gemm']}{' + ' + r['epilogue'] if r['epilogue'] else ''} | "
                         f"{r['rows']} x {r['n']} x {r['k']} | {r['form']} | {r['us']:.2f} | {r['tflops']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="pi05")
    ap.add_argument("--views", type=int, default=2)
    ap.add_argument("--text-slots", type=int, default=64)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--reps", type=int, default=20, help="calls per captured graph")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--no-inductor", dest="inductor", action="store_false")
    ap.add_argument("--pad-vision-mlp", type=int, nargs="*", default=[], metavar="M",
                    help="also time the vision fc1 / fc2 with the MLP width rounded up to each multiple M")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA GPU: run with --device cpu for the tool check", file=sys.stderr)
        return 2
    result = run(args)
    print(table(result))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
