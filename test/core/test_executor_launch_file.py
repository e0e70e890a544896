"""launch/action_executor.launch.py and config/action_executor.yaml refer only to what exists: the installed
executable, the parameter file, the executor's parameters with valid values; the node starts itself (autostart)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
import yaml
from test_launch_file import EXECUTOR_CONFIG, calls_named, cmake_executables, keyword, module_constants, resolve

from flashrt_ros.executor_parameters import SPECS, settings_from_values

REPO_ROOT = Path(__file__).resolve().parents[2]
LAUNCH_FILE = REPO_ROOT / "launch" / "action_executor.launch.py"
ROS_BUILTIN_PARAMETERS = {"use_sim_time"}


@pytest.fixture(scope="module")
def launch_tree() -> ast.Module:
    return ast.parse(LAUNCH_FILE.read_text(), filename=str(LAUNCH_FILE))


def test_executable_and_parameter_file_exist(launch_tree):
    constants = module_constants(launch_tree)
    node = calls_named(launch_tree, "LifecycleNode")
    assert len(node) == 1
    executable = resolve(keyword(node[0], "executable"), constants)
    module, function = cmake_executables()[executable]
    assert module == "flashrt_ros.action_executor" and callable(getattr(importlib.import_module(module), function))
    assert constants["DEFAULT_PARAMS_FILE"] == EXECUTOR_CONFIG and (REPO_ROOT / "config" / EXECUTOR_CONFIG).is_file()


def test_inline_parameters_are_the_executors_and_it_starts_itself(launch_tree):
    node = calls_named(launch_tree, "LifecycleNode")[0]
    inline = [item for item in keyword(node, "parameters").elts if isinstance(item, ast.Dict)][0]
    names = {resolve(key, {}) for key in inline.keys}
    assert names - ROS_BUILTIN_PARAMETERS <= set(SPECS) and "autostart" in names
    declared = {resolve(c.args[0], {}) for c in calls_named(launch_tree, "DeclareLaunchArgument")}
    used = {resolve(c.args[0], {}) for c in calls_named(launch_tree, "LaunchConfiguration")}
    assert used <= declared and {"params_file", "use_sim_time", "autostart"} <= declared
    for name in ("ChangeState", "OnStateTransition", "RegisterEventHandler", "EmitEvent"):
        assert not calls_named(launch_tree, name), f"the launch file must not send lifecycle transitions ({name})"


def test_config_file_holds_valid_executor_parameters():
    document = yaml.safe_load((REPO_ROOT / "config" / EXECUTOR_CONFIG).read_text())
    assert list(document) == ["/**"]
    values = document["/**"]["ros__parameters"]
    assert set(values) <= set(SPECS), sorted(set(values) - set(SPECS))
    merged = {name: spec.default for name, spec in SPECS.items()} | values
    for name, value in merged.items():
        if isinstance(SPECS[name].default, float):
            assert isinstance(value, float), f"{name} must be written as a float (e.g. 1.0)"
    settings = settings_from_values(merged)
    assert settings.input_topic == "action_chunk" and settings.control_rate_hz == 100.0
