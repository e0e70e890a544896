#!/usr/bin/env python3
"""The action expert's MLP in one launch (kernels/flashrt_kernels/smem_mlp.py, a candidate) against the chain's two launches, at
the denoiser's shapes, as a chain of MLPs in one CUDA graph.

A denoise runs 180 expert MLPs (10 steps x 18 layers) of 10 rows (horizon 10) on W 1024, F 4096. The engine runs
each as two launches with PDL: gate/up with its GeGLU epilogue (kernels/flashrt_kernels/smem_gemm.py, the weight slice in shared
memory before the wait) and down (the load-time tuning's pick among kernels/flashrt_kernels/skinny_gemm.py and smem_gemm's split-K
forms, whose fp32 partials the next norm sums). Here each variant runs `--mlps` MLPs back to back in one graph, the
weights of 18 layers in turn (so they stream from HBM, as in a predict: 18 x 25 MB is far over the 50 MB of L2):

    chain <down form>   smem_gemm gate/up + GeGLU, then the down form (partials left for the norm after it)
    smem_mlp            kernels/flashrt_kernels/smem_mlp.py: both GEMMs, the partials summed after a grid barrier

The result is GPU time per MLP (median graph replay / mlps). Each variant's result is checked against
smem_mlp_reference first (relative L2 error; the chain's partials summed here), so a wrong kernel is reported as
wrong, not as fast. The chain's down forms leave partials that the next kernel sums; smem_mlp leaves the sum.

    python tools/benchmark_smem_mlp.py --out $OUT/smem_mlp.json       # a table last; JSON with the versions
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashrt_core.engine.graph_executor import graph_replay_ms  # noqa: E402
from flashrt_core.engine.kernel_import import load_kernels  # noqa: E402
from flashrt_core.engine.ops import SKINNY_CANDIDATES, SMEM_CANDIDATES  # noqa: E402

W, F, LAYERS = 1024, 4096, 18          # the action expert of pi0 / pi0.5
CHECK_REL_L2 = 2e-2                     # bf16 act rounding + fp32 summation order (ops.DECODER_CHECK_REL_L2)


def down_forms(K) -> dict:
    """The down GEMM's forms the engine's tuning weighs, each a function (act, w_down, pdl) -> (split, M, W) fp32
    partials or (M, W)."""
    forms = {f"skinny {c}": (lambda a, w, pdl, c=c: K.skinny_gemm(a, w, split_k=c.split_k, block_n=c.block_n,
                                                                  block_k=c.block_k, num_stages=c.stages,
                                                                  num_warps=c.warps, pdl=pdl))
             for c in SKINNY_CANDIDATES["down"]}
    forms.update({f"smem {c}": (lambda a, w, pdl, c=c: K.smem_gemm(a, w, split_k=c.split_k, pdl=pdl))
                  for c in SMEM_CANDIDATES["down"]})
    return forms


def per_mlp_us(body, mlps: int, replays: int) -> float:
    """Median GPU time of a replay of body's graph, per MLP, in us (body run once outside the capture first)."""
    body()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    times = sorted(graph_replay_ms(graph, replays))
    return times[len(times) // 2] * 1e3 / mlps


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[10, 16], help="x rows (a horizon-10 step: 10)")
    ap.add_argument("--mlps", type=int, default=180, help="MLPs per graph (a denoise: 10 steps x 18 layers)")
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--no-pdl", action="store_true", help="launch without programmatic dependent launch")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        sys.exit("benchmark_smem_mlp needs a Hopper (sm90) GPU")
    K = load_kernels()
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    pdl = not args.no_pdl
    g = torch.Generator(device=dev).manual_seed(0)
    layers = [((torch.randn(2 * F, W, device=dev, generator=g) * W ** -0.5).to(torch.bfloat16),
               (torch.randn(W, F, device=dev, generator=g) * F ** -0.5).to(torch.bfloat16)) for _ in range(LAYERS)]
    rows_out = []
    for M in args.rows:
        if not K.smem_mlp_supported(M, W, F, sms):
            sys.exit(f"smem_mlp does not serve {M} rows on this GPU ({sms} SMs)")
        x = torch.randn(M, W, device=dev, generator=g).to(torch.bfloat16)
        want = K.smem_mlp_reference(x, *layers[0])
        act = torch.empty(M, F, device=dev, dtype=torch.bfloat16)
        variants = {}
        for name, down in down_forms(K).items():
            def chain(down=down):
                for i in range(args.mlps):
                    w_gate_up, w_down = layers[i % LAYERS]
                    K.smem_gemm(x, w_gate_up, geglu=True, pdl=pdl, out=act)
                    down(act, w_down, pdl)

            def check(down=down):
                K.smem_gemm(x, layers[0][0], geglu=True, pdl=pdl, out=act)
                y = down(act, layers[0][1], pdl).float()
                return y.sum(0) if y.dim() == 3 else y
            variants[f"chain {name}"] = (chain, check)
        scratch = K.MlpScratch.allocate(M, W, F, dev)
        out = torch.empty(M, W, device=dev)

        def fused():
            for i in range(args.mlps):
                K.smem_mlp(x, *layers[i % LAYERS], pdl=pdl, out=out, scratch=scratch)
        variants["smem_mlp"] = (fused, lambda: K.smem_mlp(x, *layers[0], pdl=pdl, out=out, scratch=scratch).clone())
        for name, (body, check) in variants.items():
            err = ((check() - want).norm() / want.norm()).item()
            row = {"rows": M, "variant": name, "rel_l2": err, "pdl": pdl}
            if err < CHECK_REL_L2:
                row["us_per_mlp"] = per_mlp_us(body, args.mlps, args.replays)
            rows_out.append(row)
            print(f"{M} rows, {name}: rel L2 {err:.2e}, {row.get('us_per_mlp', float('nan')):.2f} us per MLP",
                  flush=True)
        torch.cuda.synchronize()
        if scratch.errors.item():
            sys.exit(f"smem_mlp: {scratch.errors.item()} grid barriers gave up")
    import triton
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "triton": triton.__version__, "sms": sms,
           "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    print(f"\n{env['gpu']}, torch {env['torch']}, triton {env['triton']}, {env['time_utc']}; {args.mlps} MLPs per "
          f"graph, PDL {pdl}")
    print("| rows | variant | us per MLP | rel L2 vs reference |")
    print("|---|---|---|---|")
    for r in rows_out:
        us = f"{r['us_per_mlp']:.2f}" if "us_per_mlp" in r else "not timed: wrong result"
        print(f"| {r['rows']} | {r['variant']} | {us} | {r['rel_l2']:.1e} |")
    if args.out is not None:
        args.out.write_text(json.dumps({"env": env, "mlps": args.mlps, "rows": rows_out}, indent=1))


if __name__ == "__main__":
    main()
