"""Lifecycle of the policy node over its services: every transition, failed configure, deactivate, SIGINT."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from diagnostic_msgs.msg import DiagnosticStatus

from flashrt_core.fixtures import write_random_checkpoint
from flashrt_ros.policy_node import ShuttingDown, load_policy
from node_harness import DISCOVERY_TIMEOUT_S, BorrowedPolicy, NodeHarness, shared_policy, wait_until
from ros_processes import start_python

pytestmark = pytest.mark.ros

PROCESS_EXIT_TIMEOUT_S = 30.0


@pytest.fixture
def harnesses():
    created = []
    yield lambda *args, **kwargs: created.append(NodeHarness(*args, **kwargs)) or created[-1]
    for harness in created:
        harness.close()


def test_every_transition_with_the_real_loader(harnesses):
    h = harnesses({"warmup_iterations": 1})        # default factory: flashrt_core.load_model, embedded demo
    assert h.lifecycle.state() == "unconfigured"
    assert wait_until(lambda: h.diagnostics and h.latest_diagnostics()["lifecycle_state"] == "unconfigured")
    assert h.lifecycle.change("configure")
    assert h.lifecycle.state() == "inactive"
    policy = h.node.policy
    assert policy is not None and policy.model_id.startswith("pi05_tiny")
    assert h.lifecycle.change("activate") and h.lifecycle.state() == "active"
    assert h.lifecycle.change("deactivate") and h.lifecycle.state() == "inactive"
    assert h.lifecycle.change("cleanup") and h.lifecycle.state() == "unconfigured"
    assert h.node.policy is None
    with pytest.raises(RuntimeError, match="after close"):     # the weights were really released
        policy.predict([], "x")
    assert h.lifecycle.change("configure") and h.lifecycle.change("activate")
    worker = h.node._worker
    assert h.lifecycle.change("shutdown") and h.lifecycle.state() == "finalized"
    assert h.node.policy is None and not worker.alive


def test_failed_configure_leaves_the_node_up_and_configurable_again(harnesses, tmp_path):
    checkpoint = tmp_path / "checkpoint_arrives_later"
    h = harnesses({"checkpoint": str(checkpoint)})
    assert not h.lifecycle.change("configure")
    assert h.lifecycle.state() == "unconfigured"
    assert wait_until(lambda: h.diagnostics and "checkpoint directory not found" in h.latest_diagnostics()[
        "last_error"] and h.latest_diagnostics()["lifecycle_state"] == "unconfigured")
    assert h.diagnostics[-1].level == DiagnosticStatus.ERROR
    write_random_checkpoint(checkpoint, "pi05_tiny", seed=1)    # the missing checkpoint is provided
    assert h.lifecycle.change("configure")
    assert h.lifecycle.state() == "inactive"
    assert h.node.policy.model_id.endswith("checkpoint_arrives_later")


@pytest.mark.parametrize("parameters, reason", [
    ({"camera_views": ["base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"]}, "camera_views has 3 entries"),
    ({"camera_views": ["base_0_rgb", "top_rgb"]}, "not views of the model"),
    ({"action_names": ["a", "b"]}, "action_names has 2 names"),
    ({"state_topic": ""}, "state_topic is empty"),    # the demo pi0.5 puts the state in its prompt
])
def test_configure_fails_with_a_reason_on_inconsistent_settings(harnesses, parameters, reason):
    h = harnesses(dict(parameters, warmup_iterations=1),
                  policy_factory=lambda settings: BorrowedPolicy(shared_policy()))
    assert not h.lifecycle.change("configure")
    assert h.lifecycle.state() == "unconfigured"
    assert h.node.policy is None
    assert wait_until(lambda: h.diagnostics and reason in h.latest_diagnostics()["last_error"]), \
        h.latest_diagnostics()["last_error"]


def test_deactivate_discards_results_in_flight_and_reactivation_restarts_sequence(harnesses):
    delay_s = 1.0
    borrowed = BorrowedPolicy(shared_policy(), delay_s=delay_s)
    h = harnesses(policy_factory=lambda settings: borrowed)
    assert h.lifecycle.change("configure") and h.lifecycle.change("activate")
    h.wait_for_subscribers()
    h.send_instruction()
    h.send_observation(h.now_ns())
    assert wait_until(lambda: h.node._worker.busy, timeout_s=10.0), "inference did not start"
    assert h.lifecycle.change("deactivate")
    deactivated_at = time.monotonic()
    time.sleep(delay_s + 1.5)               # the forward pass in flight finishes meanwhile
    assert all(t < deactivated_at for t in h.chunk_arrival), "a chunk computed before deactivate was published"
    assert h.node._statistics.snapshot().chunks_discarded == 1
    # activate again: new chunks start at sequence 0
    assert h.lifecycle.change("activate")
    h.wait_for_subscribers()
    count = len(h.chunks)
    h.send_observation(h.now_ns())
    assert wait_until(lambda: len(h.chunks) > count, timeout_s=30.0)
    assert h.chunks[count].sequence == 0


def _policy_run_by(executor_factory):
    """The shared demo model, tokenizer and normalization in a Policy of its own, run by a fresh executor
    (closing it closes only that executor)."""
    from flashrt_core.api import Policy
    shared = shared_policy()
    return Policy(shared.model, shared.config, executor_factory(shared), shared.tokenizer, shared.normalizer,
                  shared.device, shared.model_id)


def _cpu_engine(policy, text_buckets=None):
    """The graph engine's executor (default text buckets), eager on the CPU with the plain-PyTorch ops."""
    import torch
    from flashrt_core.engine.options import EngineOptions
    from flashrt_core.engine.dispatch import eager_cpu_dispatch
    from flashrt_core.engine.graph_executor import EngineExecutor
    options = EngineOptions() if text_buckets is None else EngineOptions(text_buckets=text_buckets)
    return EngineExecutor(policy.model, policy.config, torch.device("cpu"), eager_cpu_dispatch(options),
                          dtype=torch.float32)


@pytest.mark.parametrize("all_buckets", [True, False])
def test_configure_warms_up_every_text_bucket(harnesses, all_buckets):
    """The engine keeps one workspace (on a GPU: one captured graph) per text bucket, keyed by its token slots:
    configure makes every one an instruction can land in (warmup_all_text_buckets), or only the warm-up
    prompt's. The buckets here sit above the demo's pi0.5 state bins, so every one is reachable."""
    policy = _policy_run_by(lambda shared: _cpu_engine(shared, text_buckets=(150, 180)))
    engine = policy.executor
    h = harnesses({"warmup_iterations": 1, "warmup_all_text_buckets": all_buckets},
                  policy_factory=lambda settings: policy)
    assert h.lifecycle.change("configure")
    built = sorted(key[3] for key in engine.entries)
    assert engine.text_buckets == (150, 180, policy.config.max_token_len)
    if all_buckets:
        assert built == list(engine.text_buckets)
    else:                                       # only the bucket of the warm-up prompt (150: its state bins)
        assert len(built) == 1 and built[0] in engine.text_buckets


def test_configure_on_the_reference_path_runs_only_the_warm_up_passes(harnesses):
    """The reference executor has no text buckets: configure runs exactly warmup_iterations forward passes."""
    from flashrt_core.executor import ReferenceExecutor
    passes = []

    def counted_reference(shared):
        executor = ReferenceExecutor(shared.model, shared.config, shared.device)
        real_sample_actions = executor.sample_actions
        executor.sample_actions = lambda *args: passes.append(1) or real_sample_actions(*args)
        return executor

    h = harnesses({"warmup_iterations": 2, "warmup_all_text_buckets": True},
                  policy_factory=lambda settings: _policy_run_by(counted_reference))
    assert h.lifecycle.change("configure")
    assert h.node.policy.text_buckets == () and len(passes) == 2


def _release_from_another_thread(node) -> threading.Thread:
    """What main() does on SIGINT: release() marks the node as stopping, then waits for the configure to end."""
    releasing = threading.Thread(target=node.release)
    releasing.start()
    assert wait_until(node._stopping, timeout_s=10.0)
    return releasing


def test_a_stop_during_the_model_load_ends_the_configure_at_the_next_tensor(harnesses, tmp_path):
    """release() while the factory's load_model reads the checkpoint: the loader stops at its next tensor
    (flashrt_core.stopping) instead of loading the rest, the configure ends as it does on SIGINT (ShuttingDown,
    which main() ends on quietly) and nothing stays loaded."""
    checkpoint = write_random_checkpoint(tmp_path / "pi05", "pi05_tiny", seed=1)
    releasing = []

    def factory(settings):
        releasing.append(_release_from_another_thread(h.node))
        return load_policy(settings)
    h = harnesses({"checkpoint": str(checkpoint), "warmup_iterations": 1}, policy_factory=factory)
    with pytest.raises(ShuttingDown, match=f"stopped at reading tensor 1 of [0-9]+ of {checkpoint}$"):
        h.node.trigger_configure()
    releasing[0].join(timeout=30.0)
    assert not releasing[0].is_alive() and h.node.policy is None


def test_a_stop_during_the_warm_up_ends_it_before_the_next_text_bucket(harnesses):
    """release() during the warm-up's first pass: the engine's warm-up of the text buckets (in flashrt_core, on
    the inference thread, which enters the node's stop condition itself) stops before its first bucket."""
    policy = _policy_run_by(lambda shared: _cpu_engine(shared, text_buckets=(150, 180)))
    first_pass = policy.predict
    releasing = []

    def predict(*args, **kwargs):         # the warm-up's first pass; the stop comes during it
        if not releasing:
            releasing.append(_release_from_another_thread(h.node))
        return first_pass(*args, **kwargs)
    policy.predict = predict
    h = harnesses({"warmup_iterations": 1, "warmup_all_text_buckets": True}, policy_factory=lambda settings: policy)
    with pytest.raises(ShuttingDown, match=r"stopped at warming up text bucket 150 of \[150, 180, "):
        h.node.trigger_configure()
    releasing[0].join(timeout=30.0)
    assert not releasing[0].is_alive() and h.node.policy is None and policy.executor is None    # closed


def test_lifecycle_client_asks_again_until_the_node_first_answers():
    """A node that has not matched a new client yet drops its reply (rmw_fastrtps: "client will not receive
    response"); a node that never answers its first get_state stands in for it here. wait_for_services asks
    again and returns once an answer arrives; change() comes after, never repeated."""
    from lifecycle_msgs.srv import ChangeState, GetState
    from rclpy.callback_groups import ReentrantCallbackGroup
    from rclpy.task import Future

    from flashrt_ros.demo_main import FIRST_ANSWER_RETRY_S, LifecycleClient
    from bag_testing import RosHarness

    never = Future()
    asked = []

    async def get_state(request, response):
        asked.append(time.monotonic())
        if len(asked) == 1:
            await never                     # the first reply is lost
        response.current_state.label = "unconfigured"
        return response

    with RosHarness() as ros:
        server = ros.node("silent_first", namespace="/first_answer")
        server.create_service(GetState, "silent_first/get_state", get_state, callback_group=ReentrantCallbackGroup())
        server.create_service(ChangeState, "silent_first/change_state", lambda request, response: response)
        client = LifecycleClient(ros.node("asker"), "/first_answer/silent_first")
        assert client.wait_for_services(DISCOVERY_TIMEOUT_S)
        assert len(asked) >= 2 and asked[1] - asked[0] >= FIRST_ANSWER_RETRY_S * 0.9
        assert client.state() == "unconfigured"


NODE_PROCESS = r"""
import sys
from flashrt_ros.policy_node import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("target_state", ["unconfigured", "inactive", "active"])
def test_signal_exits_cleanly_from_every_state(harnesses, target_state, signum):
    """SIGINT (Ctrl-C, ros2 launch) and SIGTERM (ros2 launch's escalation, docker stop, systemd) from every state:
    exit code 0, no traceback (rclpy's handlers shut the context down under the spinning executor)."""
    namespace = f"/sig{int(signum)}_{target_state}_{int(time.time() * 1000) % 100000}"
    process = start_python(NODE_PROCESS, "--ros-args", "-r", f"__ns:={namespace}", "-p", "warmup_iterations:=0",
                           "-p", "state_topic:=joint_states")
    try:
        h = harnesses()           # reuse the harness's driver node only for its lifecycle client
        from flashrt_ros.demo_main import LifecycleClient
        client = LifecycleClient(h.driver, f"{namespace}/policy_node")
        assert client.wait_for_services(60.0), "node process did not come up"
        for transition in {"unconfigured": [], "inactive": ["configure"],
                           "active": ["configure", "activate"]}[target_state]:
            assert client.change(transition)
        assert client.state() == target_state
        process.send_signal(signum)
        out, err = process.communicate(timeout=PROCESS_EXIT_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, f"exit code {process.returncode}\n{out}\n{err}"
    assert "Traceback" not in err, err



@pytest.mark.parametrize("executor, phase", [("single_threaded", "configuring:"),
                                             ("multi_threaded", "model loaded: warming up")])
def test_sigint_during_configure_exits_quietly(executor, phase):
    """SIGINT while the autostart configure loads the model (single-threaded executor: the configure runs on the
    main thread, which SIGINT interrupts) or warms it up (multi-threaded: on a worker thread, which stops before
    its next warm-up pass): exit code 0 within seconds, no error, no errorprocessing transition, nothing
    published on the context SIGINT shut down (rosout)."""
    namespace = f"/sigint_configure_{executor}_{int(time.time() * 1000) % 100000}"
    process = start_python(NODE_PROCESS, "--ros-args", "-r", f"__ns:={namespace}", "-p", "autostart:=true",
                           "-p", "warmup_iterations:=100", "-p", "state_topic:=joint_states",
                           "-p", f"executor:={executor}")
    lines = []
    try:
        for line in process.stderr:             # the node logs to stderr
            lines.append(line)
            if phase in line:
                break
        time.sleep(0.5)                         # loading, or warming up (100 passes take several seconds)
        process.send_signal(signal.SIGINT)
        signalled = time.monotonic()
        out, err = process.communicate(timeout=PROCESS_EXIT_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    err = "".join(lines) + err
    assert process.returncode == 0, f"exit code {process.returncode}\n{out}\n{err}"
    assert time.monotonic() - signalled < 15.0
    assert "configuring:" in err and "configured:" not in err, err       # the signal came during configure
    for text in ("rosout", "[ERROR]", "error in a transition", "Failed", "Traceback"):
        assert text not in err, err
