# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The robot's state through the real bringup over Fast DDS (issue 38): a model with a state input subscribes
~/joint_states; a 100 Hz sensor_msgs/JointState publisher (names shuffled in every message) keeps it acting with no
tick missed; a missing joint, a NaN, 10 000 joints and a 1 MB name are each refused and counted with the node alive;
the publisher stopped -> stale_state within max_state_age_ms + one period, and /diagnostics warns. A model without a
state input subscribes nothing. The matching itself (shuffled names give the same model input, checked through the
golden model): test_robot_state.py. Helpers: ros_helpers.py, fixtures: conftest.py."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")

from rclpy.qos import QoSProfile, ReliabilityPolicy  # noqa: E402
from sensor_msgs.msg import JointState  # noqa: E402

from cpu_waits import CpuWaits, check_misses  # noqa: E402
from ros_helpers import Listener, plumbing_period_ms, start_replay, start_vla_edge  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

JOINTS = ("shoulder", "elbow", "wrist", "gripper")
MAX_AGE_MS = 100.0


@pytest.fixture(scope="module")
def state_micro_model(tmp_path_factory):
    from vla_edge_ros.model.generate import make_model

    return make_model(str(tmp_path_factory.mktemp("state-ros") / "micro_state"), "micro", seed=0,
                      state_joints=JOINTS, state_fields=("position", "velocity"))


class JointPublisher:
    """sensor_msgs/JointState at `hz` from this process (the names shuffled in every message), and one-off messages."""

    def __init__(self, node, hz: float = 100.0):
        self.node, self.period = node, 1.0 / hz
        self.pub = node.create_publisher(JointState, "/joint_states",
                                         QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE))
        self.rng = np.random.default_rng(0)
        self.sent = 0
        self.last_sent = None  # monotonic time of the last periodic message
        self.sent_at: list[float] = []  # monotonic time just before each periodic message was stamped
        self._run = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def message(self, names=None, position=None, velocity=None) -> JointState:
        order = self.rng.permutation(len(JOINTS))
        names = [JOINTS[i] for i in order] if names is None else names
        msg = JointState(name=list(names))
        msg.header.stamp = self.node.get_clock().now().to_msg()
        msg.position = [0.1 * JOINTS.index(n) if n in JOINTS else 0.0 for n in names] if position is None else position
        msg.velocity = [0.0] * len(names) if velocity is None else velocity
        return msg

    def _loop(self):
        nxt = time.monotonic()
        while True:
            self._run.wait()
            before = time.monotonic()
            self.pub.publish(self.message())
            self.sent_at.append(before)
            self.last_sent = time.monotonic()
            self.sent += 1
            nxt = max(nxt + self.period, time.monotonic() - self.period)
            time.sleep(max(0.0, nxt - time.monotonic()))

    def start(self):
        self._run.set()

    def sent_between(self, a: float, b: float) -> int:
        return sum(a <= t <= b for t in self.sent_at)

    def stop(self) -> float:
        """Stop the periodic messages; returns the monotonic time of the last one."""
        self._run.clear()
        time.sleep(3 * self.period)
        return self.last_sent


@pytest.mark.exclusive  # asserts no late cycle: runs alone (conftest)
def test_a_state_model_acts_on_a_100_hz_joint_state_and_refuses_what_it_cannot_take(
        domain, tmp_path, procs, state_micro_model):
    from vla_edge_ros.synthetic_bag import make_test_bag

    bag = make_test_bag(tmp_path / "bag", frames=30, fps=30.0, width=160, height=120)
    node = start_vla_edge(procs, domain, tmp_path, state_micro_model,
                          {"realtime_priority": 10, "max_state_age_ms": MAX_AGE_MS, "diagnostics_period_s": 0.25},
                          remaps=[("image", "/camera/image_raw"), ("~/joint_states", "/joint_states")])
    waits = CpuWaits(node.p.pid).start()
    lst = Listener(domain)
    pub = JointPublisher(lst.node)
    try:
        start_replay(procs, domain, tmp_path, bag, "--loop")
        lst.wait_for(lambda: lst.cycles and lst.cycles[-1][1]["reason"] == "stale_state", 60,
                     "stale_state cycles before any state")
        pub.start()
        lst.wait_for(lambda: sum(v["source"] == "model" for _, v, _ in lst.cycles) >= 20, 60, "model actions")
        t0 = time.monotonic()
        time.sleep(3.0)
        hostile = [pub.message(names=["shoulder", "elbow", "wrist"]),  # gripper missing
                   pub.message(position=[float("nan")] * 4),
                   pub.message(names=[f"j{i}" for i in range(10_000)], position=[], velocity=[]),
                   pub.message(names=["x" * 1_000_000, *JOINTS], position=[0.0] * 5, velocity=[0.0] * 5)]
        refusals = ("missing", "not finite", "10000 joints", "bytes (at most")
        for msg, why in zip(hostile, refusals):  # resent until counted: the big ones go in many UDP fragments
            deadline = time.monotonic() + 20
            while why not in lst.last_diag().get("state_last_refusal", "") and time.monotonic() < deadline:
                pub.pub.publish(msg)
                time.sleep(0.3)
            assert why in lst.last_diag().get("state_last_refusal", ""), (why, lst.last_diag())
        time.sleep(1.0)
        t1 = time.monotonic()
        d_running = lst.last_diag()
        t_last = pub.stop()
        # a stale_state tick of after the last message (one from before it, a publisher stalled by a loaded host, is
        # no answer: seen once under slow_host.sh -f 3)
        lst.wait_for(lambda: any(v["reason"] == "stale_state" and float(v["tick_monotonic"]) > t_last
                                 for _, v, _ in list(lst.cycles)[-50:]) and
                     "robot state stale" in lst.last_diag_message(), 10, "stale_state after the publisher stopped")
        with lst.lock:
            cycles = list(lst.cycles)
    finally:
        lst.close()
        waits.stop()
    assert node.alive(), node.output()[-3000:]
    assert node.stop() == 0, node.output()[-3000:]
    log = node.output()

    running = [v for t, v, _ in cycles if t0 <= t < t1]
    # A stale_state tick while the publisher runs is a fault when this process sent a state 40-80 ms before the tick:
    # stamped at most 80 ms before it (< max_state_age_ms) and 40 ms to arrive. A host that stalls this publisher
    # (a fresh-clone run on 2 loaded cores had 5 such ticks) leaves a gap in what was sent: then stale_state is right.
    stale = [float(v["tick_monotonic"]) for v in running if v["reason"] == "stale_state"]
    unjustified = [(round(t, 3), pub.sent_between(t - 0.080, t - 0.040)) for t in stale
                   if pub.sent_between(t - 0.080, t - 0.040)]
    stale_ages = [v.get("state_age_ms") for v in running if v["reason"] == "stale_state"]
    assert running and not unjustified, (unjustified[:5], stale_ages[:5])
    assert sum(v["source"] == "model" for v in running) >= 0.8 * len(running), [v["reason"] for v in running]
    assert all(float(v["state_age_ms"]) <= MAX_AGE_MS for v in running if v["source"] == "model")
    assert int(d_running["state_refused"]) >= 4 and int(d_running["state_accepted"]) >= 300
    # no late cycle or skipped tick the node owns (a host that kept the node off the CPU owns its misses: cpu_waits)
    check_misses([c for c in cycles if float(c[1]["tick_monotonic"]) <= t1], waits, plumbing_period_ms(),
                 int(d_running["deadline_misses"]))
    for why in refusals:
        assert "~/joint_states refused: " in log and why in log, why
    assert "x" * 1000 not in log  # a hostile name is never echoed
    # the first stale_state tick after the last message: within max_state_age_ms + one period of its stamp
    after = [(float(v["tick_monotonic"]), v) for _, v, _ in cycles if float(v["tick_monotonic"]) > t_last]
    first = next(t for t, v in after if v["reason"] == "stale_state")
    assert all(v["reason"] != "stale_state" for t, v in after if t < first)
    period_s = plumbing_period_ms() / 1000.0
    assert first - t_last <= MAX_AGE_MS / 1000.0 + period_s + 0.010, (first - t_last, period_s)


def test_a_model_without_a_state_input_subscribes_nothing(domain, tmp_path, procs, micro_model):
    node = start_vla_edge(procs, domain, tmp_path, micro_model, {}, remaps=[("~/joint_states", "/joint_states")])
    lst = Listener(domain)
    try:
        lst.wait_for(lambda: lst.diags, 60, "/diagnostics")
        time.sleep(1.0)
        subs = lst.node.get_subscriptions_info_by_topic("/joint_states")
        keys = set(lst.last_diag())
    finally:
        lst.close()
    assert node.stop() == 0, node.output()[-3000:]
    assert not subs, [s.node_name for s in subs]
    assert "state_received" not in keys


def test_replay_publishes_a_bags_state_aligned_to_its_frames(domain, tmp_path, procs, state_micro_model):
    """vla-edge-replay --state-topic: each frame is preceded by the bag's latest state at or before it; where the
    recording has no state (a second-long gap) the node's state ages past max_state_age_ms: stale_state."""
    from vla_edge_ros.synthetic_bag import make_test_bag

    start_ns, fps = 1_700_000_000_000_000_000, 30.0
    bag = make_test_bag(tmp_path / "bag", frames=120, fps=fps, width=160, height=120, joints=JOINTS, joint_hz=100.0,
                        joint_gap=(1.5, 2.5))
    node = start_vla_edge(procs, domain, tmp_path, state_micro_model,
                          {"realtime_priority": 10, "max_state_age_ms": MAX_AGE_MS},
                          remaps=[("image", "/camera/image_raw"), ("~/joint_states", "/joint_states")])
    lst = Listener(domain)
    try:
        lst.wait_for(lambda: lst.cycles, 60, "the first cycles")
        replay = start_replay(procs, domain, tmp_path, bag, "--state-topic", "/joint_states", "--wait-subscriber",
                              "30")
        replay.p.wait(60)
        assert replay.p.returncode == 0, replay.output()[-2000:]
        time.sleep(0.5)
        with lst.lock:
            cycles = [v for _, v, _ in lst.cycles]
    finally:
        lst.close()
    assert node.stop() == 0, node.output()[-3000:]
    # one state per frame, a new one only: the 90 frames outside the gap, and the gap's first (the state of 1.49 s)
    assert "published 91 robot states on /joint_states" in replay.output(), replay.output()[-2000:]
    at = [((int(v["frame_stamp_ns"]) - start_ns) / 1e9, v) for v in cycles if int(v["frame_stamp_ns"]) >= start_ns]
    in_gap = [v["reason"] for t, v in at if 1.5 + MAX_AGE_MS / 1000.0 + 0.05 <= t < 2.45]
    outside = [v for t, v in at if t < 1.4 or t >= 2.6]
    # the model never acts in the gap; a frame that itself aged past max_frame_age_ms on a loaded host is checked
    # first and gives stale_frame, which is as safe, so the gap asks for no model tick and some stale_state
    assert in_gap and "stale_state" in in_gap and set(in_gap) <= {"stale_state", "stale_frame"}, in_gap
    assert sum(v["source"] == "model" for v in outside) >= 10, [v["reason"] for v in outside]
