"""GR00T state / action normalization against the reference's StateActionProcessor (min/max with clipping,
mean/std, sin/cos state encoding, relative joint actions with per-step statistics), on fixture statistics.
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
