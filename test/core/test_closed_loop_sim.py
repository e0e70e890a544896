"""flashrt_ros.closed_loop_sim: the simulated loop shows what reading chunks by their stamps is for."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from flashrt_ros.closed_loop_sim import EXECUTORS, LoopConfig, run_loop, scripted_chunk, target

SHORT = LoopConfig(duration_s=4.0)


def test_without_delay_naive_and_latest_execute_the_same_chunks():
    config = dataclasses.replace(SHORT, delay_s=0.0, jitter=0.0)
    naive, latest = run_loop(config, "naive"), run_loop(config, "latest")
    assert naive.tracking_rms == latest.tracking_rms and naive.seam_max == latest.seam_max


@pytest.mark.parametrize("delay_s", [0.1, 0.3])
def test_reading_chunks_by_stamp_keeps_tracking_under_delay(delay_s):
    """Naive execution replays each chunk late by the delay; by stamp, the plant tracks as without delay."""
    config = dataclasses.replace(SHORT, delay_s=delay_s)
    naive, latest = run_loop(config, "naive"), run_loop(config, "latest")
    undelayed = run_loop(dataclasses.replace(SHORT, delay_s=0.0), "latest")
    assert latest.tracking_rms < 0.5 * naive.tracking_rms
    assert latest.tracking_rms < 2.0 * undelayed.tracking_rms
    assert latest.deadline_misses == 0       # a 1 s chunk outlasts a 0.3 s delay


def test_fusion_makes_smaller_seams_than_latest():
    config = dataclasses.replace(SHORT, delay_s=0.05)
    latest, fused = run_loop(config, "latest"), run_loop(config, "temporal_fusion")
    assert fused.switches == latest.switches > 0
    assert fused.seam_mean < 0.7 * latest.seam_mean


def test_a_chunk_shorter_than_the_delay_misses_deadlines():
    config = dataclasses.replace(SHORT, delay_s=0.3, jitter=0.0, horizon=5)     # 5 rows = 80 ms < 300 ms
    assert run_loop(config, "latest").deadline_misses > 0


def test_the_scripted_chunk_is_the_target_plus_feedback_plus_offset():
    config = SHORT
    observed = target(config, 1.0) - 0.1
    offset = np.array([0.01, -0.02])
    chunk = scripted_chunk(config, 1.0, observed, offset)
    assert chunk.shape == (config.horizon, config.action_dim)
    np.testing.assert_allclose(chunk[0], target(config, 1.0) + config.feedback_gain * 0.1 + offset, atol=1e-12)
    far = config.horizon - 1
    np.testing.assert_allclose(chunk[far], target(config, 1.0 + far * config.chunk_dt) + offset, atol=1e-3)


def test_runs_repeat_for_a_seed_and_bad_executors_are_refused():
    assert run_loop(SHORT, "temporal_fusion") == run_loop(SHORT, "temporal_fusion")
    assert set(EXECUTORS) == {"naive", "latest", "temporal_fusion"}
    with pytest.raises(ValueError, match="executor must be one of"):
        run_loop(SHORT, "rtc")
