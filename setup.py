# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
from glob import glob

from setuptools import find_packages, setup

package_name = "vla_edge_ros"

setup(
    name=package_name,
    version="0.1.0",
    packages=find_packages(exclude=["test"]),
    data_files=[
        ("share/ament_index/resource_index/packages", ["resource/" + package_name]),
        ("share/" + package_name, ["package.xml"]),
        ("share/" + package_name + "/launch", glob("launch/*.launch.py") + glob("launch/*.launch.yaml")),
        ("share/" + package_name + "/config", glob("config/*.yaml") + glob("config/*.xml") + glob("config/*.rviz")),
        ("share/" + package_name + "/kernels", glob("kernels/*.cu") + glob("kernels/*.cuh")),
    ],
    # The ROS packages (rclpy, the message packages, launch) come from the ROS install or the
    # ros-jazzy-* wheels, not from this list; package.xml declares them for rosdep.
    install_requires=["setuptools", "numpy", "opencv-python-headless", "rosbags", "matplotlib", "tqdm",
                      "pyyaml"],
    extras_require={
        # setuptools >= 72 ignores tests_require: colcon reads the 'test' extra to find pytest.
        "test": ["pytest", "hypothesis"],
        # The CUDA backend; without it the NumPy backend runs.
        "cuda": ["cupy-cuda13x", "cuda-python"],
        # the checkpoint's tokenizer and chat template (optional: without it the fixed prompt ids are used).
        "tokenizer": ["tokenizers", "jinja2"],
        # GGUF model files (llama.cpp's reader and dequantizer).
        "gguf": ["gguf", "xxhash"],
        # vla-edge-fleet (Ray: the bags in parallel, locally or on a cluster).
        "fleet": ["ray"],
    },
    zip_safe=True,
    maintainer="vla_edge_ros maintainers",
    maintainer_email="maintainers@vla-edge-ros.invalid",
    description="VLA reasoning on a live robot camera under a hard control deadline",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [
            "vla_edge = vla_edge_ros.nodes.bringup:main",
            "camera_node = vla_edge_ros.nodes.camera_node:main",
            "vla-edge-make-model = vla_edge_ros.tools.make_model:main",
            "vla-edge-replay = vla_edge_ros.tools.replay:main",
            "vla-edge-bench = vla_edge_ros.tools.bench:main",
            "vla-edge-demo = vla_edge_ros.tools.demo:main",
            "vla-edge-soak = vla_edge_ros.tools.soak:main",
            "vla-edge-quantize = vla_edge_ros.tools.quantize:main",
            "vla-edge-plan = vla_edge_ros.tools.plan:main",
            "vla-edge-generate = vla_edge_ros.tools.generate:main",
            "vla-edge-fleet = vla_edge_ros.tools.fleet:main",
        ],
    },
)
