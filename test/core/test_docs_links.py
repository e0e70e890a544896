"""The project's markdown files link only to files that exist, and the benchmark index names only files (and file
patterns) that are in docs/benchmarks/: a renamed or missing result file fails here, not in a reader's browser."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"), REPO / "docs" / "benchmarks" / "README.md"])
LINK = re.compile(r"\]\(([^)\s]+)\)")          # [text](target)


def _local_targets(md: Path) -> list[str]:
    targets = []
    for target in LINK.findall(md.read_text()):
        if re.match(r"^[a-z]+://", target) or target.startswith(("#", "mailto:")):
            continue
        targets.append(target.split("#", 1)[0])
    return [t for t in targets if t]


@pytest.mark.parametrize("md", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_local_link_resolves(md):
    targets = _local_targets(md)
    missing = [t for t in targets if not (md.parent / t).exists()]
    assert not missing, f"{md.relative_to(REPO)} links to missing files: {missing}"


def test_the_benchmark_index_names_files_that_exist():
    index = REPO / "docs" / "benchmarks" / "README.md"
    text = index.read_text()
    links = _local_targets(index)
    assert len(links) >= 20 and all((index.parent / t).is_file() for t in links)
    # the files and patterns it names in code spans (`gpu_tests_h200_*.log`, a timeline's JSON) are there too
    named = re.findall(r"`([A-Za-z0-9_*.-]+\.(?:md|json|log))`", text)
    assert named, "the index names no result files in code spans"
    for name in named:
        assert list(index.parent.glob(name)), f"docs/benchmarks/README.md names {name}, which matches no file"
