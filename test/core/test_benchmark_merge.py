"""tools/benchmark_engine.py --merge: one table from several runs of one machine's software (session 16's runs
40-43, a grid too long for one device call), checked on the committed result files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.benchmark_engine import main, merge_results

BENCH = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
RUNS = [BENCH / f"engine_h200_run{n}_session16_{what}_2026-12-01.json"
        for n, what in ((40, "views13"), (41, "pi0"), (42, "h50"), (43, "compile"))]
MERGED = BENCH / "engine_h200_runs40-43_session16_2026-12-01"
# session 17's runs 44-45 (pi0 at 1 / 3 views and horizons 10 / 50; pi0.5 at 1 / 3 views, horizon 50) join them
RUNS_17 = RUNS + [BENCH / f"engine_h200_run{n}_session17_{what}_2026-12-01.json"
                  for n, what in ((44, "pi0_grid"), (45, "pi05_h50"))]
MERGED_17 = BENCH / "engine_h200_runs40-45_sessions16-17_2026-12-01"
# session 20's runs 46-47 (pi0.5 at 1 / 3 views, horizon 50, FP8 too; pi0 at 2 views, horizon 50) close the grid
RUNS_20 = RUNS_17 + [BENCH / f"engine_h200_run{n}_session20_{what}_2026-12-02.json"
                     for n, what in ((46, "pi05_h50"), (47, "pi0_h50"))]
MERGED_20 = BENCH / "engine_h200_runs40-47_sessions16-20_2026-12-01"
# session 21's runs 48-49 (references only: pi0's eager rows at 1 / 3 views, its compiled reference at 2 views h10)
RUNS_21 = RUNS_20 + [BENCH / f"engine_h200_run{n}_session21_{what}_2026-12-02.json"
                     for n, what in ((48, "pi0_references"), (49, "pi0_compile"))]
MERGED_21 = BENCH / "engine_h200_runs40-49_sessions16-21_2026-12-01"
# session 22's runs 51-53 (references only: the compiled reference, with an eager row, at every other cell; run 50,
# an A/B of the fused expert MLP, is not a grid run)
RUNS_22 = RUNS_21 + [BENCH / f"engine_h200_run{n}_session22_{what}_2026-12-02.json"
                     for n, what in ((51, "pi05_compile_v1"), (52, "pi05_compile_v23"), (53, "pi0_compile"))]
MERGED_22 = BENCH / "engine_h200_runs40-53_sessions16-22_2026-12-01"


def test_merge_keeps_every_row_with_its_run():
    runs = [json.loads(p.read_text()) for p in RUNS]
    merged = merge_results(RUNS)
    assert len(merged["rows"]) == sum(len(d["rows"]) for d in runs) == 16
    assert [r["source"] for r in merged["rows"]] == [p.stem for p, d in zip(RUNS, runs) for _ in d["rows"]]
    assert merged["args"]["merged_from"] == [p.stem for p in RUNS]
    first, last = runs[0]["env"]["time_utc"], runs[-1]["env"]["time_utc"]
    assert merged["env"]["time_utc"] == f"{first} to {last}"
    grid = {(r["config"], r["views"], r["horizon"]) for r in merged["rows"] if r["variant"] == "engine_bf16"}
    assert grid == {("pi05", 1, 10), ("pi05", 2, 10), ("pi05", 3, 10), ("pi05", 2, 50), ("pi0", 2, 10)}


@pytest.mark.parametrize("runs,merged,rows", [(RUNS, MERGED, 16), (RUNS_17, MERGED_17, 26),
                                              (RUNS_20, MERGED_20, 35), (RUNS_21, MERGED_21, 41),
                                              (RUNS_22, MERGED_22, 65)],
                         ids=["runs40-43", "runs40-45", "runs40-47", "runs40-49", "runs40-53"])
def test_the_committed_table_is_what_the_merge_writes(tmp_path, runs, merged, rows):
    tag = merged.name.removeprefix("engine_").removesuffix("_2026-12-01")
    main(["--merge", *map(str, runs), "--out-dir", str(tmp_path), "--tag", tag])
    written = tmp_path / f"{merged.name}.md"
    assert written.read_text() == merged.with_suffix(".md").read_text()
    assert json.loads((tmp_path / f"{merged.name}.json").read_text()) == json.loads(
        merged.with_suffix(".json").read_text())
    text = written.read_text()
    assert "vs torch.compile reference 252.2 ms: 24.8x (target >= 3x: met)" in text
    assert text.count("| engine_h200_run") == rows                 # every row names its run


def test_the_grid_of_runs_40_to_53_is_the_issues_whole_cross_product():
    """Both models, 1-3 views, horizons 10 and 50: the engine in bf16 and FP8, an eager reference row and a
    torch.compile reference row at every cell. Runs 40-45 lacked pi0.5's FP8 at 1 / 3 views with horizon 50 and
    pi0 at 2 views with horizon 50 (runs 46-47 added them); runs 40-47 lacked pi0's eager rows at 1 / 3 views
    (run 44 timed its engines only; runs 48-49 added them); runs 40-49 had the compiled reference at the two 2-view
    horizon-10 cells only (runs 51-53 added the other ten)."""
    merged = merge_results(RUNS_22)
    cells = {(c, v, h) for c in ("pi05", "pi0") for v in (1, 2, 3) for h in (10, 50)}
    of = lambda rows, test: {(r["config"], r["views"], r["horizon"]) for r in rows  # noqa: E731
                             if test(r["variant"]) and "predict_ms" in r}
    for variant in ("engine_bf16", "engine_fp8", "reference_eager_bf16", "reference_compile_max-autotune_layers"):
        grid = of(merged["rows"], lambda v: v == variant)
        assert grid == cells, (variant, sorted(cells - grid))
    assert of(merge_results(RUNS_21)["rows"], lambda v: v.startswith("reference_compile")) == {("pi05", 2, 10),
                                                                                                ("pi0", 2, 10)}
    rows_20 = merge_results(RUNS_20)["rows"]
    assert of(rows_20, lambda v: v == "reference_eager_bf16") == cells - {("pi0", v, h) for v in (1, 3)
                                                                           for h in (10, 50)}
    assert not of(merge_results(RUNS_17)["rows"], lambda v: v == "engine_fp8") >= cells    # what runs 46-47 added


def test_the_speedup_section_of_the_merged_runs():
    """Every cell of runs 40-53 has its eager and its compiled ratios. A cell whose engine run timed a reference
    takes that run's row (pi0.5 and pi0 at 2 views h10: runs 43 and 41, though runs 49-53 timed the cell again), so
    only pi0.5 at 2 views h10 has both ratios within one run; the rest are marked as across runs."""
    from tools.benchmark_engine import speedup_table
    lines = speedup_table(merge_results(RUNS_22)["rows"])
    assert len(lines) == 2 + 12 + 2                                    # header, 12 cells, the footnote
    rows = {ln.split(" | ")[0].strip("| "): ln for ln in lines[2:14]}
    assert rows["pi0.5, 2, 10"] == "| pi0.5, 2, 10 | 597.6 ms | 58.8x / 67.8x | 252.2 ms | 24.8x / 28.6x |"
    assert rows["pi0, 2, 10"] == r"| pi0, 2, 10 | 310.3 ms | 29.5x / 34.5x | 137.6 ms | 13.1x\* / 15.3x\* |"
    assert rows["pi0, 2, 50"] == r"| pi0, 2, 50 | 524.8 ms | 44.5x / 48.6x | 143.9 ms | 12.2x\* / 13.3x\* |"
    assert all("| - |" not in ln for ln in rows.values())
    assert sum("\\*" in ln for ln in rows.values()) == 11
    assert (MERGED_22.with_suffix(".md").read_text().split("## Speed-up per cell")[1].splitlines()[2:18]
            == lines)


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
    other = json.loads(RUNS[1].read_text())
    other["env"]["driver"] = "999.0"
    path = tmp_path / "other_driver.json"
    path.write_text(json.dumps(other))
    with pytest.raises(ValueError, match="driver"):
        merge_results([RUNS[0], path])
    with pytest.raises(ValueError, match="two or more"):
        merge_results(RUNS[:1])


def test_the_readmes_grid_is_the_merged_runs_grid():
    """The README's table of predict() medians (a row per model and view count, bf16 / FP8 per horizon) is
    grid_table of runs 40-53: its numbers come from the result files, not from a hand copy."""
    from tools.benchmark_engine import grid_table
    readme = (BENCH.parents[1] / "README.md").read_text().splitlines()
    start = readme.index("| model, views | horizon 10 | horizon 50 |")
    end = readme.index("", start)
    assert readme[start:end] == grid_table(merge_results(RUNS_22)["rows"])
    assert len(readme[start:end]) == 2 + 6                                  # pi0.5 and pi0 at 1-3 views


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


def test_the_readmes_speedups_are_the_merged_runs():
    """The README's sentence on the speed-ups across the grid quotes the range of the eager ratios and of the
    compiled ratios from speedup_table of runs 40-53, and the one cell with both references in the engine's run."""
    import re

    from tools.benchmark_engine import speedup_table
    readme = " ".join((BENCH.parents[1] / "README.md").read_text().split())
    lines = speedup_table(merge_results(RUNS_22)["rows"])[2:14]
    ratios = {col: [float(x) for ln in lines for x in re.findall(r"([\d.]+)x", ln.split(" | ")[col])]
              for col in (2, 4)}
    assert len(ratios[2]) == len(ratios[4]) == 24
    eager, compiled = (f"{min(ratios[c]):.0f}-{max(ratios[c]):.0f}x" for c in (2, 4))
    assert f"the engine is {eager} faster than the eager path and {compiled} faster than the compiled" in readme
    pi05 = next(ln for ln in lines if ln.startswith("| pi0.5, 2, 10 |")).split(" | ")
    bf16, fp8 = re.findall(r"([\d.]+)x", pi05[4])
    assert f"{bf16}x / {fp8}x (bf16 / FP8) against run 43's compiled reference" in readme
    assert f"({float(pi05[3].removesuffix(' ms')):.0f} ms)" in readme
