"""The persistent denoiser's GEMM chain as one CUDA C++ kernel (kernels/flashrt_kernels/cuda/streamed_gemm_chain.cu:
weights streamed into shared memory ahead of their dependencies, one counter between GEMMs) against the same chain
launched op by op, in one process.

The chain is the action expert's four GEMMs per layer at their real shapes and dependencies
(kernels/flashrt_kernels/streamed_gemm_chain.py), pi0.5's denoise by default: 180 layers (10 steps x 18 layers'
weights, 623 MB in bf16, re-read every step as the denoise does), 10 rows. Variants:

    streamed            the persistent kernel, the MLP's two GEMMs as one paired step (three hand-overs per layer)
    streamed_four_gemms the persistent kernel with four GEMMs per layer (the GeGLU activation through global memory)
    streamed_no_wait    the same with every wait for a GEMM's inputs skipped (wrong result): the weight stream and
                        the compute alone, the design's ceiling
    streamed_no_compute the persistent kernel built without its A loads and products (wrong result): the weight
                        stream, the slot hand-overs, the sums over warps and the waits between GEMMs
    streamed_no_compute_no_wait  the same without the waits
    streamed_no_products the persistent kernel built with its A loads but without its products (wrong result): with
                        streamed_no_compute, what the A loads cost (every CTA reads each GEMM's whole A)
    streamed_no_products_no_wait  the same without the waits
    streamed_no_copy    the persistent kernel built without its weight copies (wrong result): the A loads, the
                        products, the sums and the waits on stale slots
    streamed_stream_only  the persistent kernel built with consumers that only free each weight slot as it fills:
                        the weight stream alone
    streamed_a_window   the paired kernel with each GEMM's A copied into shared memory by the bulk copy engine after
                        the hand-over (a_window; 8 ring slots instead of 12 beside it)
    streamed_a_window_no_wait, streamed_a_window_no_products  the same without the waits, without the products
    streamed_a_window_no_a_copy  the same without the window's copy (its fragments read from what the buffer holds)
    streamed_a_window_cluster2, streamed_a_window_cluster4  the A window's copies shared in clusters of 2 and 4
                        (each CTA copies a share of the rows into every CTA of its cluster)
    streamed_a_window_four_gemms  the A window with four GEMMs per layer (no atomics: the down GEMM's owners read the
                        whole activation, in two windows)
    streamed_a_window_cluster2_no_atomics  clusters of 2 without the paired MLP's atomics (wrong result): what
                        adding every CTA's partial product into the residual costs
    streamed_a_window_cluster2_down_sum, streamed_a_window_cluster4_down_sum  clusters of 2 and 4 whose CTAs add up
                        their partial products over distributed shared memory first, each doing the atomics of a
                        share of the columns (down_cluster_sum)
    streamed_resident   the persistent kernel with one layer's weights for every layer (34.6 MB, mostly held in L2):
                        the chain's dependencies and compute with little weight stream
    library_per_op      the chain as PyTorch ops (RMS norms, cuBLAS GEMMs, casts, GeGLU, adds), one launch each

With `--trace FIRST`, the kernel's trace build (StreamedGemmChain(trace=True)) then runs the paired chain with and
without its waits, and with the A window alone, in clusters of 2, and in clusters of 2 with their cluster sum of
the down products, and records steps FIRST .. FIRST + 63 in every CTA: the table of each kind of step's phases
(trace_phases: the median over CTAs and layers of the time from one event of the step to the next) and, across
CTAs, how far apart the CTAs release a step and how long after the last release the next step starts.

Each variant is captured as one CUDA graph and replayed; GPU time by CUDA events, the median of `--reps` replays.
The weight stream's rate is the weight bytes a replay reads over its time. streamed, streamed_four_gemms, the A
window's six forms with their waits, streamed_resident and library_per_op are checked against
streamed_gemm_chain_reference on the same weights and input (relative L2 error of the residual). The leave-out
variants run the paired form.

    python tools/benchmark_streamed_gemm_chain.py [--layers 180] [--distinct 18] [--rows 10] [--reps 30] [--out DIR]
                                                   [--trace FIRST]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashrt_core.config import GEMMA_300M  # noqa: E402
from flashrt_core.engine.kernel_import import load_kernels  # noqa: E402
from tools.benchmark_engine import require_cuda_build, result_header, write_result  # noqa: E402
from tools.benchmark_layer_chain import captured_replay_ms  # noqa: E402

SGC = importlib.import_module(load_kernels().__name__ + ".streamed_gemm_chain")
rms_norm = SGC.rms_norm
# variant -> StreamedGemmChain's switches (waits, what the kernel leaves out, the paired MLP); None: not the kernel
VARIANTS = {"streamed": {}, "streamed_four_gemms": {"pair_mlp": False}, "streamed_no_wait": {"wait_inputs": False},
            "streamed_no_compute": {"leave_out": ("compute",)},
            "streamed_no_compute_no_wait": {"wait_inputs": False, "leave_out": ("compute",)},
            "streamed_no_products": {"leave_out": ("products",)},
            "streamed_no_products_no_wait": {"wait_inputs": False, "leave_out": ("products",)},
            "streamed_no_copy": {"leave_out": ("copy",)},
            "streamed_stream_only": {"leave_out": ("consumers",), "wait_inputs": False},
            "streamed_a_window": {"a_window": True},
            "streamed_a_window_no_wait": {"a_window": True, "wait_inputs": False},
            "streamed_a_window_no_products": {"a_window": True, "leave_out": ("products",)},
            "streamed_a_window_no_a_copy": {"a_window": True, "leave_out": ("a_copy",)},
            "streamed_a_window_cluster2": {"a_window": True, "cluster": 2},
            "streamed_a_window_cluster4": {"a_window": True, "cluster": 4},
            "streamed_a_window_four_gemms": {"a_window": True, "pair_mlp": False},
            "streamed_a_window_cluster2_no_atomics": {"a_window": True, "cluster": 2, "leave_out": ("atomics",)},
            "streamed_a_window_cluster2_down_sum": {"a_window": True, "cluster": 2, "down_cluster_sum": True},
            "streamed_a_window_cluster4_down_sum": {"a_window": True, "cluster": 4, "down_cluster_sum": True},
            "streamed_resident": {}, "library_per_op": None}
# the variants whose result is meant to be right
CHECKED = ("streamed", "streamed_four_gemms", "streamed_a_window", "streamed_a_window_cluster2",
           "streamed_a_window_cluster4", "streamed_a_window_four_gemms", "streamed_a_window_cluster2_down_sum",
           "streamed_a_window_cluster4_down_sum", "streamed_resident", "library_per_op")


def library_chain(h: torch.Tensor, layer_weights, layers: int):
    """run() for the chain as PyTorch ops on h (in place), the formula of streamed_gemm_chain_reference."""
    def run():
        for layer in range(layers):
            w = layer_weights[layer % len(layer_weights)]
            attn, mlp = w.o.shape[1], w.down.shape[1]
            q = F.linear(rms_norm(h).bfloat16(), w.qkv)
            h.add_(F.linear(q[:, :attn], w.o).float())
            gu = F.linear(rms_norm(h).bfloat16(), w.gate_up)
            h.add_(F.linear(F.gelu(gu[:, :mlp].float(), approximate="tanh").mul_(gu[:, mlp:]).bfloat16(),
                            w.down).float())
    return run


# a traced step's phases: (name, from event, to event) of SGC.TRACE_EVENT_NAMES
# (the paired MLP's sums split at its last down product: the down products, then their cluster sum and atomics)
TRACE_PHASES = (("wait", 0, 1), ("A", 1, 2), ("to the first product", 2, 3), ("products", 3, 4), ("sums", 4, 5),
                ("down products", 4, 7), ("down sums", 7, 5), ("barrier", 5, 6), ("step", 0, 6))
PAIRED_STEP_KINDS = ("qkv", "o", "mlp")     # the paired chain's steps per layer, in order


def trace_phases(trace: torch.Tensor, first: int, kinds: tuple[str, ...] = PAIRED_STEP_KINDS) -> dict:
    """A chain's trace (StreamedGemmChain.read_trace: (ctas, steps, events, {clock, global ns})) of steps first,
    first + 1, ..., step i of kind kinds[(first + i) % len(kinds)] -> per kind, the median ns over CTAs and steps
    of each TRACE_PHASES phase and of the gap from a step's release to the next step's start in the same CTA (SM
    clocks, converted by the ratio of global time to clocks over each CTA's traced window, the median over CTAs;
    a phase counts only where the CTA reached both of its events); and across CTAs, the median over steps of the
    spread of the CTAs' releases and of the time from the last release to the first and to the last CTA whose
    inputs are ready for the next step (global timer)."""
    clk, ns = trace[..., 0].double(), trace[..., 1].double()
    reached = (trace[..., 0] > 0)                                   # (ctas, steps, events)
    whole = reached[:, :, 0] & reached[:, :, 6]                      # the step's start and release
    ratios = []
    for c in range(trace.shape[0]):
        steps = torch.nonzero(whole[c]).flatten()
        if len(steps) > 1 and clk[c, steps[-1], 6] > clk[c, steps[0], 0]:
            ratios.append(float((ns[c, steps[-1], 6] - ns[c, steps[0], 0]) / (clk[c, steps[-1], 6] -
                                                                                clk[c, steps[0], 0])))
    if not ratios:
        raise ValueError("the trace holds no CTA with two whole steps")
    ns_per_clock = statistics.median(ratios)
    kind_of = torch.tensor([(first + i) % len(kinds) for i in range(trace.shape[1])])
    result = {"ns_per_clock": ns_per_clock, "steps": {}}
    for k, kind in enumerate(kinds):
        of_kind = (kind_of == k).unsqueeze(0)
        row = {}
        for name, a, b in TRACE_PHASES:
            m = of_kind & reached[:, :, a] & reached[:, :, b]
            row[name] = float((clk[:, :, b] - clk[:, :, a])[m].median()) * ns_per_clock if m.any() else None
        m = (of_kind & whole)[:, :-1] & whole[:, 1:]
        row["to the next step"] = (float((clk[:, 1:, 0] - clk[:, :-1, 6])[m].median()) * ns_per_clock
                                   if m.any() else None)
        result["steps"][kind] = row
    spread, to_first, to_last = [], [], []
    for i in range(trace.shape[1] - 1):
        released, ready = whole[:, i], reached[:, i + 1, 1]
        if not released.all() or not ready.all():
            continue
        last = ns[:, i, 6].max()
        spread.append(float(last - ns[:, i, 6].min()))
        to_first.append(float(ns[:, i + 1, 1].min() - last))
        to_last.append(float(ns[:, i + 1, 1].max() - last))
    result["across_ctas"] = None if not spread else {
        "release_spread_ns": statistics.median(spread), "last_release_to_first_ready_ns": statistics.median(to_first),
        "last_release_to_last_ready_ns": statistics.median(to_last)}
    return result


def trace_table(phases: dict) -> str:
    """trace_phases' result as a markdown table (ns), the across-CTA line under it."""
    names = [name for name, _, _ in TRACE_PHASES] + ["to the next step"]
    lines = ["| step | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for kind, row in phases["steps"].items():
        lines.append(f"| {kind} | " + " | ".join("-" if row[n] is None else f"{row[n]:.0f}" for n in names) + " |")
    across = phases["across_ctas"]
    if across:
        lines.append(f"across CTAs: releases spread over {across['release_spread_ns']:.0f} ns; from the last "
                     f"release, the first CTA's inputs ready after {across['last_release_to_first_ready_ns']:.0f} "
                     f"ns, the last's after {across['last_release_to_last_ready_ns']:.0f} ns")
    return "\n".join(lines)


def measure(layers: int, distinct: int, rows: int, reps: int, report=print) -> dict:
    k = load_kernels()
    shapes = GEMMA_300M.layer_gemm_shapes()
    width, attn, mlp = GEMMA_300M.width, shapes["o"][1], shapes["down"][1]
    g = torch.Generator(device="cuda").manual_seed(0)
    weights = k.random_streamed_layer_weights(distinct, width, shapes["qkv"][0], attn, mlp, "cuda", g)
    h0 = torch.randn(rows, width, device="cuda", generator=g)
    layer_bytes = sum(n * kk * 2 for n, kk in shapes.values())
    wants = {distinct: k.streamed_gemm_chain_reference(h0, weights, layers),       # the checked variants' references
             1: k.streamed_gemm_chain_reference(h0, weights[:1], layers)}
    results = {}
    for variant in VARIANTS:
        layer_weights = weights[:1] if variant == "streamed_resident" else weights
        if variant == "library_per_op":
            h = h0.clone()
            chain_run = library_chain(h, layer_weights, layers)

            def run(h=h, chain_run=chain_run):
                h.copy_(h0)
                chain_run()
        else:
            chain = k.StreamedGemmChain(layer_weights, layers, rows, **VARIANTS[variant])
            h, ctas = chain.h, chain.ctas

            def run(chain=chain):
                chain.h.copy_(h0)
                chain.run()
        times = captured_replay_ms(run, reps)
        median = statistics.median(times)
        want = wants[len(layer_weights)]
        results[variant] = {"ms": median, "us_per_layer": median * 1e3 / layers,
                            "weight_tb_per_s": layer_bytes * layers / (median * 1e-3) / 1e12,
                            "rel_l2_vs_reference": float((h - want).norm() / want.norm()) if variant in CHECKED
                            else None, "ctas": None if variant == "library_per_op" else ctas}
        r = results[variant]
        report(f"| {variant} | {r['ms']:.3f} | {r['us_per_layer']:.2f} | {r['weight_tb_per_s']:.2f} | "
               f"{'-' if r['rel_l2_vs_reference'] is None else format(r['rel_l2_vs_reference'], '.1e')} |")
    return results


def traces(layers: int, distinct: int, rows: int, first: int) -> dict:
    """The paired chain's trace build, with and without its waits, and with the A window alone, in clusters of 2 and
    in clusters of 2 with the cluster sum of the down products:
    trace_phases of steps first .. first + 63 of one launch after a warm one, each table printed."""
    k = load_kernels()
    shapes = GEMMA_300M.layer_gemm_shapes()
    if not 0 <= first <= 3 * layers - SGC.TRACE_GEMMS:
        raise ValueError(f"--trace takes a first step from 0 to {3 * layers - SGC.TRACE_GEMMS}; got {first}")
    g = torch.Generator(device="cuda").manual_seed(0)
    weights = k.random_streamed_layer_weights(distinct, GEMMA_300M.width, shapes["qkv"][0], shapes["o"][1],
                                              shapes["down"][1], "cuda", g)
    h0 = torch.randn(rows, GEMMA_300M.width, device="cuda", generator=g)
    out = {}
    for name, form in (("streamed", {}), ("streamed_no_wait", {"wait_inputs": False}),
                       ("streamed_a_window", {"a_window": True}),
                       ("streamed_a_window_cluster2", {"a_window": True, "cluster": 2}),
                       ("streamed_a_window_cluster2_down_sum", {"a_window": True, "cluster": 2,
                                                                "down_cluster_sum": True})):
        chain = k.StreamedGemmChain(weights, layers, rows, trace=True, **form)
        chain.h.copy_(h0)
        chain.run()
        chain.trace_steps(first)
        chain.h.copy_(h0)
        chain.run()
        out[name] = trace_phases(chain.read_trace(), first)
        print(f"\n{name}, steps {first} .. {first + SGC.TRACE_GEMMS - 1}, ns:\n{trace_table(out[name])}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=180, help="layers of the chain (default: 10 steps x 18)")
    parser.add_argument("--distinct", type=int, default=18, help="distinct layers' weights, cycled (default 18)")
    parser.add_argument("--rows", type=int, default=10)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--out", help="folder for the JSON result")
    parser.add_argument("--trace", type=int, metavar="FIRST",
                        help="then trace steps FIRST .. FIRST + 63 of the paired chain with and without its waits, "
                             "and with the A window alone, in clusters of 2, and with their down cluster sum")
    args = parser.parse_args(argv)
    require_cuda_build("benchmark_streamed_gemm_chain.py")
    shapes = GEMMA_300M.layer_gemm_shapes()
    print(f"{args.layers} layers of the expert's GEMMs {shapes} (N, K), {args.distinct} layers' weights cycled, "
          f"{args.rows} rows, {torch.cuda.get_device_name()}", flush=True)
    print("| variant | chain ms | us per layer | weight stream TB/s | rel L2 vs reference |\n|---|---|---|---|---|",
          flush=True)
    results = measure(args.layers, args.distinct, args.rows, args.reps, report=lambda line: print(line, flush=True))
    result = {**result_header("benchmark_streamed_gemm_chain.py", argv), "layers": args.layers,
              "distinct": args.distinct, "rows": args.rows, "reps": args.reps,
              "gemm_shapes": {name: list(s) for name, s in shapes.items()}, "variants": results}
    if args.trace is not None:
        result["traces"] = traces(args.layers, args.distinct, args.rows, args.trace)
    if args.out:
        write_result(args.out, result, "streamed_gemm_chain")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
