"""tools/benchmark_text_buckets.py: its bucket grid is the one the engine builds (every bucket below max_token_len
kept, max_token_len added), its table compares each bucket with the max_token_len one, and without a GPU it stops
with a message instead of timing. The GPU numbers come from the device."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tools"))

import benchmark_text_buckets as bench  # noqa: E402

from flashrt_core.checkpoint import load_model_weights  # noqa: E402
from flashrt_core.config import get_config  # noqa: E402
from flashrt_core.engine import EngineOptions, resolve  # noqa: E402
from flashrt_core.engine.graph_executor import EngineExecutor  # noqa: E402
from flashrt_core.engine.hardware import CPU  # noqa: E402
from flashrt_core.fixtures import write_random_checkpoint  # noqa: E402


def test_bucket_grid_is_every_step_then_max_token_len():
    assert bench.bucket_grid(16, 200) == [16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 200]
    assert bench.bucket_grid(50, 200) == [50, 100, 150, 200]
    with pytest.raises(ValueError, match="step must be positive"):
        bench.bucket_grid(0, 200)


def test_the_engine_keeps_exactly_the_grid_as_its_buckets_and_tunes_at_a_typical_prompts(tmp_path):
    """Its buckets are the grid; the load-time tunings (and their cache key) use the bucket of a 48-token prompt,
    not the smallest bucket, or a finer grid would tune at a prompt no one sends."""
    cfg = get_config("pi05_tiny")
    ckpt = write_random_checkpoint(tmp_path / "ckpt", "pi05_tiny")
    model = load_model_weights(ckpt, cfg, torch.device("cpu"), torch.float32)
    for step, tuning_bucket in ((8, 48), (20, 60), (64, 64)):
        grid = bench.bucket_grid(step, cfg.max_token_len)
        engine = EngineExecutor(model, cfg, torch.device("cpu"),
                                resolve(CPU, EngineOptions(text_buckets=tuple(grid))))
        assert list(engine.text_buckets) == grid
        assert engine.tuning_text_bucket == tuning_bucket
        assert engine.tuning_key(torch.float32)["text_bucket"] == tuning_bucket


def test_markdown_compares_each_bucket_with_the_last():
    env = {"gpu": "NVIDIA H200", "time_utc": "t", "driver": "d", "torch": "2", "cuda": "13", "triton": "3"}
    args = SimpleNamespace(config="pi05", views=2, horizon=10, rounds=5, reps=40)
    rows = [{"bucket": 144, "prefix_tokens": 656, "replay_ms": 10.5, "capture_s": 0.8},
            {"bucket": 200, "prefix_tokens": 712, "replay_ms": 11.0, "capture_s": 0.9}]
    text = bench.markdown(env, args, {"bf16": rows})
    assert "| 144 | 656 | 10.500 | -0.500 | 0.80 |" in text
    assert "| 200 | 712 | 11.000 | +0.000 | 0.90 |" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU exit")
def test_without_a_gpu_it_stops_with_a_message():
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        bench.main([])
