"""The host's share of a GR00T N1.6 predict that depends on the cameras: groot_inputs.prepare_views (the reference
processor's two shortest-edge INTER_AREA scalings, the centre crop, Eagle's bicubic resize, the float [-1, 1]
tensors) for --views uint8 frames of each --sizes, at the released config's geometry, with the views on worker
threads (flashrt_core.view_workers, the default) and one after another (FLASHRT_PARALLEL_VIEWS=0). CPU only (no
model, no GPU): the median and p90 of --calls calls per mode after --warmup, the modes' calls alternating so that
both see the same load of the machine.

    python tools/benchmark_groot_inputs.py [--views 2] [--sizes 224x224 480x640] [--calls 100] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashrt_core import groot_inputs, view_workers  # noqa: E402
from flashrt_core.host_threads import usable_cpus  # noqa: E402
from flashrt_core.model.groot.config import get_groot_config  # noqa: E402


def size(text: str) -> tuple[int, int]:
    """"480x640" -> (480, 640): height x width."""
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a size is HEIGHTxWIDTH, e.g. 480x640; got {text!r}") from None
    return h, w


MODES = {"parallel": "1", "serial": "0"}          # mode -> FLASHRT_PARALLEL_VIEWS


def timed_call(frames, names, cfg, mode: str) -> tuple[float, list]:
    os.environ[view_workers.SWITCH] = MODES[mode]
    start = time.perf_counter()
    out = groot_inputs.prepare_views(frames, names, cfg)
    return (time.perf_counter() - start) * 1e3, out


def measure(views: int, sizes: list[tuple[int, int]], calls: int, warmup: int) -> list[dict]:
    cfg = get_groot_config("groot_n1.6")
    names = [f"view{k}" for k in range(views)]
    rows = []
    saved = os.environ.get(view_workers.SWITCH)
    try:
        for h, w in sizes:
            frames = [np.random.default_rng(k).integers(0, 256, (h, w, 3), dtype=np.uint8) for k in range(views)]
            outputs = {mode: timed_call(frames, names, cfg, mode)[1] for mode in MODES for _ in range(warmup)}
            if not all(torch.equal(a, b) for a, b in zip(outputs["parallel"], outputs["serial"])):
                raise AssertionError("the views on worker threads differ from the views one after another")
            samples: dict[str, list[float]] = {mode: [] for mode in MODES}
            for _ in range(calls):
                for mode in MODES:
                    samples[mode].append(timed_call(frames, names, cfg, mode)[0])
            for mode, ms in samples.items():
                rows.append({"height": h, "width": w, "views": views, "mode": mode,
                             "pixels": list(outputs[mode][0].shape[1:]), "median_ms": float(np.median(ms)),
                             "p90_ms": float(np.percentile(ms, 90))})
    finally:
        if saved is None:
            os.environ.pop(view_workers.SWITCH, None)
        else:
            os.environ[view_workers.SWITCH] = saved
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--views", type=int, default=2)
    parser.add_argument("--sizes", type=size, nargs="+", default=[(224, 224), (480, 640)])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--out", help="folder for the JSON result")
    args = parser.parse_args(argv)
    rows = measure(args.views, args.sizes, args.calls, args.warmup)
    print(f"groot_inputs.prepare_views, {args.views} views, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} torch threads, {usable_cpus()} usable CPUs")
    print("| frames | model pixels | views | median ms | p90 ms |\n|---|---|---|---|---|")
    for r in rows:
        how = "on worker threads" if r["mode"] == "parallel" else "one after another"
        print(f"| {r['views']} x {r['height']}x{r['width']} | {r['pixels'][0]}x{r['pixels'][1]} | {how} | "
              f"{r['median_ms']:.2f} | {r['p90_ms']:.2f} |")
    if args.out:
        import cv2
        from tools.benchmark_engine import write_result
        write_result(args.out, {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                                "command": "python tools/benchmark_groot_inputs.py " + " ".join(argv),
                                "machine": platform.machine(), "python": platform.python_version(),
                                "torch": torch.__version__, "numpy": np.__version__, "opencv": cv2.__version__,
                                "torch_threads": torch.get_num_threads(), "usable_cpus": usable_cpus(),
                                "rows": rows},
                     "groot_inputs", "devmachine")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
