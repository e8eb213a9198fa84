# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
# Source me: the venv plus the environment ROS 2 from PyPI wheels needs. Safe to source twice.
# (No `set -u` here or in callers: install/setup.bash reads unset variables.)
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "${VLA_VENV:-$_root/.venv}/bin/activate"
export AMENT_PREFIX_PATH="${AMENT_PREFIX_PATH:-$VIRTUAL_ENV}"
case ":$AMENT_PREFIX_PATH:" in *":$VIRTUAL_ENV:"*) ;; *) export AMENT_PREFIX_PATH="$AMENT_PREFIX_PATH:$VIRTUAL_ENV" ;; esac
export ROS_AUTOMATIC_DISCOVERY_RANGE="${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}"
# A random domain keeps concurrent runs (and CI next to a developer) from hearing each other.
export ROS_DOMAIN_ID="${ROS_DOMAIN_ID:-$(( (RANDOM % 100) + 1 ))}"
export PYTHONUNBUFFERED=1
# Console scripts (vla_edge, vla-edge-*): colcon installs an ament_python package's scripts into
# install/<pkg>/lib/<pkg>/, where `ros2 run` looks, and install/setup.bash does not put that folder on PATH.
# It is added here even before the first build (a missing folder on PATH is harmless), so the order of
# `. scripts/env.sh` and `. install/setup.bash`, and a build after sourcing, do not matter.
_bin="$_root/install/vla_edge_ros/lib/vla_edge_ros"
case ":$PATH:" in *":$_bin:"*) ;; *) export PATH="$_bin:$PATH" ;; esac
unset _root _bin
# One BLAS thread: the NumPy backend's matrices are small, and on a 2-core box a multi-threaded
# OpenBLAS competing with the camera and DDS threads was measured ~40x slower per chunk.
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}" OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
