"""Real-time chunking across the two nodes over real DDS: the action executor publishes the actions it will still
command (pending_topic), the policy node in an rtc mode conditions each chunk on them, with the rows executed during
its inference (from its measured latency) frozen. The demo policy (pi0.5 tiny, CPU) runs after a fixed inference
delay; in hard_prefix mode the frozen rows of each chunk are exactly the pending actions at their times."""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest
from rclpy.parameter import Parameter

from flashrt_ros import qos_profiles
from flashrt_ros.action_executor import ActionExecutor
from flashrt_ros.msg import ActionChunk
from node_harness import BorrowedPolicy, NodeHarness, shared_policy, wait_until

pytestmark = pytest.mark.ros

INFERENCE_DELAY_S = 0.06
ACTION_DT = 0.2            # 10 rows: a chunk covers 1.8 s, beyond the CPU inference's latency on a loaded machine
CAMERA_PERIOD_S = 0.05
LIVE_INFERENCES = 6
RUN_LIMIT_S = 60.0         # generous: the loop ends after LIVE_INFERENCES, sooner on an idle machine


class RtcRecordingPolicy(BorrowedPolicy):
    """The shared demo policy after a fixed delay, keeping every RtcRequest the node passes and its chunk."""

    def __init__(self, policy):
        super().__init__(policy, delay_s=INFERENCE_DELAY_S)
        self.requests = []            # (RtcRequest or None, actions)
        self._lock = threading.Lock()

    def predict(self, images, prompt, state=None, noise=None, rtc=None):
        self.calls += 1
        time.sleep(self.delay_s)
        actions = self._policy.predict(images, prompt, state=state, noise=noise, rtc=rtc)
        with self._lock:
            self.requests.append((rtc, actions))
        return actions


@pytest.fixture
def rtc_loop():
    policy = RtcRecordingPolicy(shared_policy())
    harness = NodeHarness({"action_dt": ACTION_DT, "rtc": "hard_prefix", "warmup_iterations": 1},
                          policy_factory=lambda _: policy)
    executor_node = ActionExecutor(namespace=harness.namespace, context=harness.context, parameter_overrides=[
        Parameter("autostart", value=True), Parameter("control_rate_hz", value=100.0)])
    harness.executor.add_node(executor_node)
    pending = []
    harness.driver.create_subscription(ActionChunk, "pending_actions", pending.append, qos_profiles.output_qos())
    yield harness, executor_node, policy, pending
    harness.executor.remove_node(executor_node)
    executor_node.destroy_node()
    harness.close()


def test_chunks_are_conditioned_on_what_the_executor_will_still_execute(rtc_loop):
    harness, executor_node, policy, pending = rtc_loop
    assert harness.lifecycle.change("configure") and harness.lifecycle.change("activate")
    assert wait_until(lambda: executor_node.lifecycle_state() == "active")
    harness.wait_for_subscribers()
    harness.send_instruction("pick up the cube")
    end = time.monotonic() + RUN_LIMIT_S
    while len(policy.requests) < 2 + LIVE_INFERENCES and time.monotonic() < end:     # 2: the warm-up passes
        now = harness.now_ns()
        harness.send_observation(now)
        time.sleep(CAMERA_PERIOD_S)
    assert wait_until(lambda: len(pending) >= LIVE_INFERENCES - 1)
    # the executor publishes its pending actions after each chunk: stamped now, rows every dt, the chunk's width
    reaching = [msg for msg in pending if msg.horizon > 0]
    assert len(reaching) >= len(pending) - 1, [msg.horizon for msg in pending]
    assert all(msg.dt == pytest.approx(ACTION_DT) and msg.action_dim == policy.action_dim
               and len(msg.actions) == msg.horizon * msg.action_dim for msg in pending)
    with policy._lock:
        warm_up, requests = policy.requests[:2], policy.requests[2:]
    # the warm-up runs a plain pass, then one with RTC (the engine captures its RTC graph at configure)
    assert warm_up[0][0] is None and warm_up[1][0].mode == "hard_prefix" and warm_up[1][0].delay_steps == 1
    conditioned = [(request, actions) for request, actions in requests if request is not None]
    # the first inference has no measured latency and nothing pending: it runs plain; the later ones are
    # conditioned (on the executor's pending actions, or the node's last chunk until they come back)
    assert requests[0][0] is None and len(requests) >= LIVE_INFERENCES, len(requests)
    assert len(conditioned) >= len(requests) - 2, [r is None for r, _ in requests]
    # the delay follows the measured latency: at least the inference delay in rows, never the whole chunk
    min_rows = math.ceil(INFERENCE_DELAY_S / ACTION_DT - 1e-9)
    for request, actions in conditioned:
        assert request.mode == "hard_prefix"
        known = len(request.previous_chunk)          # the delay counts only rows the pending actions reach
        assert min(min_rows, known) <= request.delay_steps <= known and request.delay_steps < policy.horizon
        frozen = request.delay_steps
        np.testing.assert_allclose(actions[:frozen], np.asarray(request.previous_chunk, np.float32)[:frozen],
                                   rtol=0, atol=1e-5 * max(1.0, float(np.abs(actions).max())))
    assert executor_node.counters.switches >= 3
