"""docs/node.md's parameter reference is the one the code declares."""

from pathlib import Path

from flashrt_ros.node_parameters import PARAMETERS, markdown_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "node.md"


def test_parameter_table_matches_the_declared_parameters():
    text = DOC.read_text()
    assert markdown_table() in text, "docs/node.md is stale: regenerate with python -m flashrt_ros.node_parameters"
    documented = [line.split("`")[1] for line in text.splitlines() if line.startswith("| `")]
    assert [spec.name for spec in PARAMETERS] == [name for name in documented if name in {s.name for s in PARAMETERS}]
