"""Start vla_edge (CameraNode + ReasoningNode in one process) with config/vla_edge.yaml.

    ros2 launch vla_edge_ros vla_edge.launch.py model_path:=/path/to/model image_topic:=/camera/image_raw
    ros2 launch vla_edge_ros vla_edge.launch.py make_tiny_model:=true transport:=compressed

The node name is deliberately not set: ``name=`` becomes ``__node:=`` and would rename both nodes
of the process.  FASTRTPS_DEFAULT_PROFILES_FILE points at the installed Fast DDS profile with an
8 MiB shared-memory segment (DESIGN.md §8); it applies to every process this launch starts.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, SetEnvironmentVariable
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare


def generate_launch_description():
    pkg = FindPackageShare("vla_edge_ros")
    image_topic = LaunchConfiguration("image_topic")
    return LaunchDescription([
        DeclareLaunchArgument("params_file", default_value=PathJoinSubstitution([pkg, "config", "vla_edge.yaml"]),
                              description="parameter file for both nodes"),
        DeclareLaunchArgument("image_topic", default_value="/camera/image_raw",
                              description="camera topic (raw); '<image_topic>/compressed' for transport:=compressed"),
        DeclareLaunchArgument("transport", default_value="raw", description="raw | compressed"),
        DeclareLaunchArgument("qos_reliability", default_value="best_effort",
                              description="best_effort (live camera) | reliable (bag replay)"),
        DeclareLaunchArgument("model_path", default_value="",
                              description="HF-layout model directory (empty: error unless make_tiny_model)"),
        DeclareLaunchArgument("make_tiny_model", default_value="false",
                              description="generate a tiny random model for a demo"),
        DeclareLaunchArgument("policy", default_value="fifo", description="fifo | sliding_window | semantic"),
        DeclareLaunchArgument("backend", default_value="auto", description="auto | numpy | cuda"),
        SetEnvironmentVariable("FASTRTPS_DEFAULT_PROFILES_FILE",
                               PathJoinSubstitution([pkg, "config", "fastdds_shm.xml"])),
        Node(
            package="vla_edge_ros",
            executable="vla_edge",
            output="screen",
            emulate_tty=True,
            parameters=[
                LaunchConfiguration("params_file"),
                {
                    "model_path": ParameterValue(LaunchConfiguration("model_path"), value_type=str),
                    "make_tiny_model": ParameterValue(LaunchConfiguration("make_tiny_model"), value_type=bool),
                    "policy": ParameterValue(LaunchConfiguration("policy"), value_type=str),
                    "backend": ParameterValue(LaunchConfiguration("backend"), value_type=str),
                    "transport": ParameterValue(LaunchConfiguration("transport"), value_type=str),
                    "qos_reliability": ParameterValue(LaunchConfiguration("qos_reliability"), value_type=str),
                },
            ],
            remappings=[
                ("image", image_topic),
                ("image/compressed", [image_topic, "/compressed"]),
            ],
        ),
    ])
