"""Offline evaluation: run the policy directly on a bag's observations, the reference for live replays.

No DDS and no timing noise: the bag is read in receive-time order and fed through the node's own rules,

- cameras, instruction and state topics and every setting come from the node's parameters (the same YAML the
  node is started with, ``--params-file``), converted by ``flashrt_ros.node_parameters``;
- frames are paired by ``flashrt_ros.observation_buffer.ObservationBuffer`` (slop, newest complete observation,
  out-of-order / stale / time-jump rules), with "now" = the bag's receive time of each message, which is what the
  node's clock reads when the bag is replayed with /clock;
- frames are checked and decoded by ``flashrt_ros.image_conversion`` (a corrupt frame is a counted rejection);
- a frame or JointState stamped more than ``max_future_stamp`` after its receive time is rejected (the node's rule);
- the state is the newest valid sample received before the observation is taken, and an observation whose state
  is older than ``max_state_age`` then is skipped (the node's rules);
- the flow noise is pinned per observation: ``flashrt_ros.pinned_noise.observation_noise(seed, stamp)``, the
  node's own rule when its ``noise_seed`` parameter is >= 0.

It behaves like an infinitely fast node in ``trigger: on_observation`` mode: every complete observation is
evaluated. A live node skips observations that arrive while it is busy (counted as replaced), so live chunks
are compared with these by observation (view stamps), not by sequence (:func:`compare_chunks`).

Output: a rosbag2 of ``flashrt_ros/msg/ActionChunk`` on ``/action_chunk`` (what the node would have published;
the same message the node publishes, so ``ros2 bag``, rosbags or Foxglove read both the same way). Each message
is written at the bag time its observation completed; ``inference_time`` is the measured forward time and
``staleness`` the observation's age when it completed (transport + pairing, no inference delay).

    python -m flashrt_ros.bag_evaluator BAG --params-file config/demo_two_cameras.yaml --out REF_BAG \\
        [--noise-seed 0] [--compare RECORDED_BAG]

The noise seed is the node's ``noise_seed`` parameter (from the YAML) unless ``--noise-seed`` is given; a live
recording is comparable when the node ran with the same seed.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from rosbags.rosbag2 import Reader, StoragePlugin, Writer

from flashrt_ros.bag_common import ACTION_CHUNK_TYPE, BagError, bag_typestore
from flashrt_ros.image_conversion import ImageConversionError, check_image, to_rgb
from flashrt_ros.node_parameters import SPECS, NodeSettings, StateInput, settings_from_values
from flashrt_ros.observation_buffer import AddResult, Observation, ObservationBuffer, seconds_to_ns
from flashrt_ros.pinned_noise import observation_noise
from flashrt_ros.state_input import joint_positions, state_values

LOGGER = logging.getLogger(__name__)

OUTPUT_TOPIC = "/action_chunk"
# Default tolerances when comparing a live replay with the offline reference (same weights, same noise,
# same frames; the live node runs the same code, so differences are float reordering only).
COMPARE_ATOL = 1e-4
COMPARE_RTOL = 1e-4


@dataclass(frozen=True)
class Chunk:
    """One action chunk: what it was computed from and the actions (horizon, action_dim) float32."""

    stamp_ns: int
    view_stamps_ns: tuple[int, ...]
    state_stamp_ns: int
    actions: np.ndarray
    receive_ns: int = 0  # bag time the chunk was (or would have been) published
    inference_time_s: float = 0.0
    staleness_s: float = 0.0
    sequence: int = 0
    dt: float = 0.0  # time between the chunk's rows [s] (ActionChunk.dt; 0 where not read from a bag)


@dataclass
class Evaluation:
    """Result of :func:`evaluate_bag`."""

    chunks: list[Chunk] = field(default_factory=list)
    frames: Counter = field(default_factory=Counter)  # camera topic -> frames read
    rejected: Counter = field(default_factory=Counter)  # reason -> count, the node's reasons
    buffer: dict[str, int] = field(default_factory=dict)  # ObservationBuffer counters at the end

    @property
    def inputs_rejected(self) -> int:
        """The node's PolicyStatus.inputs_rejected: rejections + stale + out-of-order frames."""
        return sum(self.rejected.values()) + self.buffer.get("stale", 0) + self.buffer.get("out_of_order", 0)


# ------------------------------------------------------------------------------------------- settings
def load_node_values(params_file: Path | None = None, overrides: dict[str, Any] | None = None,
                     node_name: str | None = None) -> dict[str, Any]:
    """Every node parameter's value: the node's defaults, then a ROS 2 parameters YAML
    (``node: ros__parameters: ...``), then ``overrides``. Unknown names are an error."""
    values = {name: spec.default for name, spec in SPECS.items()}
    if params_file is not None:
        document = yaml.safe_load(Path(params_file).read_text()) or {}
        sections = {key: section["ros__parameters"] for key, section in document.items()
                    if isinstance(section, dict) and "ros__parameters" in section}
        if not sections:
            raise BagError(f"{params_file} has no '<node>: ros__parameters:' section")
        if node_name is None:
            if len(sections) > 1:
                raise BagError(f"{params_file} has sections {sorted(sections)}: choose one with --node-name")
            node_name = next(iter(sections))
        if node_name not in sections:
            raise BagError(f"{params_file} has no section {node_name!r} (it has {sorted(sections)})")
        values.update(sections[node_name])
    values.update(overrides or {})
    unknown = sorted(set(values) - set(SPECS) - {"use_sim_time"})
    if unknown:
        raise BagError(f"unknown node parameters {unknown}")
    return {name: values[name] for name in SPECS}


def parse_param_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``NAME:=VALUE`` command-line overrides (as ``ros2 run ... -p``) -> {name: YAML-parsed value}."""
    overrides = {}
    for item in items:
        name, sep, value = item.partition(":=")
        if not sep:
            raise ValueError(f"--param {item!r} is not NAME:=VALUE")
        overrides[name] = yaml.safe_load(value)
    return overrides


def settings_for_values(values: dict[str, Any]) -> NodeSettings:
    """NodeSettings (validated by the node's own rules) from :func:`load_node_values`' result."""
    return settings_from_values({name: values[name] for name in SPECS})


def load_node_settings(params_file: Path | None = None, overrides: dict[str, Any] | None = None,
                       node_name: str | None = None) -> NodeSettings:
    """NodeSettings from the node's defaults, a ROS 2 parameters YAML and overrides."""
    return settings_for_values(load_node_values(params_file, overrides, node_name))


def absolute_topic(name: str, namespace: str = "/") -> str:
    """Resolve a node-relative topic name the way a node in ``namespace`` does (no ~ or substitutions)."""
    if name.startswith("/"):
        return name
    return f"{namespace.rstrip('/')}/{name}"


# ------------------------------------------------------------------------------------------- evaluation
def _stamp_ns(stamp) -> int:
    return int(stamp.sec) * 10**9 + int(stamp.nanosec)


def _state_values(msg, settings: NodeSettings, state_dim: int) -> np.ndarray:
    """The node's JointState rule (flashrt_ros.state_input): positions by state_joint_names (all, as sent, when
    empty); finite; state_dim."""
    return state_values(joint_positions(list(msg.name), list(msg.position), settings.state_joint_names), state_dim)


class _Evaluator:
    """Feeds one bag through the node's rules; see the module docstring."""

    def __init__(self, policy, settings: NodeSettings, noise_seed: int, namespace: str) -> None:
        if settings.state_topic and settings.state_type is not StateInput.JOINT_STATE:
            raise BagError("the evaluator supports state_type joint_state only (float arrays carry no stamp)")
        self.policy, self.settings, self.noise_seed = policy, settings, noise_seed
        cameras = len(settings.camera_topics)
        self.view_names = tuple(settings.camera_views or tuple(policy.view_names)[:cameras])
        self.camera_index = {absolute_topic(t, namespace): i for i, t in enumerate(settings.camera_topics)}
        self.instruction_topic = absolute_topic(settings.instruction_topic, namespace)
        self.state_topic = absolute_topic(settings.state_topic, namespace) if settings.state_topic else ""
        self.buffer: ObservationBuffer = ObservationBuffer(self.view_names, seconds_to_ns(settings.sync_slop),
                                                           seconds_to_ns(settings.max_observation_age))
        self.max_future_ns = seconds_to_ns(settings.max_future_stamp)
        self.instruction: str | None = None
        self.state: tuple[int, np.ndarray] | None = None
        self.result = Evaluation()

    @property
    def topics(self) -> set[str]:
        return {*self.camera_index, self.instruction_topic, *([self.state_topic] if self.state_topic else [])}

    def feed(self, topic: str, receive_ns: int, msg) -> None:
        if topic in self.camera_index:
            self._on_image(topic, receive_ns, msg)
        elif topic == self.instruction_topic:
            text = msg.data.strip()
            if not text:
                self.result.rejected["empty_instruction"] += 1
                return
            first, self.instruction = self.instruction is None, text
            if first:
                self._take(receive_ns)
        elif topic == self.state_topic:
            try:
                values = _state_values(msg, self.settings, self.policy.state_dim)
            except ValueError:
                self.result.rejected["bad_state"] += 1
                return
            if _stamp_ns(msg.header.stamp) - receive_ns > self.max_future_ns:
                self.result.rejected["future_stamp"] += 1
                return
            first, self.state = self.state is None, (_stamp_ns(msg.header.stamp), values)
            if first:
                self._take(receive_ns)

    def _on_image(self, topic: str, receive_ns: int, msg) -> None:
        self.result.frames[topic] += 1
        try:
            check_image(msg)
        except ImageConversionError:
            self.result.rejected["bad_image"] += 1
            return
        if _stamp_ns(msg.header.stamp) - receive_ns > self.max_future_ns:
            self.result.rejected["future_stamp"] += 1
            return
        added = self.buffer.add_frame(self.camera_index[topic], _stamp_ns(msg.header.stamp), msg, receive_ns)
        if added in (AddResult.COMPLETED, AddResult.RESET):
            self._take(receive_ns)

    def _take(self, now_ns: int) -> None:
        prompt = self.instruction or self.settings.default_instruction
        if not prompt or (self.state_topic and self.state is None):
            return  # the observation stays pending, as in the node, until the missing input arrives
        self.buffer.note_time(now_ns)
        observation = self.buffer.take(now_ns)
        if observation is None:
            return
        if self.state_topic and now_ns - self.state[0] > seconds_to_ns(self.settings.max_state_age):
            self.result.rejected["stale_state"] += 1
            return
        self._infer(observation, prompt, now_ns)

    def _infer(self, observation: Observation, prompt: str, now_ns: int) -> None:
        try:
            images = {view: to_rgb(frame.payload) for view, frame in zip(self.view_names, observation.frames)}
        except ImageConversionError:
            self.result.rejected["bad_image"] += 1
            return
        state_stamp, state = self.state if self.state_topic and self.state else (0, None)
        noise = observation_noise(self.noise_seed, observation.stamp_ns, self.policy.horizon)  # (horizon, 32)
        start = time.perf_counter()
        actions = self.policy.predict(images, prompt, state=state, noise=noise)  # (horizon, action_dim)
        elapsed = time.perf_counter() - start
        self.result.chunks.append(Chunk(
            stamp_ns=observation.stamp_ns, view_stamps_ns=observation.view_stamps_ns, state_stamp_ns=state_stamp,
            actions=np.asarray(actions, dtype=np.float32), receive_ns=now_ns, inference_time_s=elapsed,
            staleness_s=(now_ns - observation.stamp_ns) * 1e-9, sequence=len(self.result.chunks)))


def pinned_seed(settings: NodeSettings, noise_seed: int | None = None) -> int:
    """Seed of the pinned noise: ``noise_seed`` if given, else the node's ``noise_seed`` parameter (must be >= 0)."""
    seed = settings.noise_seed if noise_seed is None else noise_seed
    if seed < 0:
        raise BagError("the offline reference needs pinned noise: set the node parameter noise_seed >= 0 (and run "
                       "the node with the same value) or give a seed (--noise-seed)")
    return seed


def evaluate_bag(bag: Path, policy, settings: NodeSettings, noise_seed: int | None = None,
                 namespace: str = "/") -> Evaluation:
    """Run ``policy`` on every complete observation of ``bag`` under the node's ``settings`` rules.

    ``noise_seed`` None uses the node's ``noise_seed`` parameter from ``settings``.
    """
    evaluator = _Evaluator(policy, settings, pinned_seed(settings, noise_seed), namespace)
    store = bag_typestore()
    with Reader(bag) as reader:
        present = {c.topic for c in reader.connections}
        missing = sorted(t for t in evaluator.topics if t not in present)
        if set(evaluator.camera_index) & set(missing):
            raise BagError(f"camera topics {missing} are not in {bag} (it has {sorted(present)}); "
                           "check camera_topics or the namespace")
        if missing:
            LOGGER.warning("topics not in %s: %s", bag, missing)
        connections = [c for c in reader.connections if c.topic in evaluator.topics]
        for conn, receive_ns, raw in reader.messages(connections=connections):
            evaluator.feed(conn.topic, receive_ns, store.deserialize_cdr(raw, conn.msgtype))
    counters = evaluator.buffer.counters()
    evaluator.result.buffer = {name: getattr(counters, name) for name in counters.__dataclass_fields__}
    LOGGER.info("evaluated %s: %d chunks, frames %s, rejected %s, buffer %s", bag, len(evaluator.result.chunks),
                dict(evaluator.result.frames), dict(evaluator.result.rejected), evaluator.result.buffer)
    return evaluator.result


def recompute_chunks(bag: Path, policy, settings: NodeSettings, chunks: Sequence[Chunk],
                     noise_seed: int | None = None, namespace: str = "/") -> list[Chunk]:
    """Reference chunks for exactly the inputs of ``chunks`` (their frames by view stamps, state by state stamp).

    For live chunks whose inputs the evaluation did not pair the same way (typically a later state sample):
    the prompt is the instruction in effect at the chunk's receive time (else ``default_instruction``).
    """
    noise_seed = pinned_seed(settings, noise_seed)
    evaluator = _Evaluator(policy, settings, noise_seed, namespace)
    cameras = {topic: i for topic, i in evaluator.camera_index.items()}
    wanted_frames = [{c.view_stamps_ns[i] for c in chunks} for i in range(len(cameras))]
    wanted_states = {c.state_stamp_ns for c in chunks}
    frames: list[dict[int, Any]] = [{} for _ in cameras]
    states: dict[int, np.ndarray] = {}
    instructions: list[tuple[int, str]] = []
    store = bag_typestore()
    with Reader(bag) as reader:
        connections = [c for c in reader.connections if c.topic in evaluator.topics]
        for conn, receive_ns, raw in reader.messages(connections=connections):
            msg = store.deserialize_cdr(raw, conn.msgtype)
            if conn.topic in cameras:
                index = cameras[conn.topic]
                if _stamp_ns(msg.header.stamp) in wanted_frames[index]:
                    frames[index][_stamp_ns(msg.header.stamp)] = msg
            elif conn.topic == evaluator.instruction_topic and msg.data.strip():
                instructions.append((receive_ns, msg.data.strip()))
            elif conn.topic == evaluator.state_topic and _stamp_ns(msg.header.stamp) in wanted_states:
                states[_stamp_ns(msg.header.stamp)] = _state_values(msg, settings, policy.state_dim)
    result = []
    for chunk in chunks:
        missing = [i for i, stamp in enumerate(chunk.view_stamps_ns) if stamp not in frames[i]]
        if missing or (evaluator.state_topic and chunk.state_stamp_ns not in states):
            raise BagError(f"{bag} has no frames/state for the chunk stamped {chunk.stamp_ns} "
                           f"(views {missing}, state {chunk.state_stamp_ns})")
        prompt = next((text for t, text in reversed(instructions) if t <= chunk.receive_ns),
                      settings.default_instruction)
        images = {view: to_rgb(frames[i][stamp])
                  for i, (view, stamp) in enumerate(zip(evaluator.view_names, chunk.view_stamps_ns))}
        state = states.get(chunk.state_stamp_ns) if evaluator.state_topic else None
        noise = observation_noise(noise_seed, chunk.stamp_ns, policy.horizon)  # (horizon, 32)
        actions = policy.predict(images, prompt, state=state, noise=noise)  # (horizon, action_dim)
        result.append(dataclasses.replace(chunk, actions=np.asarray(actions, dtype=np.float32)))
    return result


# ------------------------------------------------------------------------------------------- chunk bags
def write_chunk_bag(out: Path, chunks: Iterable[Chunk], settings: NodeSettings, view_names: Sequence[str],
                    model_id: str, storage: str = "sqlite3") -> None:
    """Write chunks as flashrt_ros/msg/ActionChunk on :data:`OUTPUT_TOPIC`, as the node would publish them."""
    store = bag_typestore()
    action_chunk, time_type = store.types[ACTION_CHUNK_TYPE], store.types["builtin_interfaces/msg/Time"]
    header_type = store.types["std_msgs/msg/Header"]

    def to_time(ns: int):
        return time_type(sec=ns // 10**9, nanosec=ns % 10**9)

    plugin = {"sqlite3": StoragePlugin.SQLITE3, "mcap": StoragePlugin.MCAP}[storage]
    with Writer(out, version=Writer.VERSION_LATEST, storage_plugin=plugin) as writer:
        connection = writer.add_connection(OUTPUT_TOPIC, ACTION_CHUNK_TYPE, typestore=store)
        for chunk in chunks:
            horizon, action_dim = chunk.actions.shape
            msg = action_chunk(
                header=header_type(stamp=to_time(chunk.stamp_ns), frame_id=settings.frame_id),
                view_names=list(view_names), view_stamps=[to_time(ns) for ns in chunk.view_stamps_ns],
                state_stamp=to_time(chunk.state_stamp_ns), sequence=chunk.sequence, horizon=horizon,
                action_dim=action_dim, dt=settings.action_dt, action_names=list(settings.action_names),
                actions=chunk.actions.reshape(-1), inference_time=chunk.inference_time_s,
                staleness=chunk.staleness_s, model_id=model_id, config_id=settings.config_id())
            writer.write(connection, chunk.receive_ns, bytes(store.serialize_cdr(msg, ACTION_CHUNK_TYPE)))


def read_chunk_bag(bag: Path, topic: str | None = None) -> list[Chunk]:
    """ActionChunks of a bag (an evaluator output or a recording of the live node), in bag order."""
    store = bag_typestore()
    chunks: list[Chunk] = []
    with Reader(bag) as reader:
        connections = [c for c in reader.connections if c.msgtype == ACTION_CHUNK_TYPE
                       and (topic is None or c.topic == topic)]
        if not connections:
            raise BagError(f"{bag} has no {ACTION_CHUNK_TYPE} messages" + (f" on {topic}" if topic else ""))
        for _, receive_ns, raw in reader.messages(connections=connections):
            msg = store.deserialize_cdr(raw, ACTION_CHUNK_TYPE)
            actions = np.asarray(msg.actions, dtype=np.float32).reshape(msg.horizon, msg.action_dim)
            chunks.append(Chunk(stamp_ns=_stamp_ns(msg.header.stamp),
                                view_stamps_ns=tuple(_stamp_ns(s) for s in msg.view_stamps),
                                state_stamp_ns=_stamp_ns(msg.state_stamp), actions=actions, receive_ns=receive_ns,
                                inference_time_s=msg.inference_time, staleness_s=msg.staleness,
                                sequence=msg.sequence, dt=msg.dt))
    return chunks


@dataclass
class Comparison:
    """Live chunks matched with reference chunks by their inputs (the frames' view stamps and the state stamp).

    The state is the newest sample received before inference starts, in the node as in the evaluator; live,
    a state sample can arrive between the frame and the start of inference (or the node can still be busy with
    the previous observation), so a live chunk may use a later state than the reference: those are counted in
    ``state_differs`` and not compared here; :func:`check_live_chunks` recomputes references for them.
    """

    matched: int  # same frames and same state: actions compared
    state_differs: int  # same frames, another state sample
    unmatched_live: list[Chunk]  # live chunks from an observation the evaluator never formed
    mismatched: list[tuple[Chunk, Chunk]]  # (reference, live): same inputs, actions outside tolerance
    reference_total: int  # observations (distinct frame sets) in the reference
    max_abs_error: float

    @property
    def coverage(self) -> float:
        """Compared live chunks per reference observation (1.0: every observation reproduced and checked)."""
        return self.matched / self.reference_total if self.reference_total else 0.0

    @property
    def ok(self) -> bool:
        """Every live chunk comes from a reference observation, every compared one within tolerance."""
        return self.matched > 0 and not self.unmatched_live and not self.mismatched

    def summary(self) -> str:
        return (f"{self.matched} chunks compared ({self.coverage:.0%} of {self.reference_total} reference chunks), "
                f"{len(self.mismatched)} outside tolerance (max |error| {self.max_abs_error:.3g}), "
                f"{self.state_differs} with another state sample, {len(self.unmatched_live)} live chunks from "
                "observations the evaluator did not form")


def compare_chunks(reference: Sequence[Chunk], live: Sequence[Chunk], atol: float = COMPARE_ATOL,
                   rtol: float = COMPARE_RTOL) -> Comparison:
    """Match every live chunk with the reference chunk of the same inputs (frames, state) and compare actions."""
    by_inputs = {(c.view_stamps_ns, c.state_stamp_ns): c for c in reference}
    views = {c.view_stamps_ns for c in reference}
    matched, state_differs, unmatched, mismatched, max_error = 0, 0, [], [], 0.0
    for chunk in live:
        ref = by_inputs.get((chunk.view_stamps_ns, chunk.state_stamp_ns))
        if ref is None:
            if chunk.view_stamps_ns in views:
                state_differs += 1
            else:
                unmatched.append(chunk)
            continue
        matched += 1
        if ref.actions.shape != chunk.actions.shape:
            mismatched.append((ref, chunk))
            continue
        max_error = max(max_error, float(np.abs(ref.actions - chunk.actions).max()))
        if not np.allclose(chunk.actions, ref.actions, atol=atol, rtol=rtol):
            mismatched.append((ref, chunk))
    observations = len(views)
    return Comparison(matched, state_differs, unmatched, mismatched, observations, max_error)


def check_live_chunks(bag: Path, policy, settings: NodeSettings, reference: Sequence[Chunk], live: Sequence[Chunk],
                      noise_seed: int | None = None, namespace: str = "/", atol: float = COMPARE_ATOL,
                      rtol: float = COMPARE_RTOL) -> tuple[Comparison, int]:
    """Compare ``live`` with ``reference``; live chunks that used another state sample than the reference are
    checked against references recomputed for their exact inputs. Returns (comparison, chunks recomputed)."""
    comparison = compare_chunks(reference, live, atol, rtol)
    if not comparison.state_differs:
        return comparison, 0
    known = {(c.view_stamps_ns, c.state_stamp_ns) for c in reference}
    views = {c.view_stamps_ns for c in reference}
    differing = [c for c in live if c.view_stamps_ns in views and (c.view_stamps_ns, c.state_stamp_ns) not in known]
    extra = recompute_chunks(bag, policy, settings, differing, noise_seed, namespace)
    return compare_chunks([*reference, *extra], live, atol, rtol), len(extra)


# ------------------------------------------------------------------------------------------- CLI
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m flashrt_ros.bag_evaluator BAG --params-file YAML --out REF_BAG [--compare LIVE_BAG]``."""
    parser = argparse.ArgumentParser(prog="python -m flashrt_ros.bag_evaluator", description=__doc__.split("\n")[0])
    parser.add_argument("bag", type=Path, help="input rosbag2 with the camera / instruction / state topics")
    parser.add_argument("--params-file", type=Path, help="the node's parameters YAML (default: node defaults)")
    parser.add_argument("--node-name", help="section of the YAML to use when it has several")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="NAME:=VALUE",
                        help="override a node parameter (YAML value syntax), e.g. -p sync_slop:=0.03")
    parser.add_argument("--namespace", default="/", help="namespace the node runs in (resolves relative topics)")
    parser.add_argument("--noise-seed", type=int, default=None,
                        help="seed of the pinned per-observation noise (default: the node's noise_seed parameter)")
    parser.add_argument("--out", type=Path, help="write the chunks into this new bag (ActionChunk on /action_chunk)")
    parser.add_argument("--storage", choices=("sqlite3", "mcap"), default="sqlite3")
    parser.add_argument("--compare", type=Path, help="a recording of the live node's chunks to check against")
    parser.add_argument("--compare-topic", default=None, help="ActionChunk topic in --compare (default: any)")
    parser.add_argument("--atol", type=float, default=COMPARE_ATOL)
    parser.add_argument("--rtol", type=float, default=COMPARE_RTOL)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        overrides = parse_param_overrides(args.param)
    except ValueError as error:
        parser.error(str(error))
    if args.out is not None and args.out.exists():
        parser.error(f"--out {args.out} exists already")
    settings = load_node_settings(args.params_file, overrides, args.node_name)

    from flashrt_ros.node_calibration import calibrate_offline
    from flashrt_ros.policy_node import load_policy  # the node's own model loading

    policy = load_policy(settings)
    try:
        calibrate_offline(policy, settings, args.bag, args.namespace)      # an FP8 policy, as the node does
        evaluation = evaluate_bag(args.bag, policy, settings, args.noise_seed, args.namespace)
        view_names = settings.camera_views or tuple(policy.view_names)[:len(settings.camera_topics)]
        if args.out is not None:
            write_chunk_bag(args.out, evaluation.chunks, settings, view_names, str(policy.model_id), args.storage)
        print(f"{len(evaluation.chunks)} chunks from {sum(evaluation.frames.values())} frames; "
              f"rejected {dict(evaluation.rejected)}; buffer {evaluation.buffer}")
        if args.compare is None:
            return 0
        comparison, recomputed = check_live_chunks(
            args.bag, policy, settings, evaluation.chunks, read_chunk_bag(args.compare, args.compare_topic),
            args.noise_seed, args.namespace, args.atol, args.rtol)
    finally:
        policy.close()
    print(f"compared with {args.compare}: {comparison.summary()}; {recomputed} references recomputed for "
          "chunks that used another state sample")
    return 0 if comparison.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
