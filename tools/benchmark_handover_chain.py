"""What one hand-over of the streamed GEMM chain costs with the activation bytes every CTA reads after it
(kernels/flashrt_kernels/cuda/handover_chain.cu: the chain's release / acquire counter and its whole-A reads alone,
no weights, no products), in one process.

Each variant is `--steps` dependent steps (default 720: the chain's four GEMMs x 180 layers) in one launch of one
CTA per SM (in clusters: as many whole clusters as fit at once); a step waits for the one before, reads its whole
output and writes its own share of the next:

    counter_only        no activation: the hand-over itself
    read_20kb           every CTA reads 20 KB per step (10 rows of the expert's width in bf16)
    read_40kb           40 KB (10 rows of fp32 h, or of q's 2048 columns in bf16: QKV's, gate/up's and O's A)
    read_80kb           80 KB (10 rows of the 4096-wide GeGLU activation in bf16: the four-GEMM down GEMM's A)
    read_40kb_no_wait   the 40 KB reads and the writes without the waits: what the reads cost with no dependency
    read_40kb_cluster2  40 KB in clusters of 2: each CTA loads its half from L2, a cluster barrier, then reads the
                        other half from its partner's shared memory (what broadcasting A within clusters saves)
    read_40kb_cluster4  the same in clusters of 4 (a quarter from L2 per CTA)
    read_80kb_cluster4  80 KB in clusters of 4
    read_128kb_16_readers  16 CTAs read 128 KB per step, the others hand over alone: one SM's reads of a large
                        block on the critical path (an attention head's keys and values over a quarter of ~570
                        keys is ~146 KB)
    read_256kb_8_readers   8 CTAs read 256 KB per step (a head over half the keys: ~292 KB)
    read_20kb_sliced, read_40kb_sliced, read_80kb_sliced  the sliced hand-over: each warp of a CTA waits for its
                        eighth of the step before on that slice's own counter and reads it alone (no CTA barrier
                        between the wait and the reads), each CTA releasing the slices its share touches

Each is captured as one CUDA graph and replayed; GPU time by CUDA events, the median of `--reps` replays, in us per
step. Every waiting variant must read no stale value (`mismatches`, also checked by the GPU test).

    python tools/benchmark_handover_chain.py [--steps 720] [--reps 30] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashrt_core.engine.kernel_import import load_kernels  # noqa: E402
from tools.benchmark_engine import require_cuda_build, result_header, write_result  # noqa: E402
from tools.benchmark_layer_chain import captured_replay_ms  # noqa: E402

# variant -> (fp32 values each step writes and its readers read, waits, cluster size, readers (None: every CTA),
# slices)
VARIANTS = {"counter_only": (0, True, 1, None, 1), "read_20kb": (5 * 1024, True, 1, None, 1),
            "read_40kb": (10 * 1024, True, 1, None, 1), "read_80kb": (20 * 1024, True, 1, None, 1),
            "read_40kb_no_wait": (10 * 1024, False, 1, None, 1), "read_40kb_cluster2": (10 * 1024, True, 2, None, 1),
            "read_40kb_cluster4": (10 * 1024, True, 4, None, 1), "read_80kb_cluster4": (20 * 1024, True, 4, None, 1),
            "read_128kb_16_readers": (32 * 1024, True, 1, 16, 1), "read_256kb_8_readers": (64 * 1024, True, 1, 8, 1),
            "read_20kb_sliced": (5 * 1024, True, 1, None, 8), "read_40kb_sliced": (10 * 1024, True, 1, None, 8),
            "read_80kb_sliced": (20 * 1024, True, 1, None, 8)}


def measure(steps: int, reps: int, report=print) -> dict:
    k = load_kernels()
    results = {}
    for variant, (elems, wait, cluster, readers, slices) in VARIANTS.items():
        try:
            chain = k.HandoverChain(elems, steps, wait_inputs=wait, cluster=cluster, readers=readers, slices=slices)
            times = captured_replay_ms(chain.run, reps)
        except RuntimeError as exc:            # a cluster shape this GPU cannot launch: said, and the rest run
            results[variant] = {"elems": elems, "cluster": cluster, "error": str(exc)}
            report(f"| {variant} | {elems * 4 / 1024:.0f} | - | - | cannot run: {exc} |")
            continue
        torch.cuda.synchronize()
        median = statistics.median(times)
        results[variant] = {"elems": elems, "kb_read_per_cta": elems * 4 / 1024, "waits": wait, "cluster": cluster,
                            "readers": chain.readers, "slices": slices, "ms": median,
                            "us_per_step": median * 1e3 / steps,
                            "ctas": chain.ctas,
                            "mismatches": int(chain.mismatches.item()) if wait else None}
        r = results[variant]
        report(f"| {variant} | {r['kb_read_per_cta']:.0f} | {r['ms']:.3f} | {r['us_per_step']:.2f} | "
               f"{'-' if r['mismatches'] is None else r['mismatches']} |")
    return results


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=720, help="dependent steps (default: 4 GEMMs x 180 layers)")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--out", help="folder for the JSON result")
    args = parser.parse_args(argv)
    require_cuda_build("benchmark_handover_chain.py")
    print(f"{args.steps} dependent steps, one CTA per SM, {torch.cuda.get_device_name()}")
    print("| variant | KB read per reading CTA per step | ms | us per step | stale values read |\n"
          "|---|---|---|---|---|", flush=True)
    results = measure(args.steps, args.reps, report=lambda line: print(line, flush=True))
    result = {**result_header("benchmark_handover_chain.py", argv), "steps": args.steps, "reps": args.reps,
              "variants": results}
    if args.out:
        write_result(args.out, result, "handover_chain")
    stale = [v for v, r in results.items() if r.get("mismatches")]
    failed = [v for v, r in results.items() if "error" in r]
    if failed:
        print(f"could not run {failed}", flush=True)
    if stale:
        print(f"stale values read in {stale}: the hand-over does not order the steps", flush=True)
    return 1 if stale or failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
