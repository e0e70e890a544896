"""The node's FP8 precision over real rclpy and DDS: precision fp8 is refused where it cannot run (the real loader
on the CPU), and an FP8 policy (the graph engine's executor with FP8 GEMMs, eager on the CPU: fp8_testing.py) is
never calibrated on the warm-up's frames: live, the node publishes nothing until it has collected its first real
observations (counted in /diagnostics), calibrates, passes the gate and then publishes; with a failed gate it
publishes nothing; from calibration_bag it calibrates at configure and keeps the scales in fp8_scale_cache; the
offline evaluator calibrates on the bag's first complete observations as the node does."""

from __future__ import annotations

import pytest
from diagnostic_msgs.msg import DiagnosticStatus

from flashrt_core import Fp8NotCalibrated
from flashrt_core.api import demo_checkpoint_dir
from flashrt_core.calibration import engine_inputs
from flashrt_core.engine.fp8_calibration import observations_digest
from flashrt_ros.bag_evaluator import evaluate_bag, load_node_settings
from flashrt_ros.demo_bag import (BASE_CAMERA_TOPIC, INSTRUCTION_TOPIC, JOINT_STATE_TOPIC, WRIST_CAMERA_TOPIC,
                                  DemoBagConfig, write_demo_bag)
from flashrt_ros.node_calibration import bag_observations, calibrate_offline
from fp8_testing import cpu_engine_policy
from node_harness import NodeHarness, shared_policy, wait_until

pytestmark = pytest.mark.ros

CALIBRATION = {"precision": "fp8", "calibration_observations": 3, "calibration_gate_observations": 1,
               "warmup_iterations": 1}


@pytest.fixture
def harnesses():
    created = []
    yield lambda *args, **kwargs: created.append(NodeHarness(*args, **kwargs)) or created[-1]
    for harness in created:
        harness.close()


def _fp8_policy_factory(made: list):
    def factory(settings):
        made.append(cpu_engine_policy(shared_policy(), checkpoint_dir=demo_checkpoint_dir()))
        return made[-1]
    return factory




def _status(h: NodeHarness) -> str:
    """/diagnostics' fp8_calibration value ("" before the first message)."""
    return h.latest_diagnostics()["fp8_calibration"] if h.diagnostics else ""


def test_fp8_on_the_cpu_is_refused_at_configure_naming_why(harnesses):
    h = harnesses({"precision": "fp8"})              # the real loader, embedded demo checkpoint, device auto: CPU
    assert not h.lifecycle.change("configure")
    assert wait_until(lambda: h.diagnostics and "precision='fp8' cannot run on device cpu" in
                      h.latest_diagnostics()["last_error"])
    assert h.diagnostics[-1].level == DiagnosticStatus.ERROR


def test_live_calibration_on_the_first_real_observations_then_publishing(harnesses):
    made: list = []
    h = harnesses(CALIBRATION, policy_factory=_fp8_policy_factory(made))
    assert h.lifecycle.change("configure")
    policy = made[-1]
    assert not policy.fp8_calibrated                          # the warm-up ran (placeholder scales), calibrated nothing
    assert wait_until(lambda: _status(h) == "collecting 0/4 real observations")
    assert h.lifecycle.change("activate")
    h.wait_for_subscribers()
    h.send_instruction()
    assert wait_until(lambda: h.node._instruction is not None)
    for i in range(4):
        h.send_observation(h.now_ns())
        if i < 3:
            assert wait_until(lambda: _status(h) ==
                              f"collecting {i + 1}/4 real observations", timeout_s=30.0)
            assert h.diagnostics[-1].level == DiagnosticStatus.WARN and "not publishing yet" in \
                h.diagnostics[-1].message
    assert wait_until(lambda: policy.fp8_calibrated and _status(h).startswith(
        "FP8 calibrated on 3 observations"), timeout_s=60.0)
    report = policy.calibration
    assert report.observations == 3 and len(report.gate_cosines) == 1 and report.gate_min >= report.gate
    assert not h.chunks                                       # nothing published while calibrating
    h.send_observation(h.now_ns())
    assert wait_until(lambda: h.chunks, timeout_s=30.0)
    assert h.chunks[0].sequence == 0


def test_a_failed_gate_publishes_nothing_and_shows_an_error(harnesses, monkeypatch):
    import flashrt_core.engine.gate as gate
    monkeypatch.setattr(gate, "GATE_FP8", 1.0)               # no FP8 chunk equals the bf16 one exactly
    made: list = []
    h = harnesses(CALIBRATION, policy_factory=_fp8_policy_factory(made))
    assert h.lifecycle.change("configure") and h.lifecycle.change("activate")
    h.wait_for_subscribers()
    h.send_instruction()
    assert wait_until(lambda: h.node._instruction is not None)
    for i in range(6):
        h.send_observation(h.now_ns())
        assert wait_until(lambda: h.node._buffer.counters().completed >= i + 1, timeout_s=30.0)
    assert wait_until(lambda: _status(h).startswith("failed: Fp8GateError"),
                      timeout_s=60.0)
    assert wait_until(lambda: h.diagnostics[-1].level == DiagnosticStatus.ERROR)
    assert "FP8 calibration failed" in h.latest_diagnostics()["last_error"]
    assert not h.chunks


BAG = DemoBagConfig(duration_s=1.0, width=160, height=120, camera_hz=10.0, joint_count=32)
BAG_TOPICS = {"camera_topics": [BASE_CAMERA_TOPIC, WRIST_CAMERA_TOPIC],
              "camera_views": ["base_0_rgb", "left_wrist_0_rgb"], "instruction_topic": INSTRUCTION_TOPIC,
              "state_topic": JOINT_STATE_TOPIC}


def test_calibration_bag_calibrates_at_configure_and_reuses_the_cached_scales(harnesses, tmp_path):
    bag = tmp_path / "calibration_bag"
    write_demo_bag(bag, BAG)
    parameters = {**CALIBRATION, "calibration_bag": str(bag), "fp8_scale_cache": str(tmp_path / "scales"),
                  **BAG_TOPICS}
    made: list = []
    h = harnesses(parameters, policy_factory=_fp8_policy_factory(made))
    assert h.lifecycle.change("configure")
    first = made[-1].calibration
    assert made[-1].fp8_calibrated and first.observations == 3 and first.source == "measured"
    assert first.cache_path is not None and len(first.gate_cosines) == 1
    assert wait_until(lambda: _status(h).startswith("FP8 calibrated on 3"))
    assert h.lifecycle.change("cleanup") and h.lifecycle.change("configure")
    second = made[-1].calibration
    assert second.source == "cache" and second.cache_path == first.cache_path
    assert second.observations_sha256 == first.observations_sha256


def test_a_missing_calibration_bag_fails_the_configure_naming_it(harnesses, tmp_path):
    missing = tmp_path / "no_such_bag"
    made: list = []
    h = harnesses({**CALIBRATION, "calibration_bag": str(missing)}, policy_factory=_fp8_policy_factory(made))
    assert not h.lifecycle.change("configure") and h.lifecycle.state() == "unconfigured"
    assert wait_until(lambda: h.diagnostics and f"calibration_bag {missing} does not exist" in
                      h.latest_diagnostics()["last_error"])


def test_the_offline_evaluator_calibrates_an_fp8_policy_on_the_bags_first_observations(tmp_path):
    bag = tmp_path / "bag"
    write_demo_bag(bag, BAG)
    settings = load_node_settings(overrides={**BAG_TOPICS, "calibration_observations": 3,
                                             "calibration_gate_observations": 1, "fp8_scale_cache": ""})
    policy = cpu_engine_policy(shared_policy())
    with pytest.raises(Fp8NotCalibrated):
        evaluate_bag(bag, policy, settings, noise_seed=3)
    report = calibrate_offline(policy, settings, bag)
    first = bag_observations(bag, policy, settings, 3)
    assert [tuple(images) for images, _, _ in first] == [("base_0_rgb", "left_wrist_0_rgb")] * 3
    assert all(images["base_0_rgb"].shape == (BAG.height, BAG.width, 3) for images, _, _ in first)
    assert report.observations == 3 and len(report.gate_cosines) == 1
    assert report.observations_sha256 == observations_digest([engine_inputs(policy, *obs) for obs in first])
    assert len(evaluate_bag(bag, policy, settings, noise_seed=3).chunks) >= 4
