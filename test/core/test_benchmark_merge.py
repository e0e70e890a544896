"""tools/benchmark_engine.py --merge: one table from several result files of one machine's software (a grid longer
than one device call), checked on the committed result files: the two engine calls of docs/benchmarks/2026-12-04 and
the merged grid of docs/benchmarks/2026-12-02, whose committed sections must be what the tool writes from its rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.benchmark_engine import main, merge_results

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "docs" / "benchmarks"
CALLS = [BENCH / "2026-12-04" / f"engine_after_{model}_2026-12-04.json" for model in ("pi05", "pi0")]
GRID = BENCH / "2026-12-02" / "engine_grid_h200"          # thirteen calls of 2026-12-01/02 merged


def _grid_rows() -> list[dict]:
    return json.loads(GRID.with_suffix(".json").read_text())["rows"]


def test_merge_keeps_every_row_with_its_call():
    calls = [json.loads(p.read_text()) for p in CALLS]
    merged = merge_results(CALLS)
    assert len(merged["rows"]) == sum(len(d["rows"]) for d in calls) == 12
    assert [r["source"] for r in merged["rows"]] == [p.stem for p, d in zip(CALLS, calls) for _ in d["rows"]]
    assert merged["args"]["merged_from"] == [p.stem for p in CALLS]
    first, last = calls[0]["env"]["time_utc"], calls[-1]["env"]["time_utc"]
    assert merged["env"]["time_utc"] == f"{first} to {last}"
    grid = {(r["config"], r["views"], r["horizon"]) for r in merged["rows"] if r["variant"] == "engine_fp8"}
    assert grid == {("pi05", 2, 10), ("pi05", 2, 50), ("pi0", 2, 10), ("pi0", 2, 50)}


def test_the_merge_writes_both_calls_in_one_table(tmp_path):
    main(["--merge", *map(str, CALLS), "--out-dir", str(tmp_path), "--tag", "h200_merged"])
    (written,) = tmp_path.glob("engine_h200_merged*.md")
    text = written.read_text()
    assert text.count("| engine_after_pi05_2026-12-04 |") == 6 and text.count("| engine_after_pi0_2026-12-04 |") == 6
    assert "| pi0.5, 2 | 9.76 / 9.00 | 12.00 / 10.90 |" in text and "| pi0, 2 | 9.89 / 8.82 | 11.94 / 10.81 |" in text


def test_the_committed_grid_is_the_issues_whole_cross_product():
    """Both models, 1-3 views, horizons 10 and 50: the engine in bf16 and FP8, an eager reference row and a
    torch.compile reference row at every cell."""
    rows = _grid_rows()
    cells = {(c, v, h) for c in ("pi05", "pi0") for v in (1, 2, 3) for h in (10, 50)}
    for variant in ("engine_bf16", "engine_fp8", "reference_eager_bf16", "reference_compile_max-autotune_layers"):
        grid = {(r["config"], r["views"], r["horizon"]) for r in rows if r["variant"] == variant and "predict_ms" in r}
        assert grid == cells, (variant, sorted(cells - grid))


def test_the_committed_grid_sections_are_what_the_tool_writes_from_its_rows():
    """A cell whose engine call timed a reference takes that call's row, so only pi0.5 at 2 views h10 has both
    ratios within one call; the rest are marked as across calls."""
    from tools.benchmark_engine import grid_table, speedup_table
    rows = _grid_rows()
    lines = speedup_table(rows)
    assert len(lines) == 2 + 12 + 2                                    # header, 12 cells, the footnote
    cells = {ln.split(" | ")[0].strip("| "): ln for ln in lines[2:14]}
    assert cells["pi0.5, 2, 10"] == "| pi0.5, 2, 10 | 597.6 ms | 58.8x / 67.8x | 252.2 ms | 24.8x / 28.6x |"
    assert cells["pi0, 2, 10"] == r"| pi0, 2, 10 | 310.3 ms | 29.5x / 34.5x | 137.6 ms | 13.1x\* / 15.3x\* |"
    assert all("| - |" not in ln for ln in cells.values())
    assert sum("\\*" in ln for ln in cells.values()) == 11
    text = GRID.with_suffix(".md").read_text()
    assert text.split("## Speed-up per cell")[1].splitlines()[2:18] == lines
    grid = grid_table(rows)
    assert len(grid) == 2 + 6 and "\n".join(grid) in text


def test_the_performance_pages_grid_is_the_committed_grid():
    """docs/performance.md's table of every view count is grid_table of the merged rows, not a hand copy."""
    from tools.benchmark_engine import grid_table
    page = (REPO / "docs" / "performance.md").read_text().splitlines()
    start = page.index("| model, views | horizon 10 | horizon 50 |")
    end = page.index("", start)
    assert page[start:end] == grid_table(_grid_rows())


def test_speedup_table_marks_ratios_across_runs_and_skips_cells_without_a_reference():
    from tools.benchmark_engine import speedup_table
    row = lambda variant, ms, source, views=2: {"config": "pi05", "variant": variant, "views": views,  # noqa: E731
                                                 "horizon": 10, "predict_ms": {"median": ms}, "source": source}
    rows = [row("engine_bf16", 10.0, "a"), row("engine_fp8", 8.0, "a"), row("reference_eager_bf16", 500.0, "a"),
            row("reference_compile_max-autotune_layers", 200.0, "b"), row("engine_bf16", 9.0, "c", views=1),
            row("engine_bf16-no_pdl", 1.0, "a"), {"config": "pi05", "variant": "reference_eager_bf16",
                                                   "views": 3, "horizon": 10, "error": "exit 1"}]
    rows_line = r"| pi0.5, 2, 10 | 500.0 ms | 50.0x / 62.5x | 200.0 ms | 20.0x\* / 25.0x\* |"
    assert speedup_table(rows) == [
        "| model, views, horizon | eager reference | engine x eager, bf16 / FP8 | torch.compile reference | "
        "engine x compile, bf16 / FP8 |", "|---|---|---|---|---|",
        rows_line, "",
        r"\* the reference ran in another run than the engine row (another machine, maybe)."]
    later = rows + [row("reference_eager_bf16", 400.0, "d")]          # a later run timed the cell again
    assert speedup_table(later)[2] == rows_line                         # the engine's own run's row is kept
    without_own = [r for r in later if (r["variant"], r.get("source")) != ("reference_eager_bf16", "a")]
    assert speedup_table(without_own)[2].startswith(r"| pi0.5, 2, 10 | 400.0 ms | 40.0x\* / 50.0x\* |")
    single_run = [{k: v for k, v in r.items() if k != "source"} for r in rows[:3]]
    assert speedup_table(single_run)[2:] == ["| pi0.5, 2, 10 | 500.0 ms | 50.0x / 62.5x | - | - |"]
    assert speedup_table(rows[4:]) == []                                # no reference row, no section


def test_merge_refuses_runs_of_other_software_and_a_single_file(tmp_path):
    other = json.loads(CALLS[1].read_text())
    other["env"]["driver"] = "999.0"
    path = tmp_path / "other_driver.json"
    path.write_text(json.dumps(other))
    with pytest.raises(ValueError, match="driver"):
        merge_results([CALLS[0], path])
    with pytest.raises(ValueError, match="two or more"):
        merge_results(CALLS[:1])


def test_grid_table_keeps_the_last_run_of_a_cell_and_marks_what_is_missing():
    rows = [{"config": "pi05", "variant": "engine_bf16", "views": 2, "horizon": 10, "predict_ms": {"median": 10.0}},
            {"config": "pi05", "variant": "engine_bf16", "views": 2, "horizon": 10, "predict_ms": {"median": 9.5}},
            {"config": "pi05", "variant": "engine_fp8", "views": 2, "horizon": 50, "predict_ms": {"median": 11.0}},
            {"config": "pi05", "variant": "engine_bf16-no_pdl", "views": 2, "horizon": 10,
             "predict_ms": {"median": 99.0}},
            {"config": "pi05", "variant": "reference_eager_bf16", "views": 2, "horizon": 10,
             "predict_ms": {"median": 500.0}},
            {"config": "pi0", "variant": "engine_fp8", "views": 1, "horizon": 10, "error": "exit 1"}]
    from tools.benchmark_engine import grid_table
    assert grid_table(rows) == ["| model, views | horizon 10 | horizon 50 |", "|---|---|---|",
                                "| pi0.5, 2 | 9.50 / - | - / 11.00 |"]
    assert grid_table(rows[3:]) == []
