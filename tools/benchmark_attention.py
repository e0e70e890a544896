#!/usr/bin/env python3
"""Benchmark of the denoiser's attention block on the GPU: QKV GEMM -> (RoPE + KV write) -> attention, per layer.

Compares, at the real pi0.5 expert shapes (10 suffix rows, 8 heads, head dim 256, one KV head, 576 prefix keys:
2 views + 64 text slots), the two ways the engine can run a step's attention block:

    qkv_rope + attention   the QKV GEMM, the qkv_rope kernel (RoPE, q scale, suffix K/V into the cache), attention
    decoder_attention      the QKV GEMM, then one attention kernel that applies RoPE itself (rope_in_attention)

for each key block of the decoder's early-K/V path (the launchers' key_block). `--o-gemm` appends the O projection
to every block (the split-K GEMM the engine's tuning picks on the H200: the shared-memory TMA GEMM in 2 K slices,
else the few-row Triton GEMM), so that what the attention releases to the kernel after it is timed too. Every
variant runs the block over 18 layers (their own weights and caches, as the denoiser does), launched with
programmatic dependent launch, captured in a CUDA graph and replayed; the time is GPU time per layer (CUDA events
around the replays).

    python tools/benchmark_attention.py [--o-gemm] --out docs/benchmarks/<date>/attention_<gpu>.json

Prints a markdown table; the JSON holds the same numbers with the GPU, driver, torch and Triton versions.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashrt_core.engine.kernel_import import load_kernels  # noqa: E402
from flashrt_core.engine.kernel_configs import SKINNY_DEFAULT  # noqa: E402
from flashrt_core.engine.timing import graph_time_us  # noqa: E402

LAYERS, ROWS, HEADS, DH, WIDTH = 18, 10, 8, 256, 1024


def build(prefix: int, rows: int, device: torch.device) -> dict:
    g = torch.Generator(device=device).manual_seed(0)
    bf = torch.bfloat16

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, device=device, generator=g) * scale).to(bf)
    kern = load_kernels()
    cos, sin = kern.rope_tables(prefix + rows, DH, 10000.0, device)
    return {
        "y": rnd(rows, WIDTH),
        "w": [rnd((HEADS + 2) * DH, WIDTH, scale=WIDTH ** -0.5) for _ in range(LAYERS)],
        "w_o": [rnd(WIDTH, HEADS * DH, scale=(HEADS * DH) ** -0.5) for _ in range(LAYERS)],
        "k": [rnd(1, prefix + rows, DH) for _ in range(LAYERS)],
        "v": [rnd(1, prefix + rows, DH) for _ in range(LAYERS)],
        "q": torch.empty(rows, HEADS, DH, device=device, dtype=bf),
        "out": torch.empty(rows * HEADS, DH, device=device, dtype=bf),
        "pos": torch.arange(prefix, prefix + rows, device=device),
        "cos": cos, "sin": sin,
        "bias": torch.zeros(prefix, device=device),
        "visible": torch.full((rows,), rows, device=device, dtype=torch.int32),
        "prefix": prefix, "rows": rows,
    }


PATHS = ("qkv_rope + attention", "decoder_attention")


def block(st: dict, i: int, path: str, key_block: int, o_gemm: bool) -> None:
    kern = load_kernels()
    c = SKINNY_DEFAULT["qkv"]
    qkv = kern.skinny_gemm(st["y"], st["w"][i], False, c.split_k, c.block_n, c.block_k, c.stages, c.warps, pdl=True)
    P, S = st["prefix"], st["rows"]
    if path == "decoder_attention":
        kern.decoder_attention(qkv, st["k"][i][0], st["v"][i][0], st["pos"], st["cos"], st["sin"], st["bias"], P,
                               st["visible"], HEADS, DH ** -0.5, st["out"], pdl=True, key_block=key_block)
    else:
        kern.qkv_rope(qkv, st["pos"], st["cos"], st["sin"], st["q"], st["k"][i], st["v"][i], P, HEADS, 1,
                      DH ** -0.5, pdl=True)
        kern.attention(st["q"].view(S * HEADS, DH), st["k"][i][0], st["v"][i][0], st["bias"], P, st["visible"],
                       HEADS, 1.0, st["out"], pdl=True, key_block=key_block)
    if o_gemm:
        x = st["out"].view(S, HEADS * DH)
        if kern.HAVE_GLUON and kern.smem_gemm_supported(S, WIDTH, HEADS * DH, False, 2) and \
                torch.cuda.get_device_capability()[0] == 9:
            kern.smem_gemm(x, st["w_o"][i], split_k=2, pdl=True)
        else:
            c = SKINNY_DEFAULT["o"]
            kern.skinny_gemm(x, st["w_o"][i], False, c.split_k, c.block_n, c.block_k, c.stages, c.warps, pdl=True)


def time_us(st: dict, path: str, key_block: int, reps: int, replays: int, o_gemm: bool) -> float:
    """GPU time per layer: `reps` passes over the 18 layers in one graph, the median of `replays` replays."""
    return graph_time_us(lambda: [block(st, i, path, key_block, o_gemm) for i in range(LAYERS)], reps,
                         replays) / LAYERS


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", type=int, default=576, help="prefix keys (2 views x 256 + 64 text slots)")
    ap.add_argument("--rows", type=int, nargs="+", default=[ROWS], help="suffix rows (pi0.5 h10: 10, h50: 50)")
    ap.add_argument("--key-blocks", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--reps", type=int, default=10, help="passes over the 18 layers per graph")
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--o-gemm", action="store_true", help="append the O projection to every block")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("benchmark_attention needs a CUDA GPU")
    import triton
    attn_module = sys.modules[load_kernels().attention.__module__]
    dev = torch.device("cuda")
    rows_out = []
    for rows in args.rows:
        st = build(args.prefix, rows, dev)
        for kb in args.key_blocks:
            for path in PATHS:
                fused = path == "decoder_attention"
                us = time_us(st, path, kb, args.reps, args.replays, args.o_gemm)
                plan = attn_module.plan(rows * HEADS, args.prefix if fused else args.prefix + rows, key_block=kb)
                rows_out.append({"rows": rows, "key_block": kb, "path": path, "us_per_layer": us, "plan": plan})
                print(f"rows {rows} key block {kb} {path}: {us:.2f} us per layer", flush=True)
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "triton": triton.__version__, "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat()}
    print(f"\n{env['gpu']}, torch {env['torch']}, triton {env['triton']}, {env['time_utc']}; prefix {args.prefix} keys"
          + ("; with the O GEMM" if args.o_gemm else ""))
    print("| rows | key block | path | us per layer (GEMM + RoPE + attention" + (" + O" if args.o_gemm else "")
          + ") | (BLOCK_M, BLOCK_N, splits) |")
    print("|---|---|---|---|---|")
    for r in rows_out:
        print(f"| {r['rows']} | {r['key_block']} | {r['path']} | {r['us_per_layer']:.2f} | {r['plan']} |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"env": env, "prefix": args.prefix, "o_gemm": args.o_gemm, "rows": rows_out},
                                       indent=1))


if __name__ == "__main__":
    main()
