"""Time faults and silence over DDS: stamps from the future, frames that never pair, a camera that stops, a state
that stops or turns invalid. Each is detected within its parameter, logged once, counted and shown in
/diagnostics with the reason; no chunk is computed from a state older than max_state_age."""

from __future__ import annotations

import re
import time

import cv2
import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticStatus
from rclpy.time import Time
from sensor_msgs.msg import CompressedImage

from node_harness import ActiveHarnesses, wait_until
from node_streams import InputStream, RosoutLines, seconds_since

pytestmark = pytest.mark.ros

MS = 1_000_000
CHUNK_TIMEOUT_S = 60.0
LIMIT_S = 0.3                   # camera_timeout / pairing_timeout / max_state_age of these tests
DETECTION_SLACK_S = 1.0         # watchdog period, diagnostics transport and polling on a loaded 2-core machine


@pytest.fixture
def active_harness():
    harnesses = ActiveHarnesses()
    yield harnesses.make
    harnesses.close()


def ns(stamp) -> int:
    return Time.from_msg(stamp).nanoseconds


def latest(h) -> tuple[int, str, dict[str, str]]:
    """Level, message and values of the newest /diagnostics entry of the harness's node."""
    if not h.diagnostics:
        return -1, "", {}
    status = h.diagnostics[-1]
    return status.level, status.message, {kv.key: kv.value for kv in status.values}


def error_within(h, text: str, start: float, limit_s: float) -> float:
    """Wait for an ERROR entry whose message holds ``text``; returns the seconds since ``start``."""
    assert wait_until(lambda: latest(h)[0] == DiagnosticStatus.ERROR and text in latest(h)[1], timeout_s=10.0), \
        latest(h)[1]
    elapsed = seconds_since(start)
    assert elapsed <= limit_s + DETECTION_SLACK_S, f"detected after {elapsed:.2f} s"
    return elapsed


def test_stamps_from_the_future_are_rejected_beyond_the_tolerance_and_used_within_it(active_harness):
    h = active_harness({"max_future_stamp": 0.05})
    log = RosoutLines(h)
    h.send_instruction()
    assert wait_until(lambda: h.node._instruction is not None)
    for ahead_s in (0.3, 10.0):          # an unsynchronised camera PC, a bad clock: camera 1 only
        now = h.now_ns()
        h.send_state(now)
        h.send_frame(0, now)
        h.send_frame(1, now + int(ahead_s * 1e9))
    assert wait_until(lambda: h.node._statistics.snapshot().rejected.get("future_stamp") == 2)
    h.send_state(h.now_ns() + 10_000 * MS)                                 # a JointState from the future
    assert wait_until(lambda: h.node._statistics.snapshot().rejected.get("future_stamp") == 3)
    assert wait_until(lambda: "in the future" in latest(h)[1] and latest(h)[0] >= DiagnosticStatus.WARN)
    assert wait_until(lambda: latest(h)[2].get("frames_future_stamped_in_window") == "2"
                      and latest(h)[2].get("rejected_future_stamp") == "3", timeout_s=5.0), latest(h)[2]
    assert not h.chunks
    # within the tolerance: used as stamped; the +10 s frame left no trace in the buffer (no time reset)
    now = h.now_ns()
    h.send_state(now)
    h.send_frame(0, now)
    h.send_frame(1, now + 20 * MS)
    assert wait_until(lambda: len(h.chunks) == 1, timeout_s=CHUNK_TIMEOUT_S)
    chunk = h.chunks[0]
    assert [ns(s) for s in chunk.view_stamps] == [now, now + 20 * MS] and ns(chunk.state_stamp) == now
    assert chunk.staleness > -0.05
    assert h.node._buffer.counters().time_resets == 0
    assert 1 <= log.count("in the future") <= 2, log.with_text("in the future")        # throttled: 3 rejections


def test_frames_that_never_pair_are_a_pairing_stall_until_the_clocks_agree(active_harness):
    h = active_harness({"pairing_timeout": LIMIT_S})
    log = RosoutLines(h)
    h.send_instruction()
    start = time.monotonic()
    with InputStream(h, offsets_s=(0.0, -0.3)) as stream:     # camera 1's clock 0.3 s behind: usable, never paired
        error_within(h, "no complete observation", start, LIMIT_S)
        _, message, values = latest(h)
        assert "sync_slop 0.02 s" in message and re.search(r"camera_0/image_raw \+0\.3\d\d s", message), message
        assert values["faults_pairing_stall"] == "1" and not h.chunks
        time.sleep(0.5)
        assert log.count("no complete observation") == 1                # logged once
        stream.offsets_s[1] = 0.003                                      # the clocks agree again
        assert wait_until(lambda: h.chunks and latest(h)[2].get("input_faults") == "", timeout_s=CHUNK_TIMEOUT_S)
    assert wait_until(lambda: log.count("recovered: cameras: pairing stall over") == 1)
    assert latest(h)[2]["faults_pairing_stall"] == "1"


def test_a_camera_that_stops_is_an_error_within_camera_timeout(active_harness):
    h = active_harness({"camera_timeout": LIMIT_S})
    log = RosoutLines(h)
    h.send_instruction()
    with InputStream(h) as stream:
        assert wait_until(lambda: len(h.chunks) >= 2, timeout_s=CHUNK_TIMEOUT_S)
        assert wait_until(lambda: latest(h)[2].get("input_faults") == "", timeout_s=5.0), latest(h)[1]
        stream.cameras.discard(1)
        stopped = time.monotonic()
        error_within(h, "camera_1/image_raw: no frame for", stopped, LIMIT_S)
        assert latest(h)[2]["faults_camera_silent"] == "1"
        time.sleep(0.5)
        assert log.count("camera_1/image_raw: no frame") == 1
        stream.cameras.add(1)
        assert wait_until(lambda: latest(h)[2].get("input_faults") == "" and latest(h)[0] != DiagnosticStatus.ERROR,
                          timeout_s=5.0)
        count = len(h.chunks)
        assert wait_until(lambda: len(h.chunks) > count, timeout_s=CHUNK_TIMEOUT_S), "chunks resume"


def test_a_camera_whose_every_frame_is_rejected_is_an_error_naming_the_reason(active_harness):
    h = active_harness({"camera_timeout": LIMIT_S})
    h.send_instruction()
    with InputStream(h) as stream:
        assert wait_until(lambda: len(h.chunks) >= 1, timeout_s=CHUNK_TIMEOUT_S)
        stream.bad_cameras.add(1)
        start = time.monotonic()
        error_within(h, "camera_1/image_raw: every frame of the last 0.3 s rejected", start, LIMIT_S)
        assert "unsupported image encoding 'yuv422'" in latest(h)[1]
        assert latest(h)[2]["faults_camera_rejected"] == "1"
        count = len(h.chunks)
        time.sleep(0.5)
        assert len(h.chunks) <= count + 1, "no chunks while camera 1 sends only bad frames"   # one may be in flight


def test_a_compressed_camera_whose_frames_fail_to_decode_is_an_error_logged_through_ros(active_harness, capfd):
    """JPEGs with intact markers but corrupt data pass the cheap check, pair, and fail to decode on the inference
    thread: libjpeg's own stderr line becomes part of the reason in /diagnostics and the (throttled) ROS log."""
    h = active_harness({"camera_timeout": LIMIT_S}, cameras=("camera_0/image_raw", "camera_1/image_raw/compressed"))
    log = RosoutLines(h)
    ok, encoded = cv2.imencode(".jpg", np.full((120, 160, 3), 90, np.uint8))
    data = encoded.tobytes()
    h.send_instruction()
    stream = InputStream(h)
    stream.images[1] = CompressedImage(format="jpeg", data=data[:40] + bytes(200) + data[-2:])
    with stream:
        assert wait_until(lambda: latest(h)[0] == DiagnosticStatus.ERROR
                          and "camera_1/image_raw/compressed: its frames fail to decode" in latest(h)[1],
                          timeout_s=10.0), latest(h)[1]
        assert "Corrupt JPEG data" in latest(h)[1] and not h.chunks
        assert int(latest(h)[2]["rejected_bad_image"]) >= 1
    def lines_starting(prefix: str) -> int:
        return sum(line.startswith(prefix) for line in log.with_text(prefix))

    rejected, fault = ("camera_1/image_raw/compressed: cannot decode jpeg data",
                       "camera_1/image_raw/compressed: its frames fail to decode")
    assert wait_until(lambda: lines_starting(rejected) >= 1 and lines_starting(fault) >= 1)
    assert lines_starting(rejected) == 1 and lines_starting(fault) == 1, log.with_text("decode")   # throttled
    assert not [line for line in capfd.readouterr().err.splitlines() if line.startswith("Corrupt JPEG data")]


def test_no_chunk_from_a_state_older_than_max_state_age(active_harness):
    h = active_harness({"max_state_age": LIMIT_S})
    log = RosoutLines(h)
    h.send_instruction()
    with InputStream(h) as stream:
        assert wait_until(lambda: len(h.chunks) >= 2, timeout_s=CHUNK_TIMEOUT_S)
        stream.send_state = False                                  # joint_states stops, the cameras go on
        stopped = time.monotonic()
        error_within(h, "joint_states: newest valid state is", stopped, LIMIT_S)
        assert wait_until(lambda: int(latest(h)[2].get("rejected_stale_state", "0")) >= 3, timeout_s=5.0)
        stream.send_state, stream.nan_state = True, True           # only invalid states: the last valid one ages
        assert wait_until(lambda: h.node._statistics.snapshot().rejected.get("bad_state", 0) >= 5, timeout_s=5.0)
        time.sleep(0.5)
        assert "joint_states: newest valid state is" in latest(h)[1]
        assert latest(h)[2]["faults_state_stale"] == "1"
        assert log.count("joint_states: newest valid state is") == 1
        count = len(h.chunks)
        stream.nan_state = False                                    # valid states again
        assert wait_until(lambda: len(h.chunks) > count + 1, timeout_s=CHUNK_TIMEOUT_S), "chunks resume"
    for chunk in h.chunks:                          # each chunk's state was at most max_state_age old at its start
        assert ns(chunk.header.stamp) - ns(chunk.state_stamp) <= LIMIT_S * 1e9, chunk.sequence


def test_under_sim_time_the_watch_follows_the_bag_clock(active_harness):
    """Activated before the first /clock, with a paused clock: no fault (no time passed); the limits count on the
    bag's clock once it runs, and no frame is 'from the future' before /clock starts."""
    h = active_harness({"use_sim_time": True, "camera_timeout": LIMIT_S, "pairing_timeout": LIMIT_S,
                        "max_state_age": LIMIT_S})
    h.send_instruction()
    sim = 1_767_225_600 * 1_000_000_000
    h.send_observation(sim, offsets_ns=(0, 0))                 # before any /clock: the node clock reads 0
    assert wait_until(lambda: h.node._buffer.counters().completed == 1)
    assert "future_stamp" not in h.node._statistics.snapshot().rejected
    assert wait_until(lambda: (h.send_clock(sim) or True) and h.node.get_clock().now().nanoseconds == sim)
    time.sleep(1.0)                                            # wall time passes, the bag's clock stands still
    assert h.node._faults == ()
    late = sim + 2 * int(LIMIT_S * 1e9)                        # the bag's clock runs on, no input
    assert wait_until(lambda: (h.send_clock(late) or True) and h.node._faults, timeout_s=10.0)
    assert {fault.kind.value for fault in h.node._faults} == {"camera_silent", "state_stale"}
