"""Start the flashrt_ros action executor as a lifecycle node (it configures and activates itself once with
autostart): the command for now, at the control rate, from the policy node's action chunks.

    ros2 launch flashrt_ros action_executor.launch.py \
        params_file:=$(ros2 pkg prefix flashrt_ros)/share/flashrt_ros/config/action_executor.yaml

Arguments: params_file (the executor's parameters; see config/action_executor.yaml and docs/action_executor.md),
namespace, node_name, use_sim_time (true when replaying a bag with /clock), autostart (false leaves the node
unconfigured for ``ros2 lifecycle set``), log_level. Start it beside the policy node (policy_node.launch.py),
each with its own parameter file: both take `/**` files, and both have an `output_topic`.
"""

import os

import launch
import launch.actions
import launch.substitutions
import launch_ros.actions
import launch_ros.parameter_descriptions
from ament_index_python.packages import get_package_share_directory

PACKAGE = "flashrt_ros"
EXECUTABLE = "action_executor"
DEFAULT_PARAMS_FILE = "action_executor.yaml"


def generate_launch_description() -> launch.LaunchDescription:
    params_file = launch.substitutions.LaunchConfiguration("params_file")
    namespace = launch.substitutions.LaunchConfiguration("namespace")
    node_name = launch.substitutions.LaunchConfiguration("node_name")
    use_sim_time = launch.substitutions.LaunchConfiguration("use_sim_time")
    autostart = launch.substitutions.LaunchConfiguration("autostart")
    log_level = launch.substitutions.LaunchConfiguration("log_level")

    arguments = [
        launch.actions.DeclareLaunchArgument(
            "params_file",
            default_value=os.path.join(get_package_share_directory(PACKAGE), "config", DEFAULT_PARAMS_FILE),
            description="YAML file with the action executor's parameters."),
        launch.actions.DeclareLaunchArgument("namespace", default_value="", description="Node namespace."),
        launch.actions.DeclareLaunchArgument("node_name", default_value="action_executor", description="Node name."),
        launch.actions.DeclareLaunchArgument(
            "use_sim_time", default_value="false", description="Follow /clock (bag replay)."),
        launch.actions.DeclareLaunchArgument(
            "autostart", default_value="true", description="Configure and activate the node once at start."),
        launch.actions.DeclareLaunchArgument("log_level", default_value="info", description="Logging level."),
    ]

    executor_node = launch_ros.actions.LifecycleNode(
        package=PACKAGE,
        executable=EXECUTABLE,
        name=node_name,
        namespace=namespace,
        output="screen",
        emulate_tty=True,
        parameters=[params_file, {
            "use_sim_time": launch_ros.parameter_descriptions.ParameterValue(use_sim_time, value_type=bool),
            "autostart": launch_ros.parameter_descriptions.ParameterValue(autostart, value_type=bool),
        }],
        arguments=["--ros-args", "--log-level", log_level],
    )

    return launch.LaunchDescription(arguments + [executor_node])
