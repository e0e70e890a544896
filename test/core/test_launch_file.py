"""The launch file and the config files refer only to executables, files and parameters that exist.

``ros2 launch`` (launch / launch_ros) cannot be installed from wheels, so the launch file is parsed with
``ast`` here and each reference is checked against CMakeLists.txt, config/ and node_parameters.py.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest
import yaml

from flashrt_ros.node_parameters import SPECS, settings_from_values

REPO_ROOT = Path(__file__).resolve().parents[2]
LAUNCH_FILE = REPO_ROOT / "launch" / "policy_node.launch.py"
EXECUTOR_CONFIG = "action_executor.yaml"           # the action executor's (test_executor_launch_file.py)
CONFIG_FILES = sorted(p for p in (REPO_ROOT / "config").glob("*.yaml") if p.name != EXECUTOR_CONFIG)
ROS_BUILTIN_PARAMETERS = {"use_sim_time"}


def module_constants(tree: ast.Module) -> dict[str, object]:
    constants = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    constants[target.id] = node.value.value
    return constants


def resolve(value: ast.expr, constants: dict[str, object]):
    if isinstance(value, ast.Constant):
        return value.value
    if isinstance(value, ast.Name) and value.id in constants:
        return constants[value.id]
    return None


def calls_named(tree: ast.AST, name: str) -> list[ast.Call]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called == name:
                found.append(node)
    return found


def keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


@pytest.fixture(scope="module")
def launch_tree() -> ast.Module:
    return ast.parse(LAUNCH_FILE.read_text(), filename=str(LAUNCH_FILE))


def cmake_executables() -> dict[str, tuple[str, str]]:
    """name -> (module, function) of the executables CMakeLists.txt installs into lib/flashrt_ros."""
    text = (REPO_ROOT / "CMakeLists.txt").read_text()
    block = re.search(r"set\(FLASHRT_EXECUTABLES(.*?)\)", text, re.S)
    assert block, "CMakeLists.txt has no FLASHRT_EXECUTABLES list"
    entries = re.findall(r'"([\w]+):([\w.]+):(\w+)"', block.group(1))
    assert "install(PROGRAMS" in text and "DESTINATION lib/${PROJECT_NAME}" in text
    return {name: (module, function) for name, module, function in entries}


def test_launch_file_executable_is_installed_and_importable(launch_tree):
    constants = module_constants(launch_tree)
    nodes = calls_named(launch_tree, "LifecycleNode")
    assert len(nodes) == 1, "expected one launch_ros.actions.LifecycleNode"
    package = resolve(keyword(nodes[0], "package"), constants)
    executable = resolve(keyword(nodes[0], "executable"), constants)
    assert package == "flashrt_ros"
    executables = cmake_executables()
    assert executable in executables, f"{executable!r} is not installed by CMakeLists.txt: {sorted(executables)}"
    module, function = executables[executable]
    assert callable(getattr(importlib.import_module(module), function))
    # the pip console script runs the same module, through flashrt_ros.console_scripts' table of tools
    from flashrt_ros.console_scripts import TOOLS
    setup_py = (REPO_ROOT / "setup.py").read_text()
    assert TOOLS[executable] == module, "console_scripts.TOOLS does not run the executable's module"
    assert f"=flashrt_ros.console_scripts:{executable}\"" in setup_py, "setup.py has no console script for it"


def test_launch_file_default_params_file_exists_and_is_installed(launch_tree):
    constants = module_constants(launch_tree)
    default_file = constants["DEFAULT_PARAMS_FILE"]
    assert (REPO_ROOT / "config" / default_file).is_file()
    assert re.search(r"install\(DIRECTORY[^)]*\bconfig\b[^)]*DESTINATION share/\$\{PROJECT_NAME\}",
                     (REPO_ROOT / "CMakeLists.txt").read_text()), "config/ is not installed to share/flashrt_ros"
    # the share-directory lookup names this package and the config folder
    joins = [c for c in calls_named(launch_tree, "join") if any(
        isinstance(a, ast.Name) and a.id == "DEFAULT_PARAMS_FILE" for a in c.args)]
    assert joins and any(isinstance(a, ast.Constant) and a.value == "config" for a in joins[0].args)


def test_pip_route_installs_every_launch_file_parameter_file_and_message(monkeypatch):
    """`pip install .` puts into share/flashrt_ros what the ament build installs there (CMakeLists.txt installs
    the launch/, config/ and msg/ folders whole): each launch file, parameter file and message of the tree."""
    import runpy

    import setuptools
    captured = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: captured.update(kwargs))
    monkeypatch.chdir(REPO_ROOT)
    runpy.run_path(str(REPO_ROOT / "setup.py"))
    installed = {destination: set(files) for destination, files in captured["data_files"]}
    for folder, pattern in (("launch", "*.launch.py"), ("config", "*.yaml"), ("msg", "*.msg")):
        in_tree = {str(path.relative_to(REPO_ROOT)) for path in (REPO_ROOT / folder).glob(pattern)}
        assert in_tree, f"no {pattern} in {folder}/"
        assert installed.get(f"share/flashrt_ros/{folder}") == in_tree, f"setup.py does not install {folder}/ whole"
    cmake = (REPO_ROOT / "CMakeLists.txt").read_text()
    assert re.search(r"install\(DIRECTORY launch config DESTINATION share/\$\{PROJECT_NAME\}\)", cmake)


def test_launch_arguments_are_declared_before_use(launch_tree):
    declared = {resolve(c.args[0], {}) for c in calls_named(launch_tree, "DeclareLaunchArgument")}
    used = {resolve(c.args[0], {}) for c in calls_named(launch_tree, "LaunchConfiguration")}
    assert used <= declared, f"undeclared launch arguments: {used - declared}"
    assert {"params_file", "use_sim_time", "autostart"} <= declared


def test_launch_file_parameter_names_exist(launch_tree):
    node = calls_named(launch_tree, "LifecycleNode")[0]
    parameters = keyword(node, "parameters")
    names = {resolve(key, {}) for item in parameters.elts if isinstance(item, ast.Dict) for key in item.keys}
    assert names, "the launch file passes no inline parameters (expected use_sim_time)"
    unknown = names - set(SPECS) - ROS_BUILTIN_PARAMETERS
    assert not unknown, f"parameters not declared by node_parameters.py: {unknown}"


def test_launch_file_autostart_is_the_nodes_own_parameter_and_sends_no_transitions(launch_tree):
    """The node configures and activates itself once (its autostart parameter, tested over DDS in
    test/ros/test_node_ros_usage.py); a launch-side event handler would re-activate it after every later manual
    configure, so the launch file sends no transition at all."""
    node = calls_named(launch_tree, "LifecycleNode")[0]
    inline = [item for item in keyword(node, "parameters").elts if isinstance(item, ast.Dict)][0]
    values = {resolve(key, {}): value for key, value in zip(inline.keys, inline.values)}
    assert ast.unparse(values["autostart"]) == \
        "launch_ros.parameter_descriptions.ParameterValue(autostart, value_type=bool)"
    assigned = {target.id: node_value for node_value in ast.walk(launch_tree) if isinstance(node_value, ast.Assign)
                for target in node_value.targets if isinstance(target, ast.Name)}
    assert "LaunchConfiguration" in ast.unparse(assigned["autostart"]) and "'autostart'" in ast.unparse(
        assigned["autostart"])
    for name in ("ChangeState", "OnStateTransition", "RegisterEventHandler", "EmitEvent"):
        assert not calls_named(launch_tree, name), f"the launch file must not send lifecycle transitions ({name})"


@pytest.mark.parametrize("path", CONFIG_FILES, ids=[p.name for p in CONFIG_FILES])
def test_config_files_use_only_declared_parameters_with_valid_values(path):
    document = yaml.safe_load(path.read_text())
    assert list(document) == ["/**"], f"{path.name}: top-level key must be /** (any node name and namespace)"
    values = document["/**"]["ros__parameters"]
    unknown = set(values) - set(SPECS) - ROS_BUILTIN_PARAMETERS
    assert not unknown, f"{path.name}: parameters not declared by node_parameters.py: {sorted(unknown)}"
    merged = {name: spec.default for name, spec in SPECS.items()}
    merged.update({k: v for k, v in values.items() if k in SPECS})
    for name, value in merged.items():
        if isinstance(SPECS[name].default, float):
            assert isinstance(value, float), f"{path.name}: {name} must be written as a float (e.g. 1.0)"
    settings = settings_from_values(merged)
    assert len(settings.camera_topics) >= 1


def test_demo_config_has_two_cameras_and_aloha_three():
    load = lambda name: yaml.safe_load((REPO_ROOT / "config" / name).read_text())["/**"][  # noqa: E731
        "ros__parameters"]
    assert len(load("demo_two_cameras.yaml")["camera_topics"]) == 2
    assert load("demo_two_cameras.yaml")["checkpoint"] == ""
    aloha = load("aloha_pi0.yaml")
    assert len(aloha["camera_topics"]) == 3 and aloha["model_config"] == "pi0"
    assert load("libero_pi05.yaml")["model_config"] == "pi05"


def test_readme_launch_commands_name_existing_launch_and_config_files(launch_tree):
    readme = (REPO_ROOT / "README.md").read_text()
    commands = re.findall(r"ros2 launch flashrt_ros (\S+)(.*)", readme)
    assert commands, "README.md shows no `ros2 launch flashrt_ros ...` command"
    for launch_name, rest in commands:
        assert (REPO_ROOT / "launch" / launch_name).is_file(), launch_name
        declared = {resolve(c.args[0], {}) for c in calls_named(launch_tree, "DeclareLaunchArgument")}
        for argument, value in re.findall(r"(\w+):=(\S+)", rest):
            assert argument in declared, f"README passes undeclared launch argument {argument}"
            config = re.search(r"/config/([\w.]+\.yaml)$", value)
            if config:
                assert (REPO_ROOT / "config" / config.group(1)).is_file(), value
    node_names = {resolve(keyword(c, "default_value"), {}) for c in calls_named(launch_tree, "DeclareLaunchArgument")
                  if resolve(c.args[0], {}) == "node_name"}
    for node in re.findall(r"ros2 lifecycle set /(\w+)", readme):
        assert node in node_names, f"README drives /{node}, the launch file names the node {node_names}"
