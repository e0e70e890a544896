"""NodeStatistics: the per-chunk latency split that /diagnostics and the overhead benchmark report."""

from __future__ import annotations

import math

import pytest

from flashrt_ros.node_diagnostics import NodeStatistics

pytestmark = pytest.mark.ros


def test_overhead_splits_into_input_latency_and_time_in_the_node():
    stats = NodeStatistics(("camera_0",), window_s=60.0)
    # staleness, inference, queue wait, node code, input latency [s]
    chunks = [(0.010, 0.002, 0.0005, 0.0004, 0.006), (0.012, 0.003, 0.0010, 0.0003, 0.007),
              (0.020, 0.002, 0.0020, 0.0005, 0.014)]
    for staleness, inference, queue, code, latency in chunks:
        stats.record_chunk(inference, staleness, queue, code, latency)
    snap = stats.snapshot()
    assert snap.chunks_published == 3
    assert snap.overhead.median == pytest.approx(0.009)                 # 0.008, 0.009, 0.018
    assert snap.input_latency.median == pytest.approx(0.007) and snap.input_latency.max == pytest.approx(0.014)
    assert snap.in_node.median == pytest.approx(0.002)                  # 0.002, 0.002, 0.004
    assert snap.in_node.max == pytest.approx(0.004)
    assert snap.handling.median == pytest.approx(0.008)                 # overhead - queue wait: 0.0075, 0.008, 0.016


def test_without_an_input_latency_the_split_stays_empty():
    stats = NodeStatistics(("camera_0",), window_s=60.0)
    stats.record_chunk(0.002, 0.010, 0.001, 0.0004)
    snap = stats.snapshot()
    assert snap.overhead.count == 1 and snap.input_latency.count == 0 and math.isnan(snap.in_node.median)
