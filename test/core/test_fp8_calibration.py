"""FP8 precision and calibration through the public API, on the CPU: load_model's precision (one mapping to the
engine's option, conflicts refused, FP8 refused where it cannot run), Policy.calibrate on real observations (predict
refused before, warm-up allowed, amax = max over the observations, the scales in the FP8 layers, the gate after),
and the scale cache keyed by the checkpoint's weight content. The FP8 engine runs eagerly on the CPU
(fp8_testing.py); its speed and the full-size gate are GPU checks (test/gpu/test_fp8_calibration_gpu.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import flashrt_core
from flashrt_core import Fp8GateError, Fp8NotCalibrated
from flashrt_core.api import resolve_precision
from flashrt_core.engine import EngineOptions
from flashrt_core.engine.fp8 import CALIB_MARGIN, wide_linears
from flashrt_core.engine.fp8_calibration import checkpoint_digest
from flashrt_core.engine.gate import cosine
from flashrt_core.fixtures import write_random_checkpoint
from fp8_testing import cpu_engine_policy

CUDA = torch.device("cuda")     # only compared by type: no GPU is touched


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt") / "pi05"
    write_random_checkpoint(path, "pi05_tiny", seed=0)
    return path


@pytest.fixture(scope="module")
def base(ckpt):
    return flashrt_core.load_model(ckpt, device="cpu")


def _observation(policy, seed: int, prompt: str = "pick up the cube"):
    rng = np.random.default_rng(seed)
    size = policy.config.vision.image_size
    images = {view: rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for view in policy.view_names[:2]}
    return images, prompt, rng.uniform(-1, 1, policy.state_dim).astype(np.float32)


def test_precision_maps_to_the_dtype_and_the_engine_option_in_one_place(monkeypatch):
    monkeypatch.delenv("FLASHRT_FP8", raising=False)
    monkeypatch.delenv("FLASHRT_DISABLE_FP8", raising=False)
    dtype, options, fp8 = resolve_precision("fp8", None, EngineOptions(text_buckets=(32,)), CUDA, "auto")
    assert (dtype, options.fp8, options.text_buckets, fp8) == (torch.bfloat16, True, (32,), True)
    dtype, options, fp8 = resolve_precision("bf16", None, None, CUDA, "auto")
    assert (dtype, options.fp8, fp8) == (torch.bfloat16, False, False)
    assert resolve_precision(None, "float16", None, CUDA, "auto") == ("float16", None, False)
    with pytest.raises(ValueError, match="conflicts with FP8 asked by engine_options.fp8=True or FLASHRT_FP8=1"):
        resolve_precision("bf16", None, EngineOptions(fp8=True), CUDA, "auto")
    with pytest.raises(ValueError, match="computes in torch.bfloat16 but dtype='float32'"):
        resolve_precision("fp8", "float32", None, CUDA, "auto")
    with pytest.raises(ValueError, match="fast paths off"):
        resolve_precision("fp8", None, EngineOptions(fast_paths=False), CUDA, "auto")
    with pytest.raises(ValueError, match="unsupported precision 'int4'"):
        resolve_precision("int4", None, None, CUDA, "auto")
    monkeypatch.setenv("FLASHRT_FP8", "1")
    with pytest.raises(ValueError, match="conflicts with FP8"):
        resolve_precision("fp32", None, None, CUDA, "auto")
    monkeypatch.setenv("FLASHRT_FP8", "0")
    with pytest.raises(ValueError, match="FLASHRT_FP8=0 turn FP8 off"):
        resolve_precision("fp8", None, None, CUDA, "auto")


def test_fp8_is_refused_on_the_cpu_and_the_reference_path_naming_why(ckpt):
    with pytest.raises(ValueError, match=r"precision='fp8' cannot run on device cpu: FP8 runs in the graph engine "
                                         r"on a CUDA GPU with FP8 tensor cores"):
        flashrt_core.load_model(ckpt, device="cpu", precision="fp8")
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="hardware='reference'"):
            flashrt_core.load_model(ckpt, device="cuda", hardware="reference", precision="fp8")
    policy = flashrt_core.load_model(ckpt, device="cpu", precision="fp32")
    assert policy.precision == "float32" and not policy.fp8 and not policy.fp8_calibrated
    with pytest.raises(ValueError, match="calibrate is for an FP8 policy"):
        policy.calibrate([_observation(policy, 0)])


def test_predict_is_refused_until_calibration_on_real_observations(base):
    policy = cpu_engine_policy(base)
    assert policy.precision == "fp8" and not policy.fp8_calibrated
    images, prompt, state = _observation(policy, 0)
    with pytest.raises(Fp8NotCalibrated, match="calibrate it on real observations first"):
        policy.predict(images, prompt, state)
    # the warm-up captures (on a GPU) with placeholder scales, and calibrates nothing
    assert policy.warm_up_text_buckets(images, prompt, state) == list(policy.executor.text_buckets)
    with policy.warming_up():
        policy.predict(images, prompt, state)
    assert not policy.fp8_calibrated
    with pytest.raises(Fp8NotCalibrated):
        policy.predict(images, prompt, state)


def test_calibration_takes_the_max_amax_over_the_observations_and_sets_the_scales(base):
    observations = [_observation(base, seed, prompt) for seed, prompt in
                    ((1, "pick up the cube"), (2, "open the drawer"), (3, "stack the red block on the blue one"))]
    singles = []
    for obs in observations:
        alone = cpu_engine_policy(base)
        report = alone.calibrate([obs])
        singles.append([lin.fp8.x_amax for lin in wide_linears(alone.executor.weights)])
        assert report.observations == 1 and report.source == "measured"
    policy = cpu_engine_policy(base)
    report = policy.calibrate(observations)
    lins = wide_linears(policy.executor.weights)
    amax = [lin.fp8.x_amax for lin in lins]
    np.testing.assert_array_equal(amax, np.max(singles, axis=0))
    assert len(set(map(tuple, singles))) == 3                      # the observations differ where it counts
    # gate/up and down of every backbone layer but the last (its MLP output feeds no key or value)
    assert report.observations == 3 and report.scales["gemms"] == len(lins) == 2 * (policy.config.paligemma.depth - 1)
    assert report.scales["amax_max"] == max(amax) and report.scales["amax_min"] == min(amax)
    assert list(report.amax) == amax
    fmax = torch.finfo(torch.float8_e4m3fn).max
    for lin, a in zip(lins, amax):
        assert lin.fp8.x_scale.item() == pytest.approx(a * CALIB_MARGIN / fmax, rel=1e-6)
        assert lin.fp8.x_inv.item() == pytest.approx(fmax / (a * CALIB_MARGIN), rel=1e-6)
    assert policy.fp8_calibrated and policy.calibration is report
    bf16 = cpu_engine_policy(base, fp8=False)
    images, prompt, state = _observation(base, 9)
    noise = np.random.default_rng(0).standard_normal((base.horizon, 32)).astype(np.float32)
    assert cosine(policy.predict(images, prompt, state, noise), bf16.predict(images, prompt, state, noise)) > 0.999


def test_the_gate_after_calibration_compares_fp8_with_bf16_on_held_out_observations(base):
    policy = cpu_engine_policy(base)
    calibration = [_observation(base, s) for s in range(2)]
    held_out = [{"images": _observation(base, s)[0], "prompt": "open the drawer", "state": _observation(base, s)[2]}
                for s in (10, 11)]
    report = policy.calibrate(calibration, held_out=held_out)
    assert len(report.gate_cosines) == 2 and report.gate == 0.998
    assert all(0.998 <= c < 1.0 for c in report.gate_cosines), report.gate_cosines   # FP8 differs, within the gate
    assert "gate: cosine vs bf16 min" in report.summary()
    strict = cpu_engine_policy(base)
    with pytest.raises(Fp8GateError, match="FP8 accuracy gate failed after calibration"):
        strict.calibrate(calibration, held_out=held_out, gate=1.0)


def test_the_scale_cache_follows_the_weights_content_not_the_folder_name(tmp_path):
    folder = tmp_path / "robot_policy"
    write_random_checkpoint(folder, "pi05_tiny", seed=0)
    cache = tmp_path / "scales"
    base = flashrt_core.load_model(folder, device="cpu")
    observations = [_observation(base, s) for s in range(2)]
    first = cpu_engine_policy(base, checkpoint_dir=folder).calibrate(observations, scale_cache=cache)
    assert first.source == "measured" and first.cache_path is not None
    entry = json.loads(open(first.cache_path).read())
    assert entry["key"]["checkpoint_sha256"] == checkpoint_digest(folder) == first.checkpoint_sha256
    again = cpu_engine_policy(base, checkpoint_dir=folder)
    second = again.calibrate(observations, scale_cache=cache)
    assert second.source == "cache" and second.cache_path == first.cache_path and again.fp8_calibrated
    assert [lin.fp8.x_amax for lin in wide_linears(again.executor.weights)] == entry["amax"]
    other_obs = cpu_engine_policy(base, checkpoint_dir=folder).calibrate(observations[:1], scale_cache=cache)
    assert other_obs.source == "measured" and other_obs.cache_path != first.cache_path
    # another checkpoint written into the same folder: other weights, other key
    write_random_checkpoint(folder, "pi05_tiny", seed=1)
    other = flashrt_core.load_model(folder, device="cpu")
    third = cpu_engine_policy(other, checkpoint_dir=folder).calibrate(observations, scale_cache=cache)
    assert third.source == "measured" and third.checkpoint_sha256 != first.checkpoint_sha256
    assert third.cache_path != first.cache_path
    assert len(list(cache.glob("fp8-scales-*.json"))) == 3
