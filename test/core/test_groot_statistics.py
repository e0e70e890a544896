"""GR00T per-embodiment statistics, normalization and the pitfalls its users hit: an unknown embodiment, another
embodiment's statistics, a checkpoint without statistics, a calibration cache recorded on another embodiment."""

import json

import numpy as np
import pytest

from flashrt_core import load_model
from flashrt_core.errors import CheckpointError
from flashrt_core.groot_calibration import CalibrationKey, calibration_key, load_calibration, save_calibration
from flashrt_core.groot_fixtures import write_random_groot_checkpoint
from flashrt_core.groot_statistics import STATISTICS_FILE, load_embodiment

TINY = "groot_n1.6_tiny"
ROBOTS = {"new_embodiment": {"views": ["front", "wrist"], "state": [("arm", 5), ("gripper", 1)],
                             "action": [("arm", 5), ("gripper", 1)]},
          "gr1": {"views": ["ego"], "state": [("left_arm", 7), ("right_arm", 7)],
                  "action": [("left_arm", 7), ("right_arm", 7), ("waist", 2)]}}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_random_groot_checkpoint(tmp_path_factory.mktemp("stats") / "c", TINY, embodiments=ROBOTS)


def test_embodiments_pick_groups_ids_and_views(ckpt):
    a = load_embodiment(ckpt, "new_embodiment", 16, 16)
    b = load_embodiment(ckpt, "gr1", 16, 16)
    assert (a.id, a.views, a.state_dim, a.action_dim) == (10, ("front", "wrist"), 6, 6)
    assert (b.id, b.views, b.state_dim, b.action_dim) == (20, ("ego",), 14, 16)


def test_minmax_normalization_round_trip(ckpt):
    emb = load_embodiment(ckpt, "gr1", 16, 16)
    stats = json.loads((ckpt / STATISTICS_FILE).read_text())["gr1"]
    lo = np.array(stats["state"]["left_arm"]["min"])
    hi = np.array(stats["state"]["left_arm"]["max"])
    mid = (lo + hi) / 2
    out = emb.normalize_state({"left_arm": hi, "right_arm": np.zeros(7)}, 16)
    np.testing.assert_allclose(out[:7], 1.0, atol=1e-6)
    out = emb.normalize_state({"left_arm": mid, "right_arm": np.zeros(7)}, 16)
    np.testing.assert_allclose(out[:7], 0.0, atol=1e-6)
    out = emb.normalize_state({"left_arm": hi + 10, "right_arm": np.zeros(7)}, 16)     # clip_outliers
    np.testing.assert_allclose(out[:7], 1.0, atol=1e-6)
    assert (out[14:] == 0).all()                                                       # padding
    acts = np.zeros((16, 16))
    acts[:, :7] = -1.0
    robot = emb.unnormalize_actions(acts)
    assert robot.shape == (16, 16)
    np.testing.assert_allclose(robot[:, :7], np.broadcast_to(stats["action"]["left_arm"]["min"], (16, 7)),
                               rtol=1e-6)


def test_mean_std_groups(tmp_path):
    out = write_random_groot_checkpoint(tmp_path / "c", TINY)
    proc = json.loads((out / "processor_config.json").read_text())
    proc["processor_kwargs"]["modality_configs"]["new_embodiment"]["action"]["mean_std_embedding_keys"] = ["gripper"]
    (out / "processor_config.json").write_text(json.dumps(proc))
    emb = load_embodiment(out, "new_embodiment", 16, 16)
    g = emb.action[1]
    assert g.mode == "meanstd"
    acts = np.zeros((16, 16))
    acts[:, 5] = 2.0
    robot = emb.unnormalize_actions(acts)
    np.testing.assert_allclose(robot[:, 5], 2.0 * g.hi[0] + g.lo[0], rtol=1e-6)         # x std + mean, no clip


def test_unknown_embodiment_names_the_known_ones(ckpt):
    with pytest.raises(CheckpointError, match=r"unknown embodiment 'ur5'; this checkpoint knows \['gr1', "
                                              r"'new_embodiment'\]"):
        load_model(ckpt, config=TINY, embodiment="ur5", device="cpu")


def test_embodiment_with_an_id_but_not_fine_tuned(ckpt):
    with pytest.raises(CheckpointError, match=r"'oxe_droid' has a projector id \(16\) .* fine-tuned for "
                                              r"\['gr1', 'new_embodiment'\]"):
        load_model(ckpt, config=TINY, embodiment="oxe_droid", device="cpu")


def test_statistics_of_another_embodiment(ckpt, tmp_path):
    stats = json.loads((ckpt / STATISTICS_FILE).read_text())
    other = tmp_path / "other_stats.json"
    other.write_text(json.dumps({"gr1": stats["gr1"]}))
    with pytest.raises(CheckpointError, match=r"no statistics for embodiment 'new_embodiment' \(it has \['gr1'\]\): "
                                              "these are another embodiment's statistics"):
        load_model(ckpt, config=TINY, embodiment="new_embodiment", device="cpu", statistics=other)
    # same tag, another robot's joint groups
    swapped = tmp_path / "swapped.json"
    swapped.write_text(json.dumps({"new_embodiment": stats["gr1"]}))
    with pytest.raises(CheckpointError, match=r"lack the state groups \['arm', 'gripper'\] .* another embodiment"):
        load_model(ckpt, config=TINY, embodiment="new_embodiment", device="cpu", statistics=swapped)


def test_checkpoint_without_statistics(tmp_path):
    out = write_random_groot_checkpoint(tmp_path / "c", TINY)
    (out / STATISTICS_FILE).unlink()
    with pytest.raises(CheckpointError, match=r"has no per-embodiment statistics: .*statistics\.json is missing\. "
                                              r"GR00T writes statistics\.json .* pass statistics=PATH"):
        load_model(out, config=TINY, embodiment="new_embodiment", device="cpu")
    with pytest.raises(CheckpointError, match=r"nowhere\.json \(given as statistics=\) is missing"):
        load_model(out, config=TINY, embodiment="new_embodiment", device="cpu", statistics=tmp_path / "nowhere.json")


def test_supplied_statistics_are_used(ckpt, tmp_path):
    stats = json.loads((ckpt / STATISTICS_FILE).read_text())
    for group in stats["new_embodiment"]["action"].values():
        group["min"] = [100.0] * len(group["min"])
        group["max"] = [101.0] * len(group["max"])
    path = tmp_path / "s.json"
    path.write_text(json.dumps(stats))
    pol = load_model(ckpt, config=TINY, embodiment="new_embodiment", device="cpu", statistics=path)
    rng = np.random.default_rng(0)
    images = {v: rng.integers(0, 256, (56, 56, 3), dtype=np.uint8) for v in pol.view_names}
    a = pol.predict(images, "pick", np.zeros(6), np.zeros((16, 16), np.float32))
    assert (a >= 100).all() and (a <= 101).all()


def test_embodiment_is_required(ckpt):
    with pytest.raises(ValueError, match="GR00T needs embodiment=TAG"):
        load_model(ckpt, config=TINY, device="cpu")


def test_calibration_cache_keyed_by_embodiment(ckpt, tmp_path):
    a = load_model(ckpt, config=TINY, embodiment="new_embodiment", device="cpu")
    b = load_model(ckpt, config=TINY, embodiment="gr1", device="cpu")
    path = save_calibration(tmp_path / "calib.json", calibration_key(a, "fp8"), {"dit.0.ff": 3.5})
    assert load_calibration(path, calibration_key(a, "fp8")) == {"dit.0.ff": 3.5}
    with pytest.raises(CheckpointError, match=r"embodiment 'new_embodiment' \(wanted 'gr1'\), embodiment_id 10 "
                                              r"\(wanted 20\); recalibrate for embodiment 'gr1'"):
        load_calibration(path, calibration_key(b, "fp8"))
    legacy = tmp_path / "legacy.json"
    legacy.write_text(json.dumps({"key": {"model": TINY, "precision": "fp8"}, "amax": {"x": 1.0}}))
    with pytest.raises(CheckpointError, match="does not say which embodiment"):
        load_calibration(legacy, CalibrationKey(TINY, "gr1", 20, "fp8"))


def _relative_checkpoint(tmp_path, action_type="non_eef", with_stats=True, steps=None):
    out = write_random_groot_checkpoint(tmp_path / "c", TINY)
    proc = json.loads((out / "processor_config.json").read_text())
    proc["processor_kwargs"]["use_relative_action"] = True
    action = proc["processor_kwargs"]["modality_configs"]["new_embodiment"]["action"]
    action["action_configs"][0].update(rep="RELATIVE", type=action_type.upper(), state_key="single_arm")
    (out / "processor_config.json").write_text(json.dumps(proc))
    stats = json.loads((out / STATISTICS_FILE).read_text())
    if with_stats:
        lo = np.full((steps, 5), -0.1) if steps else np.full(5, -0.1)
        stats["new_embodiment"]["relative_action"] = {"single_arm": {"min": lo.tolist(), "max": (-lo).tolist(),
                                                                     "mean": (0 * lo).tolist(),
                                                                     "std": (1 - lo).tolist()}}
    (out / STATISTICS_FILE).write_text(json.dumps(stats))
    return out


@pytest.mark.parametrize("steps", [None, 16])
def test_relative_joint_actions_are_added_to_the_state(tmp_path, steps):
    out = _relative_checkpoint(tmp_path, steps=steps)
    emb = load_embodiment(out, "new_embodiment", 16, 16)
    assert emb.action[0].relative_to == "single_arm" and emb.action[1].relative_to is None
    acts = np.zeros((16, 16))
    acts[:, 0] = 1.0                                    # the top of the relative range: +0.1
    state = {"single_arm": np.arange(5) * 0.5, "gripper": [0.3]}
    robot = emb.unnormalize_actions(acts, state)
    np.testing.assert_allclose(robot[:, 0], 0.1 + 0.0, atol=1e-6)
    np.testing.assert_allclose(robot[:, 1:5], np.broadcast_to(state["single_arm"][1:], (16, 4)), atol=1e-6)
    absolute = emb.action[1]
    np.testing.assert_allclose(robot[:, 5], (absolute.lo + absolute.hi)[0] / 2, rtol=1e-6)   # gripper: absolute
    pol = load_model(out, config=TINY, embodiment="new_embodiment", device="cpu")
    rng = np.random.default_rng(0)
    images = {v: rng.integers(0, 256, (56, 56, 3), dtype=np.uint8) for v in pol.view_names}
    far = pol.predict(images, "pick", {"single_arm": np.full(5, 50.0), "gripper": [0.0]}, np.zeros((16, 16)))
    assert (np.abs(far[:, :5] - 50.0) <= 0.1 + 1e-5).all()      # within the relative range around the state


RZ90_ROT6D = [0.0, -1.0, 0.0, 1.0, 0.0, 0.0]          # the first two rows of a 90-degree turn about z


@pytest.mark.parametrize("fmt", ["XYZ_ROT6D", "xyz+rot6d"])
def test_relative_end_effector_actions_are_composed_onto_the_state_pose(tmp_path, fmt):
    """An EEF group (xyz+rot6d) relative to the end-effector state: the relative statistics' midpoint (5 cm along
    the pose's own x, no turn) lands 5 cm along the world's y for an end effector turned 90 degrees about z, with
    its turn kept; the gripper stays absolute."""
    robots = {"new_embodiment": {"views": ["front"], "state": [("eef", 9), ("gripper", 1)],
                                 "action": [("eef", 9), ("gripper", 1)]}}
    out = write_random_groot_checkpoint(tmp_path / "c", TINY, embodiments=robots)
    proc = json.loads((out / "processor_config.json").read_text())
    proc["processor_kwargs"]["use_relative_action"] = True
    action = proc["processor_kwargs"]["modality_configs"]["new_embodiment"]["action"]
    action["action_configs"][0].update(rep="RELATIVE", type="EEF", format=fmt, state_key="eef")
    (out / "processor_config.json").write_text(json.dumps(proc))
    stats = json.loads((out / STATISTICS_FILE).read_text())
    mid = np.array([0.05, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0])
    stats["new_embodiment"]["relative_action"] = {"eef": {"min": (mid - 0.1).tolist(), "max": (mid + 0.1).tolist(),
                                                          "mean": mid.tolist(), "std": np.ones(9).tolist()}}
    (out / STATISTICS_FILE).write_text(json.dumps(stats))
    emb = load_embodiment(out, "new_embodiment", 16, 16)
    assert (emb.action[0].relative_to, emb.action[0].pose_format) == ("eef", "xyz+rot6d")
    state = {"eef": np.array([0.3, 0.1, 0.5] + RZ90_ROT6D), "gripper": [0.2]}
    robot = emb.unnormalize_actions(np.zeros((16, 16)), state)
    np.testing.assert_allclose(robot[:, :9], np.broadcast_to([0.3, 0.15, 0.5] + RZ90_ROT6D, (16, 9)), atol=1e-6)
    gripper = emb.action[1]
    np.testing.assert_allclose(robot[:, 9], (gripper.lo + gripper.hi)[0] / 2, rtol=1e-6)
    action["action_configs"][0].update(format="XYZ_ROTVEC")            # 9 values are not a rotation vector pose
    (out / "processor_config.json").write_text(json.dumps(proc))
    with pytest.raises(CheckpointError, match="has format 'XYZ_ROTVEC' and 9 values"):
        load_embodiment(out, "new_embodiment", 16, 16)


def test_relative_settings_refused_or_required(tmp_path):
    with pytest.raises(CheckpointError, match="has format 'DEFAULT' and 5 values; the reference composes"):
        load_embodiment(_relative_checkpoint(tmp_path / "a", action_type="eef"), "new_embodiment", 16, 16)
    with pytest.raises(CheckpointError, match=r"lack relative_action\.single_arm"):
        load_embodiment(_relative_checkpoint(tmp_path / "b", with_stats=False), "new_embodiment", 16, 16)
    with pytest.raises(CheckpointError, match="fewer steps than its action horizon 16"):
        load_embodiment(_relative_checkpoint(tmp_path / "c", steps=8), "new_embodiment", 16, 16)
    out = _relative_checkpoint(tmp_path / "d")
    (out / "processor_config.json").unlink()
    with pytest.raises(CheckpointError, match=r"processor_config\.json is missing"):
        load_embodiment(out, "new_embodiment", 16, 16)


def test_joint_groups_wider_than_the_model(tmp_path):
    robots = {"new_embodiment": {"views": ["front"], "state": [("arm", 12), ("hand", 6)], "action": [("arm", 6)]}}
    out = write_random_groot_checkpoint(tmp_path / "c", TINY, embodiments=robots)
    with pytest.raises(CheckpointError, match=r"state 18 / action 6 values exceed the model's max_state_dim=16"):
        load_model(out, config=TINY, embodiment="new_embodiment", device="cpu")
