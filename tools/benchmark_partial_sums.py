"""What folding many programs' partial products into one activation costs (kernels/flashrt_kernels/partial_sums.py):
the step a persistent denoiser MLP needs when each program multiplies its own GeGLU columns by its rows of W_down
and so holds a partial of the whole output.

The default is the expert's: 128 programs (one per SM of a persistent launch), partials of 10 rows x 1024 fp32
(40 KB each, 5 MiB per layer), 180 layers (10 steps x 18 layers). Modes: every program adding its partial with
vector atomics and counting itself into the layer's counter, all layers in one launch (`atomic`); or every program
storing its partial and a second launch per layer summing them (`stored`, the reduce-stage form). Each is captured
as one CUDA graph and replayed; GPU time by CUDA events, the median of `--reps` replays.

    python tools/benchmark_partial_sums.py [--programs 128] [--layers 180] [--rows 10] [--width 1024] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashrt_core.engine.kernel_import import load_kernels  # noqa: E402
from tools.benchmark_engine import env_info, write_result  # noqa: E402
from tools.benchmark_layer_chain import captured_replay_ms  # noqa: E402


def measure(programs: int, layers: int, rows: int, width: int, reps: int) -> dict:
    """{mode: {"ms", "us_per_layer", "folded_gb_per_s", "exact"}}: each mode's chain of `layers` foldings."""
    k = load_kernels()
    want = k.partial_sums_reference(programs, layers, rows, width, "cuda")
    results = {}
    for mode in k.PARTIAL_SUMS_MODES:
        sums = k.PartialSums(programs, layers, rows, width, mode, "cuda")
        median = statistics.median(captured_replay_ms(sums.run, reps))
        folded = programs * rows * width * 4 * layers       # partial bytes folded
        results[mode] = {"ms": median, "us_per_layer": median * 1e3 / layers,
                         "folded_gb_per_s": folded / (median * 1e-3) / 1e9, "exact": bool(torch.equal(sums.out, want))}
        print(f"| {mode} | {median:.3f} | {median * 1e3 / layers:.2f} | {results[mode]['folded_gb_per_s']:.0f} | "
              f"{results[mode]['exact']} |", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=128)
    parser.add_argument("--layers", type=int, default=180)
    parser.add_argument("--rows", type=int, default=10)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--out", help="folder for the JSON result")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmark_partial_sums.py needs a CUDA GPU")
    print(f"{args.layers} foldings of {args.programs} partials of {args.rows} x {args.width} fp32, "
          f"{torch.cuda.get_device_name()}")
    print("| mode | chain ms | us per layer | partials folded GB/s | exact |\n|---|---|---|---|---|", flush=True)
    results = measure(args.programs, args.layers, args.rows, args.width, args.reps)
    result = {**env_info(), "command": "python tools/benchmark_partial_sums.py " + " ".join(argv),
              "programs": args.programs, "layers": args.layers, "rows": args.rows, "width": args.width,
              "reps": args.reps, "modes": results}
    if args.out:
        write_result(args.out, result, "partial_sums")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
