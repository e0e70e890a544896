"""tools/benchmark_pi0_fast.py on the CPU with the tiny preset: every phase is timed and the JSON names them (the
H200 numbers come from the same tool on the GPU)."""

from __future__ import annotations

import json

from flashrt_core.pi0_fast_fixtures import write_random_fast_checkpoint
from tools import benchmark_pi0_fast as bench


def test_random_preset_run_writes_its_timings(tmp_path, capsys):
    assert bench.main(["--config", "pi0fast_tiny", "--device", "cpu", "--dtype", "float32", "--tokens", "6",
                       "--runs", "2", "--prompt-tokens", "20", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("pi0_fast_reference_cpu_pi0fast_tiny_*.json")
    result = json.loads(path.read_text())
    assert result["prefix_tokens"] == 2 * 16 + 20 and result["tokens"] == 6
    assert len(result["prefill_ms"]) == len(result["chunk_ms"]) == 2
    assert 0 < result["decode_ms_per_token_median"] and 0 < result["prefill_ms_median"] < result["chunk_ms_median"]
    assert "ms per token, 6-token chunk" in capsys.readouterr().out


def test_a_checkpoint_folder_is_timed_with_its_config(tmp_path):
    ckpt = write_random_fast_checkpoint(tmp_path / "ckpt", seed=1)
    assert bench.main(["--checkpoint", str(ckpt), "--config", "pi0fast_tiny", "--device", "cpu", "--tokens", "3",
                       "--runs", "1", "--views", "3"]) == 0
