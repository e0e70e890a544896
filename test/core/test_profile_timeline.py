"""The critical-path arithmetic of tools/profile_engine_timeline.py: what each kernel adds to a replay's span when
kernels overlap (programmatic dependent launch starts a kernel before the one ahead has finished)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
pytest.importorskip("torch")

from profile_engine_timeline import critical_path  # noqa: E402


def test_increments_sum_to_the_span_and_charge_waiting_to_the_kernel_ahead():
    kernels = [("b", 5.0, 12.0),      # starts early (PDL) while a runs, ends 2 us after a
               ("a", 0.0, 10.0),
               ("c", 6.0, 11.0),      # ends inside the span already covered: adds nothing
               ("d", 15.0, 16.0)]     # after a 3 us gap: the gap is on the critical path
    got = critical_path(kernels)
    assert [k[0] for k in got] == ["a", "b", "c", "d"]            # launch (start) order
    assert [k[1] for k in got] == [10.0, 2.0, 0.0, 4.0]
    assert [k[2] for k in got] == [10.0, 7.0, 5.0, 1.0]           # own durations, waiting included
    assert sum(k[1] for k in got) == 16.0                          # first start to last end


def test_serial_kernels_add_their_durations():
    got = critical_path([("x", 0.0, 2.0), ("y", 2.5, 3.0)])
    assert [k[1] for k in got] == [2.0, 1.0]
