# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""What reaches the robot (issue 19), through the real bringup over Fast DDS: an overflowing model never drives,
commands respect their limits, carry a fresh stamp (or the frame's, on request) in the message type the base wants,
the standard ROS parameters work (use_sim_time with /clock, qos_overrides, integers for doubles), and the node
behaves under a lifecycle manager (configure fails cleanly and can be retried after a fix, shutdown ends the
process, names carry the namespace). Helpers: ros_helpers.py, fixtures: conftest.py."""

from __future__ import annotations

import math
import os
import time

import pytest

rclpy = pytest.importorskip("rclpy")

from geometry_msgs.msg import Twist  # noqa: E402
from lifecycle_msgs.msg import Transition  # noqa: E402
from rcl_interfaces.msg import Parameter as ParameterMsg, ParameterType, ParameterValue  # noqa: E402
from rcl_interfaces.srv import SetParameters  # noqa: E402
from rclpy.qos import ReliabilityPolicy, qos_profile_sensor_data  # noqa: E402
from rosgraph_msgs.msg import Clock  # noqa: E402

from overflow_models import KINDS, PHASE, make_overflow_model  # noqa: E402
from ros_helpers import Listener, bag_stamps, rate_ok, reasons, start_replay, start_vla_edge  # noqa: E402
from test_lifecycle_ros import Lifecycle  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]


def child_pids(pid: int) -> list[int]:
    """Processes whose parent is `pid` (from /proc)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except (OSError, ValueError, IndexError):
                pass
    return out


def comps(m):
    tw = m.twist if hasattr(m, "twist") else m
    return [tw.linear.x, tw.linear.y, tw.linear.z, tw.angular.x, tw.angular.y, tw.angular.z]


def set_params(lst: Listener, node: str, **values) -> list:
    """Set parameters of `node` through its ~/set_parameters service; the results (successful, reason)."""
    cli = lst.node.create_client(SetParameters, f"{node}/set_parameters")
    assert cli.wait_for_service(30)
    msgs = []
    for k, v in values.items():
        if isinstance(v, bool):
            pv = ParameterValue(type=ParameterType.PARAMETER_BOOL, bool_value=v)
        elif isinstance(v, int):
            pv = ParameterValue(type=ParameterType.PARAMETER_INTEGER, integer_value=v)
        elif isinstance(v, float):
            pv = ParameterValue(type=ParameterType.PARAMETER_DOUBLE, double_value=v)
        elif isinstance(v, str):
            pv = ParameterValue(type=ParameterType.PARAMETER_STRING, string_value=v)
        else:
            pv = ParameterValue(type=ParameterType.PARAMETER_DOUBLE_ARRAY, double_array_value=[float(x) for x in v])
        msgs.append(ParameterMsg(name=k, value=pv))
    fut = cli.call_async(SetParameters.Request(parameters=msgs))
    t_end = time.monotonic() + 10
    while not fut.done() and time.monotonic() < t_end:
        time.sleep(0.02)
    assert fut.done(), "no answer from set_parameters"
    return [(r.successful, r.reason) for r in fut.result().results]


# --- 1. nothing non-finite becomes a command -------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_an_overflowing_model_is_refused_at_configure(domain, tmp_path, procs, kind):
    model = make_overflow_model(str(tmp_path / kind), kind)
    node = start_vla_edge(procs, domain, tmp_path, model, {})
    lst = Listener(domain)
    try:
        t_end = time.monotonic() + 120
        while node.alive() and time.monotonic() < t_end:
            time.sleep(0.1)
        assert not node.alive(), "an overflowing model was not refused"
        assert not lst.actions or all(c == [0.0] * 6 for _, _, m in lst.actions for c in [comps(m)])
    finally:
        lst.close()
    out = node.output()
    assert node.stop() == 3, out[-3000:]
    line = [ln for ln in out.splitlines() if "model refused" in ln]
    assert line and f"overflows during warm-up, in the {PHASE[kind]}" in line[-1], out[-3000:]
    assert "Traceback" not in out


def test_a_model_that_overflows_on_live_frames_only_publishes_zero_fallbacks(domain, tmp_path, procs):
    """warmup_chunks 0: the model is not caught at configure, so every live frame meets the check before the argmax:
    fallback non_finite (ERROR), a zero command, counted in /diagnostics; never a model action."""
    from vla_edge_ros.synthetic_bag import make_test_bag

    model = make_overflow_model(str(tmp_path / "m"), "final_norm")
    bag = make_test_bag(tmp_path / "bag", frames=60, fps=30.0, storage="sqlite3")
    node = start_vla_edge(procs, domain, tmp_path, model, {"warmup_chunks": 0, "fallback": "hold"},
                          remaps=[("image", "/camera/image_raw")])
    lst = Listener(domain)
    try:
        start_replay(procs, domain, tmp_path, bag, "--loop")
        lst.wait_for(lambda: sum(v["reason"] == "non_finite" for _, v, _ in lst.cycles) >= 10, 60,
                     "non_finite fallbacks")
        lst.wait_for(lambda: lst.diags and int(lst.diags[-1][1].get("non_finite_blocked", 0)) >= 10, 10,
                     "non_finite_blocked in /diagnostics")
        with lst.lock:
            cyc = list(lst.cycles)
            acts = list(lst.actions)
        r = reasons(cyc)
        assert r["fresh"] == 0 and all(v["source"] == "fallback" for _, v, _ in cyc), r
        assert all(lv == 2 for _, v, lv in cyc if v["reason"] == "non_finite")  # ERROR
        assert all(comps(m) == [0.0] * 6 for _, _, m in acts)
        assert any("action logits" in v.get("error", "") for _, v, _ in cyc)
    finally:
        lst.close()
    assert node.stop() == 0, node.output()[-3000:]


# --- 2.-4. limits, stamps, message type, standard parameters --------------------------------------------------

def test_twist_output_with_limits_and_a_qos_override(domain, tmp_path, procs, micro_model):
    """action_type twist: geometry_msgs/Twist on ~/action; every component within velocity_limits (the model's
    actions, scaled x100, ask for far more); the publisher's QoS follows qos_overrides; nothing flags that
    override as an unknown parameter."""
    from vla_edge_ros.synthetic_bag import make_test_bag

    bag = make_test_bag(tmp_path / "bag", frames=60, fps=30.0, storage="sqlite3")
    limits = [0.05, 0.04, 0.03, 0.2, 0.1, 0.3]
    node = start_vla_edge(procs, domain, tmp_path, micro_model, {
        "action_type": "twist", "twist_scale": "[100.0, 100.0, 100.0, 100.0, 100.0, 100.0]",
        "velocity_limits": "[" + ", ".join(map(str, limits)) + "]",
        "qos_overrides./vla_edge/action.publisher.reliability": "best_effort"},
        remaps=[("image", "/camera/image_raw")])
    lst = Listener(domain, action_type=Twist)
    got = []  # a best-effort reader: the override made the publisher best effort (the Listener's reliable one hears
    # nothing from it), and the action vector, whose QoS is not overridden, still reaches the reliable reader
    lst.node.create_subscription(Twist, "/vla_edge/action", lambda m: got.append((time.monotonic(), -1, m)),
                                 qos_profile_sensor_data)
    try:
        start_replay(procs, domain, tmp_path, bag, "--loop")
        lst.wait_for(lambda: sum(v["reason"] == "fresh" for _, v, _ in lst.cycles) >= 20, 60, "fresh actions")
        t = time.monotonic()
        time.sleep(1.0)
        acts = [a for a in list(got) if a[0] >= t]
        assert lst.vectors and not lst.actions
        assert rate_ok(len(acts) / (time.monotonic() - t)), len(acts)
        for _, _, m in acts:
            assert isinstance(m, Twist)
            assert all(abs(c) <= lim + 1e-12 for c, lim in zip(comps(m), limits)), comps(m)
        assert any(abs(c) == lim for _, _, m in acts for c, lim in zip(comps(m), limits))
        assert any(int(v["clamped"]) > 0 for _, v, _ in lst.cycles_between(t, time.monotonic()))
        lst.wait_for(lambda: lst.diags and int(lst.diags[-1][1].get("clamped_velocity", 0)) > 0, 5, "clamped_velocity")
        info = lst.node.get_publishers_info_by_topic("/vla_edge/action")
        assert info and info[0].qos_profile.reliability == ReliabilityPolicy.BEST_EFFORT, info
    finally:
        lst.close()
    out = node.output()
    assert node.stop() == 0, out[-3000:]
    assert "unknown parameters" not in out, out[-3000:]


def test_stamps_sim_time_and_run_time_parameters(domain, tmp_path, procs, micro_model):
    """Commands are stamped 'now' by default (a bag recorded in 2023 still drives a controller that drops old
    commands), the frame's stamp on request,
    and sim time once use_sim_time is set at run time with a /clock source; an integer for a double parameter and
    a run-time acceleration limit are accepted."""
    from vla_edge_ros.synthetic_bag import make_test_bag

    bag = make_test_bag(tmp_path / "bag", frames=60, fps=30.0, storage="sqlite3")  # recorded in 2023
    frame_stamps = bag_stamps(bag)
    node = start_vla_edge(procs, domain, tmp_path, micro_model, {}, remaps=[("image", "/camera/image_raw")])
    lst = Listener(domain)
    name = "/vla_edge"
    try:
        start_replay(procs, domain, tmp_path, bag, "--loop")
        lst.wait_for(lambda: sum(v["reason"] == "fresh" for _, v, _ in lst.cycles) >= 10, 60, "fresh actions")
        t = time.monotonic()
        time.sleep(0.5)
        now_ns = time.time_ns()
        acts = lst.actions_between(t, time.monotonic())
        assert acts and all(abs(s - now_ns) < 3e9 for _, s, _ in acts), [s for _, s, _ in acts[:3]]

        assert set_params(lst, name, action_stamp="frame") == [(True, "")]
        t = time.monotonic()
        time.sleep(0.5)
        stamps = [s for _, s, _ in lst.actions_between(t + 0.2, time.monotonic())]
        # the bag's 2023 stamps are years from this node's clock (action_stamp_max_offset_s): sent as now, counted
        # (frame stamps close to the clock pass through: test_round4_ros.py)
        now_ns = time.time_ns()
        assert stamps and all(abs(s - now_ns) < 3e9 and s not in frame_stamps for s in stamps), stamps[:3]
        lst.wait_for(lambda: int(lst.diags[-1][1].get("stamps_replaced", 0)) > 0, 5, "stamps_replaced")

        # use_sim_time at run time, /clock from here: stamps follow it
        clock_pub = lst.node.create_publisher(Clock, "/clock", 10)
        sim = 12345 * 10**9
        assert set_params(lst, name, action_stamp="now", use_sim_time=True) == [(True, "")] * 2
        t_end = time.monotonic() + 1.5
        while time.monotonic() < t_end:
            m = Clock()
            m.clock.sec, m.clock.nanosec = divmod(sim, 10**9)
            clock_pub.publish(m)
            time.sleep(0.02)
        got = [s for _, s, _ in lst.actions_between(time.monotonic() - 0.5, time.monotonic())]
        assert got and all(s == sim for s in got), got[:3]

        # an integer for a double parameter; limits changed at run time
        assert set_params(lst, name, max_frame_age_ms=300) == [(True, "")]
        assert set_params(lst, name, acceleration_limits=[0.5] * 6, twist_scale=[50.0] * 6) == [(True, "")] * 2
        t = time.monotonic()
        time.sleep(2.0)
        sent = [([float(x) for x in v["twist"].split(",")], float(v["t_command_monotonic"]))
                for _, v, _ in lst.cycles_between(t, time.monotonic())]
        # each command moved at most 0.5 m/s^2 x the time since the previous one (the times the node applied the
        # limits at, from ~/cycle; 1e-5 for the 6 printed decimals)
        over = [(max(abs(a - b) for a, b in zip(c1, c0)), t1 - t0) for (c0, t0), (c1, t1) in zip(sent, sent[1:])
                if max(abs(a - b) for a, b in zip(c1, c0)) > 0.5 * (t1 - t0) + 1e-5]
        assert len(sent) >= 10 and not over, over[:3]  # ~2 s of cycles at the plumbing period
        assert any(max(abs(x) for x in c) > 0.5 * 0.05 for c, _ in sent)  # the commands did move
        lst.wait_for(lambda: lst.diags and int(lst.diags[-1][1].get("clamped_acceleration", 0)) > 0, 5,
                     "clamped_acceleration")
        assert set_params(lst, name, velocity_limits=[0.1, math.nan, 0, 0, 0, 0])[0][0] is False
    finally:
        lst.close()
    assert node.stop() == 0, node.output()[-3000:]


# --- 5. under a lifecycle manager ------------------------------------------------------------------------------

def test_managed_configure_fails_cleanly_then_succeeds_after_a_fix(domain, tmp_path, procs, micro_model):
    """autostart false, a missing model: configure FAILS and the process stays up (unconfigured); model_path is
    fixed through the parameter service and configure succeeds; a model setting is refused while configured;
    hints and /diagnostics names carry the namespace; `shutdown` ends the process and its camera child."""
    node = start_vla_edge(procs, domain, tmp_path, str(tmp_path / "missing"), {"autostart": "false"},
                          remaps=[("__ns", "/robot1")])
    name = "/robot1/vla_edge"
    lst = Listener(domain, ns=name)
    lc = Lifecycle(lst, name)
    try:
        assert lc.wait(), node.output()[-3000:]
        assert lc.state() == "unconfigured"
        assert f"ros2 lifecycle set {name} configure" in node.output()
        assert not lc.set(Transition.TRANSITION_CONFIGURE), "configure with a missing model succeeded"
        assert lc.state() == "unconfigured" and node.alive()
        assert "no such directory" in node.output()

        assert set_params(lst, name, model_path=micro_model) == [(True, "")]
        assert lc.set(Transition.TRANSITION_CONFIGURE) and lc.state() == "inactive"
        ok, reason = set_params(lst, name, model_path=str(tmp_path))[0]
        assert not ok and "unconfigured" in reason
        lst.wait_for(lambda: {"robot1/vla_edge: reasoning", "robot1/vla_edge: camera"} <= lst.diag_names, 10,
                     "namespaced /diagnostics names")

        children = child_pids(node.p.pid)
        assert children, "no camera process"
        assert lc.set(Transition.TRANSITION_INACTIVE_SHUTDOWN)
        node.p.wait(15)
        assert node.p.returncode == 0, node.output()[-3000:]
        t_end = time.monotonic() + 10
        while any(os.path.exists(f"/proc/{c}") for c in children) and time.monotonic() < t_end:
            time.sleep(0.1)
        alive = [c for c in children if os.path.exists(f"/proc/{c}")]
        assert not alive, f"camera process outlived a shutdown: {alive}"
    finally:
        lst.close()


def test_sim_time_from_a_replayed_bag_clock(domain, tmp_path, procs, micro_model):
    """use_sim_time with `vla-edge-replay --clock` (as `ros2 bag play --clock`): commands carry the bag's time."""
    from vla_edge_ros.synthetic_bag import make_test_bag

    bag = make_test_bag(tmp_path / "bag", frames=60, fps=30.0, storage="sqlite3")
    frame_stamps = bag_stamps(bag)
    node = start_vla_edge(procs, domain, tmp_path, micro_model, {"use_sim_time": "true"},
                          remaps=[("image", "/camera/image_raw")])
    lst = Listener(domain)
    try:
        start_replay(procs, domain, tmp_path, bag, "--loop", "--clock")
        lst.wait_for(lambda: sum(v["reason"] == "fresh" for _, v, _ in lst.cycles) >= 10, 60, "fresh actions")
        t = time.monotonic()
        time.sleep(1.0)
        stamps = [s for _, s, _ in lst.actions_between(t, time.monotonic())]
        # the node's clock is the last /clock message: the stamp of a frame the replay just published
        assert stamps and all(s in frame_stamps for s in stamps), stamps[:3]
    finally:
        lst.close()
    assert node.stop() == 0, node.output()[-3000:]
