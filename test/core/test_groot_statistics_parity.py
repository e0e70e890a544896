"""GR00T state / action normalization against the reference's StateActionProcessor (min/max with clipping,
mean/std, sin/cos state encoding, relative joint actions with per-step statistics, relative end-effector poses),
on fixture statistics.
Runs where groot_reference can import it (FLASHRT_GROOT_SOURCE, plus scipy); skips with the reason elsewhere."""

import json

import numpy as np
import pytest

import groot_reference
from flashrt_core.groot_fixtures import write_random_groot_checkpoint
from flashrt_core.groot_statistics import STATISTICS_FILE, load_embodiment

PROCESSOR, REASON = groot_reference.state_action_processor_class()
pytestmark = pytest.mark.skipif(PROCESSOR is None, reason=str(REASON))
TINY = "groot_n1.6_tiny"
ROBOT = {"views": ["front"], "state": [("arm", 5), ("wrist_angle", 2), ("torso", 3)],
         "action": [("arm", 5), ("torso", 3), ("gripper", 1)]}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    out = write_random_groot_checkpoint(tmp_path_factory.mktemp("sap") / "c", TINY, seed=9,
                                        embodiments={"new_embodiment": ROBOT})
    proc = json.loads((out / "processor_config.json").read_text())
    kw = proc["processor_kwargs"]
    kw.update(apply_sincos_state_encoding=True, use_relative_action=True)
    m = kw["modality_configs"]["new_embodiment"]
    m["state"].update(sin_cos_embedding_keys=["wrist_angle"], mean_std_embedding_keys=["torso"])
    m["action"]["mean_std_embedding_keys"] = ["torso"]
    m["action"]["action_configs"][0].update(rep="RELATIVE", state_key="arm")
    (out / "processor_config.json").write_text(json.dumps(proc))
    stats = json.loads((out / STATISTICS_FILE).read_text())
    rng = np.random.default_rng(3)
    lo = -0.05 - 0.1 * rng.random((16, 5))
    stats["new_embodiment"]["relative_action"] = {"arm": {"min": lo.tolist(), "max": (-lo).tolist(),
                                                          "mean": np.zeros((16, 5)).tolist(),
                                                          "std": np.ones((16, 5)).tolist()}}
    (out / STATISTICS_FILE).write_text(json.dumps(stats))
    return out, kw, stats


def reference(kw, stats):
    ref = PROCESSOR(modality_configs=kw["modality_configs"], statistics=stats, use_percentiles=False,
                    clip_outliers=True, apply_sincos_state_encoding=True, use_relative_action=True)
    ref.eval()
    return ref


def test_state_normalization(ckpt):
    out, kw, stats = ckpt
    emb = load_embodiment(out, "new_embodiment", 16, 16)
    rng = np.random.default_rng(0)
    state = {"arm": rng.uniform(-3, 3, 5), "wrist_angle": rng.uniform(-3, 3, 2), "torso": rng.uniform(-1, 1, 3)}
    theirs = reference(kw, stats).apply_state({k: v[None] for k, v in state.items()}, "new_embodiment")
    theirs = np.concatenate([theirs[k][0] for k in ("arm", "wrist_angle", "torso")])
    mine = emb.normalize_state(state, 16)
    assert theirs.shape == (5 + 4 + 3,)
    np.testing.assert_allclose(mine[:12], theirs, rtol=1e-6, atol=1e-6)
    assert (mine[12:] == 0).all()


def test_action_unnormalization_with_relative_joints(ckpt):
    out, kw, stats = ckpt
    emb = load_embodiment(out, "new_embodiment", 16, 16)
    rng = np.random.default_rng(1)
    normalized = rng.uniform(-1.3, 1.3, (16, 16))
    state = {"arm": rng.uniform(-1, 1, 5), "wrist_angle": rng.uniform(-1, 1, 2), "torso": rng.uniform(-1, 1, 3)}
    groups, start = {}, 0
    for name, dim in (("arm", 5), ("torso", 3), ("gripper", 1)):
        groups[name] = normalized[:, start:start + dim]
        start += dim
    theirs = reference(kw, stats).unapply_action(groups, "new_embodiment", state={k: v[None] for k, v in state.items()})
    theirs = np.concatenate([theirs[k] for k in ("arm", "torso", "gripper")], axis=-1)
    mine = emb.unnormalize_actions(normalized, state)
    assert mine.shape == theirs.shape == (16, 9)
    np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fmt, dim", [("XYZ_ROT6D", 9), ("XYZ_ROTVEC", 6)])
def test_action_unnormalization_with_relative_end_effector_poses(tmp_path, fmt, dim):
    """A relative EEF group (flashrt_core/eef_poses.py) against the reference's EndEffectorActionChunk: the
    unnormalized relative poses composed onto a random end-effector state pose, for both pose formats."""
    robot = {"views": ["front"], "state": [("eef", dim), ("gripper", 1)], "action": [("eef", dim), ("gripper", 1)]}
    out = write_random_groot_checkpoint(tmp_path / "c", TINY, seed=4, embodiments={"new_embodiment": robot})
    proc = json.loads((out / "processor_config.json").read_text())
    kw = proc["processor_kwargs"]
    kw.update(use_relative_action=True)
    kw["modality_configs"]["new_embodiment"]["action"]["action_configs"][0].update(rep="RELATIVE", type="EEF",
                                                                                   format=fmt, state_key="eef")
    (out / "processor_config.json").write_text(json.dumps(proc))
    stats = json.loads((out / STATISTICS_FILE).read_text())
    rng = np.random.default_rng(5)
    mid = np.concatenate([rng.uniform(-0.05, 0.05, 3), [1.0, 0.0, 0.0, 0.0, 1.0, 0.0] if dim == 9
                          else rng.uniform(-0.2, 0.2, 3)])
    stats["new_embodiment"]["relative_action"] = {"eef": {"min": (mid - 0.1).tolist(), "max": (mid + 0.1).tolist(),
                                                          "mean": mid.tolist(), "std": np.ones(dim).tolist()}}
    (out / STATISTICS_FILE).write_text(json.dumps(stats))
    emb = load_embodiment(out, "new_embodiment", 16, 16)
    angle = rng.uniform(-2.5, 2.5, 3)
    from flashrt_core.eef_poses import matrix_to_rot6d, rotvec_to_matrix
    pose = matrix_to_rot6d(rotvec_to_matrix(angle)) if dim == 9 else angle
    state = {"eef": np.concatenate([rng.uniform(-0.5, 0.5, 3), pose]), "gripper": rng.uniform(0, 1, 1)}
    normalized = rng.uniform(-1, 1, (16, 16))
    groups = {"eef": normalized[:, :dim], "gripper": normalized[:, dim:dim + 1]}
    ref = PROCESSOR(modality_configs=kw["modality_configs"], statistics=stats, use_percentiles=False,
                    clip_outliers=True, apply_sincos_state_encoding=False, use_relative_action=True)
    ref.eval()
    theirs = ref.unapply_action(groups, "new_embodiment", state={k: v[None] for k, v in state.items()})
    theirs = np.concatenate([theirs["eef"], theirs["gripper"]], axis=-1)
    mine = emb.unnormalize_actions(normalized, state)
    assert mine.shape == theirs.shape == (16, dim + 1)
    np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
