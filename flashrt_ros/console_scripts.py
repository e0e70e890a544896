"""Entry points of the executables: the pip console scripts (setup.py) and the ROS executables that
CMakeLists.txt writes into lib/flashrt_ros. Each imports its tool's module and runs its main().

`pip install .` gives the Python code of both packages but not ROS 2 (rclpy, the message packages), not this
package's messages (built by colcon or tools/bootstrap.sh) and not the bag or plotting libraries unless asked for
(`pip install .[bags]`, `.[plots]`). Where a tool's import fails for want of one of those parts, the executable
says which part is missing and how to get it, and exits with status 2, instead of ending in a traceback."""

from __future__ import annotations

import importlib
import sys

EXIT_MISSING_PART = 2

ROS_2 = ("ROS 2 (rclpy and the standard message packages): source a ROS 2 install "
         "(`source /opt/ros/kilted/setup.bash`, Jazzy works too), or use the venv of tools/bootstrap.sh, "
         "which has the ROS 2 Kilted Python wheels")
BAG_LIBRARY = ("the rosbags library, which reads and writes the bags: `pip install 'flashrt-ros[bags]'` "
               "(from the source folder: `pip install '.[bags]'`)")
PLOTTING = ("matplotlib, which draws the plots: `pip install 'flashrt-ros[plots]'` (from the source folder: "
            "`pip install '.[plots]'`)")
MESSAGES = ("this package's ROS messages (flashrt_ros.msg), which `pip install .` does not build: build the "
            "package in a ROS 2 workspace (`colcon build --packages-select flashrt_ros`, then "
            "`source install/setup.bash`) or run tools/bootstrap.sh")
# The top-level module a tool imports -> the part that provides it.
MISSING_PARTS = {
    "rosbags": BAG_LIBRARY,
    "matplotlib": PLOTTING,
    "rclpy": ROS_2,
    "builtin_interfaces": ROS_2,
    "diagnostic_msgs": ROS_2,
    "lifecycle_msgs": ROS_2,
    "rosgraph_msgs": ROS_2,
    "sensor_msgs": ROS_2,
    "std_msgs": ROS_2,
    "trajectory_msgs": ROS_2,
    "ament_index_python": ROS_2,
    "flashrt_ros.msg": MESSAGES,
}

# Executable name (as `ros2 run flashrt_ros <name>` knows it) -> the module whose main() it runs.
TOOLS = {
    "policy_node": "flashrt_ros.policy_node",
    "action_executor": "flashrt_ros.action_executor",
    "demo": "flashrt_ros.demo_main",
    "bag_player": "flashrt_ros.bag_player",
    "bag_recorder": "flashrt_ros.bag_recorder",
    "bag_evaluator": "flashrt_ros.bag_evaluator",
    "bag_regression": "flashrt_ros.bag_regression",
    "demo_bag": "flashrt_ros.demo_bag",
    "chunk_plots": "flashrt_ros.chunk_plots",
    "fixture": "flashrt_core.fixtures",
    "inspect": "flashrt_core.checkpoint_inspect",
    "convert": "flashrt_core.checkpoint_convert",
}


def missing_part(error: ModuleNotFoundError) -> str | None:
    """What to install for a failed import, or None where the missing module is none of the optional parts."""
    name = error.name or ""
    if name in MISSING_PARTS:
        return MISSING_PARTS[name]
    return MISSING_PARTS.get(name.split(".", 1)[0])


def run(tool: str) -> int:
    """Import the tool's module and return what its main() returns (its exit status). A missing optional part,
    imported by the module or later by its main(), is reported on stderr, naming the module and what provides it,
    with exit status 2."""
    try:
        return importlib.import_module(TOOLS[tool]).main()
    except ModuleNotFoundError as error:
        advice = missing_part(error)
        if advice is None:
            raise
        print(f"{tool}: cannot import {error.name!r}. This tool needs {advice}.", file=sys.stderr)
        return EXIT_MISSING_PART


def policy_node() -> int:
    return run("policy_node")


def action_executor() -> int:
    return run("action_executor")


def demo() -> int:
    return run("demo")


def bag_player() -> int:
    return run("bag_player")


def bag_recorder() -> int:
    return run("bag_recorder")


def bag_evaluator() -> int:
    return run("bag_evaluator")


def bag_regression() -> int:
    return run("bag_regression")


def demo_bag() -> int:
    return run("demo_bag")


def chunk_plots() -> int:
    return run("chunk_plots")


def fixture() -> int:
    return run("fixture")


def inspect() -> int:
    return run("inspect")


def convert() -> int:
    return run("convert")
