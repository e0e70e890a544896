"""Start the flashrt_ros policy node as a lifecycle node; with autostart it configures and activates itself once.

    ros2 launch flashrt_ros policy_node.launch.py \
        params_file:=$(ros2 pkg prefix flashrt_ros)/share/flashrt_ros/config/demo_two_cameras.yaml

Arguments: params_file (node parameters, one YAML per setup in config/; their `/**` key applies them under any
node name and namespace), namespace, node_name, use_sim_time (true when replaying a bag with /clock), autostart
(false leaves the node unconfigured for ``ros2 lifecycle set``), log_level.

autostart is the node's own ``autostart`` parameter: the node configures and then activates itself once, right
after it starts. The launch file sends no lifecycle transitions, so nothing re-activates the node after a later
manual deactivate / cleanup / configure.
"""

import os

import launch
import launch.actions
import launch.substitutions
import launch_ros.actions
import launch_ros.parameter_descriptions
from ament_index_python.packages import get_package_share_directory

PACKAGE = "flashrt_ros"
EXECUTABLE = "policy_node"
DEFAULT_PARAMS_FILE = "demo_two_cameras.yaml"


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
            description="YAML file with the policy node's parameters (see config/)."),
        launch.actions.DeclareLaunchArgument("namespace", default_value="", description="Node namespace."),
        launch.actions.DeclareLaunchArgument(
            "node_name", default_value="policy_node",
            description="Node name; params_file applies when its top-level key is /** (as in config/) or this name."),
        launch.actions.DeclareLaunchArgument(
            "use_sim_time", default_value="false", description="Follow /clock (bag replay)."),
        launch.actions.DeclareLaunchArgument(
            "autostart", default_value="true", description="Configure and activate the node once at start."),
        launch.actions.DeclareLaunchArgument("log_level", default_value="info", description="Logging level."),
    ]

    policy_node = launch_ros.actions.LifecycleNode(
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

    return launch.LaunchDescription(arguments + [policy_node])
