"""docs/action_executor.md's parameter reference is the one the code declares."""

from pathlib import Path

from flashrt_ros.executor_parameters import PARAMETERS, markdown_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "action_executor.md"


def test_parameter_table_matches_the_declared_parameters():
    text = DOC.read_text()
    assert markdown_table() in text, ("docs/action_executor.md is stale: regenerate with "
                                      "python -m flashrt_ros.executor_parameters")
    reference = text.split("\n## Parameters", 1)[1]
    documented = [line.split("`")[1] for line in reference.splitlines() if line.startswith("| `")]
    names = {spec.name for spec in PARAMETERS}
    assert [spec.name for spec in PARAMETERS] == [name for name in documented if name in names]
