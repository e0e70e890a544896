"""tools/benchmark_groot.py on the CPU with the tiny preset: every path is timed, the static path's chunk is the
fp32 reference's (cosine 1), the FP8 path's is within E4M3 weight rounding of it, the gate of both is recorded,
and the JSON records what the H200 run records (the GPU numbers come from the same tool on CUDA, where the graph
path is a captured replay)."""

from __future__ import annotations

import json

from tools import benchmark_groot as bench


def test_tiny_preset_times_both_paths_and_writes_json(tmp_path, capsys):
    assert bench.main(["--config", "groot_n1.6_tiny", "--device", "cpu", "--dtype", "float32", "--runs", "3",
                       "--warmup", "1", "--observations", "2", "--prompt-tokens", "12", "--out",
                       str(tmp_path)]) == 0
    (path,) = tmp_path.glob("groot_graph_cpu_groot_n1.6_tiny_*.json")
    result = json.loads(path.read_text())
    assert result["executor"] == "static-eager" and result["fused_dit"] and "graph_replay" not in result
    assert result["view_sizes"] == [[56, 56], [56, 56]] and result["prompt_len"] == 12 + 2 * (4 + 2)
    for key in ("reference", "graph", "graph_no_fused_dit", "graph_no_step_tables", "graph_fp8"):
        assert len(result[key]["samples_ms"]) == 3 and 0 < result[key]["median_ms"] <= result[key]["p99_ms"]
    cos = result["cosine_vs_fp32"]
    assert cos["graph_worst"] > 0.99999 and cos["reference_worst"] > 0.99999
    assert cos["graph_no_fused_dit_worst"] > 0.99999
    assert 0.99 < cos["graph_fp8_worst"] < 0.999999 and cos["graph_fp8_mean"] >= cos["graph_fp8_worst"]
    gates = result["gate"]
    assert gates["graph"]["passed"] and gates["graph"]["sign_flips"] == 0 and gates["graph"]["observations"] == 2
    assert gates["graph"]["gripper_dims"] == [5] and gates["graph_fp8"]["gripper_dims"] == [5]
    assert gates["graph_fp8"]["worst"] == cos["graph_fp8_worst"] and gates["graph"]["gate_worst"] == 0.995
    assert result["command"].startswith("python tools/benchmark_groot.py --config groot_n1.6_tiny")
    assert result["driver"] is None and result["torch"]
    out = capsys.readouterr().out
    assert "reference (eager)" in out and "static-eager (sample_actions)" in out and "cosine vs fp32" in out
    assert "static-eager, no step tables" in out and "static-eager, no fused DiT" in out
    assert "without the fused DiT mean" in out and "static-eager, FP8 DiT" in out
    assert "gate (float32 graph vs fp32): cosine mean 1.000000" in out and "gate (FP8 graph vs fp32)" in out
