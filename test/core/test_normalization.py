"""Norm stats: openpi / lerobot file formats, (un)normalization formulas, padding and slicing."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from flashrt_core.errors import CheckpointError, InputError
from flashrt_core.normalization import (
    LEROBOT_POST_FILE,
    LEROBOT_PRE_FILE,
    FeatureStats,
    Normalizer,
    NormStats,
    load_norm_stats,
    pad_to,
    random_norm_stats,
)

ROUND_TRIP_ATOL = 1e-5  # float32 results of float64 arithmetic
FLOAT32_RTOL = 1e-6  # values stored as float32 (lerobot safetensors)


def assert_stats_equal(a: NormStats, b: NormStats, rtol: float = 0.0) -> None:
    for key in ("state", "actions"):
        fa, fb = getattr(a, key), getattr(b, key)
        assert (fa is None) == (fb is None), key
        if fa is None:
            continue
        for name in ("mean", "std", "q01", "q99"):
            np.testing.assert_allclose(getattr(fa, name), getattr(fb, name), rtol=rtol, atol=0, err_msg=f"{key}.{name}")


@pytest.fixture()
def stats() -> NormStats:
    return random_norm_stats(state_dim=8, action_dim=7, seed=0)


def test_random_norm_stats_are_plausible_and_seeded(stats):
    assert stats.state.dim == 8 and stats.actions.dim == 7
    for _, f in stats.items():
        assert (f.std > 0).all() and (f.q01 < f.mean).all() and (f.mean < f.q99).all()
    assert_stats_equal(stats, random_norm_stats(8, 7, seed=0))
    assert not np.allclose(stats.state.mean, random_norm_stats(8, 7, seed=1).state.mean)


def test_known_values_zscore_and_quantile():
    f = FeatureStats(mean=[1.0, 2.0], std=[0.5, 2.0], q01=[-1.0, 0.0], q99=[3.0, 10.0])
    s = NormStats(state=f, actions=f)
    z = Normalizer(s, "zscore").normalize_state(np.array([2.0, 2.0]))
    np.testing.assert_allclose(z, [1.0 / (0.5 + 1e-6), 0.0], rtol=1e-7)
    q = Normalizer(s, "quantile").normalize_state(np.array([-1.0, 10.0]))
    np.testing.assert_allclose(q, [-1.0, 10.0 / (10.0 + 1e-6) * 2 - 1], rtol=1e-7)
    q_mid = Normalizer(s, "quantile").normalize_state(np.array([1.0, 5.0]))
    np.testing.assert_allclose(q_mid, [0.0, 0.0], atol=1e-6)
    a = Normalizer(s, "quantile").unnormalize_actions(np.array([[1.0, -1.0]]))
    np.testing.assert_allclose(a, [[3.0 + 1e-6, 0.0]], rtol=1e-7)


@pytest.mark.parametrize("mode", ["zscore", "quantile"])
def test_round_trip(mode):
    f = random_norm_stats(7, 7, seed=4).actions
    normalizer = Normalizer(NormStats(state=f, actions=f), mode)
    x = np.random.default_rng(5).normal(f.mean, f.std, (50, 7)).astype(np.float32)
    back = normalizer.unnormalize_actions(np.stack([normalizer.normalize_state(row) for row in x]))
    assert back.dtype == np.float32
    np.testing.assert_allclose(back, x, atol=ROUND_TRIP_ATOL)


def test_state_stats_are_sliced_to_the_state_length(stats):
    normalizer = Normalizer(stats, "quantile")
    full = normalizer.normalize_state(np.arange(8, dtype=np.float32))
    np.testing.assert_array_equal(normalizer.normalize_state(np.arange(5, dtype=np.float32)), full[:5])
    with pytest.raises(InputError, match="state has 9 values but the norm stats cover only 8"):
        normalizer.normalize_state(np.zeros(9))


def test_model_width_actions_beyond_stats_follow_openpi(stats):
    x = np.random.default_rng(6).normal(size=(10, 32))  # model output, 7 real action dims
    q = Normalizer(stats, "quantile").unnormalize_actions(x)
    np.testing.assert_allclose(q[:, 7:], x[:, 7:].astype(np.float32))  # untouched
    z = Normalizer(stats, "zscore").unnormalize_actions(x)
    np.testing.assert_allclose(z[:, 7:], (x[:, 7:] * (1 + 1e-6)).astype(np.float32))  # std padded with 1
    sliced = Normalizer(stats, "quantile").unnormalize_actions(x, action_dim=7)
    assert sliced.shape == (10, 7)
    np.testing.assert_array_equal(sliced, q[:, :7])
    with pytest.raises(InputError, match="action_dim 40 exceeds"):
        Normalizer(stats, "quantile").unnormalize_actions(x, action_dim=40)


@pytest.mark.parametrize("mode", ["zscore", "quantile"])
def test_action_affine_equals_unnormalize(stats, mode):
    normalizer = Normalizer(stats, mode)
    x = np.random.default_rng(7).normal(size=(10, 32))
    scale, offset = normalizer.action_affine(32)
    np.testing.assert_allclose(x * scale + offset, normalizer.unnormalize_actions(x), rtol=1e-6, atol=1e-6)


def test_none_stats_is_identity():
    normalizer = Normalizer(None, "quantile")
    x = np.array([0.5, -3.0, 7.0])
    np.testing.assert_array_equal(normalizer.normalize_state(x), x.astype(np.float32))
    np.testing.assert_array_equal(normalizer.unnormalize_actions(x[None]), x[None].astype(np.float32))
    scale, offset = normalizer.action_affine(4)
    assert scale.tolist() == [1.0] * 4 and offset.tolist() == [0.0] * 4


def test_pad_to():
    padded = pad_to(np.ones((2, 3)), 32)
    assert padded.shape == (2, 32) and padded.dtype == np.float32
    assert (padded[:, :3] == 1).all() and (padded[:, 3:] == 0).all()
    assert Normalizer.pad_to(np.ones(8), 32).shape == (32,)
    with pytest.raises(InputError, match="cannot pad"):
        pad_to(np.ones(33), 32)


def test_quantile_mode_needs_quantiles():
    f = FeatureStats(mean=[0.0], std=[1.0])
    Normalizer(NormStats(state=f), "zscore")
    with pytest.raises(CheckpointError, match="quantile normalization needs q01/q99, the 'state' statistics"):
        Normalizer(NormStats(state=f), "quantile")
    with pytest.raises(ValueError, match="unknown normalization mode 'minmax'"):
        Normalizer(None, "minmax")


def test_openpi_json_round_trip_and_format(tmp_path, stats):
    path = stats.save_openpi(tmp_path)
    assert path == tmp_path / "norm_stats.json"
    body = json.loads(path.read_text())["norm_stats"]
    assert set(body) == {"state", "actions"} and set(body["state"]) == {"mean", "std", "q01", "q99"}
    assert_stats_equal(load_norm_stats(tmp_path), stats)  # exact: JSON keeps float64 digits


def test_openpi_assets_layout(tmp_path, stats):
    stats.save_openpi(tmp_path / "assets" / "physical-intelligence" / "libero" / "norm_stats.json")
    assert_stats_equal(load_norm_stats(tmp_path), stats)
    other = random_norm_stats(8, 7, seed=9)
    other.save_openpi(tmp_path / "assets" / "droid")
    with pytest.raises(CheckpointError, match="several norm_stats.json.*choose one with asset_id"):
        load_norm_stats(tmp_path)
    assert_stats_equal(load_norm_stats(tmp_path, asset_id="droid"), other)
    assert_stats_equal(load_norm_stats(tmp_path, asset_id="physical-intelligence/libero"), stats)
    with pytest.raises(CheckpointError, match="no norm_stats.json for asset id 'bridge'"):
        load_norm_stats(tmp_path, asset_id="bridge")


def test_openpi_json_without_quantiles_loads_for_zscore(tmp_path):
    (tmp_path / "norm_stats.json").write_text(
        json.dumps({"norm_stats": {"state": {"mean": [0.5], "std": [2.0], "q01": None, "q99": None}}})
    )
    loaded = load_norm_stats(tmp_path)
    assert loaded.actions is None and not loaded.state.has_quantiles
    np.testing.assert_allclose(Normalizer(loaded, "zscore").normalize_state([2.5]), [2.0 / (2.0 + 1e-6)], rtol=1e-7)


def test_lerobot_round_trip_and_format(tmp_path, stats):
    written = stats.save_lerobot(tmp_path)
    assert [p.name for p in written] == [LEROBOT_PRE_FILE, LEROBOT_POST_FILE]
    pre = load_file(str(tmp_path / LEROBOT_PRE_FILE))
    assert {"observation.state.mean", "observation.state.q99", "action.std", "action.q01"} <= set(pre)
    post = load_file(str(tmp_path / LEROBOT_POST_FILE))
    assert set(post) == {"action.mean", "action.std", "action.q01", "action.q99"}
    assert pre["observation.state.mean"].dtype == np.float32
    assert_stats_equal(load_norm_stats(tmp_path), stats, rtol=FLOAT32_RTOL)


def test_lerobot_stats_with_extra_entries(tmp_path):
    """Real lerobot files also hold min/max/count and image statistics; only state and action are used."""
    f32 = np.float32
    save_file(
        {
            "observation.state.mean": np.array([0.0, 1.0], f32),
            "observation.state.std": np.array([1.0, 2.0], f32),
            "observation.state.min": np.array([-5.0, -5.0], f32),
            "observation.state.q01": np.array([-2.0, -3.0], f32),
            "observation.state.q99": np.array([2.0, 5.0], f32),
            "observation.images.base.mean": np.zeros((3, 1, 1), f32),
            "action.mean": np.array([9.0], f32),
            "action.std": np.array([9.0], f32),
            "action.q01": np.array([9.0], f32),
            "action.q99": np.array([10.0], f32),
        },
        str(tmp_path / "policy_preprocessor_step_3_normalizer_processor.safetensors"),
    )
    post = {"action.mean": [0.1], "action.std": [0.2], "action.q01": [-0.5], "action.q99": [0.5], "action.count": [9]}
    save_file({k: np.array(v, f32) for k, v in post.items()}, str(tmp_path / LEROBOT_POST_FILE))
    loaded = load_norm_stats(tmp_path)
    np.testing.assert_allclose(loaded.state.q99, [2.0, 5.0])
    np.testing.assert_allclose(loaded.actions.q01, [-0.5])  # the unnormalizer's copy is the one applied to outputs


def test_no_stats_returns_none_and_missing_dir_is_an_error(tmp_path):
    assert load_norm_stats(tmp_path) is None
    with pytest.raises(CheckpointError, match="checkpoint directory not found"):
        load_norm_stats(tmp_path / "absent")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "norm_stats.json: not valid JSON"),
        (json.dumps({"stats": {}}), "missing object 'norm_stats'"),
        (json.dumps({"norm_stats": {"image": {}}}), "neither 'state' nor 'actions'"),
        (json.dumps({"norm_stats": {"state": [1, 2]}}), r"norm_stats.state must be an object"),
        (json.dumps({"norm_stats": {"state": {"std": [1.0]}}}), r"norm_stats.state: missing key 'mean'"),
        (
            json.dumps({"norm_stats": {"actions": {"mean": [0, 0], "std": [1, 1], "q01": [0, 0], "q99": [1]}}}),
            r"norm_stats.actions: q99 has 1 values, mean has 2",
        ),
        (json.dumps({"norm_stats": {"state": {"mean": ["a"], "std": [1]}}}), r"norm_stats.state.mean: not a numeric"),
        (json.dumps({"norm_stats": {"state": {"mean": [0], "std": [1], "q01": [0]}}}), "q01 and q99 must be given"),
        (json.dumps({"norm_stats": {"state": {"mean": [0, 0], "std": [1, -1]}}}), r"std has negative values .*\[1\]"),
        (
            json.dumps({"norm_stats": {"state": {"mean": [0], "std": [1], "q01": [2], "q99": [1]}}}),
            r"norm_stats.state: q01 > q99 at indices \[0\]",
        ),
    ],
)
def test_malformed_openpi_files_name_file_and_key(tmp_path, content, message):
    (tmp_path / "norm_stats.json").write_text(content)
    with pytest.raises(CheckpointError, match=message):
        load_norm_stats(tmp_path)


def test_malformed_lerobot_files(tmp_path):
    (tmp_path / LEROBOT_PRE_FILE).write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match=f"{LEROBOT_PRE_FILE}: not a readable safetensors file"):
        load_norm_stats(tmp_path)
    save_file({"action.q01": np.zeros(2, np.float32)}, str(tmp_path / LEROBOT_PRE_FILE))
    with pytest.raises(CheckpointError, match=r"action: missing key 'mean'"):
        load_norm_stats(tmp_path)
    save_file({"observation.images.base.mean": np.zeros(3, np.float32)}, str(tmp_path / LEROBOT_PRE_FILE))
    with pytest.raises(CheckpointError, match="no 'observation.state.\\*' or 'action.\\*' statistics"):
        load_norm_stats(tmp_path)


def processor(directory, name, steps):
    (directory / f"{name}.json").write_text(json.dumps({"name": name, "steps": steps}))


def test_lerobot_statistics_files_are_named_by_the_processor_json(tmp_path, stats):
    """Newer lerobot versions insert steps, so the normalizer's file name comes from the JSON, not a pattern."""
    written = stats.save_lerobot(tmp_path / "src")
    (written[0]).rename(tmp_path / "policy_preprocessor_step_5_normalizer_processor.safetensors")
    (written[1]).rename(tmp_path / "policy_postprocessor_step_0_unnormalizer_processor.safetensors")
    save_file({"action.mean": np.zeros(7, np.float32), "action.std": np.ones(7, np.float32)},
              str(tmp_path / "policy_preprocessor_step_2_normalizer_processor.safetensors"))   # a stale file
    processor(tmp_path, "policy_preprocessor", [{"registry_name": "to_batch_processor", "config": {}}] * 5 + [
        {"registry_name": "normalizer_processor", "config": {},
         "state_file": "policy_preprocessor_step_5_normalizer_processor.safetensors"}])
    processor(tmp_path, "policy_postprocessor", [
        {"registry_name": "unnormalizer_processor", "config": {},
         "state_file": "policy_postprocessor_step_0_unnormalizer_processor.safetensors"}])
    assert_stats_equal(load_norm_stats(tmp_path), stats, rtol=FLOAT32_RTOL)
    (tmp_path / "policy_postprocessor_step_0_unnormalizer_processor.safetensors").unlink()
    with pytest.raises(CheckpointError, match="step 0 names the statistics file policy_postprocessor_step_0_"):
        load_norm_stats(tmp_path)


def test_an_empty_lerobot_normalizer_is_no_statistics_and_says_so(tmp_path):
    from flashrt_core.normalization import locate_norm_stats
    processor(tmp_path, "policy_preprocessor", [{"registry_name": "normalizer_processor", "config": {}}])
    processor(tmp_path, "policy_postprocessor", [{"registry_name": "unnormalizer_processor", "config": {}}])
    assert load_norm_stats(tmp_path) is None
    location = locate_norm_stats(tmp_path)
    assert location.format is None and "policy_preprocessor.json step 0 normalizer_processor" in location.note
    assert "hold no statistics" in location.note
    (tmp_path / "policy_preprocessor.json").write_text("{\"steps\": 3}")
    with pytest.raises(CheckpointError, match="expected a lerobot processor pipeline"):
        load_norm_stats(tmp_path)


def test_several_normalizer_files_without_the_json_are_refused(tmp_path, stats):
    stats.save_lerobot(tmp_path)
    (tmp_path / LEROBOT_PRE_FILE).rename(tmp_path / "policy_preprocessor_step_4_normalizer_processor.safetensors")
    stats.save_lerobot(tmp_path)
    with pytest.raises(CheckpointError, match="several files match .* no normalizer step of policy_preprocessor.json"):
        load_norm_stats(tmp_path)


def test_processor_json_without_normalizer_registry_names_falls_back_to_the_file_names(tmp_path, stats):
    """Steps saved by class path instead of registry name name no normalizer: the files are found by pattern."""
    stats.save_lerobot(tmp_path)
    processor(tmp_path, "policy_preprocessor", [{"class": "my_pkg.MyNormalizer", "config": {},
                                                 "state_file": LEROBOT_PRE_FILE}])
    assert_stats_equal(load_norm_stats(tmp_path), stats, rtol=FLOAT32_RTOL)
