# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""How long rclpy's take of a big message holds a process's interpreter (why ~/instruction is taken in the camera
process, instruction_mailbox.py).

A publisher process sends 10 MB std_msgs/String messages as fast as it can for SECONDS; this process's main thread,
at SCHED_FIFO 10 when allowed (as the node's control thread), sleeps 1 ms in a loop and records how late each wake-up
is. Three modes: `take` (a normal-priority thread spins a raw subscription: rclpy takes every message), `receive`
(the subscription exists, so DDS reassembles the messages in this process, but nothing takes them), `none` (no
subscription to the topic). Prints the wake-up lateness per mode.

    . scripts/env.sh && python dev/instruction_take_stall/take_stall.py [SECONDS]
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

MB = 10


def publisher(seconds: float) -> None:
    import rclpy
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    from std_msgs.msg import String

    rclpy.init()
    node = rclpy.create_node("take_stall_pub")
    qos = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    pub = node.create_publisher(String, "/take_stall/instruction", qos)
    big, n, t_end = "x" * (MB << 20), 0, time.monotonic() + seconds
    while time.monotonic() < t_end:
        pub.publish(String(data=big))
        n += 1
    print(f"sent {n}", flush=True)


def measure(mode: str, seconds: float) -> str:
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    from std_msgs.msg import String

    sys.setswitchinterval(0.0005)  # as the node (realtime.tighten_gil_switch)
    rclpy.init()
    node = rclpy.create_node("take_stall_sub")
    qos = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    taken = [0]
    if mode != "none":
        node.create_subscription(String, "/take_stall/instruction", lambda raw: taken.__setitem__(0, taken[0] + 1),
                                 qos, raw=True)
    ex = SingleThreadedExecutor()
    ex.add_node(node)
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ex.spin_once(timeout_sec=0.1)

    if mode == "take":
        threading.Thread(target=spin, daemon=True).start()
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
        sched = "SCHED_FIFO 10"
    except (AttributeError, PermissionError, OSError):
        sched = "normal scheduling"
    pub = subprocess.Popen([sys.executable, __file__, "--publish", str(seconds)], stdout=subprocess.PIPE, text=True)
    gaps, t_end, last = [], time.monotonic() + seconds + 2.0, time.perf_counter()
    while time.monotonic() < t_end:
        time.sleep(0.001)
        now = time.perf_counter()
        gaps.append((now - last - 0.001) * 1e3)
        last = now
    sent = pub.communicate()[0].strip()
    stop.set()
    gaps.sort()
    return (f"{mode:8s} {sent}, taken {taken[0]}: wake-up late p50 {gaps[len(gaps) // 2]:.2f} ms, "
            f"p99 {gaps[int(len(gaps) * 0.99)]:.2f} ms, max {gaps[-1]:.2f} ms, >5 ms {sum(g > 5 for g in gaps)}, "
            f">20 ms {sum(g > 20 for g in gaps)} ({sched}, {os.cpu_count()} CPUs)")


def main() -> int:
    if sys.argv[1:2] == ["--publish"]:
        publisher(float(sys.argv[2]))
        return 0
    if sys.argv[1:2] == ["--measure"]:
        print(measure(sys.argv[2], float(sys.argv[3])), flush=True)
        return 0
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    env = {**os.environ, "ROS_DOMAIN_ID": os.environ.get("ROS_DOMAIN_ID", "77")}
    for mode in ("take", "receive", "none"):
        subprocess.run([sys.executable, __file__, "--measure", mode, str(seconds)], env=env, check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
