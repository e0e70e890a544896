"""tools/benchmark_host_resize.py on the CPU: both resize paths are timed per size, give the same pixels, and the
numpy path runs with Pillow hidden as on a machine without it (the module is left as it was)."""

from __future__ import annotations

from flashrt_core import preprocess
from tools.benchmark_host_resize import measure, resize_path


def test_each_size_is_timed_on_both_paths():
    rows = measure(views=2, sizes=[(480, 640), (224, 224)], calls=2, warmup=1)
    assert [(r["height"], r["path"]) for r in rows] == [(480, "pillow"), (480, "numpy"), (224, "pillow"),
                                                         (224, "numpy")]
    assert all(0 < r["median_ms"] <= r["p90_ms"] for r in rows)


def test_the_numpy_path_hides_pillow_and_restores_it():
    with resize_path("numpy"):
        assert preprocess._openpi_pillow() is None
    assert preprocess._openpi_pillow() is not None
