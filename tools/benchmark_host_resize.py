"""The pi family's host resize-with-pad (preprocess.prepare_images: what pi0-FAST runs on every predict, and pi0 /
pi0.5 on the CPU or with FLASHRT_GPU_PREPROCESS=0) for --views uint8 frames of each --sizes, on Pillow (the
installed one, where it resamples as openpi's) and on the numpy path that runs without it, the two paths' calls
alternating in one process. Checks that both give the same pixels. CPU only: medians and p90 of --calls calls.

    python tools/benchmark_host_resize.py [--views 2] [--sizes 224x224 480x640 720x1280] [--calls 50] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashrt_core import preprocess  # noqa: E402
from tools.benchmark_groot_inputs import size  # noqa: E402

PATHS = ("pillow", "numpy")


@contextmanager
def resize_path(path: str):
    """preprocess's resize on `path` for the block: "numpy" hides Pillow from it as a machine without Pillow would."""
    preprocess._openpi_pillow.cache_clear()
    if path == "pillow":
        if preprocess._openpi_pillow() is None:
            raise RuntimeError("no Pillow <= 12 installed: the pillow path does not run here")
        yield
        return
    saved = preprocess._openpi_pillow
    preprocess._openpi_pillow = lambda: None
    try:
        yield
    finally:
        preprocess._openpi_pillow = saved
        preprocess._openpi_pillow.cache_clear()


def measure(views: int, sizes: list[tuple[int, int]], calls: int, warmup: int = 3) -> list[dict]:
    names = [f"view{k}" for k in range(views)]
    rows = []
    for h, w in sizes:
        frames = [np.random.default_rng(k).integers(0, 256, (h, w, 3), dtype=np.uint8) for k in range(views)]
        pixels, samples = {}, {path: [] for path in PATHS}
        for path in PATHS:
            with resize_path(path):
                for _ in range(warmup):
                    pixels[path] = preprocess.prepare_images(frames, names)[0]
        if not np.array_equal(pixels["pillow"], pixels["numpy"]):
            raise AssertionError(f"{h}x{w}: the Pillow and numpy paths give different pixels")
        for _ in range(calls):
            for path in PATHS:
                with resize_path(path):
                    start = time.perf_counter()
                    preprocess.prepare_images(frames, names)
                    samples[path].append((time.perf_counter() - start) * 1e3)
        for path, ms in samples.items():
            rows.append({"height": h, "width": w, "views": views, "path": path, "median_ms": float(np.median(ms)),
                         "p90_ms": float(np.percentile(ms, 90))})
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--views", type=int, default=2)
    parser.add_argument("--sizes", type=size, nargs="+", default=[(224, 224), (480, 640), (720, 1280)])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--out", help="folder for the JSON result")
    args = parser.parse_args(argv)
    rows = measure(args.views, args.sizes, args.calls)
    import PIL
    print(f"preprocess.prepare_images, {args.views} views, {platform.processor() or platform.machine()}, "
          f"Pillow {PIL.__version__}, numpy {np.__version__}")
    print("| frames | resize on | median ms | p90 ms |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['views']} x {r['height']}x{r['width']} | {r['path']} | {r['median_ms']:.2f} | {r['p90_ms']:.2f} |")
    if args.out:
        from tools.benchmark_engine import write_result
        write_result(args.out, {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                                "command": "python tools/benchmark_host_resize.py " + " ".join(argv),
                                "machine": platform.machine(), "python": platform.python_version(),
                                "numpy": np.__version__, "pillow": PIL.__version__, "rows": rows},
                     "host_resize", "devmachine")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
