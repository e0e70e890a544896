"""What a dependency between layers costs: a chain of dependent one-shot GEMMs (kernels/flashrt_kernels/layer_chain.py)
with one launch per layer in a CUDA graph (plain stream order, PDL, PDL with early trigger), the library GEMM per
layer in a graph, and one persistent kernel whose layers wait on counters in global memory.

The default chain is the denoiser's: 180 layers (10 steps x 18 layers) of the action expert's width (1024) at 10
rows; each layer reads a 2 MiB weight, so the time per layer above its weight stream is what one dependency costs.
The `*_resident` variants multiply every layer by the first layer's weight (held by the persistent programs, in L2
for the launches): the dependency alone, beside the same chain streaming its weights.
Each variant is captured as one CUDA graph and replayed; GPU time by CUDA events, the median of `--reps` replays.

    python tools/benchmark_layer_chain.py [--layers 180] [--width 1024] [--rows 10] [--reps 50] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashrt_core.engine.kernel_import import load_kernels  # noqa: E402
from flashrt_core.engine.timing import graph_replay_ms  # noqa: E402
from tools.benchmark_engine import result_header, write_result  # noqa: E402

VARIANTS = ("launch_per_layer", "launch_per_layer_pdl", "launch_per_layer_pdl_early", "library_per_layer",
            "persistent_counters")
# The same chains with every layer multiplying by W_0 (LayerChain(resident=True)): the hand-over without the weight
# stream, so each pair says how much of its stream the wait hides.
RESIDENT_VARIANTS = ("launch_per_layer_pdl", "persistent_counters")
RESIDENT = "_resident"


def captured_replay_ms(run, reps: int) -> list[float]:
    """run() once eagerly, then captured as one CUDA graph: the GPU ms of `reps` replays of it (graph_replay_ms)."""
    run()                                                   # compile, warm the caches of the launch path
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return graph_replay_ms(graph, reps)


def print_row(name: str, r: dict) -> None:
    """One variant's row of the table, printed (and flushed) as soon as it is measured."""
    print(f"| {name} | {r['ms']:.3f} | {r['us_per_layer']:.2f} | {r['weight_tb_per_s']:.2f} | "
          f"{r['rel_l2_vs_reference']:.1e} |", flush=True)


def measure(layers: int, width: int, rows: int, reps: int, report=print_row) -> dict:
    """{variant: its result}; report(variant, result) after each one."""
    k = load_kernels()
    g = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(layers, width, width, device="cuda", generator=g) * width ** -0.5).to(torch.bfloat16)
    x = torch.randn(rows, width, device="cuda", generator=g).to(torch.bfloat16)
    wants = {False: k.layer_chain_reference(x, w).float(),
             True: k.layer_chain_reference(x, k.resident_weights(w)).float()}
    results = {}
    for variant in VARIANTS + tuple(name + RESIDENT for name in RESIDENT_VARIANTS):
        resident = variant.endswith(RESIDENT)
        base = variant.removesuffix(RESIDENT)
        if variant == "library_per_layer":
            buf = torch.empty(layers + 1, rows, width, device="cuda", dtype=torch.bfloat16)
            buf[0].copy_(x)

            def run(buf=buf):
                for layer in range(layers):
                    torch.mm(buf[layer], w[layer].T, out=buf[layer + 1])
            out = buf[-1]
        else:
            pdl = {"launch_per_layer": False, "launch_per_layer_pdl": True,
                   "launch_per_layer_pdl_early": k.EARLY_TRIGGER}.get(base, False)
            wait = "counter" if base == "persistent_counters" else "launch"
            chain = k.LayerChain(w, rows, wait, pdl, resident=resident)
            chain.x.copy_(x)
            run, out = chain.run, chain.out
        times = captured_replay_ms(run, reps)
        want = wants[resident]
        err = float((out.float() - want).norm() / want.norm())
        median = statistics.median(times)
        streamed = width * width * 2 * (1 if resident else layers)    # bf16 weight bytes read
        results[variant] = {"ms": median, "us_per_layer": median * 1e3 / layers,
                            "weight_tb_per_s": streamed / (median * 1e-3) / 1e12,
                            "rel_l2_vs_reference": err}
        report(variant, results[variant])
    return results


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=180)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--rows", type=int, default=10)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--out", help="folder for the JSON result")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmark_layer_chain.py needs a CUDA GPU")
    print(f"{args.layers} dependent layers, {args.rows} x {args.width} @ {args.width} x {args.width} bf16 "
          f"({args.width * args.width * 2 / 2 ** 20:.0f} MiB of weights each), {torch.cuda.get_device_name()}")
    print("| variant | chain ms | us per layer | weight stream TB/s | rel L2 vs reference |\n|---|---|---|---|---|",
          flush=True)
    results = measure(args.layers, args.width, args.rows, args.reps)
    result = {**result_header("benchmark_layer_chain.py", argv), "layers": args.layers, "width": args.width,
              "rows": args.rows, "reps": args.reps, "weight_mib_per_layer": args.width * args.width * 2 / 2 ** 20,
              "variants": results}
    if args.out:
        write_result(args.out, result, "layer_chain")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
