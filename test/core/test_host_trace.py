"""tools/host_trace.py: a traced predict call splits into consecutive host and GPU segments that sum to its wall
time (the arithmetic on CUPTI-like activity tuples; the profiler itself runs on the GPU machine)."""

from __future__ import annotations

import pytest

from tools.host_trace import SEGMENTS, split_call, summarize

H2D = "Memcpy HtoD (Pinned -> Device)"
D2H = "Memcpy DtoH (Device -> Pinned)"


def test_a_call_splits_into_its_six_segments():
    # call 0..1000 us: host work until 120, copy in 120-160, graph kernels 190-900 (overlapping under PDL),
    # copy out 905-915, host again until 1000
    gpu = [(H2D, 120.0, 160.0), ("_patch_rows_kernel", 190.0, 200.0), ("nvjet_gemm", 195.0, 600.0),
           ("Memset (Device)", 610.0, 612.0), ("_step_out_kernel", 620.0, 900.0), (D2H, 905.0, 915.0)]
    seg = split_call((0.0, 1000.0), gpu)
    assert list(seg) == list(SEGMENTS)
    assert seg == pytest.approx({"host_before": 0.120, "copy_in": 0.040, "launch_gap": 0.030, "graph": 0.710,
                                 "copy_out": 0.015, "host_after": 0.085})
    assert sum(seg.values()) == pytest.approx(1.0)


def test_activities_outside_the_call_are_not_its_own():
    gpu = [("kernel_of_the_call_before", -50.0, 10.0), (H2D, 20.0, 30.0), ("k", 40.0, 80.0), (D2H, 85.0, 90.0),
           ("kernel_of_the_next_call", 120.0, 130.0)]
    seg = split_call((0.0, 100.0), gpu)
    assert seg["host_before"] == pytest.approx(0.020) and seg["graph"] == pytest.approx(0.040)
    assert seg["host_after"] == pytest.approx(0.010) and sum(seg.values()) == pytest.approx(0.1)


def test_overlapping_boundaries_never_count_twice():
    # a copy out that starts before the last kernel ends: copy_out counts only what runs after the kernels
    gpu = [(H2D, 10.0, 20.0), ("k", 20.0, 60.0), (D2H, 55.0, 65.0)]
    seg = split_call((0.0, 70.0), gpu)
    assert seg["launch_gap"] == 0.0 and seg["copy_out"] == pytest.approx(0.005)
    assert min(seg.values()) >= 0.0 and sum(seg.values()) == pytest.approx(0.07)


def test_a_call_without_gpu_work_is_refused_by_name():
    with pytest.raises(ValueError, match="0 kernels, 0 copies out"):
        split_call((0.0, 100.0), [("k", 200.0, 210.0)])


def test_summary_is_the_median_per_segment():
    calls = [dict.fromkeys(SEGMENTS, v) for v in (0.1, 0.3, 0.2)]
    out = summarize(calls)
    assert out["graph"] == pytest.approx(0.2) and out["total"] == pytest.approx(1.2)
