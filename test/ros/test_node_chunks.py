"""Chunks over DDS: stamps, shapes, sequence, trajectory output, no backlog, rate trigger, sim time."""

from __future__ import annotations

import time

import numpy as np
import pytest

from flashrt_ros.inference_worker import DEFAULT_HANDOVER_TIMEOUT_S
from node_harness import ActiveHarnesses, shared_policy, wait_until

pytestmark = pytest.mark.ros

MS = 1_000_000
CHUNK_TIMEOUT_S = 60.0
ACTION_DT = 0.05
# Staleness is measured on the node clock at publish; the subscriber sees it a little later.
STALENESS_RECEIVE_SLACK_S = 0.5
# A frame published while a forward pass starts may be delivered a little later on a loaded machine.
NEWEST_FRAME_SLACK_S = 0.15
# Same model, inputs and noise in the node and in the test: only float reassociation may differ.
PINNED_RTOL = 1e-5
PINNED_ATOL = 1e-5


@pytest.fixture
def harness_factory():
    harnesses = ActiveHarnesses()
    yield lambda parameters=None, delay_s=0.0, **kwargs: harnesses.make(parameters, delay_s=delay_s,
                                                                        instruction=True, **kwargs)
    harnesses.close()


def test_chunks_carry_observation_stamps_shapes_and_sequence(harness_factory):
    policy = shared_policy()
    names = [f"joint_{i}" for i in range(policy.action_dim)]
    h = harness_factory({"action_dt": ACTION_DT, "action_names": names, "frame_id": "base_link",
                         "trajectory_topic": "joint_trajectory"})
    assert h.node._worker._handover_timeout_s == DEFAULT_HANDOVER_TIMEOUT_S > 0     # the hand-over wait: default on
    sent = []
    for k in range(3):
        stamp = h.now_ns()
        h.send_observation(stamp, offsets_ns=(2 * MS, 0))      # camera 1 is the older frame this time
        sent.append(stamp)
        count = k + 1
        assert wait_until(lambda: len(h.chunks) >= count, timeout_s=CHUNK_TIMEOUT_S), f"chunk {k} missing"
    for k, (chunk, stamp) in enumerate(zip(h.chunks, sent)):
        assert chunk.sequence == k
        stamp_ns = chunk.header.stamp.sec * 1_000_000_000 + chunk.header.stamp.nanosec
        assert stamp_ns == stamp                                  # the OLDEST camera stamp
        assert list(chunk.view_names) == ["base_0_rgb", "left_wrist_0_rgb"]
        assert [(t.sec * 1_000_000_000 + t.nanosec) for t in chunk.view_stamps] == [stamp + 2 * MS, stamp]
        assert chunk.state_stamp.sec * 1_000_000_000 + chunk.state_stamp.nanosec == stamp
        assert (chunk.horizon, chunk.action_dim) == (policy.horizon, policy.action_dim)
        actions = np.asarray(chunk.actions, np.float32)
        assert actions.shape == (policy.horizon * policy.action_dim,) and np.all(np.isfinite(actions))
        assert chunk.dt == ACTION_DT and list(chunk.action_names) == names
        assert chunk.header.frame_id == "base_link"
        assert chunk.model_id == policy.model_id and len(chunk.config_id) == 12
        assert 0 < chunk.inference_time <= chunk.staleness
        age_at_receive = (h.chunk_arrival[k] - time.monotonic()) + (h.now_ns() - stamp) * 1e-9
        assert chunk.staleness <= age_at_receive + 1e-3
        assert chunk.staleness >= age_at_receive - STALENESS_RECEIVE_SLACK_S
    assert wait_until(lambda: len(h.trajectories) >= 3)
    trajectory = h.trajectories[0]
    assert list(trajectory.joint_names) == names and len(trajectory.points) == policy.horizon
    assert trajectory.header.stamp == h.chunks[0].header.stamp
    assert trajectory.points[2].time_from_start.nanosec == int(round(2 * ACTION_DT * 1e9))
    np.testing.assert_allclose(trajectory.points[1].positions,
                               np.asarray(h.chunks[0].actions[policy.action_dim:2 * policy.action_dim]), rtol=1e-6)


@pytest.mark.parametrize("handover_s", [0.0, 0.01])     # inference_handover_timeout off / at its maximum
def test_no_backlog_with_a_60hz_two_camera_stream_and_slow_inference(harness_factory, handover_s):
    delay_s = 0.3
    h = harness_factory({"inference_handover_timeout": handover_s}, delay_s=delay_s)
    assert h.node._worker._handover_timeout_s == handover_s
    period_ns, duration_s = 16_666_667, 4.0
    start = time.monotonic()
    frames = 0
    while time.monotonic() - start < duration_s:
        h.send_observation(h.now_ns())
        frames += 1
        time.sleep(period_ns * 1e-9)
    stream_end = time.monotonic()
    assert wait_until(lambda: h.node._worker is not None and not h.node._worker.busy, timeout_s=30.0)
    time.sleep(0.3)
    chunks = list(h.chunks)
    inference = np.array([c.inference_time for c in chunks])
    staleness = np.array([c.staleness for c in chunks])
    assert len(chunks) >= 3
    # one chunk per forward pass at most: nothing queued behind a slow inference
    assert len(chunks) <= (time.monotonic() - start) / delay_s + 1
    # the age of each chunk stays within two forward passes (the one it waited for + its own): no growth
    assert np.all(staleness - inference <= inference.max() + 0.2), (staleness, inference)
    # each chunk comes from a frame captured around the time the previous forward pass started or later
    # (the newest observation), never from one queued before it: stamp[i] >= start[i-1] - slack
    stamps = np.array([c.header.stamp.sec + c.header.stamp.nanosec * 1e-9 for c in chunks])
    starts = stamps + staleness - inference            # node clock when each forward pass started (approx.)
    assert np.all(stamps[1:] >= starts[:-1] - NEWEST_FRAME_SLACK_S), (stamps, starts)
    # the last chunk is computed from a frame of the last forward pass, not an old queued one
    last_arrival = max(h.chunk_arrival)
    assert last_arrival - stream_end < 2 * inference.max() + 1.0
    counters = h.node._buffer.counters()
    assert counters.replaced > frames // 2, counters       # most observations were replaced, and counted
    assert wait_until(lambda: h.statuses and h.statuses[-1].observations_replaced == counters.replaced)
    assert wait_until(lambda: h.diagnostics and int(h.latest_diagnostics()["inference_handover_timeouts"]) ==
                      h.node._worker.handover_timeouts)


def test_rate_trigger_runs_at_the_configured_rate(harness_factory):
    rate_hz = 2.0
    h = harness_factory({"trigger": "rate", "inference_rate_hz": rate_hz})
    start = time.monotonic()
    while time.monotonic() - start < 3.0:
        h.send_observation(h.now_ns())
        time.sleep(0.02)
    chunks = len(h.chunks)
    assert 3 <= chunks <= 3.0 * rate_hz + 1, chunks


def test_staleness_follows_sim_time_and_survives_time_going_backwards(harness_factory):
    h = harness_factory({"use_sim_time": True, "max_observation_age": 1.0})
    sim_now = 1_000 * 1_000_000_000
    assert wait_until(lambda: (h.send_clock(sim_now) or True) and h.node.get_clock().now().nanoseconds == sim_now)
    h.send_observation(sim_now - 100 * MS, offsets_ns=(0, 0))
    assert wait_until(lambda: len(h.chunks) >= 1, timeout_s=CHUNK_TIMEOUT_S)
    chunk = h.chunks[0]
    # the sim clock stood still: staleness is exactly clock - stamp, whatever the wall time spent
    assert chunk.staleness == pytest.approx(0.1, abs=1e-9)
    assert chunk.header.stamp.sec == 999 and chunk.header.stamp.nanosec == 900_000_000
    # a looping bag: clock and stamps jump back 500 s
    looped = sim_now - 500 * 1_000_000_000
    assert wait_until(lambda: (h.send_clock(looped) or True) and h.node.get_clock().now().nanoseconds == looped)
    h.send_observation(looped - 50 * MS, offsets_ns=(0, 0))
    assert wait_until(lambda: len(h.chunks) >= 2, timeout_s=CHUNK_TIMEOUT_S)
    assert h.chunks[1].staleness == pytest.approx(0.05, abs=1e-9)
    assert h.chunks[1].sequence == 1
    assert h.node._buffer.counters().time_resets >= 1


def test_pinned_noise_chunk_equals_a_direct_policy_call_on_the_same_inputs(harness_factory):
    from flashrt_ros.pinned_noise import observation_noise
    from node_harness import pattern_frame
    policy = shared_policy()
    h = harness_factory({"noise_seed": 7})
    stamp = h.now_ns()
    h.send_observation(stamp, offsets_ns=(0, 0))
    assert wait_until(lambda: len(h.chunks) == 1, timeout_s=CHUNK_TIMEOUT_S)
    image = pattern_frame(stamp // 1_000_000)
    state = np.linspace(-0.5, 0.5, policy.state_dim).astype(np.float32)
    expected = policy.predict({"base_0_rgb": image, "left_wrist_0_rgb": image}, "pick up the cube", state=state,
                              noise=observation_noise(7, stamp, policy.horizon))      # (horizon, action_dim)
    actions = np.asarray(h.chunks[0].actions, np.float32).reshape(policy.horizon, policy.action_dim)
    np.testing.assert_allclose(actions, expected, rtol=PINNED_RTOL, atol=PINNED_ATOL)
