# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Start vla_edge (the ReasoningNode, and the CameraNode in a child process it starts) with config/vla_edge.yaml.

    ros2 launch vla_edge_ros vla_edge.launch.py model_path:=/path/to/model image_topic:=/camera/image_raw
    ros2 launch vla_edge_ros vla_edge.launch.py model_path:=/path/to/model action_type:=twist \
        action_topic:=/cmd_vel
    ros2 launch vla_edge_ros vla_edge.launch.py params_file:=my.yaml namespace:=robot1 log_level:=debug

The parameter arguments (model_path, make_tiny_model, policy, backend, transport, qos_reliability,
use_sim_time, action_type, autostart) are empty by default and then set nothing: the value comes from
params_file.  Given on the command line they override it.  Parameters go to the process as, in this
order, ``--params-file <params_file>`` and one ``-p name:=value`` per given argument (rcl applies them
in order, the last wins); both are scoped to the group below.  launch_yaml's file does exactly the same
(test/test_launch.py compares the two).

The node name is deliberately not set: ``name=`` becomes ``__node:=`` and would rename both nodes
of the process.  VLA_EDGE_CAMERA_FASTDDS_PROFILE points at the installed Fast DDS profile with an
8 MiB shared-memory segment (docs/DESIGN.md §8); vla_edge applies it to its camera process only (the
reasoning process runs UDP only: nodes/bringup.py, udp_only_transport).
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, GroupAction, SetEnvironmentVariable
from launch.conditions import IfCondition
from launch.substitutions import IfElseSubstitution, LaunchConfiguration, NotEqualsSubstitution, PathJoinSubstitution
from launch_ros.actions import Node, SetParameter, SetParametersFromFile, SetRemap
from launch_ros.substitutions import FindPackageShare

# Launch argument -> description.  Each one is a node parameter set only when the argument is given.
PARAM_ARGS = {
    "model_path": "HF-layout model directory (params file default: empty -> error unless make_tiny_model)",
    "make_tiny_model": "true | false: generate a tiny random model for a demo",
    "policy": "KV eviction policy: fifo | sliding_window | semantic",
    "backend": "auto | numpy | cuda",
    "transport": "raw | compressed (camera input)",
    "qos_reliability": "auto (reliable when every publisher offers it) | best_effort | reliable",
    "use_sim_time": "true | false: follow /clock (bag replay with --clock)",
    "action_type": "twist_stamped | twist: message type of ~/action",
    "autostart": "true | false: configure and activate the lifecycle node at start-up; false: wait for a "
                 "lifecycle manager",
}
BOOL_PARAMS = ("make_tiny_model", "use_sim_time", "autostart")


def _given(name):
    return IfCondition(NotEqualsSubstitution(LaunchConfiguration(name), ""))


def _value(name):
    # Booleans are normalised (1/0/True/yes... -> true/false), so both launch files pass a bool
    # parameter and never an integer the node would refuse.
    if name in BOOL_PARAMS:
        return IfElseSubstitution(LaunchConfiguration(name), "true", "false")
    return LaunchConfiguration(name)


def generate_launch_description():
    pkg = FindPackageShare("vla_edge_ros")
    image_topic = LaunchConfiguration("image_topic")
    args = [
        DeclareLaunchArgument("params_file", default_value=PathJoinSubstitution([pkg, "config", "vla_edge.yaml"]),
                              description="parameter file for both nodes "
                                          "(default: the installed config/vla_edge.yaml)"),
        DeclareLaunchArgument("image_topic", default_value="/camera/image_raw",
                              description="camera topic (raw); '<image_topic>/compressed' for transport:=compressed"),
        DeclareLaunchArgument("action_topic", default_value="",
                              description="remap the command output ~/action (default /vla_edge/action), "
                                          "e.g. /cmd_vel (with action_type twist for a Twist base)"),
        DeclareLaunchArgument("trajectory_topic", default_value="",
                              description="remap the plan output ~/action_chunk (default /vla_edge/action_chunk), "
                                          "e.g. /joint_trajectory_controller/joint_trajectory"),
        DeclareLaunchArgument("joint_states_topic", default_value="/joint_states",
                              description="the robot state in (~/joint_states, sensor_msgs/JointState): subscribed "
                                          "only for a model with a state input; '' leaves it "
                                          "/vla_edge/joint_states"),
        DeclareLaunchArgument("namespace", default_value="", description="namespace of both nodes"),
        DeclareLaunchArgument("log_level", default_value="info", description="debug | info | warn | error | fatal"),
    ] + [DeclareLaunchArgument(name, default_value="", description=f"{text} (default: from params_file)")
         for name, text in PARAM_ARGS.items()]
    group = GroupAction(scoped=True, actions=[
        SetParametersFromFile(LaunchConfiguration("params_file")),
        *[SetParameter(name, _value(name), condition=_given(name)) for name in PARAM_ARGS],
        SetRemap("~/action", LaunchConfiguration("action_topic"), condition=_given("action_topic")),
        SetRemap("~/action_chunk", LaunchConfiguration("trajectory_topic"), condition=_given("trajectory_topic")),
        SetRemap("~/joint_states", LaunchConfiguration("joint_states_topic"),
                 condition=_given("joint_states_topic")),
        Node(
            package="vla_edge_ros",
            executable="vla_edge",
            namespace=LaunchConfiguration("namespace"),
            output="screen",
            emulate_tty=True,
            ros_arguments=["--log-level", LaunchConfiguration("log_level")],
            remappings=[
                ("image", image_topic),
                ("image/compressed", [image_topic, "/compressed"]),
            ],
        ),
    ])
    return LaunchDescription(args + [
        SetEnvironmentVariable("VLA_EDGE_CAMERA_FASTDDS_PROFILE",
                               PathJoinSubstitution([pkg, "config", "fastdds_shm.xml"])),
        group,
    ])
