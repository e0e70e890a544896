"""ObservationBuffer: pairing by stamp within a slop, newest complete observation only, age limit, time jumps."""

from __future__ import annotations

import random
import threading

import pytest

from flashrt_ros.observation_buffer import AddResult, ObservationBuffer, seconds_to_ns

MS = 1_000_000  # ns
SLOP = 10 * MS
MAX_AGE = 500 * MS
T0 = 1_700_000_000 * 1_000_000_000


def make_buffer(views=("base", "wrist"), **kwargs) -> ObservationBuffer:
    options = dict(slop_ns=SLOP, max_age_ns=MAX_AGE)
    options.update(kwargs)
    return ObservationBuffer(list(views), **options)


def test_pairs_frames_within_slop_and_stamps_with_oldest():
    buffer = make_buffer()
    assert buffer.add_frame("base", T0, "b0", now_ns=T0 + 5 * MS) is AddResult.QUEUED
    assert buffer.add_frame("wrist", T0 + 4 * MS, "w0", now_ns=T0 + 6 * MS) is AddResult.COMPLETED
    observation = buffer.take(now_ns=T0 + 7 * MS)
    assert observation is not None
    assert [f.payload for f in observation.frames] == ["b0", "w0"]
    assert observation.view_stamps_ns == (T0, T0 + 4 * MS)
    assert observation.stamp_ns == T0            # oldest camera stamp
    assert observation.completed_ns == T0 + 6 * MS
    assert buffer.take(now_ns=T0 + 8 * MS) is None   # taken once only


def test_frames_farther_apart_than_slop_are_not_paired():
    buffer = make_buffer()
    buffer.add_frame("base", T0, "b0", now_ns=T0)
    assert buffer.add_frame("wrist", T0 + SLOP + 1, "w0", now_ns=T0 + SLOP) is AddResult.QUEUED
    assert buffer.take(now_ns=T0 + SLOP) is None
    # the next base frame pairs with the waiting wrist frame
    assert buffer.add_frame("base", T0 + SLOP + 2 * MS, "b1", now_ns=T0 + 13 * MS) is AddResult.COMPLETED
    assert [f.payload for f in buffer.take(now_ns=T0 + 14 * MS).frames] == ["b1", "w0"]


def test_pairs_with_the_closest_frame_of_the_other_camera():
    buffer = make_buffer(slop_ns=20 * MS)
    buffer.add_frame("base", T0, "b0", now_ns=T0)
    buffer.add_frame("base", T0 + 15 * MS, "b1", now_ns=T0 + 15 * MS)   # completes nothing: no wrist yet
    assert buffer.add_frame("wrist", T0 + 14 * MS, "w0", now_ns=T0 + 16 * MS) is AddResult.COMPLETED
    assert [f.payload for f in buffer.take(now_ns=T0 + 17 * MS).frames] == ["b1", "w0"]


def test_newer_observation_replaces_untaken_one_and_is_counted():
    buffer = make_buffer()
    for k in range(5):
        stamp = T0 + k * 33 * MS
        buffer.add_frame("base", stamp, f"b{k}", now_ns=stamp + MS)
        buffer.add_frame("wrist", stamp + MS, f"w{k}", now_ns=stamp + 2 * MS)
    observation = buffer.take(now_ns=T0 + 4 * 33 * MS + 3 * MS)
    assert [f.payload for f in observation.frames] == ["b4", "w4"]
    counters = buffer.counters()
    assert (counters.completed, counters.replaced, counters.taken) == (5, 4, 1)


def test_frame_is_never_used_twice():
    buffer = make_buffer(views=("a", "b"), slop_ns=40 * MS)
    buffer.add_frame("a", T0, "a0", now_ns=T0)
    buffer.add_frame("b", T0 + MS, "b0", now_ns=T0 + MS)
    assert buffer.take(now_ns=T0 + 2 * MS) is not None
    # a new frame of "a" alone must not re-pair with the consumed b0
    assert buffer.add_frame("a", T0 + 30 * MS, "a1", now_ns=T0 + 30 * MS) is AddResult.QUEUED
    assert buffer.take(now_ns=T0 + 31 * MS) is None


def test_stale_frames_rejected_at_arrival_and_at_take():
    buffer = make_buffer()
    assert buffer.add_frame("base", T0, "b0", now_ns=T0 + MAX_AGE + 1) is AddResult.STALE
    buffer.add_frame("base", T0 + 600 * MS, "b1", now_ns=T0 + 601 * MS)
    buffer.add_frame("wrist", T0 + 600 * MS, "w1", now_ns=T0 + 601 * MS)
    # pending observation ages past the limit before anyone takes it
    assert buffer.take(now_ns=T0 + 600 * MS + MAX_AGE + 1) is None
    assert buffer.counters().stale == 2


def test_three_cameras_need_all_three():
    buffer = make_buffer(views=("high", "left", "right"))
    buffer.add_frame("high", T0, 1, now_ns=T0)
    assert buffer.add_frame("left", T0 + MS, 2, now_ns=T0 + MS) is AddResult.QUEUED
    assert buffer.add_frame("right", T0 + 2 * MS, 3, now_ns=T0 + 2 * MS) is AddResult.COMPLETED
    assert buffer.take(now_ns=T0 + 3 * MS).view_stamps_ns == (T0, T0 + MS, T0 + 2 * MS)


def test_time_jumping_backwards_resets_the_buffer():
    buffer = make_buffer()
    late = T0 + 10_000 * MS
    buffer.add_frame("base", late, "b_late", now_ns=late)
    buffer.add_frame("wrist", late, "w_late", now_ns=late)
    assert buffer.has_pending()
    # a looping bag: stamps and the clock start again 10 s earlier
    assert buffer.add_frame("base", T0, "b0", now_ns=T0) is AddResult.RESET
    assert not buffer.has_pending()
    assert buffer.add_frame("wrist", T0 + MS, "w0", now_ns=T0 + MS) is AddResult.COMPLETED
    assert [f.payload for f in buffer.take(now_ns=T0 + 2 * MS).frames] == ["b0", "w0"]
    counters = buffer.counters()
    assert counters.time_resets == 1
    assert counters.dropped_by_reset == 1                          # the pending late observation, never taken
    assert counters.completed == counters.taken + counters.replaced + counters.stale + counters.dropped_by_reset


def test_clear_counts_a_dropped_pending_observation_only():
    buffer = make_buffer()
    buffer.clear()                                                 # nothing pending: nothing dropped
    assert buffer.counters().dropped_by_reset == 0
    buffer.add_frame("base", T0, "b0", now_ns=T0)
    buffer.add_frame("wrist", T0, "w0", now_ns=T0)
    buffer.clear()
    assert buffer.take(now_ns=T0) is None and buffer.counters().dropped_by_reset == 1


def test_clock_jump_alone_resets_and_small_jitter_does_not():
    buffer = make_buffer(jump_tolerance_ns=100 * MS)
    buffer.add_frame("base", T0, "b0", now_ns=T0 + 5 * MS)
    assert buffer.note_time(T0 + 5 * MS - 50 * MS) is False     # clock read on another thread, slightly older
    assert buffer.note_time(T0 - 5_000 * MS) is True             # /clock restarted
    assert buffer.counters().time_resets == 1


def test_duplicate_and_out_of_order_frames_are_rejected():
    buffer = make_buffer()
    buffer.add_frame("base", T0 + 10 * MS, "b0", now_ns=T0 + 10 * MS)
    assert buffer.add_frame("base", T0 + 10 * MS, "dup", now_ns=T0 + 11 * MS) is AddResult.OUT_OF_ORDER
    assert buffer.add_frame("base", T0 + 5 * MS, "old", now_ns=T0 + 12 * MS) is AddResult.OUT_OF_ORDER
    assert buffer.counters().out_of_order == 2


def test_observations_come_out_strictly_newer_with_jittery_cameras():
    rng = random.Random(7)
    buffer = make_buffer(views=("a", "b", "c"), slop_ns=15 * MS)
    events = []
    for k in range(300):
        for view in ("a", "b", "c"):
            stamp = T0 + k * 33 * MS + rng.randint(0, 12) * MS          # capture jitter per camera
            events.append((stamp + rng.randint(1, 30) * MS, view, stamp))  # delivery delay per frame
    events.sort()
    taken = []
    for arrival, view, stamp in events:
        buffer.add_frame(view, stamp, (view, stamp), now_ns=arrival)
        if rng.random() < 0.3:
            observation = buffer.take(now_ns=arrival)
            if observation is not None:
                assert observation.spread_ns <= 15 * MS
                assert [p[0] for p in (f.payload for f in observation.frames)] == ["a", "b", "c"]
                taken.append(observation.stamp_ns)
    assert len(taken) > 50
    assert all(later > earlier for earlier, later in zip(taken, taken[1:]))


def test_bad_arguments_name_the_problem():
    with pytest.raises(ValueError, match="at least one view"):
        ObservationBuffer([], slop_ns=0, max_age_ns=1)
    with pytest.raises(ValueError, match="unique"):
        ObservationBuffer(["a", "a"], slop_ns=0, max_age_ns=1)
    with pytest.raises(ValueError, match="slop_ns"):
        ObservationBuffer(["a"], slop_ns=-1, max_age_ns=1)
    with pytest.raises(ValueError, match="max_age_ns"):
        ObservationBuffer(["a"], slop_ns=0, max_age_ns=0)
    buffer = make_buffer()
    with pytest.raises(ValueError, match="unknown view 'side'"):
        buffer.add_frame("side", T0, None, now_ns=T0)
    with pytest.raises(ValueError, match="out of range"):
        buffer.add_frame(5, T0, None, now_ns=T0)


def test_set_limits_applies_to_next_frames():
    buffer = make_buffer()
    buffer.set_limits(slop_ns=50 * MS)
    buffer.add_frame("base", T0, "b0", now_ns=T0)
    assert buffer.add_frame("wrist", T0 + 40 * MS, "w0", now_ns=T0 + 40 * MS) is AddResult.COMPLETED
    with pytest.raises(ValueError):
        buffer.set_limits(max_age_ns=0)


def test_concurrent_producers_and_consumer_keep_counts_consistent():
    # each producer thread reads its own clock (its frame's stamp); one may run more than the default 200 ms
    # tolerance ahead of the other, which would be a time reset: this test is about the locking, so no resets
    buffer = make_buffer(slop_ns=seconds_to_ns(0.001), jump_tolerance_ns=seconds_to_ns(3600.0))
    frames_per_camera = 2000
    taken = []

    def produce(view: str) -> None:
        for k in range(frames_per_camera):
            stamp = T0 + k * MS
            buffer.add_frame(view, stamp, k, now_ns=stamp)

    def consume() -> None:
        for _ in range(frames_per_camera):
            observation = buffer.take(now_ns=T0 + frames_per_camera * MS)
            if observation is not None:
                taken.append(observation.stamp_ns)

    threads = [threading.Thread(target=produce, args=(v,)) for v in ("base", "wrist")]
    threads.append(threading.Thread(target=consume))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    final = buffer.take(now_ns=T0 + frames_per_camera * MS)
    if final is not None:
        taken.append(final.stamp_ns)
    counters = buffer.counters()
    assert counters.time_resets == 0
    assert counters.completed == counters.taken + counters.replaced + counters.stale + counters.dropped_by_reset
    assert taken == sorted(taken) and len(set(taken)) == len(taken)   # newer only, never twice
