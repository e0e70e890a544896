"""The README's table for the targets' cell (pi0.5, 2 views, horizon 10) quotes its result files: each row's
median and p99 are read here from the JSON the benchmark wrote and must stand in the README as it prints them. A
number typed by hand, or left behind when its row changed, fails here. (The grid below that table is checked
against the merged runs in test_benchmark_merge.py.)"""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "docs" / "benchmarks"
SESSION18_PAIR1 = "engine_h200_session18_overlap_ab1_2026-12-02.json"
SESSION18_PAIR2 = "engine_h200_session18_overlap_ab2_2026-12-02.json"
SESSION20 = "engine_h200_session20_attention_forms_2026-12-02.json"
RUN43 = "engine_h200_run43_session16_compile_2026-12-01.json"
POLICY = "policy_predict_h200_2026-12-01_host_session16.json"


def _engine(name: str, variant: str) -> dict:
    rows = json.loads((BENCH / name).read_text())["rows"]
    return next(r for r in rows if r["variant"] == variant and r["views"] == 2 and r["horizon"] == 10)["predict_ms"]


def _span(values: list[float], digits: int = 2) -> str:
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return low if low == high else f"{low}-{high}"


def _row(starts: str) -> str:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Measured performance"):text.index("The targets (issue 4):")]
    (line,) = [ln for ln in section.splitlines() if ln.startswith(f"| {starts}")]
    return line


def test_the_engine_rows_quote_the_default_engines_of_sessions_18_and_20():
    bf16 = [_engine(SESSION18_PAIR2, "engine_bf16"), _engine(SESSION20, "engine_bf16")]
    fp8 = [_engine(SESSION18_PAIR1, "engine_fp8-with_overlap_first_step"), _engine(SESSION20, "engine_fp8")]
    for starts, stats in (("graph engine, bf16", bf16), ("graph engine, FP8", fp8)):
        cells = _row(starts).split("|")[2:4]
        assert [c.strip() for c in cells] == [f"{_span([s['median'] for s in stats])} ms",
                                              f"{_span([s['p99'] for s in stats])} ms"], (starts, cells)


def test_the_reference_rows_quote_run_43():
    eager, compiled = _engine(RUN43, "reference_eager_bf16"), _engine(RUN43, "reference_compile_max-autotune_layers")
    assert _row("eager reference path").split("|")[2].strip() == f"{eager['median']:.0f} ms"
    assert [c.strip() for c in _row("reference under `torch.compile").split("|")[2:4]] == \
        [f"{compiled['median']:.0f} ms", f"{compiled['p99']:.0f} ms"]
    engines = [_engine(RUN43, f"engine_{p}")["median"] for p in ("bf16", "fp8")]
    speedups = " / ".join(f"{compiled['median'] / e:.1f}x" for e in engines)
    assert f"{engines[0]:.2f} / {engines[1]:.2f} ms, {speedups}" in _row("reference under `torch.compile")


def test_the_policy_predict_row_quotes_session_16():
    rows = json.loads((BENCH / POLICY).read_text())["rows"]
    measured = next(r for r in rows if r["host_wait"] == "sync" and r["gpu_unnormalize"] and r["gpu_preprocess"])
    assert [c.strip() for c in _row("`Policy.predict`").split("|")[2:4]] == \
        [f"{measured['median_ms']:.2f} ms", f"{measured['p99_ms']:.2f} ms"]
    bucket = f"{measured['prompt_tokens']} tokens in the {measured['text_bucket']}-token bucket"
    assert bucket in _row("`Policy.predict`")
