"""tools/benchmark_wide_gemms.py runs its forms and checks them against each other (the GPU numbers come from the
device; here the tool itself is checked on the CPU, at the real shapes divided by 16)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tools"))

import benchmark_wide_gemms as bench  # noqa: E402


def test_shapes_are_pi05s_wide_gemms():
    shapes = {(s.tower, s.name): s for s in bench.wide_shapes("pi05", views=2, text_slots=64)}
    assert (shapes["vision", "qkv"].rows, shapes["vision", "qkv"].n, shapes["vision", "qkv"].k) == (512, 3456, 1152)
    assert (shapes["vision", "fc2"].n, shapes["vision", "fc2"].k) == (1152, 4304)
    assert (shapes["prefix", "gate_up"].rows, shapes["prefix", "gate_up"].n) == (576, 32768)
    assert (shapes["prefix", "qkv"].n, shapes["prefix", "down"].k) == (2048 + 2 * 256, 16384)
    assert shapes["prefix", "gate_up"].flops == 2.0 * 576 * 32768 * 2048


def test_cpu_run_times_every_form_and_they_agree(tmp_path):
    out = tmp_path / "wide.json"
    assert bench.main(["--device", "cpu", "--reps", "1", "--replays", "1", "--no-inductor", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert not [r for r in rows if "error" in r]
    forms = {(r["tower"], r["gemm"]): set() for r in rows}
    for r in rows:
        forms[r["tower"], r["gemm"]].add(r["form"])
        assert r["cosine"] > 0.9999 and r["us"] > 0
    assert forms["vision", "fc1"] == {"linear", "linear_nobias", "addmm"}     # biases: the vision tower only
    assert forms["prefix", "gate_up"] == {"linear"}
    assert len(forms) == 8


def test_padded_vision_mlp_shapes_round_the_width_up():
    listed = bench.wide_shapes("pi05", views=2, text_slots=64, pad_vision_mlp=(128, 256, 16))
    shapes = {s.name: s for s in listed}
    assert (shapes["fc1_pad4352"].n, shapes["fc1_pad4352"].k, shapes["fc1_pad4352"].epilogue) == (4352, 1152, "gelu")
    assert (shapes["fc2_pad4352"].n, shapes["fc2_pad4352"].k) == (1152, 4352)       # 4304 -> 34 x 128 = 17 x 256
    # 128 and 256 give the same width (timed once); 16 divides 4304 already (nothing to pad)
    assert len(listed) == 8 + 2 and [s.name for s in listed[8:]] == ["fc1_pad4352", "fc2_pad4352"]
