"""flashrt_ros.chunk_plots: the executor replayed over a chunk bag, and the three PNG files."""

from __future__ import annotations

import numpy as np
import pytest

from flashrt_ros.bag_evaluator import Chunk, read_chunk_bag, write_chunk_bag
from flashrt_ros.chunk_plots import PLOT_FILES, executed_trace, main
from flashrt_ros.chunk_schedule import Switching
from flashrt_ros.node_parameters import SPECS, settings_from_values

DT = 0.02
START_NS = 50 * 10**9
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def ramp_chunks(count: int = 6, period_s: float = 0.1, delay_s: float = 0.05) -> list[Chunk]:
    """Chunk k observed at START + k * period, received delay_s later; row i = 10 k + i (dimension 1: + 100)."""
    chunks = []
    for k in range(count):
        stamp = START_NS + int(k * period_s * 1e9)
        rows = 10.0 * k + np.arange(10, dtype=np.float32)[:, None] + np.array([0.0, 100.0], dtype=np.float32)
        chunks.append(Chunk(stamp_ns=stamp, view_stamps_ns=(stamp,), state_stamp_ns=0, actions=rows,
                            receive_ns=stamp + int(delay_s * 1e9), inference_time_s=0.04 + 0.001 * k,
                            staleness_s=delay_s, sequence=k, dt=DT))
    return chunks


def test_the_trace_is_the_schedule_replayed_at_the_chunks_arrivals():
    trace = executed_trace(ramp_chunks(), control_rate_hz=50.0)
    # the first command: chunk 0 at its arrival, 2.5 rows after its observation
    assert trace.times_s[0] == pytest.approx(START_NS * 1e-9 + 0.05)
    np.testing.assert_allclose(trace.commands[0], [2.5, 102.5], atol=1e-6)
    # every later chunk takes over when it arrives: at t = its stamp + 50 ms it gives 10 k + 2.5, the old one
    # (5 rows older) 10 (k - 1) + 7.5: a seam of 5
    assert list(trace.switch_sequences) == [0, 1, 2, 3, 4, 5]
    np.testing.assert_allclose(trace.seams[1:], 5.0, atol=1e-4)
    assert trace.deadline_misses == 0
    fused = executed_trace(ramp_chunks(), control_rate_hz=50.0, switching=Switching.TEMPORAL_FUSION)
    assert fused.seams[1:].max() < trace.seams[1:].max()


def test_plots_are_written_from_a_chunk_bag(tmp_path, capsys):
    settings = settings_from_values({name: spec.default for name, spec in SPECS.items()} | {"action_dt": DT})
    bag = tmp_path / "chunks"
    write_chunk_bag(bag, ramp_chunks(), settings, ["base"], "test-model")
    assert [c.dt for c in read_chunk_bag(bag)] == [DT] * 6
    out = tmp_path / "plots"
    assert main([str(bag), "--out-dir", str(out), "--control-rate-hz", "50"]) == 0
    for name in PLOT_FILES:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000, name
    assert capsys.readouterr().out.split() == [str(out / name) for name in PLOT_FILES]


def test_a_bag_without_chunks_is_named(tmp_path, capsys):
    from flashrt_ros.demo_bag import DemoBagConfig, write_demo_bag
    bag = tmp_path / "frames"
    write_demo_bag(bag, DemoBagConfig(duration_s=0.2))
    assert main([str(bag), "--out-dir", str(tmp_path / "plots")]) == 1
    assert "has no flashrt_ros/msg/ActionChunk messages" in capsys.readouterr().err
