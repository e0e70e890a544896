"""The project's markdown files link only to files that exist; docs/benchmarks/ holds one folder per date with only
the result files that docs/performance.md cites, each named in its index; and the README and docs say what the
code does, not in which session or run it was measured (that history is in git)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "docs" / "benchmarks"
DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"), *BENCH.rglob("*.md")])
PROSE = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"), BENCH / "README.md"])
LINK = re.compile(r"\]\(([^)\s]+)\)")          # [text](target)
# "session 12", "sessions 16-22", "run 43", "runs 40-53"; not a ratio such as "steps run 3-7x slower"
HISTORY = re.compile(r"\bsessions? \d+|\bruns? \d+(?:-\d+)?(?![\dx-]|\.\d)", re.IGNORECASE)
DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _local_targets(md: Path) -> list[str]:
    targets = []
    for target in LINK.findall(md.read_text()):
        if re.match(r"^[a-z]+://", target) or target.startswith(("#", "mailto:")):
            continue
        targets.append(target.split("#", 1)[0])
    return [t for t in targets if t]


def _result_files() -> list[Path]:
    return sorted(p for p in BENCH.rglob("*") if p.is_file() and p != BENCH / "README.md")


@pytest.mark.parametrize("md", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_local_link_resolves(md):
    targets = _local_targets(md)
    missing = [t for t in targets if not (md.parent / t).exists()]
    assert not missing, f"{md.relative_to(REPO)} links to missing files: {missing}"


@pytest.mark.parametrize("md", PROSE, ids=lambda p: str(p.relative_to(REPO)))
def test_the_docs_tell_no_session_or_run_history(md):
    hits = [ln.strip() for ln in md.read_text().splitlines() if HISTORY.search(ln)]
    assert not hits, f"{md.relative_to(REPO)} tells history (it belongs in git messages): {hits[:3]}"


def test_the_history_guard_catches_what_it_is_for():
    assert all(HISTORY.search(s) for s in ("measured in session 12", "Session 3", "run 43's reference",
                                           "runs 40-53", "sessions 16-22", "as in run 12."))
    assert not any(HISTORY.search(s) for s in ("for the whole session", "session_id 4", "a rerun 3 times",
                                               "running 5 engines", "the steps run 3-7x slower"))


def test_the_benchmark_folder_holds_dated_folders_only():
    assert [p.name for p in BENCH.iterdir() if p.is_file()] == ["README.md"]
    folders = [p for p in BENCH.iterdir() if p.is_dir()]
    assert folders and all(DATE.match(p.name) for p in folders), [p.name for p in folders]
    assert all(f.parent.parent == BENCH for f in _result_files()), "one folder level per date"


def test_every_result_file_is_behind_a_number_of_the_performance_page():
    """A result file stays while docs/performance.md cites it (by name, or the .json beside a cited .md)."""
    page = (REPO / "docs" / "performance.md").read_text()
    cited = set(re.findall(r"[A-Za-z0-9_.-]+\.(?:md|json|txt|log)", page))
    stems = {Path(name).stem for name in cited}
    uncited = [str(f.relative_to(BENCH)) for f in _result_files() if f.name not in cited and f.stem not in stems]
    assert not uncited, f"result files no number of docs/performance.md stands on (delete them; git keeps them): " \
                        f"{uncited}"


def test_the_benchmark_index_names_every_result_file():
    index = BENCH / "README.md"
    text = index.read_text()
    linked = {(index.parent / t).resolve() for t in _local_targets(index)}
    named = set(re.findall(r"`([A-Za-z0-9_.-]+\.(?:md|json|log|txt))`", text))
    for f in _result_files():
        sibling_linked = any(p.parent == f.parent and p.stem == f.stem for p in linked)
        assert f.resolve() in linked or f.name in named or sibling_linked, \
            f"docs/benchmarks/README.md does not name {f.relative_to(BENCH)}"


# Where code, tools and tests cite a result file by its path. (flashrt_core joins this list once its comments cite
# the dated folders.)
SOURCES = ["README.md", "docs", "tools", "flashrt_core", "flashrt_ros", "kernels", "test"]
CITED = re.compile(r"docs/benchmarks/([A-Za-z0-9_./-]+\.(?:md|json|log|txt))")


def test_every_result_file_cited_by_path_exists():
    missing = []
    for root in SOURCES:
        paths = [REPO / root] if root.endswith(".md") else sorted((REPO / root).rglob("*"))
        for path in paths:
            if path.suffix not in (".py", ".md", ".sh") or not path.is_file():
                continue
            for name in CITED.findall(path.read_text(errors="replace")):
                if not (BENCH / name).is_file():
                    missing.append(f"{path.relative_to(REPO)}: docs/benchmarks/{name}")
    assert not missing, f"cited result files that are not there: {missing}"
