#!/usr/bin/env python3
"""What one dependency boundary costs on the GPU: a kernel boundary (with and without programmatic dependent launch)
against a grid barrier inside one persistent kernel.

The denoiser runs ~1,400 dependent kernels per predict (180 layer passes x 8 kernels), each a few microseconds of
work behind a dependency on the kernel before it. Whether a persistent kernel per layer or step would be faster
depends on one number this tool measures: the time from "every program has written its part" to "every program
may read all parts", per boundary, as a chain of

    kernels   one launch per step; each of G programs reads a value another program wrote in the step before
              (a true data dependency), optionally streams a weight slice first (independent of the inputs, so
              with PDL it is loaded before the wait, as the decoder GEMMs do), and writes its value
    barrier   the same steps in ONE launch of G programs (G <= SM count, all resident), separated by a grid
              barrier: a per-program arrive (release atomic) and a spin on the counter (acquire atomic)

Every variant runs `--steps` steps captured in one CUDA graph; the result is GPU time per step (median replay).
The values each variant leaves are checked against the closed form, so a barrier that lets a program run ahead is
reported as wrong, not as fast.

    python tools/benchmark_grid_sync.py --out docs/benchmarks/grid_sync_<gpu>_<date>.json
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
from flashrt_kernels._triton import launch_options, tl, triton, wait_for_inputs  # noqa: E402


@triton.jit
def _weight_sum(w_ptr, pid, CHUNK: tl.constexpr):
    offs = tl.arange(0, CHUNK)
    return tl.sum(tl.load(w_ptr + pid * CHUNK + offs).to(tl.float32), axis=0)


@triton.jit
def _step_kernel(src_ptr, dst_ptr, w_ptr, G, CHUNK: tl.constexpr, PDL: tl.constexpr):
    """One step as its own launch: dst[p] = src[(p + 1) % G] + 1 (+ 0 * the weight slice's sum)."""
    pid = tl.program_id(0)
    ws = 0.0
    if CHUNK > 0:
        ws = _weight_sum(w_ptr, pid, CHUNK)
    wait_for_inputs(PDL)
    v = tl.load(src_ptr + (pid + 1) % G)
    tl.store(dst_ptr + pid, v + 1.0 + 0.0 * ws)


@triton.jit
def _grid_barrier(counter_ptr, target):
    """Every program of the grid arrives, then waits until `target` arrivals are counted. All programs must be
    resident at once (grid <= what fits on the SMs), or this never returns."""
    tl.debug_barrier()                                            # this program's stores are issued
    tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _persistent_kernel(buf_ptr, w_ptr, counter_ptr, G, STEPS: tl.constexpr, CHUNK: tl.constexpr):
    """All steps in one launch: buf holds 2 x G values (ping-pong); step s reads half s % 2 and writes the other."""
    pid = tl.program_id(0)
    for s in range(STEPS):
        ws = 0.0
        if CHUNK > 0:
            half = tl.multiple_of((s % 2) * G * CHUNK, CHUNK)
            ws = _weight_sum(w_ptr + half, pid, CHUNK)                  # independent of the inputs: before the wait
        if s > 0:
            _grid_barrier(counter_ptr, s * G)
        src = buf_ptr + (s % 2) * G
        dst = buf_ptr + ((s + 1) % 2) * G
        v = tl.load(src + (pid + 1) % G, cache_modifier=".cg")      # L2, not a stale L1 line of this SM
        tl.store(dst + pid, v + 1.0 + 0.0 * ws)


def run_kernels(steps: int, grid: int, chunk: int, pdl: bool, replays: int, dev) -> tuple[float, bool]:
    bufs = [torch.zeros(grid, device=dev) for _ in range(2)]
    w = torch.randn(2 * grid * max(chunk, 1), device=dev, dtype=torch.bfloat16)

    def body():
        for s in range(steps):
            _step_kernel[(grid,)](bufs[s % 2], bufs[(s + 1) % 2], w[(s % 2) * grid * max(chunk, 1):], grid,
                                  CHUNK=chunk, PDL=pdl, **launch_options(pdl))
    return _time(body, lambda: bufs[steps % 2], bufs, steps, replays)


def run_barrier(steps: int, grid: int, chunk: int, replays: int, dev) -> tuple[float, bool]:
    buf = torch.zeros(2 * grid, device=dev)
    counter = torch.zeros(1, device=dev, dtype=torch.int32)
    w = torch.randn(2 * grid * max(chunk, 1), device=dev, dtype=torch.bfloat16)

    def body():
        counter.zero_()
        _persistent_kernel[(grid,)](buf, w, counter, grid, STEPS=steps, CHUNK=chunk)
    return _time(body, lambda: buf[(steps % 2) * grid:][:grid], [buf], steps, replays)


def _time(body, result, zero, steps: int, replays: int) -> tuple[float, bool]:
    body()                                               # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    for t in zero:
        t.zero_()
    graph.replay()
    torch.cuda.synchronize()
    ok = bool(torch.all(result() == steps).item())      # every value went through every step exactly once
    times = sorted(graph_replay_ms(graph, replays))
    return times[len(times) // 2] * 1e3 / steps, ok


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=720, help="dependent steps per graph (a predict has ~1,400)")
    ap.add_argument("--grids", type=int, nargs="+", default=[10, 132], help="programs per step (<= SM count)")
    ap.add_argument("--chunks", type=int, nargs="+", default=[0, 16384],
                    help="bf16 weight elements each program streams per step (16384 x 132 x 2 B = 4.3 MB)")
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("benchmark_grid_sync needs a CUDA GPU")
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    rows = []
    for grid in args.grids:
        if grid > sms:
            sys.exit(f"--grids {grid}: a persistent grid must fit the {sms} SMs")
        for chunk in args.chunks:
            for variant in ("kernels, no PDL", "kernels, PDL", "grid barrier"):
                if variant == "grid barrier":
                    us, ok = run_barrier(args.steps, grid, chunk, args.replays, dev)
                else:
                    us, ok = run_kernels(args.steps, grid, chunk, variant.endswith(" PDL"), args.replays, dev)
                rows.append({"grid": grid, "chunk": chunk, "variant": variant, "us_per_step": us, "correct": ok})
                print(f"grid {grid} chunk {chunk} {variant}: {us:.2f} us per step, correct={ok}", flush=True)
    import triton as _triton
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "triton": _triton.__version__, "sms": sms,
           "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    print(f"\n{env['gpu']}, torch {env['torch']}, triton {env['triton']}, {env['time_utc']}; {args.steps} steps")
    print("| programs | weight bytes per step | variant | us per step | values correct |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['grid']} | {2 * r['chunk'] * r['grid']} | {r['variant']} | {r['us_per_step']:.2f} | "
              f"{r['correct']} |")
    if args.out is not None:
        args.out.write_text(json.dumps({"env": env, "steps": args.steps, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
