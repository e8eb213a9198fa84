# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The reasoning node is a managed (lifecycle) node (issue 12.4), and SIGINT/SIGTERM end the process promptly in
every state, warm-up included (issue 13.6). The bringup runs as its own OS process; the transitions are driven
through its lifecycle services (/vla_edge/change_state, /vla_edge/get_state) by a client node in this process,
over DDS. Helpers: ros_helpers.py, fixtures: conftest.py."""

from __future__ import annotations

import signal
import time

import pytest

rclpy = pytest.importorskip("rclpy")

from lifecycle_msgs.msg import Transition  # noqa: E402
from lifecycle_msgs.srv import ChangeState, GetState  # noqa: E402

from ros_helpers import Listener, cadence, start_vla_edge  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]


class Lifecycle:
    def __init__(self, lst: Listener, node: str = "/vla_edge"):
        self.change = lst.node.create_client(ChangeState, f"{node}/change_state")
        self.get = lst.node.create_client(GetState, f"{node}/get_state")

    def wait(self, timeout: float = 60.0) -> bool:
        return self.change.wait_for_service(timeout) and self.get.wait_for_service(timeout)

    @staticmethod
    def _call(client, req, timeout):
        fut = client.call_async(req)
        t_end = time.monotonic() + timeout
        while not fut.done() and time.monotonic() < t_end:
            time.sleep(0.02)
        assert fut.done(), f"no answer from {client.srv_name}"
        return fut.result()

    def state(self) -> str:
        return self._call(self.get, GetState.Request(), 10).current_state.label

    def set(self, transition_id: int, timeout: float = 60.0) -> bool:
        return self._call(self.change, ChangeState.Request(transition=Transition(id=transition_id)), timeout).success


def test_transitions_through_the_lifecycle_services(domain, tmp_path, procs, micro_model):
    node = start_vla_edge(procs, domain, tmp_path, micro_model, {"autostart": "false"})
    lst = Listener(domain)
    lc = Lifecycle(lst)
    try:
        assert lc.wait(), node.output()[-3000:]
        assert lc.state() == "unconfigured"
        lst.wait_for(lambda: lst.diags, 10, "/diagnostics while unconfigured")
        assert lst.last_diag()["lifecycle_state"] == "unconfigured"
        time.sleep(0.5)
        assert not lst.actions, "an unconfigured node publishes no action"

        assert lc.set(Transition.TRANSITION_CONFIGURE) and lc.state() == "inactive"
        assert "configured in" in node.output()
        time.sleep(0.7)
        assert not lst.actions, "an inactive node publishes no action"

        assert lc.set(Transition.TRANSITION_ACTIVATE) and lc.state() == "active"
        t0 = time.monotonic()
        time.sleep(2.0)
        ok, why = cadence(lst.actions_between(t0 + 0.5, time.monotonic()), cycles=lst.all_cycles())
        assert ok, why

        # deactivate: one zero action (reason inactive), then silence; the engine stays warm
        assert lc.set(Transition.TRANSITION_DEACTIVATE) and lc.state() == "inactive"
        t_off = time.monotonic()
        lst.wait_for(lambda: any(v["reason"] == "inactive" for _, v, _ in lst.cycles), 5, "the inactive fallback")
        with lst.lock:
            last = lst.actions[-1][2].twist
            reasons = [v["reason"] for _, v, _ in lst.cycles]
        assert reasons.count("inactive") == 1 and reasons[-1] == "inactive", reasons[-5:]
        assert (last.linear.x, last.linear.y, last.linear.z, last.angular.x, last.angular.y, last.angular.z) == \
            (0.0,) * 6
        time.sleep(1.0)
        assert not lst.actions_between(t_off + 0.3, time.monotonic()), "actions after deactivate"
        assert "engine closed" not in node.output()

        # activate again: the inactive second is not a stall
        assert lc.set(Transition.TRANSITION_ACTIVATE)
        t1 = time.monotonic()
        lst.wait_for(lambda: sum(t >= t1 for t, _, _ in lst.actions) > 20, 10, "actions after re-activation")
        lst.wait_for(lambda: lst.diags[-1][0] > t1 + 1.2, 5, "diagnostics after re-activation")
        d = lst.last_diag()
        assert d["lifecycle_state"] == "active" and int(d["missed_ticks"]) < 5, d["missed_ticks"]
        assert float(d["action_gap_ms_max"]) < 500.0, d["action_gap_ms_max"]

        # cleanup releases the engine; configure again warms a new one
        assert lc.set(Transition.TRANSITION_DEACTIVATE) and lc.set(Transition.TRANSITION_CLEANUP)
        assert lc.state() == "unconfigured" and "engine closed and released" in node.output()
        assert not lc.set(Transition.TRANSITION_ACTIVATE), "activate is not a transition of 'unconfigured'"
        assert lc.set(Transition.TRANSITION_CONFIGURE) and lc.state() == "inactive"
        assert lc.set(Transition.TRANSITION_INACTIVE_SHUTDOWN)
        node.p.wait(15)  # a finalized node has nothing left to do: the process ends (test_robot_output_ros.py)
    finally:
        lst.close()
    assert node.stop() == 0, node.output()[-3000:]


def _stop_time(node, sig=signal.SIGINT, timeout: float = 15.0) -> float:
    t = time.monotonic()
    node.signal(sig)
    try:
        node.p.wait(timeout)
    except Exception:  # noqa: BLE001 - reported by the caller's assertion
        pass
    return time.monotonic() - t


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_warm_up_stops_the_process_at_once(domain, tmp_path, procs, micro_model, sig):
    node = start_vla_edge(procs, domain, tmp_path, micro_model, {"warmup_chunks": 1000, "kv_capacity_tokens": 4096})
    lst = Listener(domain)
    lc = Lifecycle(lst)
    try:
        assert lc.wait(), node.output()[-3000:]
        time.sleep(1.0)
        assert "configured in" not in node.output(), "warm-up of 1000 chunks already over: make it longer"
        took = _stop_time(node, sig)
    finally:
        lst.close()
    assert node.p.returncode == 0, node.output()[-3000:]
    # 0.2-0.4 s measured on a loaded 2-core box; without the fix it is the executor join timeout (2 s) or more
    assert took < 1.5, f"{took:.2f} s to stop during warm-up"  # the warm-up itself takes ~10 s
    assert "configure interrupted" in node.output()


def test_a_signal_stops_the_process_promptly_in_every_state(domain, tmp_path, procs, micro_model):
    """SIGINT / SIGTERM end the process in each lifecycle state with exit 0, and cleanly: the node's one-line stop
    report (bringup.StopSteps) names every step, none cut short by its timeout (an executor thread left waiting,
    a camera process that had to be terminated), and a configure in progress is interrupted, not waited for. The
    wall-clock bound is a backstop, far above the ~0.5 s measured under slow_host -f 3: the verdict rests on the
    report, which a slow host does not change."""
    took, nodes = {}, {}
    lst = Listener(domain)
    lc = Lifecycle(lst)
    try:
        # unconfigured (autostart false): the state service answers once the node's executor spins
        nodes["unconfigured"] = node = start_vla_edge(procs, domain, tmp_path, micro_model, {"autostart": "false"},
                                                      name="unconfigured")
        assert lc.wait(), node.output()[-3000:]
        assert lc.state() == "unconfigured"
        took["unconfigured"] = _stop_time(node)
        # configuring through the service (a long warm-up)
        nodes["configuring"] = node = start_vla_edge(
            procs, domain, tmp_path, micro_model, {"autostart": "false", "warmup_chunks": 1000,
                                                   "kv_capacity_tokens": 4096}, name="configuring")
        assert lc.wait(), node.output()[-3000:]
        assert lc.state() == "unconfigured"
        fut = lc.change.call_async(ChangeState.Request(transition=Transition(id=Transition.TRANSITION_CONFIGURE)))
        time.sleep(1.0)
        assert not fut.done()
        took["configuring"] = _stop_time(node)
        # active (autostart, the default)
        nodes["active"] = node = start_vla_edge(procs, domain, tmp_path, micro_model, {}, name="active")
        assert lc.wait(), node.output()[-3000:]
        n0 = len(lst.actions)
        lst.wait_for(lambda: len(lst.actions) > n0 + 5, 60, "actions of the autostarted node")
        assert lc.state() == "active"
        took["active"] = _stop_time(node, signal.SIGTERM)
    finally:
        lst.close()
    reports = {}
    for state, p in nodes.items():
        assert p.p.returncode == 0, (state, p.output()[-2000:])
        lines = [line for line in p.output().splitlines() if line.startswith("vla_edge: stopped")]
        assert len(lines) == 1, (state, p.output()[-2000:])
        reports[state] = lines[0]
    assert "configure interrupted" in nodes["configuring"].output(), nodes["configuring"].output()[-2000:]
    assert all("not cleanly" not in r for r in reports.values()), reports
    assert all(t < 3.0 for t in took.values()), (took, reports)
