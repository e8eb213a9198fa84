#!/usr/bin/env bash
# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
# Start both launch files with the REAL ROS 2 Jazzy launch + launch_ros (pure Python, from their jazzy
# sources) next to this repository's PyPI ROS wheels, and check that parameters, remaps, namespace and a
# clean SIGINT shutdown work.  Nothing is installed into .venv: the launch packages go to a scratch
# folder on PYTHONPATH, and a scratch ament prefix makes `vla_edge_ros` findable by FindPackageShare /
# the Node action (its share/ links back to launch/ and config/ here, lib/vla_edge_ros/vla_edge runs
# `python -m vla_edge_ros.nodes.bringup` from this tree).
#
#   scripts/launch_check.sh LAUNCH_SRC LAUNCH_ROS_SRC [SCRATCH]
#     LAUNCH_SRC, LAUNCH_ROS_SRC: clones of github.com/ros2/launch and ros2/launch_ros on branch jazzy
#     SCRATCH: work folder (default /tmp/vla_launch_check)
#
# composition_interfaces (imported by launch_ros for composable nodes) has no PyPI wheel: only that
# import is patched, to a placeholder namespace, in the scratch copy.
set -eo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
src="${1:?launch source}"; ros_src="${2:?launch_ros source}"; scratch="${3:-/tmp/vla_launch_check}"
. "$root/scripts/env.sh"
rm -rf "$scratch"; mkdir -p "$scratch"
pkgs="$scratch/pkgs"; prefix="$scratch/prefix"
python -m pip install -q --no-deps --target "$pkgs" osrf-pycommon "$src/launch" "$src/launch_yaml" \
  "$src/launch_xml" "$ros_src/launch_ros"
# pip --target drops launch's grammar (a data file found through ament_index): put it where it is looked for.
mkdir -p "$pkgs/share/launch/frontend"
cp "$src/launch/share/launch/frontend/grammar.lark" "$pkgs/share/launch/frontend/"
python - "$pkgs/launch_ros/actions/load_composable_nodes.py" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
s = s.replace("import composition_interfaces.srv\n", """try:  # scratch patch: no composition_interfaces wheel
    import composition_interfaces.srv
except ImportError:
    import types as _t
    composition_interfaces = _t.SimpleNamespace(srv=_t.SimpleNamespace(
        LoadNode=_t.SimpleNamespace(Request=object, Response=object)))
""", 1)
open(p, "w").write(s)
PY
mkdir -p "$prefix/share/ament_index/resource_index/packages" "$prefix/share/vla_edge_ros" "$prefix/lib/vla_edge_ros"
touch "$prefix/share/ament_index/resource_index/packages/vla_edge_ros"
ln -s "$root/launch" "$root/config" "$root/package.xml" "$prefix/share/vla_edge_ros/"
cat > "$prefix/lib/vla_edge_ros/vla_edge" <<SH
#!/bin/sh
PYTHONPATH="$root\${PYTHONPATH:+:\$PYTHONPATH}" exec "$(command -v python)" -m vla_edge_ros.nodes.bringup "\$@"
SH
chmod +x "$prefix/lib/vla_edge_ros/vla_edge"
cat > "$scratch/params.yaml" <<YAML
/**/vla_camera:
  ros__parameters: {transport: compressed, qos_reliability: reliable}
/**/vla_edge:
  ros__parameters: {policy: sliding_window, backend: numpy, kv_capacity_tokens: 512, period_ms: 50.0}
YAML
export AMENT_PREFIX_PATH="$prefix:$pkgs:$AMENT_PREFIX_PATH" PYTHONPATH="$pkgs:$root${PYTHONPATH:+:$PYTHONPATH}"
check="python $root/scripts/launch_check.py --seconds 90"
rc=0
for f in "$root/launch/vla_edge.launch.py" "$root/launch/vla_edge.launch.yaml"; do
  echo "== $(basename "$f"): params file decides what is not given; make_tiny_model:=1; action_topic:=/cmd_vel"
  $check "$f" params_file:="$scratch/params.yaml" make_tiny_model:=1 action_topic:=/cmd_vel \
    --expect vla_edge:policy=sliding_window --expect vla_edge:backend=numpy --expect vla_edge:period_ms=50.0 \
    --expect vla_edge:make_tiny_model=true --expect vla_camera:transport=compressed \
    --expect vla_camera:qos_reliability=reliable --action-topic /cmd_vel \
    --expect-output "DDS transports: UDPv4 in this process" \
    --expect-output "config/fastdds_shm.xml in the camera process" 2>&1 | grep -E '^(ok |BAD|launch service)' || rc=1
  echo "== $(basename "$f"): arguments override the params file; namespace, use_sim_time, log_level"
  $check "$f" params_file:="$scratch/params.yaml" make_tiny_model:=true policy:=semantic transport:=raw \
    namespace:=robot1 use_sim_time:=1 log_level:=debug --namespace /robot1 \
    --expect vla_edge:policy=semantic --expect vla_edge:use_sim_time=true --expect vla_edge:kv_capacity_tokens=512 \
    --expect vla_camera:transport=raw --action-topic /robot1/vla_edge/action 2>&1 | grep -E '^(ok |BAD|launch service)' || rc=1
  echo "== $(basename "$f"): the installed config/vla_edge.yaml as params file"
  $check "$f" make_tiny_model:=True backend:=numpy --expect vla_edge:policy=fifo \
    --expect vla_edge:kv_capacity_tokens=4096 --expect vla_camera:qos_reliability=best_effort \
    --action-topic /vla_edge/action 2>&1 | grep -E '^(ok |BAD|launch service)' || rc=1
  echo "== $(basename "$f"): autostart:=false leaves the lifecycle node unconfigured (parameters still answer)"
  $check "$f" make_tiny_model:=1 backend:=numpy autostart:=false --expect vla_edge:autostart=false \
    --expect vla_edge:make_tiny_model=true 2>&1 | grep -E '^(ok |BAD|launch service)' || rc=1
  echo "== $(basename "$f"): action_type:=twist puts geometry_msgs/Twist on the remapped action topic"
  $check "$f" make_tiny_model:=1 backend:=numpy action_type:=twist action_topic:=/cmd_vel \
    --expect vla_edge:action_type=twist --action-topic /cmd_vel --twist 2>&1 \
    | grep -E '^(ok |BAD|launch service)' || rc=1
done
echo "== test/test_launch.py with the real launch packages importable (nothing skipped)"
python -m pytest -q -p no:cacheprovider -rs "$root/test/test_launch.py" 2>&1 | tail -n 1
python -m pytest -q -p no:cacheprovider -rs "$root/test/test_launch.py" > /dev/null 2>&1 || rc=1
exit $rc
