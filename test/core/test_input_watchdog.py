"""InputWatchdog: which input fault holds when, and what its message says (pure Python, no DDS)."""

from __future__ import annotations

from flashrt_ros.input_watchdog import FaultKind, InputWatchdog, WatchLimits

TOPICS = ("cam0", "cam1")
LIMITS = WatchLimits(camera_timeout_s=0.5, pairing_timeout_s=0.5, max_state_age_s=0.5, sync_slop_s=0.02)
S = 1_000_000_000


def kinds(faults) -> list[tuple[FaultKind, str]]:
    return [(fault.kind, fault.subject) for fault in faults]


def feed(watchdog: InputWatchdog, now_s: float, offsets_s=(0.0, 0.0), cameras=(0, 1), completed=True) -> None:
    for camera in cameras:
        watchdog.frame_received(camera, now_s)
        watchdog.frame_accepted(camera, int((now_s + offsets_s[camera]) * S), now_s)
    if completed:
        watchdog.observation_completed(now_s)


def test_nothing_holds_while_inputs_flow_and_every_limit_counts_from_activation():
    watchdog = InputWatchdog(TOPICS)
    watchdog.reset(100.0)
    assert watchdog.check(100.4, LIMITS, "joint_states", None) == ()          # within the limits of activation
    faults = watchdog.check(100.6, LIMITS, "joint_states", None)
    assert kinds(faults) == [(FaultKind.CAMERA_SILENT, "cam0"), (FaultKind.CAMERA_SILENT, "cam1"),
                             (FaultKind.STATE_STALE, "joint_states")]
    assert faults[0].message == "cam0: no frame since activation (camera_timeout 0.5 s)"
    for t in (100.7, 100.8, 100.9):
        feed(watchdog, t)
    assert watchdog.check(101.0, LIMITS, "joint_states", 0.1) == ()
    assert watchdog.check(101.0, LIMITS) == ()                                  # no state topic: no state fault


def test_a_silent_camera_and_a_stale_state_name_their_age():
    watchdog = InputWatchdog(TOPICS)
    watchdog.reset(0.0)
    feed(watchdog, 0.1)
    feed(watchdog, 0.7, cameras=(0,), completed=False)
    faults = watchdog.check(0.8, LIMITS, "joint_states", 0.9)
    assert kinds(faults) == [(FaultKind.CAMERA_SILENT, "cam1"), (FaultKind.STATE_STALE, "joint_states")]
    assert faults[0].message == "cam1: no frame for 0.70 s (camera_timeout 0.5 s)"
    assert faults[1].message == "joint_states: newest valid state is 0.90 s old (max_state_age 0.5 s)"


def test_a_camera_whose_frames_are_all_rejected_or_undecodable():
    watchdog = InputWatchdog(TOPICS)
    watchdog.reset(0.0)
    feed(watchdog, 0.1)
    for t in (0.3, 0.5, 0.7):          # cam1 keeps sending, every frame rejected
        feed(watchdog, t, cameras=(0,), completed=False)
        watchdog.frame_received(1, t)
        watchdog.frame_rejected(1, "cam1: frame stamped 10.000 s in the future")
    faults = watchdog.check(0.7, LIMITS)
    assert kinds(faults) == [(FaultKind.CAMERA_REJECTED, "cam1")]
    assert faults[0].message == ("cam1: every frame of the last 0.5 s rejected (last: cam1: frame stamped 10.000 s "
                                 "in the future)")
    # compressed frames that pass the cheap checks but fail to decode on the inference thread
    feed(watchdog, 0.8)
    watchdog.frame_decoded(0, 0.8)
    watchdog.frame_decoded(1, 0.8, "cam1: cannot decode jpeg data (240 bytes)")
    assert kinds(watchdog.check(0.9, LIMITS)) == [(FaultKind.CAMERA_REJECTED, "cam1")]
    assert "its frames fail to decode (last: cam1: cannot decode jpeg" in watchdog.check(0.9, LIMITS)[0].message
    watchdog.frame_decoded(1, 1.0)
    feed(watchdog, 1.0)
    assert watchdog.check(1.0, LIMITS) == ()


def test_a_pairing_stall_names_the_stamp_offsets_and_counts_from_when_every_camera_is_usable():
    watchdog = InputWatchdog(TOPICS)
    watchdog.reset(0.0)
    for t in (0.1, 0.2, 0.3, 0.4, 0.5):
        feed(watchdog, t, offsets_s=(0.0, -2.3), completed=False)      # cam1's clock 2.3 s behind: never paired
    assert watchdog.check(0.55, LIMITS) == ()                            # usable since 0.1: 0.45 s
    feed(watchdog, 0.65, offsets_s=(0.0, -2.3), completed=False)
    faults = watchdog.check(0.65, LIMITS)
    assert kinds(faults) == [(FaultKind.PAIRING_STALL, "cameras")]
    assert faults[0].message == ("no complete observation since activation: the newest frames' stamps differ by "
                                 "more than sync_slop 0.02 s (cam0 +2.300 s, cam1 +0.000 s)")
    feed(watchdog, 0.7)                                                  # an observation completes: over
    assert watchdog.check(0.7, LIMITS) == ()
    for t in (0.9, 1.1, 1.3):
        feed(watchdog, t, completed=False)
    assert "no complete observation for 0.60 s" in watchdog.check(1.3, LIMITS)[0].message


def test_a_camera_back_from_silence_gets_a_full_pairing_timeout_and_time_going_back_starts_afresh():
    watchdog = InputWatchdog(TOPICS)
    watchdog.reset(0.0)
    feed(watchdog, 0.1)
    feed(watchdog, 0.5, cameras=(0,), completed=False)
    assert kinds(watchdog.check(0.7, LIMITS)) == [(FaultKind.CAMERA_SILENT, "cam1")]
    feed(watchdog, 0.9, completed=False)                                 # cam1 is back at 0.9
    assert watchdog.check(1.3, LIMITS) == ()                             # 0.4 s since then: no stall yet
    feed(watchdog, 1.45, completed=False)
    assert kinds(watchdog.check(1.45, LIMITS)) == [(FaultKind.PAIRING_STALL, "cameras")]
    assert watchdog.check(0.2, LIMITS) == ()          # a looping bag: the clock went back, the watch restarts


def test_the_watch_starts_with_the_clock_under_sim_time():
    """Activated before the first /clock (sim time reads 0): the limits count from the first time seen."""
    watchdog = InputWatchdog(TOPICS)
    watchdog.reset(None)
    assert watchdog.check(1_767_225_600.0, LIMITS, "joint_states", None) == ()
    faults = watchdog.check(1_767_225_600.6, LIMITS, "joint_states", None)
    assert kinds(faults)[0] == (FaultKind.CAMERA_SILENT, "cam0") and "since activation" in faults[0].message
