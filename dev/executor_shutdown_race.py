# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Does a spinning rclpy executor always stop when another thread asks it to? (why bringup.ExecutorThread spins one
callback at a time on a guard condition of the node instead of ``executor.spin()`` ended by ``executor.shutdown()``).

Each round builds a node with many entities (ENTITIES services and as many subscriptions, a 0.5 ms timer) so the
spinning thread spends its time building wait sets (the race's window: the more entities, the wider), starts the
spin on a thread, waits a random 0-10 ms, cancels the timer (as the bringup stops its timers) and then ends the spin
one of two ways:

- ``shutdown``: ``executor.spin()`` on the thread, ``executor.shutdown()`` from the main thread. shutdown() triggers
  and at once destroys the executor's wake-up guard condition; a thread that is between appending that guard to its
  wait set and entering its handle skips it and waits on the rest, which never wakes (ros2/rclpy#968).
- ``bringup``: bringup.ExecutorThread (``while not stop: executor.spin_once()`` with a guard condition of the node;
  ``finish()`` sets ``stop``, triggers the guard, joins, and only then shuts the executor down).

A thread still spinning 0.5 s after the stop counts as stuck; one that raised counts as crashed. Measured on the
2-core dev host (2026-12-06, rclpy from the ROS 2 wheels, GIL switch interval 0.5 ms as the node sets it):
``shutdown`` 31 stuck + 8 crashed of 300, ``bringup`` 0 of 300 (20 entities). The same host on a later day, 20
entities: ``shutdown`` 0 stuck of 300 unloaded, 3 stuck + 3 crashed of 200 under ``slow_host.sh -f 3``; 60
entities: 5 stuck + 8 crashed of 100; 150: 6 + 12 of 100. test/test_executor_thread.py runs the ``bringup`` way in
CI with 60.

    . scripts/env.sh && python dev/executor_shutdown_race.py shutdown 300 [ENTITIES=20]
    . scripts/env.sh && python dev/executor_shutdown_race.py bringup 300 60
"""
from __future__ import annotations

import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(mode: str, rounds: int, entities: int) -> None:
    import rclpy
    from rcl_interfaces.srv import GetParameters
    from rclpy.executors import SingleThreadedExecutor
    from std_msgs.msg import String

    from vla_edge_ros.nodes.bringup import ExecutorThread

    sys.setswitchinterval(0.0005)  # as realtime.tighten_gil_switch sets it in the node's processes
    rclpy.init()
    stuck = crashed = 0
    for i in range(rounds):
        node = rclpy.create_node(f"race{i}")
        for k in range(entities):
            node.create_service(GetParameters, f"s{k}", lambda req, res: res)
            node.create_subscription(String, f"t{k}", lambda m: None, 10)
        timer = node.create_timer(0.0005, lambda: None)
        errors: list = []
        if mode == "shutdown":
            ex = SingleThreadedExecutor()
            ex.add_node(node)

            def spin():
                try:
                    ex.spin()
                except Exception as e:  # noqa: BLE001 - counted
                    errors.append(e)

            t = threading.Thread(target=spin, daemon=True)
            t.start()
            time.sleep(random.uniform(0.0, 0.01))
            timer.cancel()
            ex.shutdown(timeout_sec=2.0)
            t.join(0.5)
            left = not t.is_alive()
        else:
            spinner = ExecutorThread(node, threading.Event(), f"race{i}")
            spinner.start()
            time.sleep(random.uniform(0.0, 0.01))
            timer.cancel()
            left = spinner.finish(timeout=0.5) == ""
        if not left:
            stuck += 1
        else:
            crashed += bool(errors)
            node.destroy_node()
    print(f"{mode}: {stuck} stuck, {crashed} crashed of {rounds}", flush=True)
    os._exit(0)  # a stuck thread holds its node: do not wait for it


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("shutdown", "bringup"):
        sys.exit("usage: executor_shutdown_race.py shutdown|bringup [ROUNDS] [ENTITIES]")
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 300, int(sys.argv[3]) if len(sys.argv) > 3 else 20)
