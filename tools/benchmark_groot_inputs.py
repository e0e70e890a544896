"""The host's share of a GR00T N1.6 predict that depends on the cameras: groot_inputs.prepare_views (the reference
processor's two shortest-edge INTER_AREA scalings, the centre crop, Eagle's bicubic resize, the float [-1, 1]
tensors) for --views uint8 frames of each --sizes, at the released config's geometry. CPU only (no model, no
GPU): the median and p90 of --calls calls after --warmup, per size.

    python tools/benchmark_groot_inputs.py [--views 2] [--sizes 224x224 480x640] [--calls 50] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashrt_core import groot_inputs  # noqa: E402
from flashrt_core.model.groot.config import get_groot_config  # noqa: E402


def size(text: str) -> tuple[int, int]:
    """"480x640" -> (480, 640): height x width."""
    try:
        h, w = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a size is HEIGHTxWIDTH, e.g. 480x640; got {text!r}") from None
    return h, w


def measure(views: int, sizes: list[tuple[int, int]], calls: int, warmup: int) -> list[dict]:
    cfg = get_groot_config("groot_n1.6")
    names = [f"view{k}" for k in range(views)]
    rows = []
    for h, w in sizes:
        frames = [np.random.default_rng(k).integers(0, 256, (h, w, 3), dtype=np.uint8) for k in range(views)]
        for _ in range(warmup):
            out = groot_inputs.prepare_views(frames, names, cfg)
        samples = []
        for _ in range(calls):
            start = time.perf_counter()
            out = groot_inputs.prepare_views(frames, names, cfg)
            samples.append((time.perf_counter() - start) * 1e3)
        rows.append({"height": h, "width": w, "views": views, "pixels": list(out[0].shape[1:]),
                     "median_ms": float(np.median(samples)), "p90_ms": float(np.percentile(samples, 90))})
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--views", type=int, default=2)
    parser.add_argument("--sizes", type=size, nargs="+", default=[(224, 224), (480, 640)])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--out", help="folder for the JSON result")
    args = parser.parse_args(argv)
    rows = measure(args.views, args.sizes, args.calls, args.warmup)
    print(f"groot_inputs.prepare_views, {args.views} views, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} torch threads")
    print("| frames | model pixels | median ms | p90 ms |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['views']} x {r['height']}x{r['width']} | {r['pixels'][0]}x{r['pixels'][1]} | "
              f"{r['median_ms']:.2f} | {r['p90_ms']:.2f} |")
    if args.out:
        import cv2
        from tools.benchmark_engine import write_result
        write_result(args.out, {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                                "command": "python tools/benchmark_groot_inputs.py " + " ".join(argv),
                                "machine": platform.machine(), "python": platform.python_version(),
                                "torch": torch.__version__, "numpy": np.__version__, "opencv": cv2.__version__,
                                "torch_threads": torch.get_num_threads(), "rows": rows},
                     "groot_inputs", "devmachine")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
