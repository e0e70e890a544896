"""Regression-test the policy node on a bag in one command (no ros2 CLI, no launch needed).

    python -m flashrt_ros.bag_regression BAG --params-file config/demo_two_cameras.yaml --out-dir runs/r1 \\
        [--rate 0.2] [--noise-seed 0] [-p camera_topics:=[/cam0/image_raw,/cam1/image_raw/compressed]]

1. Offline reference: :func:`flashrt_ros.bag_evaluator.evaluate_bag` on the bag -> ``OUT_DIR/reference``.
2. Live run, in this process over real DDS: the policy node (the same parameters, ``use_sim_time``, the same
   ``noise_seed``) is configured and activated, a recorder (sim time) records its ActionChunk / PolicyStatus / diagnostics
   into ``OUT_DIR/live``, and the bag player replays the bag's input topics with /clock at ``--rate``.
3. Comparison by observation (:func:`flashrt_ros.bag_evaluator.compare_chunks`); exit status 0 when every live
   chunk comes from an observation of the reference, the compared actions are within tolerance and at least
   ``--min-coverage`` of the reference observations were reproduced.

Use a replay rate at which the node keeps up (every observation processed): the inference time in wall seconds
times the camera rate times ``--rate`` below 1. DDS stays on this machine (loopback only, a random domain id)
unless ``--network`` is given.

Pinned noise: with its ``noise_seed`` parameter >= 0 the node draws the flow noise per observation as
``observation_noise(seed, observation stamp)`` (flashrt_ros.pinned_noise), as the evaluator does. The seed is
``--noise-seed``, else the parameters' ``noise_seed``, else 0.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashrt_ros.bag_common import BagError
from flashrt_ros.bag_evaluator import (COMPARE_ATOL, COMPARE_RTOL, Chunk, Comparison, Evaluation, absolute_topic,
                                       check_live_chunks, compare_chunks, evaluate_bag, load_node_values,
                                       parse_param_overrides,
                                       read_chunk_bag, settings_for_values, write_chunk_bag)
from flashrt_ros.node_calibration import calibrate_offline
from flashrt_ros.node_parameters import SPECS
from flashrt_ros.waiting import wait_until

LOGGER = logging.getLogger(__name__)

SETTLE_S = 3.0  # wall seconds without a new chunk after playback: the node is done
SETTLE_TIMEOUT_S = 60.0
DISCOVERY_TIMEOUT_S = 30.0
DEFAULT_MIN_COVERAGE = 0.8
NODE_NAME = "policy_node"


@dataclass
class LiveRun:
    """What the live replay produced."""

    chunks: list[Chunk]
    published: dict[str, int]  # input topic -> messages the player published
    lifecycle_state: str  # the node's state after the replay ("active" unless it failed)
    recording: Path


def replay_through_node(bag: Path, values: dict[str, Any], rate: float, recording: Path,
                        policy_factory: Callable | None = None) -> LiveRun:
    """Run the node (parameters ``values``) on ``bag`` replayed at ``rate`` with /clock; record its outputs
    (on the bag's clock) into ``recording``."""
    import rclpy
    from rclpy.parameter import Parameter

    from flashrt_ros.bag_player import BagPlayer, PlayerConfig
    from flashrt_ros.bag_recorder import BagRecorder, RecorderConfig
    from flashrt_ros.node_executor import make_executor, spin_until_shutdown
    from flashrt_ros.policy_node import PolicyNode

    settings = settings_for_values(values)
    inputs = [absolute_topic(t) for t in (*settings.camera_topics, settings.instruction_topic)]
    if settings.state_topic:
        inputs.append(absolute_topic(settings.state_topic))
    outputs = (absolute_topic(settings.output_topic), f"/{NODE_NAME}/status", "/diagnostics")
    # Only values that differ from the node's defaults (an empty list has no ROS parameter type to infer).
    overrides = [Parameter(name, value=value) for name, value in values.items() if value != SPECS[name].default]
    context = rclpy.Context()
    rclpy.init(args=["flashrt_bag_regression"], context=context)  # not sys.argv: it holds this tool's -p options
    kwargs = {} if policy_factory is None else {"policy_factory": policy_factory}
    node = PolicyNode(NODE_NAME, context=context, parameter_overrides=[
        *overrides, Parameter("use_sim_time", value=True)], **kwargs)
    executor = make_executor(settings.executor, context=context)
    helper = rclpy.create_node("flashrt_bag_regression", context=context,
                               parameter_overrides=[Parameter("use_sim_time", value=True)])
    player_node = rclpy.create_node("flashrt_bag_player", context=context)
    executor.add_node(node)
    executor.add_node(helper)
    spinner = threading.Thread(target=spin_until_shutdown, args=(executor, context), name="bag-regression-executor",
                               daemon=True)
    spinner.start()
    recorder = None
    try:
        node.trigger_configure()
        if node.lifecycle_state() != "inactive":
            raise BagError("the policy node failed to configure (see its log)")
        node.trigger_activate()
        recorder = BagRecorder(helper, RecorderConfig(out=recording, topics=outputs))
        if not wait_until(lambda: len(recorder.subscribed_topics) == len(outputs), DISCOVERY_TIMEOUT_S):
            raise TimeoutError(f"the recorder did not discover {outputs}")
        player = BagPlayer(player_node, PlayerConfig(bag=bag, rate=rate, topics=tuple(inputs),
                                                     wait_for=(*inputs, "/clock"), wait_timeout_s=DISCOVERY_TIMEOUT_S))
        stats = player.play()
        _wait_until_idle(recorder, outputs[0])
        state = node.lifecycle_state()
        recorder.close()
        if state == "active":
            node.trigger_deactivate()
            node.trigger_cleanup()
    finally:
        if recorder is not None:
            recorder.close()
        executor.shutdown(timeout_sec=2.0)
        rclpy.shutdown(context=context)
        spinner.join(timeout=5.0)
        for n in (node, helper, player_node):
            n.destroy_node()
    return LiveRun(read_chunk_bag(recording, outputs[0]), dict(stats.published), state, recording)


def _wait_until_idle(recorder, chunk_topic: str) -> None:
    """After playback the last observation may still be in inference: wait until no chunk came for SETTLE_S."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    last, since = recorder.recorded[chunk_topic], time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < SETTLE_S:
        time.sleep(0.1)
        if recorder.recorded[chunk_topic] != last:
            last, since = recorder.recorded[chunk_topic], time.monotonic()


@dataclass
class RegressionResult:
    reference: Evaluation
    live: LiveRun
    comparison: Comparison
    recomputed: int  # references recomputed for live chunks that used another state sample


def run_regression(bag: Path, out_dir: Path, values: dict[str, Any], rate: float = 0.2,
                   policy_factory: Callable | None = None, atol: float = COMPARE_ATOL,
                   rtol: float = COMPARE_RTOL) -> RegressionResult:
    """Offline reference, live replay through the node, comparison (see the module docstring).

    ``values``: the node's parameters (:func:`flashrt_ros.bag_evaluator.load_node_values`); noise_seed >= 0.
    """
    settings = settings_for_values(values)
    if settings.noise_seed < 0:
        raise BagError("a regression needs pinned noise: noise_seed must be >= 0")
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("reference", "live"):
        if (out_dir / name).exists():
            raise BagError(f"{out_dir / name} exists already; use a new --out-dir")
    if policy_factory is None:
        from flashrt_ros.policy_node import load_policy as policy_factory
    policy = policy_factory(settings)
    try:
        calibrate_offline(policy, settings, bag)          # an FP8 policy, as the node does with calibration_bag
        reference = evaluate_bag(bag, policy, settings)
        views = settings.camera_views or tuple(policy.view_names)[:len(settings.camera_topics)]
        write_chunk_bag(out_dir / "reference", reference.chunks, settings, views, str(policy.model_id))
    finally:
        policy.close()
    live = replay_through_node(bag, values, rate, out_dir / "live", policy_factory)
    comparison, recomputed = compare_chunks(reference.chunks, live.chunks, atol, rtol), 0
    if comparison.state_differs:
        policy = policy_factory(settings)  # the node closed its model; load it again for the recomputation
        try:
            comparison, recomputed = check_live_chunks(bag, policy, settings, reference.chunks, live.chunks,
                                                       atol=atol, rtol=rtol)
        finally:
            policy.close()
    return RegressionResult(reference, live, comparison, recomputed)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashrt_ros.bag_regression", description=__doc__.split("\n")[0])
    parser.add_argument("bag", type=Path)
    parser.add_argument("--params-file", type=Path, help="the node's parameters YAML (default: node defaults)")
    parser.add_argument("--node-name", help="section of the YAML to use when it has several")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="NAME:=VALUE",
                        help="override a node parameter (YAML value syntax)")
    parser.add_argument("--out-dir", type=Path, help="where reference/ and live/ bags go (default: a temp dir)")
    parser.add_argument("--rate", type=float, default=0.2, help="replay rate (slow enough for the node)")
    parser.add_argument("--noise-seed", type=int, default=None,
                        help="seed of the pinned noise (default: the parameters' noise_seed if >= 0, else 0)")
    parser.add_argument("--min-coverage", type=float, default=DEFAULT_MIN_COVERAGE,
                        help="fraction of reference observations the live node must reproduce")
    parser.add_argument("--atol", type=float, default=COMPARE_ATOL)
    parser.add_argument("--rtol", type=float, default=COMPARE_RTOL)
    parser.add_argument("--network", action="store_true", help="do not confine DDS to loopback")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="flashrt_regression_"))
    if not args.network:
        from flashrt_ros.loopback_dds import apply_loopback_dds

        apply_loopback_dds(out_dir / "dds")
    try:
        overrides = parse_param_overrides(args.param)
    except ValueError as error:
        parser.error(str(error))
    values = load_node_values(args.params_file, overrides, args.node_name)
    if args.noise_seed is not None:
        values["noise_seed"] = args.noise_seed
    elif values["noise_seed"] < 0:
        values["noise_seed"] = 0
    print(f"noise_seed: {values['noise_seed']}")
    result = run_regression(args.bag, out_dir, values, args.rate, atol=args.atol, rtol=args.rtol)
    comparison = result.comparison
    print(f"reference: {len(result.reference.chunks)} chunks, rejected {dict(result.reference.rejected)}, "
          f"buffer {result.reference.buffer}")
    print(f"live: {len(result.live.chunks)} chunks, node {result.live.lifecycle_state}, bags in {out_dir}")
    print(f"{comparison.summary()}; {result.recomputed} references recomputed for chunks that used another "
          "state sample")
    passed = comparison.ok and comparison.coverage >= args.min_coverage and result.live.lifecycle_state == "active"
    print("PASS" if passed else "FAIL")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
