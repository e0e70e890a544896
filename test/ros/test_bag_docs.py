"""docs/bag_replay.md and the README name only bag commands and options that exist.

Every ``python -m flashrt_ros.<tool> ...`` and ``ros2 run flashrt_ros <tool> ...`` line of the document must name a
flashrt_ros tool, and every ``--option`` on it must be one the tool's ``--help`` lists. The commands themselves
run in test_bag_player / test_bag_recorder / test_bag_evaluator / test_bag_demo.
"""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DOC = REPO_ROOT / "docs" / "bag_replay.md"
README = REPO_ROOT / "README.md"


def cmake_executables() -> dict[str, str]:
    """`ros2 run flashrt_ros <name>` -> module, as CMakeLists.txt installs them ("name:module:function")."""
    text = (REPO_ROOT / "CMakeLists.txt").read_text()
    return {name: module.split(".", 1)[1] for name, module, _ in re.findall(r'"(\w+):(flashrt_ros\.\w+):(\w+)"', text)}


RUN_EXECUTABLES = cmake_executables()


def documented_commands(doc: Path = DOC) -> list[tuple[str, list[str]]]:
    """(module, argv) of every flashrt_ros command line in the doc's code blocks (continuations joined)."""
    lines, joined = doc.read_text().splitlines(), []
    buffer = ""
    for line in lines:
        if not line.startswith("    "):
            buffer = ""
            continue
        buffer += line.strip()
        if buffer.endswith("\\"):
            buffer = buffer[:-1] + " "
            continue
        joined.append(buffer)
        buffer = ""
    commands = []
    for line in joined:
        if not line.startswith(("python -m flashrt_ros.", "ros2 run flashrt_ros ")):
            continue  # other commands (ros2 launch / bag) and example output
        words = shlex.split(line)
        if words[:2] == ["python", "-m"] and words[2].startswith("flashrt_ros."):
            commands.append((words[2].split(".", 1)[1], words[3:]))
        elif words[:3] == ["ros2", "run", "flashrt_ros"]:
            commands.append((RUN_EXECUTABLES[words[3]], words[4:]))
    return commands


def test_doc_has_the_commands():
    modules = {module for module, _ in documented_commands()}
    assert modules == {"demo_bag", "bag_player", "bag_recorder", "bag_evaluator", "bag_regression"}


def test_cmake_installs_every_bag_tool():
    assert {"bag_player", "bag_recorder", "bag_evaluator", "bag_regression", "demo_bag"} <= set(RUN_EXECUTABLES)
    for module in RUN_EXECUTABLES.values():
        assert callable(importlib.import_module(f"flashrt_ros.{module}").main)


def test_readme_has_the_bag_regression_command():
    assert "bag_regression" in {module for module, _ in documented_commands(README)}


@pytest.mark.parametrize("module,argv", documented_commands() + documented_commands(README),
                         ids=lambda v: v if isinstance(v, str) else None)
def test_documented_options_exist(module, argv, capsys):
    main = importlib.import_module(f"flashrt_ros.{module}").main
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    options = [word.split("=", 1)[0] for word in argv if re.match(r"^--[a-z]", word)]
    unknown = [option for option in options if not re.search(rf"(^|[\s,\[]){re.escape(option)}\b", help_text)]
    assert not unknown, f"{module}: options {unknown} are not in its --help"
