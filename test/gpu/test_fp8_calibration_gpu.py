"""FP8 through the public API on a GPU: load_model(precision="fp8") refuses predict until Policy.calibrate ran on
real observations, the warm-up captures the FP8 graphs before the calibration and keeps them (the scales are
written in place: a graph captured with placeholder scales then gives bitwise the actions of one captured after
the calibration), and the accuracy gate after the calibration passes on full-size pi0.5. Skips without CUDA.

Full-size checkpoints are generated once (flashrt_core.fixtures) into $FLASHRT_FULL_CKPT_ROOT/<config> (default:
$FLASHRT_CACHE_DIR/full), as test_engine_gpu.py does."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

import flashrt_core
from flashrt_core import Fp8NotCalibrated
from flashrt_core.engine import EngineOptions
from flashrt_core.engine.gate import GATE_FP8
from flashrt_core.fixtures import CONFIG_FILE, write_random_checkpoint

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PROMPT = "pick up the red block and put it in the bowl"


def _checkpoint(name: str) -> Path:
    root = Path(os.environ.get("FLASHRT_FULL_CKPT_ROOT")
                or Path(os.environ.get("FLASHRT_CACHE_DIR", Path.home() / ".cache" / "flashrt")) / "full")
    path = root / name
    if not (path / CONFIG_FILE).is_file():
        write_random_checkpoint(path, name, seed=0)
    return path


def _observation(policy, seed: int):
    rng = np.random.default_rng(seed)
    images = [rng.integers(0, 256, (480, 640, 3), dtype=np.uint8) for _ in range(2)]
    return images, PROMPT, rng.uniform(-1, 1, policy.state_dim).astype(np.float32)


def test_fp8_policy_calibrates_after_its_warm_up_and_keeps_the_captured_graphs(tmp_path):
    options = EngineOptions(tuning_cache=str(tmp_path / "tuning"))      # both loads run the same kernels
    warmed = flashrt_core.load_model(_checkpoint("pi05"), device="cuda", precision="fp8", engine_options=options)
    assert warmed.precision == "fp8" and warmed.executor.name.endswith("-fp8") and not warmed.fp8_calibrated
    images, prompt, state = _observation(warmed, 0)
    with pytest.raises(Fp8NotCalibrated):
        warmed.predict(images, prompt, state)
    assert warmed.warm_up_text_buckets(images, prompt, state)
    graphs = {key: entry.graph for key, entry in warmed.executor._entries.items()}
    assert graphs and all(g is not None for g in graphs.values())
    calibration = [_observation(warmed, seed) for seed in range(1, 5)]
    held_out = [_observation(warmed, seed) for seed in (10, 11)]
    report = warmed.calibrate(calibration, held_out=held_out)
    assert report.observations == 4 and report.scales["gemms"] == 2 * (warmed.config.paligemma.depth - 1)
    assert report.gate == GATE_FP8 and min(report.gate_cosines) >= GATE_FP8, report.summary()
    noise = np.random.default_rng(5).standard_normal((warmed.horizon, 32)).astype(np.float32)
    got = warmed.predict(*_observation(warmed, 20), noise=noise)
    assert {key: entry.graph for key, entry in warmed.executor._entries.items()} == graphs    # none re-captured
    fresh = flashrt_core.load_model(_checkpoint("pi05"), device="cuda", precision="fp8", engine_options=options)
    assert fresh.executor.tuning_source == "cache"
    fresh.calibrate(calibration)                                       # no warm-up: captured after calibration
    want = fresh.predict(*_observation(fresh, 20), noise=noise)
    np.testing.assert_array_equal(got, want)


def test_fp8_is_refused_on_the_reference_path():
    with pytest.raises(ValueError, match="hardware='reference'"):
        flashrt_core.load_model(None, device="cuda", hardware="reference", precision="fp8")
