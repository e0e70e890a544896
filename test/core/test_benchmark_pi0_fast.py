"""tools/benchmark_pi0_fast.py on the CPU with the tiny preset: the reference's phases and the engine's chunk are
timed, the engine's logits are compared with the reference's, and the JSON names them all (the H200 numbers come
from the same tool on the GPU, where the engine's graphs are timed too)."""

from __future__ import annotations

import json

from flashrt_core.pi0_fast_fixtures import write_random_fast_checkpoint
from tools import benchmark_pi0_fast as bench


def test_random_preset_run_writes_its_timings(tmp_path, capsys):
    assert bench.main(["--config", "pi0fast_tiny", "--device", "cpu", "--dtype", "float32", "--tokens", "6",
                       "--runs", "2", "--prompt-tokens", "20", "--out", str(tmp_path)]) == 0
    (path,) = tmp_path.glob("pi0_fast_cpu_pi0fast_tiny_*.json")
    result = json.loads(path.read_text())
    assert result["prefix_tokens"] == 2 * 16 + 20 and result["tokens"] == 6
    ref, engine = result["reference"], result["engine"]
    assert len(ref["prefill_ms"]) == len(ref["chunk_ms"]) == len(engine["chunk_ms"]) == 2
    assert 0 < ref["decode_ms_per_token_median"] and 0 < ref["prefill_ms_median"] < ref["chunk_ms_median"]
    assert engine["name"] == "engine-fast-eager-float32" and engine["chunk_ms_median"] > 0
    # fp32 on both sides: the same greedy tokens, logits equal up to the folded / merged op order
    assert engine["greedy_tokens_agreeing"] == 6 and engine["logits_cosine_min"] > 0.99999
    out = capsys.readouterr().out
    assert "6-token chunk" in out and "greedy tokens agreeing 6/6" in out


def test_a_checkpoint_folder_is_timed_with_its_config(tmp_path):
    ckpt = write_random_fast_checkpoint(tmp_path / "ckpt", seed=1)
    assert bench.main(["--checkpoint", str(ckpt), "--config", "pi0fast_tiny", "--device", "cpu", "--tokens", "3",
                       "--runs", "1", "--views", "3"]) == 0
