"""Start the flashrt_ros policy node as a lifecycle node and bring it to active (configure, then activate).

    ros2 launch flashrt_ros policy_node.launch.py \
        params_file:=$(ros2 pkg prefix flashrt_ros)/share/flashrt_ros/config/demo_two_cameras.yaml

Arguments: params_file (node parameters, one YAML per setup in config/), namespace, node_name, use_sim_time
(true when replaying a bag with /clock), autostart (false leaves the node unconfigured for
``ros2 lifecycle set``), log_level.
"""

import os

import launch
import launch.actions
import launch.conditions
import launch.events
import launch.substitutions
import launch_ros.actions
import launch_ros.event_handlers
import launch_ros.events.lifecycle
import lifecycle_msgs.msg
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
            description="Node name; must match the top-level key of params_file (or use /** there)."),
        launch.actions.DeclareLaunchArgument(
            "use_sim_time", default_value="false", description="Follow /clock (bag replay)."),
        launch.actions.DeclareLaunchArgument(
            "autostart", default_value="true", description="Configure and activate the node at start."),
        launch.actions.DeclareLaunchArgument("log_level", default_value="info", description="Logging level."),
    ]

    policy_node = launch_ros.actions.LifecycleNode(
        package=PACKAGE,
        executable=EXECUTABLE,
        name=node_name,
        namespace=namespace,
        output="screen",
        emulate_tty=True,
        parameters=[params_file, {"use_sim_time": use_sim_time}],
        arguments=["--ros-args", "--log-level", log_level],
    )

    is_policy_node = launch.events.matches_action(policy_node)
    configure = launch.actions.EmitEvent(
        event=launch_ros.events.lifecycle.ChangeState(
            lifecycle_node_matcher=is_policy_node,
            transition_id=lifecycle_msgs.msg.Transition.TRANSITION_CONFIGURE),
        condition=launch.conditions.IfCondition(autostart))
    # Activate once configure succeeded (loading and warm-up can take a while on a large checkpoint).
    activate_when_inactive = launch.actions.RegisterEventHandler(
        launch_ros.event_handlers.OnStateTransition(
            target_lifecycle_node=policy_node,
            start_state="configuring",
            goal_state="inactive",
            entities=[launch.actions.EmitEvent(
                event=launch_ros.events.lifecycle.ChangeState(
                    lifecycle_node_matcher=is_policy_node,
                    transition_id=lifecycle_msgs.msg.Transition.TRANSITION_ACTIVATE))]),
        condition=launch.conditions.IfCondition(autostart))

    return launch.LaunchDescription(arguments + [policy_node, activate_when_inactive, configure])
