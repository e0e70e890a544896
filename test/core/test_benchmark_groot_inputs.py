"""tools/benchmark_groot_inputs.py on the CPU: it times prepare_views at the released geometry (each frame size to
the model's pixels, as groot_inputs.image_geometry says) and names a malformed size."""

from __future__ import annotations

import argparse

import pytest

from tools.benchmark_groot_inputs import measure, size


def test_each_size_is_timed_at_the_released_geometry():
    rows = measure(views=2, sizes=[(224, 224), (480, 640)], calls=2, warmup=1)
    assert [(r["height"], r["width"], r["pixels"]) for r in rows] == [(224, 224, [252, 252]), (480, 640, [252, 336])]
    assert all(0 < r["median_ms"] <= r["p90_ms"] for r in rows)


def test_a_size_is_height_x_width():
    assert size("480x640") == (480, 640)
    with pytest.raises(argparse.ArgumentTypeError, match="HEIGHTxWIDTH"):
        size("480-640")
