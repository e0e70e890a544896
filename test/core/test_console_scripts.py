"""The executables (pip console scripts and the ROS executables) name a missing optional part and how to get it,
and let every other import error through as it is."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from checked_run import failure_report

from flashrt_ros.console_scripts import EXIT_MISSING_PART, TOOLS

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_tool(tool: str, *args: str, blocked: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Run an executable's entry point in a fresh Python where the `blocked` modules cannot be imported (as on a
    machine without them: None in sys.modules makes their import raise ModuleNotFoundError)."""
    code = ("import sys\n"
            f"for name in {blocked!r}: sys.modules[name] = None\n"
            f"sys.argv = ['{tool}', *{list(args)!r}]\n"
            "from flashrt_ros.console_scripts import run\n"
            f"sys.exit(run({tool!r}))\n")
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


def test_every_executable_runs_through_the_table():
    """CMakeLists.txt's executables and setup.py's console scripts are the tools of console_scripts.TOOLS."""
    cmake = dict(re.findall(r'"(\w+):(flashrt_(?:ros|core)\.\w+):main"', (REPO_ROOT / "CMakeLists.txt").read_text()))
    assert cmake == {name: module for name, module in TOOLS.items() if name != "fixture"}
    console = re.findall(r'"flashrt-([\w-]+)=flashrt_ros\.console_scripts:(\w+)"', (REPO_ROOT / "setup.py").read_text())
    assert sorted(function for _, function in console) == sorted(TOOLS)
    assert all(name.replace("-", "_") in TOOLS for name, _ in console)


@pytest.mark.parametrize("tool", ["bag_player", "bag_recorder", "bag_evaluator", "demo_bag"])
def test_bag_tools_without_rosbags_say_how_to_install_it(tool):
    done = run_tool(tool, "--help", blocked=("rosbags",))
    assert done.returncode == EXIT_MISSING_PART, failure_report(done)
    assert "cannot import 'rosbags" in done.stderr and "pip install 'flashrt-ros[bags]'" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("tool", ["policy_node", "bag_regression", "demo"])
def test_ros_tools_without_rclpy_say_where_ros_comes_from(tool):
    done = run_tool(tool, blocked=("rclpy",))
    assert done.returncode == EXIT_MISSING_PART, failure_report(done)
    assert "cannot import 'rclpy" in done.stderr and "ROS 2" in done.stderr and "tools/bootstrap.sh" in done.stderr
    assert "Traceback" not in done.stderr


def test_plots_without_matplotlib_say_how_to_install_it(tmp_path):
    from flashrt_ros.bag_evaluator import Chunk, write_chunk_bag
    from flashrt_ros.node_parameters import SPECS, settings_from_values
    settings = settings_from_values({name: spec.default for name, spec in SPECS.items()})
    chunk = Chunk(stamp_ns=10**10, view_stamps_ns=(10**10,), state_stamp_ns=0, actions=np.zeros((4, 2), np.float32),
                  receive_ns=10**10 + 5 * 10**7, dt=0.02)
    write_chunk_bag(tmp_path / "bag", [chunk], settings, ["base"], "test-model")
    done = run_tool("chunk_plots", str(tmp_path / "bag"), "--out-dir", str(tmp_path / "plots"),
                    blocked=("matplotlib",))
    assert done.returncode == EXIT_MISSING_PART, failure_report(done)
    assert "cannot import 'matplotlib'" in done.stderr and "pip install 'flashrt-ros[plots]'" in done.stderr
    assert not (tmp_path / "plots").exists() or not any((tmp_path / "plots").iterdir())


def test_node_without_the_built_messages_says_to_build_them():
    done = run_tool("policy_node", blocked=("flashrt_ros.msg",))
    assert done.returncode == EXIT_MISSING_PART, failure_report(done)
    assert "cannot import 'flashrt_ros.msg'" in done.stderr and "colcon build" in done.stderr


def test_other_import_errors_are_not_hidden():
    """A module that is none of the optional parts (here numpy) fails with its own traceback."""
    done = run_tool("demo_bag", "--help", blocked=("numpy",))
    assert done.returncode not in (0, EXIT_MISSING_PART), failure_report(done)
    assert "Traceback" in done.stderr and "ModuleNotFoundError" in done.stderr


def test_demo_without_its_parameter_file_names_the_option(tmp_path):
    done = run_tool("demo", "--params", str(tmp_path / "missing.yaml"))
    assert done.returncode == 2, failure_report(done)
    assert "no such file" in done.stderr and "pass --params PATH" in done.stderr


def test_a_tool_runs_when_its_parts_are_there():
    done = run_tool("demo_bag", "--help")
    assert done.returncode == 0, failure_report(done)
    assert done.stdout.startswith("usage:") and "--duration" in done.stdout
