#!/usr/bin/env bash
# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
# The README's demo command: set up from nothing, then run the bringup on a generated tiny model and a
# built-in clip for ~20 s (CUDA when a GPU is present, else the NumPy backend) and print a summary.
set -eo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
. scripts/env.sh
. install/setup.bash
# setup.cfg installs console scripts under lib/vla_edge_ros (where `ros2 run` looks), not on PATH.
exec python3 -m vla_edge_ros.tools.demo "$@"
