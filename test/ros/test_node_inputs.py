"""Bad and stale inputs are skipped and counted, never fatal; parameters are validated; diagnostics content."""

from __future__ import annotations

import math
import time

import cv2
import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticStatus
from rcl_interfaces.msg import ParameterType
from rcl_interfaces.srv import DescribeParameters, SetParameters
from rclpy.parameter import Parameter
from sensor_msgs.msg import CompressedImage, Image

from flashrt_ros.image_conversion import rgb_to_image_fields
from flashrt_ros.node_parameters import PARAMETERS
from node_harness import ActiveHarnesses, BorrowedPolicy, NodeHarness, shared_policy, pattern_frame, wait_until

pytestmark = pytest.mark.ros

MS = 1_000_000
CHUNK_TIMEOUT_S = 60.0
SERVICE_TIMEOUT_S = 20.0


@pytest.fixture
def active_harness():
    harnesses = ActiveHarnesses()
    yield harnesses.make
    harnesses.close()


def jpeg(stamp_ms: int) -> CompressedImage:
    ok, data = cv2.imencode(".jpg", pattern_frame(stamp_ms))
    assert ok
    return CompressedImage(format="jpeg", data=data.tobytes())


def test_bad_and_stale_inputs_are_skipped_counted_and_the_node_keeps_working(active_harness):
    h = active_harness(cameras=("camera_0/image_raw", "camera_1/image_raw/compressed"))
    h.send_instruction("   ")                                           # empty instruction
    assert wait_until(lambda: h.node._statistics.snapshot().rejected.get("empty_instruction") == 1)
    h.send_instruction("stack the blocks")
    now = h.now_ns()
    h.send_state(now, values=[math.nan] * h.node.policy.state_dim)     # NaN state
    h.send_state(now, values=[0.0] * (h.node.policy.state_dim + 1))    # wrong size
    h.send_frame(0, now, Image(height=4, width=4, encoding="yuv422", step=8, data=bytes(32)))  # bad encoding
    h.send_frame(0, now + MS, Image(height=4, width=4, encoding="rgb8", step=12, data=bytes(7)))  # short data
    assert wait_until(lambda: h.node._statistics.snapshot().rejected.get("bad_state") == 2
                      and h.node._statistics.snapshot().rejected.get("bad_image") == 2)
    assert h.node._state is None
    # a truncated jpeg (no end marker) fails the cheap check in the callback, before any decoder sees it
    h.send_state(now)
    now = h.now_ns()
    h.send_frame(0, now)
    h.send_frame(1, now + MS, CompressedImage(format="jpeg", data=jpeg(1).data.tobytes()[:50] + bytes(100)))
    assert wait_until(lambda: h.node._statistics.snapshot().rejected.get("bad_image") == 3)
    # a stale frame pair: captured 10 s ago
    old = h.now_ns() - 10_000 * MS
    h.send_frame(0, old)
    h.send_frame(1, old, jpeg(2))
    assert wait_until(lambda: h.node._buffer.counters().stale >= 1)
    assert not h.chunks
    # valid input after all that: a chunk
    now = h.now_ns()
    h.send_frame(0, now)
    h.send_frame(1, now + MS, jpeg(3))
    assert wait_until(lambda: len(h.chunks) == 1, timeout_s=CHUNK_TIMEOUT_S)
    assert h.lifecycle.state() == "active"
    assert h.chunks[0].sequence == 0
    # status and diagnostics count them
    expected_rejected = 1 + 2 + 3 + h.node._buffer.counters().stale + h.node._buffer.counters().out_of_order
    assert wait_until(lambda: h.statuses and h.statuses[-1].inputs_rejected == expected_rejected)
    assert wait_until(lambda: h.diagnostics and h.latest_diagnostics().get("rejected_bad_image") == "3"
                      and h.latest_diagnostics().get("rejected_bad_state") == "2"
                      and h.latest_diagnostics().get("rejected_empty_instruction") == "1"
                      and int(h.latest_diagnostics()["frames_stale"]) >= 1)


def test_an_input_the_model_refuses_counts_as_inference_error_and_is_skipped(active_harness):
    h = active_harness()
    h.send_instruction()
    now = h.now_ns()
    h.send_state(now)
    # the subject is the refused frame: instruction and state are in before it (topics arrive in any order)
    assert wait_until(lambda: h.node._instruction is not None and h.node._state is not None)
    now = h.now_ns()
    sliver = np.zeros((1, 1000, 3), np.uint8)         # valid rgb8, but too elongated to resize for the model
    h.send_frame(0, now, Image(**rgb_to_image_fields(sliver)))
    h.send_frame(1, now)
    assert wait_until(lambda: h.statuses and h.statuses[-1].inference_errors == 1, timeout_s=CHUNK_TIMEOUT_S)
    assert "too elongated" in h.statuses[-1].last_error
    h.send_observation(h.now_ns())
    assert wait_until(lambda: len(h.chunks) == 1, timeout_s=CHUNK_TIMEOUT_S)
    assert h.chunks[0].sequence == 0 and h.lifecycle.state() == "active"


def test_a_chunk_with_nan_is_counted_and_never_published(active_harness, tmp_path):
    """Damaged weights (here the action projection's, all NaN) make every chunk NaN: the node counts each as an
    inference error with the reason, publishes nothing, and stays active."""
    import torch
    from safetensors.torch import load_file, save_file

    import flashrt_core
    from flashrt_core.fixtures import write_random_checkpoint
    folder = write_random_checkpoint(tmp_path / "nan", "pi05_tiny")
    tensors = load_file(folder / "model.safetensors")
    tensors["model.action_out_proj.weight"] = torch.full_like(tensors["model.action_out_proj.weight"], math.nan)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    policy = flashrt_core.load_model(folder, device="cpu")
    h = active_harness(policy=policy, instruction=True)
    h.send_observation(h.now_ns())
    assert wait_until(lambda: h.statuses and h.statuses[-1].inference_errors == 1, timeout_s=CHUNK_TIMEOUT_S)
    assert "non-finite values (NaN/inf)" in h.statuses[-1].last_error and "not published" in h.statuses[-1].last_error
    h.send_observation(h.now_ns())
    assert wait_until(lambda: h.statuses[-1].inference_errors == 2, timeout_s=CHUNK_TIMEOUT_S)
    assert not h.chunks and h.lifecycle.state() == "active"


def test_a_camera_that_never_sends_shows_in_diagnostics(active_harness):
    h = active_harness({"diagnostics_window": 1.0})
    h.send_instruction()
    for _ in range(10):
        h.send_frame(0, h.now_ns())        # camera 1 never sends
        time.sleep(0.03)
    assert wait_until(lambda: h.diagnostics and h.diagnostics[-1].level == DiagnosticStatus.ERROR
                      and "camera_1/image_raw: no frame since activation" in h.diagnostics[-1].message, timeout_s=5.0)
    assert float(h.latest_diagnostics()["input_rate_hz[camera_1/image_raw]"]) == 0.0
    assert not h.chunks


def test_diagnostics_content_and_staleness_warning(active_harness):
    # the inputs stop after four observations: detection limits far beyond the test keep the level on staleness
    h = active_harness({"staleness_warn_threshold": 30.0, "camera_timeout": 60.0, "pairing_timeout": 60.0,
                        "max_state_age": 60.0})
    h.send_instruction()
    for _ in range(4):
        h.send_observation(h.now_ns())
        time.sleep(0.1)
    assert wait_until(lambda: len(h.chunks) >= 1, timeout_s=CHUNK_TIMEOUT_S)
    assert wait_until(lambda: h.diagnostics and int(h.latest_diagnostics()["chunks_published"]) == len(h.chunks))
    status = h.diagnostics[-1]
    values = h.latest_diagnostics()
    assert status.level == DiagnosticStatus.OK and status.hardware_id == "flashrt_policy"
    assert values["lifecycle_state"] == "active"
    assert values["gpu_memory"] == "n/a"                            # CPU model
    assert values["model_id"] == shared_policy().model_id
    for key in ("inference_time_median_s", "inference_time_p99_s", "inference_time_max_s", "staleness_median_s",
                "staleness_p99_s", "staleness_max_s", "overhead_median_s", "overhead_p99_s", "queue_wait_median_s",
                "queue_wait_p99_s", "handling_median_s", "handling_p99_s", "node_code_median_s", "node_code_p99_s",
                "input_latency_median_s", "input_latency_p99_s", "in_node_median_s", "in_node_p99_s"):
        assert float(values[key]) > -1e-3, key
    assert float(values["staleness_max_s"]) >= max(c.staleness for c in h.chunks) - 1e-6
    # per chunk: overhead = input latency (capture -> observation complete) + in node, both >= 0
    assert float(values["input_latency_median_s"]) > 0
    assert float(values["in_node_p99_s"]) <= float(values["overhead_p99_s"]) + 1e-6
    assert float(values["input_rate_hz[camera_0/image_raw]"]) > 0
    # each of the four observations is taken (one chunk each) or replaced before it was taken; no time reset
    assert int(values["observations_replaced"]) + len(h.chunks) <= 4 and len(h.chunks) >= 1
    assert values["time_resets"] == "0" and values["observations_dropped_by_reset"] == "0"
    # lower the threshold at runtime: WARN naming the staleness
    result = h.node.set_parameters([Parameter("staleness_warn_threshold", value=1e-6)])[0]
    assert result.successful
    assert wait_until(lambda: h.diagnostics[-1].level == DiagnosticStatus.WARN
                      and "staleness p99" in h.diagnostics[-1].message, timeout_s=5.0)
    # deactivate: diagnostics say so
    assert h.lifecycle.change("deactivate")
    assert wait_until(lambda: h.latest_diagnostics()["lifecycle_state"] == "inactive", timeout_s=5.0)


def call(client, request):
    assert client.wait_for_service(SERVICE_TIMEOUT_S)
    future = client.call_async(request)
    assert wait_until(future.done, timeout_s=SERVICE_TIMEOUT_S)
    return future.result()


def test_parameters_have_descriptors_and_invalid_values_are_rejected_with_a_reason():
    h = NodeHarness()        # unconfigured: no model needed
    try:
        describe = h.driver.create_client(DescribeParameters, f"{h.namespace}/policy_node/describe_parameters")
        names = [spec.name for spec in PARAMETERS]
        descriptors = {d.name: d for d in call(describe, DescribeParameters.Request(names=names)).descriptors}
        for spec in PARAMETERS:
            descriptor = descriptors[spec.name]
            assert descriptor.description, spec.name
            assert descriptor.read_only == spec.read_only, spec.name
            assert descriptor.type == spec.param_type(), spec.name
        assert descriptors["sync_slop"].floating_point_range[0].to_value == 1.0
        assert descriptors["warmup_iterations"].integer_range[0].from_value == 0
        assert descriptors["camera_topics"].type == ParameterType.PARAMETER_STRING_ARRAY
        assert "One of" in descriptors["trigger"].description

        set_parameters = h.driver.create_client(SetParameters, f"{h.namespace}/policy_node/set_parameters")

        def set_one(name, value):
            request = SetParameters.Request(parameters=[Parameter(name, value=value).to_parameter_msg()])
            return call(set_parameters, request).results[0]

        assert not set_one("sync_slop", 5.0).successful                      # outside [0, 1]
        assert not set_one("max_observation_age", -1.0).successful
        assert not set_one("max_observation_age", float("nan")).successful
        rejected = set_one("executor", "multi_threaded")                       # read at start-up
        assert not rejected.successful and "read-only" in rejected.reason
        assert set_one("checkpoint", "/somewhere/else").successful              # unconfigured: read at configure
        assert not set_one("sync_slop", "fast").successful                      # wrong type
        accepted = set_one("sync_slop", 0.05)
        assert accepted.successful, accepted.reason
        assert h.node.get_parameter("sync_slop").value == 0.05
    finally:
        h.close()


def test_parameter_overrides_with_invalid_values_fail_configure_with_the_reason():
    h = NodeHarness({"trigger": "sometimes", "device": "gpu0", "camera_topics": ["a", "a"]},
                    policy_factory=lambda s: BorrowedPolicy(shared_policy()))
    try:
        assert not h.lifecycle.change("configure")
        assert h.lifecycle.state() == "unconfigured"
        assert wait_until(lambda: h.diagnostics and "trigger='sometimes'" in h.latest_diagnostics()["last_error"])
        error = h.latest_diagnostics()["last_error"]
        assert "device='gpu0'" in error and "camera_topics has duplicate entries" in error
    finally:
        h.close()


def test_runtime_parameters_apply_to_the_observation_buffer(active_harness):
    h = active_harness({"sync_slop": 0.001})
    h.send_instruction()
    now = h.now_ns()
    h.send_observation(now, offsets_ns=(0, 20 * MS))               # 20 ms apart: not paired at 1 ms slop
    time.sleep(1.0)
    assert not h.chunks and h.node._buffer.counters().completed == 0
    assert h.node.set_parameters([Parameter("sync_slop", value=0.05)])[0].successful
    assert h.node._settings.sync_slop == 0.05
    now = h.now_ns()
    h.send_observation(now, offsets_ns=(0, 20 * MS))
    assert wait_until(lambda: len(h.chunks) == 1, timeout_s=CHUNK_TIMEOUT_S)
    stamps = [t.sec * 1_000_000_000 + t.nanosec for t in h.chunks[0].view_stamps]
    assert stamps == [now, now + 20 * MS]


def test_joint_state_is_picked_by_name_in_the_configured_order(active_harness):
    dim = shared_policy().state_dim
    names = [f"joint_{i}" for i in reversed(range(dim))]
    h = active_harness({"state_joint_names": names})
    msg_names = [f"joint_{i}" for i in range(dim)] + ["gripper_extra"]
    from sensor_msgs.msg import JointState
    from rclpy.time import Time
    msg = JointState(name=msg_names, position=[float(i) for i in range(dim)] + [99.0])
    msg.header.stamp = Time(nanoseconds=h.now_ns()).to_msg()
    h.state_publisher.publish(msg)
    assert wait_until(lambda: h.node._state is not None)
    np.testing.assert_array_equal(h.node._state.values, np.arange(dim, dtype=np.float32)[::-1])
    missing = JointState(name=msg_names[1:], position=[0.0] * dim)
    h.state_publisher.publish(missing)
    assert wait_until(lambda: h.node._statistics.snapshot().rejected.get("bad_state") == 1)
    assert "lacks joints ['joint_0']" in h.node._statistics.snapshot().last_error


def test_float_array_state_and_three_cameras_in_a_configured_view_order(active_harness):
    views = ["right_wrist_0_rgb", "base_0_rgb", "left_wrist_0_rgb"]
    h = active_harness({"state_type": "float_array", "camera_views": views},
                       cameras=("cam_right/image_raw", "cam_high/image_raw", "cam_left/image_raw"))
    h.send_instruction()
    before = h.now_ns()
    h.send_state(before)
    assert wait_until(lambda: h.node._state is not None)
    stamp = h.now_ns()
    for camera, offset in enumerate((5 * MS, 0, 9 * MS)):
        h.send_frame(camera, stamp + offset)
    assert wait_until(lambda: len(h.chunks) == 1, timeout_s=CHUNK_TIMEOUT_S)
    chunk = h.chunks[0]
    assert list(chunk.view_names) == views
    assert [t.sec * 1_000_000_000 + t.nanosec for t in chunk.view_stamps] == [stamp + 5 * MS, stamp, stamp + 9 * MS]
    assert chunk.header.stamp == chunk.view_stamps[1]                          # the oldest of the three
    state_stamp = chunk.state_stamp.sec * 1_000_000_000 + chunk.state_stamp.nanosec
    assert before <= state_stamp <= stamp                                       # no header: receive time
