"""tools/benchmark_groot_inputs.py on the CPU: it times prepare_views at the released geometry (each frame size to
the model's pixels, as groot_inputs.image_geometry says) in both modes of FLASHRT_PARALLEL_VIEWS, leaves the
switch as it found it, and names a malformed size."""

from __future__ import annotations

import argparse
import os

import pytest

from flashrt_core.view_workers import SWITCH

from tools.benchmark_groot_inputs import measure, size


def test_each_size_is_timed_at_the_released_geometry_in_both_modes(monkeypatch):
    monkeypatch.setenv(SWITCH, "1")
    rows = measure(views=2, sizes=[(224, 224), (480, 640)], calls=2, warmup=1)
    assert [(r["height"], r["width"], r["mode"], r["pixels"]) for r in rows] == [
        (224, 224, "parallel", [252, 252]), (224, 224, "serial", [252, 252]),
        (480, 640, "parallel", [252, 336]), (480, 640, "serial", [252, 336])]
    assert all(0 < r["median_ms"] <= r["p90_ms"] for r in rows)
    assert os.environ[SWITCH] == "1"


def test_a_size_is_height_x_width():
    assert size("480x640") == (480, 640)
    with pytest.raises(argparse.ArgumentTypeError, match="HEIGHTxWIDTH"):
        size("480-640")
