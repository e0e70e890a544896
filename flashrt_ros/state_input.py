"""The robot state input of the policy node: a JointState (by joint names, or in message order) or a
Float64MultiArray checked and turned into one StateSample, or an error naming what is wrong with it. The bag
evaluator reads recorded JointStates by the same rules (joint_positions, state_values)."""

from __future__ import annotations

import dataclasses

import numpy as np
from rclpy.time import Time

from flashrt_ros.node_logging import bounded
from flashrt_ros.node_parameters import NodeSettings, StateInput
from flashrt_ros.observation_buffer import seconds_to_ns


class FutureStampError(ValueError):
    """A message stamped further in the future than max_future_stamp."""


@dataclasses.dataclass(frozen=True)
class StateSample:
    stamp_ns: int
    values: np.ndarray          # (state_dim,) float32


def joint_positions(names, positions, joint_names) -> list:
    """A JointState's positions, by joint_names (all, in the message's order, when empty). ValueError for names and
    positions of different lengths, or joints missing from the message."""
    if len(positions) != len(names):
        raise ValueError(f"JointState has {len(names)} names but {len(positions)} positions")
    if not joint_names:
        return list(positions)
    by_name = dict(zip(names, positions))
    missing = [name for name in joint_names if name not in by_name]
    if missing:
        raise ValueError(bounded(f"JointState lacks joints {missing}"))
    return [by_name[name] for name in joint_names]


def state_values(values, state_dim: int) -> np.ndarray:
    """values -> (state_dim,) float32. ValueError for an empty or non-finite state, or another length than state_dim
    (0: not checked)."""
    array = np.asarray(values, dtype=np.float32)
    if array.size == 0:
        raise ValueError("empty state")
    if not np.all(np.isfinite(array)):
        raise ValueError("state has NaN or infinite values")
    if state_dim and array.size != state_dim:
        raise ValueError(f"state has {array.size} values, the model expects {state_dim}")
    return array


def state_sample(msg, settings: NodeSettings, now_ns: int, state_dim: int) -> StateSample:
    """msg (settings.state_type) received at node time now_ns -> its StateSample. A JointState keeps its stamp
    (FutureStampError when it is more than max_future_stamp ahead of now_ns, once the clock runs) and is read by
    settings.state_joint_names (joint_positions); a Float64MultiArray has no header and is stamped now_ns. The values
    are checked by state_values."""
    if settings.state_type is StateInput.JOINT_STATE:
        stamp_ns = Time.from_msg(msg.header.stamp).nanoseconds
        ahead_ns = stamp_ns - now_ns
        if now_ns > 0 and ahead_ns > seconds_to_ns(settings.max_future_stamp):   # 0: no /clock yet
            raise FutureStampError(f"JointState stamped {ahead_ns * 1e-9:.3f} s in the future "
                                   f"(max_future_stamp {settings.max_future_stamp} s)")
        values = joint_positions(msg.name, msg.position, settings.state_joint_names)
    else:
        stamp_ns = now_ns
        values = list(msg.data)
    return StateSample(stamp_ns, state_values(values, state_dim))
