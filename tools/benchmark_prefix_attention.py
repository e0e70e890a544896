#!/usr/bin/env python3
"""Benchmark of the prefix attention in every form the engine runs, beside FlashAttention-2 as torch builds it.

The prefix attention of the pi0.5 / pi0 backbone: P prefix tokens (2 views x 256 image tokens + 64 text slots),
8 query heads, one K/V head, head dim 256, bidirectional, the text padding masked out of the keys. The engine runs
it through `Ops.prefix_attention`, whose implementations (`PREFIX_ATTENTION_IMPLS`: the Triton MQA kernel with
0, 1 or 4 key splits, torch SDPA in three forms, and with `prefix_attention_wgmma` the Hopper kernel of
kernels/flashrt_kernels/prefix_attention.py in two forms) are timed
at load and the fastest kept. This tool times all of them, whatever the switches, beside FlashAttention-2
(torch's `aten._flash_attention_forward`, its variable-length form) over the first n valid keys, which is exact
only where the valid keys come first (image tokens, prompt, padding):

    fa2_gqa    queries (P, 8, 256) against the one K/V head (FlashAttention's own GQA)
    fa2_rows   the heads stacked on the query axis, (P * 8, 1, 256), as the engine's Triton kernel stacks them

Every form is first checked against the fp32 softmax attention on the same inputs (the largest absolute error is
printed), then timed: 18 calls (one per backbone layer) captured in a CUDA graph, the graph replayed, GPU time per
call (median over replays). A form that cannot run here is listed with its error.

    python tools/benchmark_prefix_attention.py --out docs/benchmarks/<date>/prefix_attention_<gpu>.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashrt_core.engine import EngineOptions, detect_hardware, resolve  # noqa: E402

from flashrt_core.engine.kernel_configs import PREFIX_ATTENTION_IMPLS  # noqa: E402
from flashrt_core.engine.timing import graph_time_us  # noqa: E402
from flashrt_core.engine.ops import KeyMask, Ops  # noqa: E402
from flashrt_kernels.attention import attention_reference  # noqa: E402

LAYERS, HEADS, DH = 18, 8, 256


def flash_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_valid: torch.Tensor,
                 rows_form: bool) -> torch.Tensor:
    """FlashAttention-2 over the keys [0, n_valid): q (P, H, Dh) scaled, k / v (P, Dh) -> (P, H * Dh)."""
    P, H, Dh = q.shape
    q3 = q.reshape(P * H, 1, Dh) if rows_form else q
    zero = torch.zeros_like(n_valid)
    cu_q = torch.stack([zero, torch.full_like(n_valid, q3.shape[0])])
    cu_k = torch.stack([zero, n_valid])
    out = torch.ops.aten._flash_attention_forward(q3, k[:, None], v[:, None], cu_q, cu_k, q3.shape[0], P, 0.0,
                                                  False, False, scale=1.0)[0]
    return out.reshape(P, H * Dh)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n_valid: int) -> torch.Tensor:
    """fp32 softmax attention of every query over the keys [0, n_valid) -> (P, H * Dh): the kernels' own
    reference (kernels/flashrt_kernels/attention.py, heads stacked on the query axis) on fp32 copies of the inputs."""
    P, H, Dh = q.shape
    bias = torch.zeros(P, device=q.device)
    bias[n_valid:] = float("-inf")
    return attention_reference(q.float().reshape(P * H, Dh), k.float(), v.float(), bias, P, None, H,
                               1.0).reshape(P, H * Dh)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", type=int, default=576, help="prefix tokens (2 views x 256 + 64 text slots)")
    ap.add_argument("--valid", type=int, default=560, help="valid keys (image tokens + a 48-token prompt)")
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("benchmark_prefix_attention needs a CUDA GPU")
    import triton
    if not 0 < args.valid <= args.prefix:
        sys.exit(f"--valid must be in 1..{args.prefix}, got {args.valid}")
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    P = args.prefix
    q = torch.randn(P, HEADS, DH, device=dev, generator=g).mul(DH ** -0.5).to(torch.bfloat16)   # scaled, as handed over
    k = torch.randn(P, DH, device=dev, generator=g).to(torch.bfloat16)
    v = torch.randn(P, DH, device=dev, generator=g).to(torch.bfloat16)
    bias = torch.zeros(P, device=dev)
    bias[args.valid:] = float("-inf")
    ops = Ops(resolve(detect_hardware("auto", dev), EngineOptions()))
    want = reference(q, k, v, args.valid)

    mask = KeyMask(bias, P, None, HEADS)                        # built once per predict in the engine, too
    forms = {impl: (lambda impl=impl: ops.prefix_attention(q, k, v, mask, impl)) for impl in PREFIX_ATTENTION_IMPLS}
    n_valid = (bias == 0).sum(dtype=torch.int32)
    forms["fa2_gqa"] = lambda: flash_varlen(q, k, v, n_valid, rows_form=False)
    forms["fa2_rows"] = lambda: flash_varlen(q, k, v, n_valid, rows_form=True)
    rows = []
    for name, fn in forms.items():
        try:
            err = (fn().float() - want).abs().max().item()
            us = graph_time_us(lambda: [fn() for _ in range(LAYERS)], 1, args.replays) / LAYERS
            rows.append({"form": name, "us_per_call": us, "max_abs_err": err})
        except Exception as e:           # no kernel for this form here, or one that does not build: report, go on
            rows.append({"form": name, "error": str(e).splitlines()[0][:160]})
        print(rows[-1], flush=True)
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "triton": triton.__version__, "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat()}
    print(f"\n{env['gpu']}, torch {env['torch']}, triton {env['triton']}, {env['time_utc']}; {P} prefix tokens, "
          f"{args.valid} valid keys, {HEADS} heads x {DH}, one K/V head")
    print("| form | us per call | max abs error vs fp32 |")
    print("|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['form']} | cannot run: {r['error']} | |")
        else:
            print(f"| {r['form']} | {r['us_per_call']:.2f} | {r['max_abs_err']:.4f} |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"env": env, "prefix": P, "valid": args.valid, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
