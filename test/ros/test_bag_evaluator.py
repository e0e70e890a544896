"""Offline evaluation of a bag, and live replays through the policy node compared with it.

- the evaluator follows the node's pairing / rejection rules and pins the noise per observation;
- replaying a bag (with /clock) through the live node in on_observation mode gives the evaluator's chunks for
  the same observations, with staleness on the bag's clock;
- a bag with a camera dropout, out-of-order stamps and a corrupt JPEG gives counted rejections (the same counts
  offline and live) and no crash.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import yaml

from flashrt_ros.bag_common import BagError
from flashrt_ros.bag_evaluator import (check_live_chunks, compare_chunks, evaluate_bag, load_node_settings,
                                       load_node_values, main, read_chunk_bag, write_chunk_bag)
from flashrt_ros.bag_regression import main as regression_main
from flashrt_ros.bag_regression import replay_through_node
from flashrt_ros.demo_bag import (BASE_CAMERA_TOPIC, INSTRUCTION_TOPIC, JOINT_STATE_TOPIC, WRIST_CAMERA_TOPIC,
                                  DemoBagConfig, write_demo_bag)
from flashrt_ros.pinned_noise import observation_noise
from node_harness import BorrowedPolicy, shared_policy

pytestmark = pytest.mark.ros

NOISE_SEED = 7
CAMERAS = [BASE_CAMERA_TOPIC, WRIST_CAMERA_TOPIC]
NODE_PARAMETERS = {
    "camera_topics": CAMERAS, "camera_views": ["base_0_rgb", "left_wrist_0_rgb"],
    "instruction_topic": INSTRUCTION_TOPIC, "state_topic": JOINT_STATE_TOPIC, "sync_slop": 0.02,
    "max_observation_age": 0.5,
    "trigger": "on_observation", "output_topic": "/action_chunk", "warmup_iterations": 0, "frame_id": "base_link",
    "diagnostics_period": 0.05,  # node clock = the bag's: every 0.25 s of wall time at REPLAY_RATE
}
# Short bags with 10 Hz cameras keep the CPU cost low (a dozen observations); faults placed inside them.
# 32 joints: the embedded demo model's state_dim.
CLEAN_BAG = DemoBagConfig(duration_s=1.2, width=320, height=240, camera_hz=10.0, joint_count=32)
FAULT_BAG = dataclasses.replace(CLEAN_BAG, faults=True, dropout_s=(0.45, 0.75), out_of_order_frames=(2, 6),
                                corrupt_frames=(9,))
# 1 s of wall time per observation: the CPU model (0.1-0.9 s per forward on this shared 2-core machine)
# processes (nearly) every one.
REPLAY_RATE = 0.1
MIN_LIVE_COVERAGE = 0.5  # of the reference observations the live node must have produced
LIVE_ATOL = 1e-4  # same weights, noise and frames: only float reordering may differ
MAX_SIM_STALENESS_S = 0.5  # on the bag's clock; on the wall clock it would be months off


@pytest.fixture(scope="module")
def bags(tmp_path_factory):
    root = tmp_path_factory.mktemp("evaluator")
    write_demo_bag(root / "clean", CLEAN_BAG)
    write_demo_bag(root / "faults", FAULT_BAG, storage="mcap")
    return {"clean": root / "clean", "faults": root / "faults"}


@pytest.fixture(scope="module")
def settings():
    return load_node_settings(overrides=NODE_PARAMETERS)


@pytest.fixture(scope="module")
def fault_evaluation(bags, settings):
    return evaluate_bag(bags["faults"], shared_policy(), settings, NOISE_SEED)


def test_evaluator_applies_the_node_rules_to_a_faulty_bag(fault_evaluation, bags, settings):
    ev = fault_evaluation
    assert ev.rejected == {"bad_image": 1}, "the corrupt JPEG is the only rejected decode"
    assert ev.buffer["out_of_order"] == 2 and ev.buffer["stale"] == 0 and ev.buffer["time_resets"] == 0
    assert ev.inputs_rejected == 3
    assert len(ev.chunks) == ev.buffer["taken"], "the corrupt JPEG is rejected before pairing: every taken " \
        "observation gives a chunk"
    start_ns = CLEAN_BAG.start_time_ns
    for chunk in ev.chunks:
        assert chunk.stamp_ns == min(chunk.view_stamps_ns), "chunk stamp = oldest camera stamp"
        assert max(chunk.view_stamps_ns) - min(chunk.view_stamps_ns) <= settings.sync_slop * 1e9
        wrist_s = (chunk.view_stamps_ns[1] - start_ns) / 1e9
        assert not FAULT_BAG.dropout_s[0] <= wrist_s < FAULT_BAG.dropout_s[1], "no wrist frame in the dropout"
        assert chunk.actions.shape == (shared_policy().horizon, shared_policy().action_dim)
        assert 0 < chunk.staleness_s < 0.05
    stamps = [c.stamp_ns for c in ev.chunks]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
    after_dropout = [s for s in stamps if (s - start_ns) / 1e9 > FAULT_BAG.dropout_s[1]]
    assert len(after_dropout) >= 3, "pairing resumes after the dropout"


def test_chunks_are_pinned_by_seed_and_stamp(fault_evaluation, bags, settings):
    """Recomputing a chunk from its observation with the pinned noise gives it exactly; another seed does not.

    A live chunk computed with a later state sample than the reference's is checked against a reference
    recomputed for its exact inputs.
    """
    from flashrt_ros.bag_common import bag_typestore
    from flashrt_ros.image_conversion import to_rgb
    from rosbags.rosbag2 import Reader

    policy, store = shared_policy(), bag_typestore()
    chunk = fault_evaluation.chunks[len(fault_evaluation.chunks) // 2]
    frames, state, later_state = {}, None, None
    with Reader(bags["faults"]) as reader:
        topics = (*CAMERAS, JOINT_STATE_TOPIC)
        for conn, _, raw in reader.messages(connections=[c for c in reader.connections if c.topic in topics]):
            msg = store.deserialize_cdr(raw, conn.msgtype)
            stamp = msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec
            if conn.topic == JOINT_STATE_TOPIC:
                if stamp == chunk.state_stamp_ns:
                    state = np.asarray(msg.position, dtype=np.float32)
                elif state is not None and later_state is None:
                    later_state = (stamp, np.asarray(msg.position, dtype=np.float32))
            elif stamp == chunk.view_stamps_ns[CAMERAS.index(conn.topic)]:
                frames[conn.topic] = to_rgb(msg)
    assert state is not None and chunk.state_stamp_ns <= chunk.stamp_ns + int(0.05e9)
    images = {"base_0_rgb": frames[BASE_CAMERA_TOPIC], "left_wrist_0_rgb": frames[WRIST_CAMERA_TOPIC]}
    again = policy.predict(images, FAULT_BAG.instruction, state=state,
                           noise=observation_noise(NOISE_SEED, chunk.stamp_ns, policy.horizon))
    np.testing.assert_array_equal(again, chunk.actions)
    other_seed = policy.predict(images, FAULT_BAG.instruction, state=state,
                                noise=observation_noise(NOISE_SEED + 1, chunk.stamp_ns, policy.horizon))
    assert np.abs(other_seed - chunk.actions).max() > 1e-3

    later = policy.predict(images, FAULT_BAG.instruction, state=later_state[1],
                           noise=observation_noise(NOISE_SEED, chunk.stamp_ns, policy.horizon))
    live = dataclasses.replace(chunk, state_stamp_ns=later_state[0], actions=later)
    assert compare_chunks(fault_evaluation.chunks, [live]).state_differs == 1
    comparison, recomputed = check_live_chunks(bags["faults"], policy, settings, fault_evaluation.chunks, [live],
                                               NOISE_SEED, atol=0.0, rtol=0.0)
    assert recomputed == 1 and comparison.ok and comparison.matched == 1
    with pytest.raises(BagError, match="pinned noise"):
        evaluate_bag(bags["faults"], policy, settings)  # the node's default noise_seed -1: fresh noise
    wrong = dataclasses.replace(live, actions=chunk.actions)
    comparison, _ = check_live_chunks(bags["faults"], policy, settings, fault_evaluation.chunks, [wrong], NOISE_SEED)
    assert not comparison.ok and len(comparison.mismatched) == 1


def test_chunk_bag_round_trip_and_comparison(fault_evaluation, settings, tmp_path):
    chunks = fault_evaluation.chunks
    write_chunk_bag(tmp_path / "ref", chunks, settings, ("base_0_rgb", "left_wrist_0_rgb"), "demo", storage="mcap")
    read = read_chunk_bag(tmp_path / "ref")
    assert [(c.stamp_ns, c.view_stamps_ns, c.sequence, c.receive_ns) for c in read] == \
        [(c.stamp_ns, c.view_stamps_ns, c.sequence, c.receive_ns) for c in chunks]
    assert all(np.array_equal(a.actions, b.actions) for a, b in zip(read, chunks))
    same = compare_chunks(chunks, read[::2])
    assert same.ok and same.matched == len(read[::2]) and same.coverage == pytest.approx(len(read[::2]) / len(chunks))
    moved = dataclasses.replace(read[0], actions=read[0].actions + 1e-2)
    unknown = dataclasses.replace(read[1], view_stamps_ns=(1, 2))
    bad = compare_chunks(chunks, [moved, unknown])
    assert not bad.ok and len(bad.mismatched) == 1 and bad.unmatched_live == [unknown]
    assert bad.max_abs_error == pytest.approx(1e-2, rel=1e-3)


def test_live_replay_matches_offline_evaluation(bags, tmp_path, capsys):
    """The one-command regression (README): offline reference, live node replay with /clock, comparison."""
    params = [f"{name}:={yaml.safe_dump(value, default_flow_style=True).strip()}"
              for name, value in NODE_PARAMETERS.items()]
    code = regression_main([str(bags["clean"]), "--out-dir", str(tmp_path), "--rate", str(REPLAY_RATE),
                            "--noise-seed", str(NOISE_SEED), "--min-coverage", str(MIN_LIVE_COVERAGE),
                            "--atol", str(LIVE_ATOL), "--rtol", "0", *[a for p in params for a in ("-p", p)]])
    out = capsys.readouterr().out
    assert code == 0 and "PASS" in out, out
    reference = read_chunk_bag(tmp_path / "reference")
    live = read_chunk_bag(tmp_path / "live", "/action_chunk")
    comparison = compare_chunks(reference, live, atol=LIVE_ATOL, rtol=0.0)
    assert not comparison.unmatched_live, "every live chunk comes from an observation the evaluator also formed"
    assert not comparison.mismatched, f"actions differ from the offline reference (max {comparison.max_abs_error})"
    assert comparison.coverage >= MIN_LIVE_COVERAGE, comparison.summary()
    bag_start, bag_end = CLEAN_BAG.start_time_ns, CLEAN_BAG.start_time_ns + int(CLEAN_BAG.duration_s * 1e9)
    for chunk in live:
        assert chunk.stamp_ns == min(chunk.view_stamps_ns)
        assert 0.0 < chunk.staleness_s < MAX_SIM_STALENESS_S, "staleness is measured on the bag's (sim) clock"
        assert bag_start <= chunk.receive_ns <= bag_end + int(1e9), "recorded on the bag's (sim) clock"
    assert [c.sequence for c in live] == list(range(len(live)))


def test_faulty_bag_gives_counted_rejections_and_no_crash(bags, fault_evaluation, tmp_path):
    values = load_node_values(overrides={**NODE_PARAMETERS, "noise_seed": NOISE_SEED})
    run = replay_through_node(bags["faults"], values, REPLAY_RATE, tmp_path / "live",
                              policy_factory=lambda s: BorrowedPolicy(shared_policy()))
    assert run.lifecycle_state == "active", "the node must survive the bag"
    status = _read(tmp_path / "live", "/policy_node/status")[-1]
    diagnostics = [d for array in _read(tmp_path / "live", "/diagnostics") for d in array.status
                   if d.name.startswith("/policy_node:")]
    values = {kv.key: kv.value for kv in diagnostics[-1].values}
    assert status.inputs_rejected == fault_evaluation.inputs_rejected == 3
    assert values["frames_out_of_order"] == str(fault_evaluation.buffer["out_of_order"]) == "2"
    assert values["rejected_bad_image"] == "1" and values["inputs_rejected"] == "3"
    after_dropout = [c for c in run.chunks if (c.stamp_ns - CLEAN_BAG.start_time_ns) / 1e9 > FAULT_BAG.dropout_s[1]]
    assert len(after_dropout) >= 2, "chunks resume after the camera comes back"
    comparison = compare_chunks(fault_evaluation.chunks, run.chunks, atol=LIVE_ATOL, rtol=0.0)
    assert not comparison.unmatched_live and not comparison.mismatched, comparison.summary()


def _read(bag, topic: str) -> list:
    """Deserialized messages of one topic of a bag."""
    from rosbags.rosbag2 import Reader

    from flashrt_ros.bag_common import bag_typestore

    store = bag_typestore()
    with Reader(bag) as reader:
        connections = [c for c in reader.connections if c.topic == topic]
        assert connections, f"{topic} was not recorded"
        return [store.deserialize_cdr(raw, c.msgtype) for c, _, raw in reader.messages(connections)]


def test_cli_writes_and_compares(bags, fault_evaluation, settings, tmp_path, capsys):
    """One CLI run (it loads the model itself): writes the reference and checks a recording against it."""
    views = ("base_0_rgb", "left_wrist_0_rgb")
    first = fault_evaluation.chunks[0]
    recorded = [*fault_evaluation.chunks[1:], dataclasses.replace(first, actions=first.actions + 1e-2)]
    write_chunk_bag(tmp_path / "recorded", recorded, settings, views, "demo")
    params = ["-p", f"camera_topics:=[{BASE_CAMERA_TOPIC}, {WRIST_CAMERA_TOPIC}]",
              "-p", f"state_topic:={JOINT_STATE_TOPIC}",
              "-p", f"instruction_topic:={INSTRUCTION_TOPIC}", "--noise-seed", str(NOISE_SEED)]
    code = main([str(bags["faults"]), *params, "--out", str(tmp_path / "ref"), "--compare", str(tmp_path / "recorded")])
    out = capsys.readouterr().out
    assert code == 1, "one recorded chunk is off by 1e-2"
    assert "rejected {'bad_image': 1}" in out and "1 outside tolerance" in out
    written = read_chunk_bag(tmp_path / "ref")
    assert [c.view_stamps_ns for c in written] == [c.view_stamps_ns for c in fault_evaluation.chunks]
    assert all(np.array_equal(a.actions, b.actions) for a, b in zip(written, fault_evaluation.chunks))
