#!/usr/bin/env bash
# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
# The DDS discovery stall (BENCHMARKS.md, "Large frames on the camera topic"): vla_edge (tiny model) runs under a
# watchdog (wd_bringup.py: names any publish() over 20 ms and any pause of its own thread), a listener (gaps.py)
# subscribes its outputs and prints every gap over 45 ms between ~/cycle publishes, and a one-image publisher
# (big.py) is started N times in a row: each start is one participant joining the domain.
#   dev/discovery_stall/repro.sh N       env: W H (image size, default 8K), RT (realtime_priority, default 10),
#                                        EXTRA (more -p rules), RMW_FASTRTPS_PUBLICATION_MODE (to override)
# ROS_AUTOMATIC_DISCOVERY_RANGE: scripts/env.sh makes it LOCALHOST (rmw_fastrtps then adds shared memory in every
# process); SUBNET is what a robot has by default (the bringup then runs the control process on UDPv4 only).
# Prints the number of gaps and of stalls, then the node's WD/SLOW lines. Needs the tiny model in out/cache/tiny-seed0 (run the
# demo once) and nothing else heavy on the machine.
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"; here="$root/dev/discovery_stall"; log="${LOG:-/tmp/vla_discovery_stall}"
mkdir -p "$log"; cd "$root" && . scripts/env.sh
export ROS_DOMAIN_ID=${ROS_DOMAIN_ID:-81}
n=${1:?number of joins}
python "$here/wd_bringup.py" --ros-args --params-file config/vla_edge.yaml -p model_path:=out/cache/tiny-seed0 \
  -p kv_capacity_tokens:=512 -p qos_reliability:=reliable -p realtime_priority:=${RT:-10} ${EXTRA:-} \
  > "$log/node.log" 2>&1 &
np=$!; sleep 6
ls /proc/$np/task | while read t; do cat /proc/$np/task/$t/comm; done | grep '^dds' | sort | tr '\n' ' ' > "$log/threads.txt"
python "$here/gaps.py" $((8 * n + 4)) > "$log/gaps.log" 2>&1 &
gp=$!; sleep 2
for i in $(seq "$n"); do python "$here/big.py" "${W:-7680}" "${H:-4320}" 1 1.0 > "$log/big$i.log" 2>&1; sleep 1; done
wait $gp; kill -INT $np; wait
# a stall: a gap over 100 ms (a publish held, or ticks that never ran); a model cycle published late in its period
# also makes a gap over 45 ms
stalls=$(awk '/^GAP/ && $2 > 100' "$log/gaps.log" | wc -l)
echo "gaps over 45 ms: $(grep -c '^GAP' "$log/gaps.log"), stalls (gap over 100 ms): $stalls"
echo "control process DDS threads: $(cat "$log/threads.txt")"
grep '^GAP' "$log/gaps.log"
grep -E '^WD|^SLOW' "$log/node.log" | grep -v 'no tick'
