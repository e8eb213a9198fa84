# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The plan on the wire (issue 37), through the real bringup over Fast DDS: a model that plans K = 8 actions
publishes ~/action_chunk (trajectory_msgs/JointTrajectory) whose joint names are the action labels, point k at
k x period, and whose points are the actions ~/action_vector then publishes tick by tick; a chunk_execute above K is
refused at run time with a reason. Helpers: ros_helpers.py, fixtures: conftest.py."""

from __future__ import annotations

import time

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")

from rclpy.qos import QoSProfile, ReliabilityPolicy  # noqa: E402
from trajectory_msgs.msg import JointTrajectory  # noqa: E402

from ros_helpers import Listener, start_replay, start_vla_edge  # noqa: E402
from test_robot_output_ros import set_params  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

K = 8
LABELS = ["vx", "vy", "vz", "wx", "wy", "wz", "grip", "extra"]


@pytest.fixture(scope="module")
def chunk_micro_model(tmp_path_factory):
    from vla_edge_ros.model.generate import make_model

    return make_model(str(tmp_path_factory.mktemp("chunk-ros") / "micro8"), "micro", seed=0,
                      action_decoding="parallel", action_chunk=K)


def test_the_plan_reaches_a_subscriber_as_a_joint_trajectory(domain, tmp_path, procs, chunk_micro_model):
    from vla_edge_ros.synthetic_bag import make_test_bag

    # 5 frames a second against a ~30 Hz loop: each frame's chunk is followed by ticks with no new frame, which
    # publish the plan, so the trajectory's later points can be compared with what was really sent on them
    bag = make_test_bag(tmp_path / "bag", frames=30, fps=5.0, storage="sqlite3")
    node = start_vla_edge(procs, domain, tmp_path, chunk_micro_model, {
        "action_labels": "[" + ", ".join(f"'{x}'" for x in LABELS) + "]", "realtime_priority": 10},
        remaps=[("image", "/camera/image_raw")])
    lst = Listener(domain)
    trajectories = []  # (arrival, message)
    lst.node.create_subscription(JointTrajectory, "/vla_edge/action_chunk",
                                 lambda m: trajectories.append((time.monotonic(), m)),
                                 QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
    try:
        start_replay(procs, domain, tmp_path, bag, "--loop")
        lst.wait_for(lambda: sum(v["source"] == "plan" for _, v, _ in lst.cycles) >= 40, 90, "plan actions")
        assert set_params(lst, "/vla_edge", chunk_execute=K + 1)[0][0] is False  # more than a chunk may plan
        assert set_params(lst, "/vla_edge", chunk_execute=K)[0] == (True, "")
        time.sleep(0.5)
        with lst.lock:
            cycles = [v for _, v, _ in lst.cycles]
            vectors = {tuple(np.float32(x) for x in m.data) for m in lst.vectors}
        period_ms = float(node_param_period(cycles))
        by_slot = {int(v["slot"]): v for v in cycles}
        landed = {int(v["slot"]) for v in cycles if "chunk_late_ticks" in v}
        assert len(trajectories) >= 5
        checked_plan_points = 0
        for _, msg in list(trajectories):
            assert list(msg.joint_names) == LABELS
            assert 1 <= len(msg.points) <= K
            for k, pt in enumerate(msg.points):
                assert pt.time_from_start.sec * 1_000_000_000 + pt.time_from_start.nanosec == \
                    pytest.approx(k * period_ms * 1e6, abs=1.0)
                assert len(pt.positions) == 8 and not pt.velocities
            assert tuple(np.float32(x) for x in msg.points[0].positions) in vectors  # point 0 was sent on its tick
        # each trajectory's points against the actions the cycles then published, tick by tick, up to the next
        # chunk's landing (the trajectory is re-sent then); a trajectory is found by its point 0, the action ~/cycle
        # reports (as the node formats it) for the tick the chunk landed on
        candidates = {}
        for _, msg in trajectories:
            candidates.setdefault(shown(msg.points[0].positions), []).append(msg)
        for s in sorted(landed):
            v = by_slot[s]
            ahead = []
            for k in range(1, K):
                later = by_slot.get(s + k)
                if later is None or s + k in landed or later["source"] != "plan":
                    break
                assert int(later["plan_age"]) == k
                ahead.append(later["action"])
            matches = [m for m in candidates.get(v["action"], [])
                       if [shown(pt.positions) for pt in m.points[1:1 + len(ahead)]] == ahead]
            assert matches or not ahead, (s, v["action"], ahead)
            checked_plan_points += len(ahead)
        assert checked_plan_points >= 10, checked_plan_points
        diag = lst.last_diag()
        assert int(diag["action_chunk"]) == K and float(diag["plan_share"]) > 0.0
        assert int(diag["chunks_landed"]) > 0
    finally:
        lst.close()
    out = node.output()
    assert node.stop() == 0, out[-3000:]


def shown(values) -> str:
    """An action as ~/cycle shows it (diagnostics.cycle_values: float32, 4 decimals)."""
    return ",".join(f"{x:.4f}" for x in np.asarray(values, np.float32))


def node_param_period(cycles) -> float:
    """The node's period from its ticks' grid (cycle_ms is per tick; the slot spacing is one period): the plumbing
    period the helper chose, read back from what the node reports."""
    from ros_helpers import plumbing_period_ms

    return plumbing_period_ms()


def test_impossible_chunk_settings_and_checkpoints_fail_configure_in_one_line(domain, tmp_path, procs):
    """autostart false, a model that plans 4 actions: chunk_execute 5 (inside the parameter's range, above the model's
    K), then a checkpoint asking for 9 actions, each fail configure with one line naming the value, and the node stays
    unconfigured; fixed, configure succeeds, and chunk_execute 5 is refused at run time with the reason."""
    import json
    import shutil

    from lifecycle_msgs.msg import Transition

    from test_lifecycle_ros import Lifecycle
    from vla_edge_ros.model.generate import make_model

    k4 = make_model(str(tmp_path / "k4"), "micro", seed=0, action_decoding="parallel", action_chunk=4)
    bad_model = tmp_path / "k9"
    shutil.copytree(k4, bad_model)
    cfg = json.loads((bad_model / "config.json").read_text())
    cfg["vla_action_chunk"] = 9
    (bad_model / "config.json").write_text(json.dumps(cfg))
    node = start_vla_edge(procs, domain, tmp_path, k4, {"autostart": "false", "chunk_execute": 5})
    lst = Listener(domain)
    lc = Lifecycle(lst, "/vla_edge")
    try:
        assert lc.wait(), node.output()[-3000:]
        assert not lc.set(Transition.TRANSITION_CONFIGURE), "configure with chunk_execute > K succeeded"
        assert lc.state() == "unconfigured" and node.alive()
        lines = [ln for ln in node.output().splitlines() if "chunk_execute=5" in ln]
        assert lines and "0..4" in lines[-1], node.output()[-3000:]
        assert set_params(lst, "/vla_edge", chunk_execute=4, model_path=str(bad_model)) == [(True, "")] * 2
        assert not lc.set(Transition.TRANSITION_CONFIGURE), "configure with vla_action_chunk 9 succeeded"
        assert lc.state() == "unconfigured"
        assert any("vla_action_chunk" in ln for ln in node.output().splitlines()), node.output()[-3000:]
        assert set_params(lst, "/vla_edge", model_path=k4) == [(True, "")]
        assert lc.set(Transition.TRANSITION_CONFIGURE) and lc.state() == "inactive"
        ok, reason = set_params(lst, "/vla_edge", chunk_execute=5)[0]
        assert not ok and "0..4" in reason, reason
    finally:
        lst.close()
    out = node.output()
    assert "Traceback" not in out, out[-3000:]
