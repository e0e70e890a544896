"""flashrt_ros.state_input: the policy node's robot state, from JointState (by name or in order) or
Float64MultiArray, each malformed message refused with an error that names the problem (the node counts it as
bad_state / future_stamp: test/ros/test_node_inputs.py)."""

from __future__ import annotations

import numpy as np
import pytest
from rclpy.time import Time
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray

from flashrt_ros.node_parameters import SPECS, settings_from_values
from flashrt_ros.state_input import FutureStampError, state_sample

NOW_NS = 50_000_000_000


def _settings(**values):
    return settings_from_values({**{name: spec.default for name, spec in SPECS.items()}, "state_topic": "/joint_states",
                                 **values})


def _joint_state(names, positions, stamp_ns=NOW_NS - 1_000_000):
    msg = JointState(name=list(names), position=[float(p) for p in positions])
    msg.header.stamp = Time(nanoseconds=stamp_ns).to_msg()
    return msg


def test_joint_state_by_name_keeps_its_stamp_and_the_named_order():
    sample = state_sample(_joint_state(["b", "a", "c"], [2, 1, 3]), _settings(state_joint_names=["a", "b"]),
                          NOW_NS, 2)
    assert sample.stamp_ns == NOW_NS - 1_000_000
    np.testing.assert_array_equal(sample.values, np.array([1, 2], np.float32))
    assert sample.values.dtype == np.float32


def test_float_array_is_stamped_now():
    sample = state_sample(Float64MultiArray(data=[0.5, -1.0]), _settings(state_type="float_array"),
                          NOW_NS, 0)
    assert sample.stamp_ns == NOW_NS
    np.testing.assert_array_equal(sample.values, np.array([0.5, -1.0], np.float32))


@pytest.mark.parametrize("msg, values, match", [
    (_joint_state(["a"], [1.0]), {"state_joint_names": ["a", "z"]}, r"lacks joints \['z'\]"),
    (JointState(name=["a", "b"], position=[1.0]), {}, "2 names but 1 positions"),
    (_joint_state([], []), {}, "empty state"),
    (_joint_state(["a", "b"], [1.0, float("nan")]), {}, "NaN or infinite"),
    (_joint_state(["a", "b", "c"], [1, 2, 3]), {}, "3 values, the model expects 2"),
])
def test_malformed_states_name_the_problem(msg, values, match):
    with pytest.raises(ValueError, match=match):
        state_sample(msg, _settings(**values), NOW_NS, 2)


def test_a_state_from_the_future_is_refused_once_the_clock_runs():
    ahead = _joint_state(["a"], [1.0], stamp_ns=NOW_NS + 2_000_000_000)
    with pytest.raises(FutureStampError, match="2.000 s in the future"):
        state_sample(ahead, _settings(max_future_stamp=0.5), NOW_NS, 1)
    assert state_sample(ahead, _settings(max_future_stamp=0.5), 0, 1).stamp_ns == NOW_NS + 2_000_000_000  # no /clock yet
