"""tools/benchmark_policy_predict.py on the CPU with a tiny checkpoint: both of its load plans run end to end and
write the rows they name (the CPU executor has nothing to tune, so its tuning column says "none"; the GPU rows
are in docs/benchmarks/)."""

from __future__ import annotations

import json

from flashrt_core.fixtures import write_random_checkpoint
from tools import benchmark_policy_predict as bench


def test_the_default_plan_times_both_resizes(tmp_path, capsys):
    ckpt = write_random_checkpoint(tmp_path / "ckpt", "pi05_tiny", seed=2)
    assert bench.main(["--checkpoint", str(ckpt), "--device", "cpu", "--calls", "2", "--views", "1",
                       "--host-trace", "2", "--out", str(tmp_path / "out")]) == 0
    (result,) = (tmp_path / "out").glob("policy_predict_cpu_*.json")
    rows = json.loads(result.read_text())["rows"]
    assert [(r["gpu_preprocess"], r["tuning"]) for r in rows] == [(False, "none"), (False, "none")]
    assert all(r["load_s"] > 0 and r["median_ms"] > 0 for r in rows)
    # the prompt carries pi0.5's state as text: far more tokens than its words; no graph engine, no bucket
    assert all(r["prompt_tokens"] > 32 and r["text_bucket"] is None for r in rows)
    assert all(r["replay_median_ms"] is None for r in rows)          # no captured graph on the CPU
    assert all(r["host_trace_ms"] is None for r in rows)             # nothing to trace without a GPU
    out = capsys.readouterr().out
    assert "Where a traced call's time goes" not in out
    assert "| tuning |" in out and f"| {rows[0]['prompt_tokens']} (-) |" in out


def test_the_tuning_cache_plan_loads_three_times(tmp_path):
    ckpt = write_random_checkpoint(tmp_path / "ckpt", "pi05_tiny", seed=2)
    assert bench.main(["--checkpoint", str(ckpt), "--device", "cpu", "--calls", "2", "--views", "1",
                       "--tuning-cache", str(tmp_path / "tuning"), "--out", str(tmp_path / "out")]) == 0
    (result,) = (tmp_path / "out").glob("policy_predict_cpu_*_tuning_cache.json")
    rows = json.loads(result.read_text())["rows"]
    assert len(rows) == 3 and all(r["tuning"] == "none" for r in rows)
    assert not (tmp_path / "tuning").exists()            # nothing tuned on the CPU: nothing stored


def test_host_unnormalize_adds_a_load(tmp_path):
    ckpt = write_random_checkpoint(tmp_path / "ckpt", "pi05_tiny", seed=2)
    assert bench.main(["--checkpoint", str(ckpt), "--device", "cpu", "--calls", "2", "--views", "1",
                       "--host-unnormalize", "--out", str(tmp_path / "out")]) == 0
    (result,) = (tmp_path / "out").glob("policy_predict_cpu_*.json")
    rows = json.loads(result.read_text())["rows"]
    # the default GPU-resize load, the host-unnormalize one and the host-resize one (no graph engine on the CPU:
    # the reference path unnormalizes on the host either way)
    assert len(rows) == 3
    assert not any(r["gpu_unnormalize"] for r in rows)
    assert "| unnormalize |" in (tmp_path / "out" / result.with_suffix(".md").name).read_text()


def test_the_spin_sweep_times_every_host_step_after_each_spin(tmp_path, capsys):
    ckpt = write_random_checkpoint(tmp_path / "ckpt", "pi05_tiny", seed=2)
    assert bench.main(["--checkpoint", str(ckpt), "--device", "cpu", "--calls", "3", "--views", "1",
                       "--spin-sweep", "0", "2", "--out", str(tmp_path / "out")]) == 0
    (result,) = (tmp_path / "out").glob("policy_predict_cpu_*.json")
    rows = json.loads(result.read_text())["rows"]
    steps = ["validate_images", "encode_prompt_and_state", "noise", "stage_frames", "postprocess"]
    for row in rows:
        sweep = row["spin_sweep_us"]
        assert list(sweep) == ["0.0", "2.0"]                          # JSON keys: the spins in ms
        assert all(list(us) == steps and min(us.values()) > 0 for us in sweep.values())
    out = capsys.readouterr().out
    assert "| spin ms | validate_images |" in out and "\n| 2 | " in out


def test_the_cpu_engine_times_the_gpu_paths_host_steps(tmp_path):
    """--cpu-engine: the graph engine's executor, eager on the CPU, serves the loads, so the rows and the spin sweep
    show the GPU path's host steps: the unnormalization in the graph (the default) and on the host (the A/B load);
    the host-resize load runs the same executor through sample_actions."""
    ckpt = write_random_checkpoint(tmp_path / "ckpt", "pi05_tiny", seed=2)
    assert bench.main(["--checkpoint", str(ckpt), "--device", "cpu", "--cpu-engine", "--host-unnormalize",
                       "--calls", "2", "--views", "1", "--spin-sweep", "0", "2",
                       "--out", str(tmp_path / "out")]) == 0
    (result,) = (tmp_path / "out").glob("policy_predict_cpu_*.json")
    rows = json.loads(result.read_text())["rows"]
    assert "right after the thread spun" in result.with_suffix(".md").read_text()
    assert [(r["executor"].startswith("engine"), r["gpu_preprocess"], r["gpu_unnormalize"]) for r in rows] == \
        [(True, True, True), (True, True, False), (True, False, False)]
    assert all(r["spin_sweep_us"]["0.0"]["postprocess"] > 0 and r["spin_sweep_us"]["2.0"]["noise"] > 0 for r in rows)
