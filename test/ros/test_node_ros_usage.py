"""The node as a ROS user drives it, over DDS: parameter dump, parameter changes while unconfigured, the
instruction from `ros2 topic pub` (volatile) and from a latched publisher, autostart, the shipped configs under a
namespace, and log lines from input throttled and bounded."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import rclpy
import yaml
from rcl_interfaces.msg import ParameterType
from rcl_interfaces.srv import GetParameters, ListParameters, SetParameters
from rclpy.event_handler import PublisherEventCallbacks
from rclpy.parameter import Parameter
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rclpy.signals import SignalHandlerOptions
from std_msgs.msg import String

from flashrt_core.fixtures import write_random_checkpoint
from flashrt_ros.demo_main import LifecycleClient
from flashrt_ros.node_executor import make_executor
from flashrt_ros.node_logging import MAX_LOG_CHARS
from flashrt_ros.node_parameters import PARAMETERS
from flashrt_ros.policy_node import PolicyNode
from node_harness import DISCOVERY_TIMEOUT_S, BorrowedPolicy, NodeHarness, shared_policy, wait_until
from node_streams import RosoutLines

pytestmark = pytest.mark.ros

CHUNK_TIMEOUT_S = 60.0
SERVICE_TIMEOUT_S = 20.0
CONFIG_FILES = sorted(p for p in (Path(__file__).resolve().parents[2] / "config").glob("*.yaml")
                      if p.name != "action_executor.yaml")      # the policy node's (the executor has its own)
# what `ros2 topic pub` uses unless told otherwise: reliable, volatile
TOPIC_PUB_QOS = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.VOLATILE)


@pytest.fixture
def harnesses():
    created = []
    yield lambda *args, **kwargs: created.append(NodeHarness(*args, **kwargs)) or created[-1]
    for harness in created:
        harness.close()


def borrowed(settings):
    return BorrowedPolicy(shared_policy())


def call(client, request):
    assert client.wait_for_service(SERVICE_TIMEOUT_S)
    future = client.call_async(request)
    assert wait_until(future.done, timeout_s=SERVICE_TIMEOUT_S)
    return future.result()


def test_parameter_dump_gets_every_parameter_with_a_typed_value(harnesses):
    """What `ros2 param dump` does: list the parameters, then get them all in one request."""
    h = harnesses()
    node = f"{h.namespace}/policy_node"
    names = list(call(h.driver.create_client(ListParameters, f"{node}/list_parameters"),
                      ListParameters.Request()).result.names)
    assert {spec.name for spec in PARAMETERS} <= set(names)
    values = call(h.driver.create_client(GetParameters, f"{node}/get_parameters"),
                  GetParameters.Request(names=names)).values
    assert len(values) == len(names), "a parameter without a value empties the whole answer"
    by_name = dict(zip(names, values))
    for spec in PARAMETERS:
        assert by_name[spec.name].type == spec.param_type(), spec.name
    assert by_name["camera_views"].type == ParameterType.PARAMETER_STRING_ARRAY
    assert list(by_name["camera_views"].string_array_value) == []
    assert by_name["engine_text_buckets"].type == ParameterType.PARAMETER_INTEGER_ARRAY
    assert list(by_name["camera_topics"].string_array_value) == list(h.camera_topics)


def test_configure_time_parameters_are_settable_while_unconfigured_and_refused_while_configured(harnesses, tmp_path):
    h = harnesses({"checkpoint": str(tmp_path / "not_there")})          # the node's own loader
    set_parameters = h.driver.create_client(SetParameters, f"{h.namespace}/policy_node/set_parameters")

    def set_one(name, value):
        request = SetParameters.Request(parameters=[Parameter(name, value=value).to_parameter_msg()])
        return call(set_parameters, request).results[0]

    assert not h.lifecycle.change("configure")
    checkpoint = write_random_checkpoint(tmp_path / "checkpoint", "pi05_tiny", seed=2)
    result = set_one("checkpoint", str(checkpoint))                      # no restart needed
    assert result.successful, result.reason
    assert h.lifecycle.change("configure") and h.node.policy.model_id.endswith("checkpoint")
    refused = set_one("checkpoint", str(tmp_path / "other"))
    assert not refused.successful
    assert "checkpoint is read at configure" in refused.reason and "it is inactive" in refused.reason
    assert h.node.get_parameter("checkpoint").value == str(checkpoint)
    assert set_one("sync_slop", 0.03).successful                         # runtime parameters: any state
    readonly = set_one("executor", "multi_threaded")
    assert not readonly.successful and "read-only" in readonly.reason


def test_instruction_arrives_from_a_volatile_publisher_and_a_latched_one_once_each(harnesses):
    h = harnesses(policy_factory=borrowed)
    assert h.lifecycle.change("configure") and h.lifecycle.change("activate")
    # `ros2 topic pub --once` (it warns that the node's transient-local subscription is incompatible: silenced here)
    plain = h.driver.create_publisher(String, "instruction", TOPIC_PUB_QOS,
                                      event_callbacks=PublisherEventCallbacks(incompatible_qos=lambda event: None))
    assert wait_until(lambda: plain.get_subscription_count() == 1)
    plain.publish(String(data="stack the red block"))
    assert wait_until(lambda: h.node._instruction == "stack the red block")
    # the latched publisher matches both subscriptions; its message is handled once
    assert wait_until(lambda: h.instruction_publisher.get_subscription_count() == 2)
    h.send_instruction("put it back")
    assert wait_until(lambda: h.node._instruction == "put it back")
    h.send_instruction("   ")
    assert wait_until(lambda: h.node._statistics.snapshot().rejected.get("empty_instruction", 0) >= 1)
    time.sleep(0.3)
    snapshot = h.node._statistics.snapshot()
    assert snapshot.instruction_changes == 2 and snapshot.rejected["empty_instruction"] == 1


def test_autostart_configures_and_activates_once(harnesses):
    h = harnesses({"autostart": True}, policy_factory=borrowed)
    assert wait_until(lambda: h.lifecycle.state() == "active", timeout_s=CHUNK_TIMEOUT_S)
    for transition in ("deactivate", "cleanup", "configure"):
        assert h.lifecycle.change(transition), transition
    time.sleep(1.0)
    assert h.lifecycle.state() == "inactive", "a manual configure must not be followed by an activation"


class ParamsFileNode:
    """A PolicyNode started with ``--params-file`` in a namespace, spun with a driver node that drives its
    lifecycle over DDS (as `ros2 run flashrt_ros policy_node --ros-args --params-file F -r __ns:=/robot1`)."""

    def __init__(self, params_file: Path, namespace: str):
        self.context = rclpy.Context()
        rclpy.init(args=["--ros-args", "--params-file", str(params_file)], context=self.context,
                   signal_handler_options=SignalHandlerOptions.NO)
        self.node = PolicyNode(namespace=namespace, context=self.context, policy_factory=borrowed,
                               parameter_overrides=[Parameter("warmup_iterations", value=0)])
        self.driver = rclpy.create_node("driver", namespace=namespace, context=self.context)
        self.executor = make_executor("single_threaded", context=self.context)
        self.executor.add_node(self.node)
        self.executor.add_node(self.driver)
        self._thread = threading.Thread(target=self.executor.spin, daemon=True)
        self._thread.start()
        self.lifecycle = LifecycleClient(self.driver, f"{namespace}/policy_node")
        assert self.lifecycle.wait_for_services(DISCOVERY_TIMEOUT_S)

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=5.0)
        self._thread.join(timeout=5.0)
        self.node.release()
        self.node.destroy_node()
        self.driver.destroy_node()
        rclpy.try_shutdown(context=self.context)


@pytest.mark.parametrize("path", CONFIG_FILES, ids=[p.name for p in CONFIG_FILES])
def test_shipped_configs_apply_under_a_namespace(path):
    values = yaml.safe_load(path.read_text())["/**"]["ros__parameters"]
    run = ParamsFileNode(path, "/robot1")
    try:
        for name, value in values.items():
            if name == "warmup_iterations":        # overridden by ParamsFileNode (no warm-up in tests)
                continue
            actual = run.node.get_parameter(name).value
            assert (list(actual) if isinstance(value, list) else actual) == value, name
    finally:
        run.close()


def test_a_params_file_for_another_node_name_fails_configure_naming_state_topic(tmp_path):
    demo = yaml.safe_load((CONFIG_FILES[0].parent / "demo_two_cameras.yaml").read_text())["/**"]
    bare = tmp_path / "bare_node_name.yaml"
    bare.write_text(yaml.safe_dump({"policy_node": demo}))     # the key matches /policy_node, not /robot1/...
    run = ParamsFileNode(bare, "/robot1")
    try:
        assert run.node.get_parameter("state_topic").value == ""
        assert not run.lifecycle.change("configure")
        error = run.node._statistics.snapshot().last_error
        assert "state_topic is empty" in error and "/robot1/policy_node" in error and "/**" in error, error
    finally:
        run.close()


def test_log_lines_from_input_are_throttled_and_bounded(harnesses, capfd):
    h = harnesses(policy_factory=borrowed)
    assert h.lifecycle.change("configure") and h.lifecycle.change("activate")
    h.wait_for_subscribers()
    log = RosoutLines(h)
    long_instruction = "pick up the cube and " * 500                     # 10,500 characters
    flood_start = time.monotonic()
    for i in range(200):                                                 # an instruction flood
        h.send_instruction(f"task {i}")
        time.sleep(0.002)
    h.send_instruction(long_instruction)
    assert wait_until(lambda: h.node._instruction == long_instruction.strip())
    flood_s = time.monotonic() - flood_start
    changes = h.node._statistics.snapshot().instruction_changes
    assert changes >= 50, changes                # most of them arrive (keep-last-1 may drop a few)
    assert 1 <= log.count("instruction: ") <= 1 + int(flood_s / 2.0), (flood_s, log.with_text("instruction: "))
    # the tokenizer cuts the long prompt and warns: through the ROS logger
    h.send_observation(h.now_ns())
    assert wait_until(lambda: len(h.chunks) == 1, timeout_s=CHUNK_TIMEOUT_S)
    assert wait_until(lambda: log.count("flashrt_core.tokenizer: prompt is") == 1)
    assert all(len(line.msg) <= MAX_LOG_CHARS + 40 for line in log.lines), max(len(x.msg) for x in log.lines)
    assert wait_until(lambda: h.latest_diagnostics().get("instruction_changes") == str(changes))
    assert h.latest_diagnostics()["instruction"].endswith(f"({len(long_instruction.strip())} characters)")
    err = capfd.readouterr().err
    assert not [line for line in err.splitlines() if line.startswith("prompt is")], "tokenizer outside ROS logger"
