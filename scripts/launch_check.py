# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Run a launch file for a few seconds with the real launch/launch_ros and read the node's parameters back.

Used by scripts/launch_check.sh (which prepares launch/launch_ros from their jazzy sources); run directly:

    python scripts/launch_check.py launch/vla_edge.launch.py --seconds 25 \
        --expect vla_edge:policy=sliding_window --expect vla_camera:transport=compressed \
        params_file:=/tmp/p.yaml make_tiny_model:=1

Starts a LaunchService on the file with the given ``name:=value`` arguments, waits until each node in
``--expect`` answers its get_parameters service, compares the values, checks that /vla_edge publishes on
the expected action topic (``--action-topic``; ``--twist`` when the launch sets action_type twist), that the
launched processes printed each ``--expect-output`` text (e.g. the transport line of vla_edge's start-up log),
then shuts the launch down (SIGINT to the node, as Ctrl-C would) and exits 0 only when everything matched and the
node exited cleanly.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time


def _query(node, fqn: str, names: list[str], timeout: float) -> dict:
    from rcl_interfaces.srv import GetParameters
    from rclpy.parameter import parameter_value_to_python

    cli = node.create_client(GetParameters, f"{fqn}/get_parameters")
    if not cli.wait_for_service(timeout_sec=timeout):
        return {}
    req = GetParameters.Request(names=names)
    fut = cli.call_async(req)
    end = time.monotonic() + timeout
    while not fut.done() and time.monotonic() < end:
        time.sleep(0.05)
    if not fut.done():
        return {}
    return {n: parameter_value_to_python(v) for n, v in zip(names, fut.result().values)}


def _tee_output(kept: list) -> None:
    """Keep a copy of everything written to this process's stdout and stderr (file descriptors 1 and 2: launch
    writes the launched processes' screen output there, from its own handlers) while it still reaches them."""
    import os

    for fd in (1, 2):
        original = os.dup(fd)
        r, w = os.pipe()
        os.dup2(w, fd)
        os.close(w)

        def pump(r=r, original=original):
            while True:
                chunk = os.read(r, 65536)
                if not chunk:
                    break
                kept.append(chunk.decode(errors="replace"))
                os.write(original, chunk)

        threading.Thread(target=pump, daemon=True).start()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("launch_file")
    ap.add_argument("launch_args", nargs="*", help="name:=value launch arguments")
    ap.add_argument("--seconds", type=float, default=30.0, help="how long to wait for the nodes (default 30)")
    ap.add_argument("--expect", action="append", default=[],
                    help="NODE:PARAM=VALUE (NODE as a fully qualified name or a bare name under --namespace)")
    ap.add_argument("--namespace", default="", help="namespace the nodes run in (default: none)")
    ap.add_argument("--action-topic", default="", help="a topic that must carry TwistStamped actions")
    ap.add_argument("--twist", action="store_true", help="the action topic carries geometry_msgs/Twist")
    ap.add_argument("--expect-output", action="append", default=[],
                    help="a text the launched processes must print (repeatable)")
    a = ap.parse_intermixed_args(argv)
    printed: list[str] = []
    if a.expect_output:
        _tee_output(printed)

    import rclpy
    from geometry_msgs.msg import Twist, TwistStamped
    from launch import LaunchDescription, LaunchService
    from launch.actions import IncludeLaunchDescription
    from launch.launch_description_sources import AnyLaunchDescriptionSource

    launch_args = [tuple(x.split(":=", 1)) for x in a.launch_args]
    ls = LaunchService(noninteractive=True)
    ls.include_launch_description(LaunchDescription([
        IncludeLaunchDescription(AnyLaunchDescriptionSource(a.launch_file), launch_arguments=launch_args)]))

    rclpy.init(args=[])
    node = rclpy.create_node("launch_check")
    executor = rclpy.executors.SingleThreadedExecutor()
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    actions = []
    if a.action_topic:
        node.create_subscription(Twist if a.twist else TwistStamped, a.action_topic, actions.append, 10)

    expect: dict[str, dict[str, str]] = {}
    for e in a.expect:
        who, kv = e.split(":", 1)
        k, v = kv.split("=", 1)
        fqn = who if who.startswith("/") else f"{a.namespace.rstrip('/')}/{who}".replace("//", "/")
        if not fqn.startswith("/"):
            fqn = "/" + fqn
        expect.setdefault(fqn, {})[k] = v

    result = {"ok": False, "lines": []}

    def check():
        end = time.monotonic() + a.seconds
        got = {}
        for fqn, want in expect.items():
            got[fqn] = _query(node, fqn, list(want), max(1.0, end - time.monotonic()))
        while a.action_topic and not actions and time.monotonic() < end:
            time.sleep(0.1)
        ok = True
        for fqn, want in expect.items():
            for k, v in want.items():
                have = got[fqn].get(k, "<no answer>")
                match = str(have).lower() == v.lower()
                ok &= match
                result["lines"].append(f"{'ok ' if match else 'BAD'} {fqn} {k} = {have!r} (want {v})")
        if a.action_topic:
            result["lines"].append(f"{'ok ' if actions else 'BAD'} {len(actions)} actions on {a.action_topic}")
            ok &= bool(actions)
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(0.2)  # the pumps pass on what the launch wrote last
        text = "".join(printed)
        for want in a.expect_output:
            seen = want in text
            ok &= seen
            result["lines"].append(f"{'ok ' if seen else 'BAD'} output {'has' if seen else 'lacks'} {want!r}")
        result["ok"] = ok
        # A launch shutdown sends SIGINT to the node (as Ctrl-C would) and waits for it to exit.
        ls.shutdown()

    threading.Thread(target=check, daemon=True).start()
    rc = ls.run()
    for line in result["lines"]:
        print(line)
    print(f"launch service exit code {rc}")
    executor.shutdown()
    spinner.join(5)
    node.destroy_node()
    rclpy.try_shutdown()
    return 0 if result["ok"] and rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
