"""flashrt_ros.rtc_sharing and ChunkSchedule.preview: what the executor will still execute, turned into the previous
chunk and delay of the policy's next inference; and the two closed over simulated time with the real tiny policy,
where guided RTC shrinks the executor's seams."""

from __future__ import annotations

import numpy as np
import pytest

import flashrt_core
from flashrt_core.rtc_request import RtcRequest
from flashrt_ros.chunk_schedule import ChunkSchedule, Switching, timed_chunk
from flashrt_ros.rtc_sharing import LatencyEstimate, PolicyRtc, pending_actions, rtc_prefix

DT = 0.02


def ramp(stamp: float, start: float, horizon: int = 10, dim: int = 2):
    rows = start + np.arange(horizon, dtype=np.float64)[:, None] + 100.0 * np.arange(dim)[None, :]
    return timed_chunk(stamp, DT, rows)


@pytest.mark.parametrize("switching", [Switching.LATEST, Switching.TEMPORAL_FUSION])
def test_preview_is_what_the_schedule_then_commands_and_changes_nothing(switching):
    schedule = ChunkSchedule(switching, fusion_decay=5.0)
    schedule.add(ramp(10.0, 0.0))
    schedule.add(ramp(10.06, 50.0))
    now = 10.07
    preview = schedule.preview(now, DT, 50)
    assert preview.shape == (9, 2)                     # the newest chunk ends at 10.06 + 9 * DT: rows 0..8 from now
    assert schedule.chunk_count == 2 and schedule.last_action is None
    commanded = [schedule.command(now + i * DT).action for i in range(len(preview))]
    np.testing.assert_allclose(preview, commanded, atol=1e-12)
    assert schedule.command(now + 9 * DT) is None
    assert ChunkSchedule().preview(now, DT, 5).shape == (0, 0)


def test_rtc_prefix_reads_the_pending_actions_from_the_observation_on():
    pending = pending_actions(10.05, DT, np.arange(8, dtype=np.float64)[:, None] * [1.0, -1.0])   # row i = (i, -i)
    previous, delay = rtc_prefix(pending, observation_s=10.06, ready_s=10.115, dt=DT, horizon=10)
    assert delay == 3                                    # 0.055 s = 2.75 rows: rows 0, 1, 2 run before arrival
    assert len(previous) == 7                            # 10.06 + 6 * DT = 10.18 = the last pending row
    np.testing.assert_allclose(previous[:, 0], 0.5 + np.arange(7), atol=1e-9)   # half a row after the start
    early, _ = rtc_prefix(pending, observation_s=10.03, ready_s=10.04, dt=DT, horizon=10)
    np.testing.assert_allclose(early[0], [0.0, 0.0])     # before the pending start: its first row (already past)
    short, delay = rtc_prefix(pending, observation_s=10.16, ready_s=10.30, dt=DT, horizon=10)
    assert len(short) == 2 and delay == 2                # frozen: only what is known
    assert rtc_prefix(pending, observation_s=10.20, ready_s=10.25, dt=DT, horizon=10) is None
    assert rtc_prefix(None, 10.0, 10.1, DT, 10) is None
    _, delay = rtc_prefix(pending_actions(10.0, DT, np.zeros((50, 1))), 10.0, 11.0, DT, horizon=10)
    assert delay == 9                                    # below the horizon: the chunk keeps a row to compute
    assert pending_actions(10.0, 0.0, np.zeros((3, 1))) is None
    assert pending_actions(10.0, DT, np.zeros((0, 1))) is None
    assert pending_actions(10.0, DT, np.full((3, 1), np.nan)) is None


def test_latency_estimate_is_the_largest_recent_measurement_plus_a_margin():
    estimate = LatencyEstimate(window=3, margin_s=0.01)
    assert estimate.value() is None
    for seconds in (0.05, 0.09, 0.04, 0.06, float("nan"), -1.0):
        estimate.record(seconds)
    assert estimate.value() == pytest.approx(0.10)       # 0.09, 0.04, 0.06 kept; NaN and negatives ignored
    estimate.record(0.03)
    assert estimate.value() == pytest.approx(0.07)
    with pytest.raises(ValueError):
        LatencyEstimate(window=0)


def test_policy_side_uses_the_newest_of_the_executors_pending_actions_and_its_own_last_chunk():
    rtc = PolicyRtc("guided", execution_horizon=6, max_guidance_weight=5.0)
    own = np.arange(20, dtype=np.float64).reshape(10, 2)
    assert rtc.request(10.0, 10.01, DT, 10, 2) is None and rtc.skipped == 1       # no latency measured yet
    rtc.latency.record(0.05)
    rtc.on_published(10.0, DT, own, sequence=4)          # the executor has not answered chunk 4 yet
    request = rtc.request(10.04, 10.045, DT, 10, 2)
    assert request.mode == "guided" and request.execution_horizon == 6 and request.max_guidance_weight == 5.0
    assert request.delay_steps == 3                      # (10.045 + 0.05 - 10.04) / DT = 2.75 rows
    np.testing.assert_allclose(request.previous_chunk, own[2:])     # its chunk from the observation on
    rtc.on_pending(10.03, DT, 3, 2, np.full(6, 7.0), sequence=4)   # the executor's answer to chunk 4 wins
    np.testing.assert_allclose(rtc.request(10.04, 10.045, DT, 10, 2).previous_chunk, np.full((2, 2), 7.0))
    rtc.on_pending(10.03, DT, 3, 2, np.full(6, 1.0), sequence=3)   # an older answer: the own chunk again
    np.testing.assert_allclose(rtc.request(10.04, 10.045, DT, 10, 2).previous_chunk, own[2:])
    assert rtc.request(10.04, 10.045, DT, 10, 3) is None                     # another action width
    rtc.on_pending(10.03, DT, 3, 2, np.zeros(5), sequence=9)                 # malformed: dropped
    assert rtc.newest().sequence == 4
    rtc.clear()
    assert rtc.request(10.04, 10.045, DT, 10, 2) is None
    assert rtc.requests == 3 and rtc.skipped == 3


def _closed_loop(policy, mode: str | None, latency_s: float = 0.05, period_s: float = 0.1, chunks: int = 8):
    """The executor's schedule fed by the policy over simulated time: an inference every period_s on a fixed
    observation with fresh noise, its chunk accepted latency_s later; with `mode`, each inference conditioned on
    the pending actions the executor published when it accepted the chunk before. Returns the seams."""
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (96, 128, 3), dtype=np.uint8) for _ in policy.view_names]
    state = rng.uniform(-1, 1, policy.state_dim)
    schedule = ChunkSchedule(Switching.LATEST)
    pending, seams, tick = None, [], 0
    for k in range(chunks):
        observation_s = 100.0 + k * period_s
        ready_s = observation_s + latency_s
        rtc = None
        if mode is not None:
            prefix = rtc_prefix(pending, observation_s, ready_s, DT, policy.horizon)
            if prefix is not None:
                rtc = RtcRequest(prefix[0], prefix[1], mode, execution_horizon=policy.horizon)
        noise = rng.standard_normal((policy.horizon, policy.config.max_action_dim))
        actions = policy.predict(images, "pick", state, noise, rtc=rtc)
        while 100.0 + tick * 0.01 < ready_s:               # the executor's 100 Hz ticks before the chunk arrives
            schedule.command(100.0 + tick * 0.01)
            tick += 1
        schedule.add(timed_chunk(observation_s, DT, actions))
        pending = pending_actions(ready_s, DT, schedule.preview(ready_s, DT, policy.horizon))
        command = schedule.command(100.0 + tick * 0.01)
        tick += 1
        if command is not None and command.switched and k > 0:
            seams.append(command.seam)
    return np.array(seams)


def test_guided_rtc_over_the_pending_actions_shrinks_the_executors_seams():
    policy = flashrt_core.load_model(device="cpu")       # the demo pi0.5 tiny with its norm stats
    try:
        plain = _closed_loop(policy, None)
        guided = _closed_loop(policy, "guided")
    finally:
        policy.close()
    assert len(plain) == len(guided) == 7
    # measured: mean seam 1.29 with guided RTC, 4.41 without (robot units of the demo's random stats)
    assert guided.mean() < 0.5 * plain.mean() and guided.max() < plain.mean(), (guided, plain)
