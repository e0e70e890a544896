"""flashrt_ros.chunk_schedule: chunks read by observation time, switching, fusion, seams and missed deadlines."""

from __future__ import annotations

import math

import numpy as np
import pytest

from flashrt_ros.chunk_schedule import ChunkRejected, ChunkSchedule, Switching, TimedChunk, timed_chunk

DT = 0.02
EXACT = 1e-12


def ramp_chunk(stamp: float, start: float, horizon: int = 10, dim: int = 3, sequence: int = 0) -> TimedChunk:
    """Row i = start + i (every dimension; dimension j adds 100 * j so dimensions differ)."""
    rows = start + np.arange(horizon, dtype=np.float64)[:, None] + 100.0 * np.arange(dim)[None, :]
    return timed_chunk(stamp, DT, rows, sequence)


def test_rows_whose_time_has_passed_are_skipped():
    """A chunk that arrives 3.5 rows late starts at row 3.5: never at row 0."""
    schedule = ChunkSchedule(interpolate=True)
    schedule.add(ramp_chunk(100.0, 0.0))
    command = schedule.command(100.0 + 3.5 * DT)
    np.testing.assert_allclose(command.action, [3.5, 103.5, 203.5], atol=1e-9)
    assert command.chunk_age_s == pytest.approx(3.5 * DT)
    held = ChunkSchedule(interpolate=False)
    held.add(ramp_chunk(100.0, 0.0))
    np.testing.assert_array_equal(held.command(100.0 + 3.5 * DT).action, [3.0, 103.0, 203.0])


def test_latest_takes_the_newest_observation_and_measures_the_seam():
    schedule = ChunkSchedule(Switching.LATEST)
    schedule.add(ramp_chunk(100.0, 0.0, sequence=0))
    first = schedule.command(100.0 + 2 * DT)
    assert first.switched and first.seam == 0.0 and first.source_sequence == 0
    assert not schedule.command(100.0 + 3 * DT).switched
    # a newer observation whose chunk starts 50 units higher: at t it gives 50 + 2, the old one 4
    schedule.add(ramp_chunk(100.0 + 2 * DT, 50.0, sequence=1))
    switch = schedule.command(100.0 + 4 * DT)
    assert switch.switched and switch.source_sequence == 1
    np.testing.assert_allclose(switch.action, [52.0, 152.0, 252.0], atol=1e-9)
    assert switch.seam == pytest.approx(52.0 - 4.0)
    assert switch.chunk_age_s == pytest.approx(2 * DT)


def test_an_older_observation_arriving_late_does_not_take_over():
    schedule = ChunkSchedule(Switching.LATEST)
    schedule.add(ramp_chunk(100.0 + 2 * DT, 50.0, sequence=1))
    schedule.command(100.0 + 3 * DT)
    schedule.add(ramp_chunk(100.0, 0.0, sequence=0))
    command = schedule.command(100.0 + 4 * DT)
    assert command.source_sequence == 1 and not command.switched
    np.testing.assert_allclose(command.action[0], 52.0, atol=1e-9)


def fusion_reference(chunks: list[TimedChunk], t: float, decay: float) -> np.ndarray:
    """The fused action, written out: each covering chunk's row at t (interpolated), weighted by
    exp(-decay * (newest stamp - its stamp))."""
    total, weight_sum = 0.0, 0.0
    covering = [c for c in chunks if c.stamp_s <= t <= c.stamp_s + (len(c.actions) - 1) * c.dt]
    newest = max(c.stamp_s for c in covering)
    for c in covering:
        position = (t - c.stamp_s) / c.dt
        i = int(math.floor(position))
        row = c.actions[i] if i == len(c.actions) - 1 else (
            c.actions[i] + (position - i) * (c.actions[i + 1] - c.actions[i]))
        weight = math.exp(-decay * (newest - c.stamp_s))
        total = total + weight * row
        weight_sum += weight
    return total / weight_sum


@pytest.mark.parametrize("decay", [0.0, 5.0, 40.0])
def test_temporal_fusion_matches_its_formula(decay):
    rng = np.random.default_rng(3)
    chunks = [timed_chunk(100.0 + k * 0.05, DT, rng.normal(size=(10, 4)), k) for k in range(4)]
    schedule = ChunkSchedule(Switching.TEMPORAL_FUSION, fusion_decay=decay)
    for chunk in chunks:
        schedule.add(chunk)
    for t in (100.155, 100.17, 100.19):
        command = schedule.command(t)
        np.testing.assert_allclose(command.action, fusion_reference(chunks, t, decay), rtol=0, atol=1e-12)


def test_fusion_makes_a_smaller_seam_than_latest():
    old, new = ramp_chunk(100.0, 0.0, sequence=0), ramp_chunk(100.0 + 2 * DT, 50.0, sequence=1)
    seams = {}
    for switching in Switching:
        schedule = ChunkSchedule(switching, fusion_decay=0.0)
        schedule.add(old)
        schedule.command(100.0 + 3 * DT)
        schedule.add(new)
        seams[switching] = schedule.command(100.0 + 4 * DT).seam
    assert seams[Switching.LATEST] == pytest.approx(48.0)
    assert seams[Switching.TEMPORAL_FUSION] == pytest.approx(24.0)


def test_no_covering_chunk_is_a_missed_deadline_and_ended_chunks_leave():
    schedule = ChunkSchedule()
    assert schedule.command(100.0) is None
    schedule.add(ramp_chunk(100.0, 0.0, horizon=5))
    assert schedule.command(100.0 - DT) is None          # before its observation: not covered
    last = schedule.command(100.0 + 4 * DT)
    np.testing.assert_allclose(last.action[0], 4.0, atol=EXACT)
    assert schedule.command(100.0 + 4 * DT + 1e-6) is None
    assert schedule.chunk_count == 0
    np.testing.assert_allclose(schedule.last_action[0], 4.0, atol=EXACT)


def test_after_a_gap_the_seam_is_measured_against_the_last_command():
    schedule = ChunkSchedule()
    schedule.add(ramp_chunk(100.0, 0.0, horizon=3))
    schedule.command(100.0 + 2 * DT)                      # last command: 2
    assert schedule.command(100.0 + 5 * DT) is None       # gap
    schedule.add(ramp_chunk(100.0 + 4 * DT, 10.0))
    command = schedule.command(100.0 + 5 * DT)            # 11 against the last command 2
    assert command.switched and command.seam == pytest.approx(9.0)


def test_bad_chunks_are_rejected_by_name():
    with pytest.raises(ChunkRejected, match="shape"):
        timed_chunk(100.0, DT, np.zeros((0, 3)))
    with pytest.raises(ChunkRejected, match="dt"):
        timed_chunk(100.0, 0.0, np.zeros((2, 3)))
    with pytest.raises(ChunkRejected, match="NaN"):
        timed_chunk(100.0, DT, np.array([[0.0, math.nan]]))
    with pytest.raises(ChunkRejected, match="stamp"):
        timed_chunk(0.0, DT, np.zeros((2, 3)))
    schedule = ChunkSchedule()
    schedule.add(ramp_chunk(100.0, 0.0, dim=3))
    with pytest.raises(ChunkRejected, match="action_dim 2 differs"):
        schedule.add(ramp_chunk(100.1, 0.0, dim=2))
    with pytest.raises(ChunkRejected, match="stored already"):
        schedule.add(ramp_chunk(100.0, 5.0, dim=3))
    with pytest.raises(ValueError, match="fusion_decay"):
        ChunkSchedule(fusion_decay=-1.0)
