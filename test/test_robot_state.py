# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The robot's state in the model (issue 38, DESIGN.md §17), ROS-free: a JointState matched by name (never by index,
never zero-filled), its age, the state token in the KV layout and in the golden model, the checkpoint's state keys
and projector, the cycle's stale_state fallback, the bench's state from a bag. The DDS side: test_state_ros.py; the
CUDA engine against the golden model: test_cuda_engine.py (-k state)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from vla_edge_ros import robot_state as rs
from vla_edge_ros.admission import AdmissionController
from vla_edge_ros.constants import FRAME_C, FRAME_H, FRAME_W, MAX_STATE_DIM
from vla_edge_ros.cycle import ReasoningCycle
from vla_edge_ros.eviction import make_policy
from vla_edge_ros.frame_buffer import FrameBuffer
from vla_edge_ros.kv_cache import KvCache, capacity_problem, min_capacity
from vla_edge_ros.model import ops
from vla_edge_ros.model.config import ModelConfig
from vla_edge_ros.model.generate import make_model, model_config
from vla_edge_ros.model.safetensors_io import ModelLoadError, load_file, save_file

JOINTS = ("shoulder", "elbow", "wrist")
FIELDS = ("position", "velocity")


def _arrays(names, t=0.3):
    """Position and velocity of `names` (each joint's own values, whatever the order)."""
    val = {j: i + 1.0 for i, j in enumerate(JOINTS)}
    return {"position": [val[n] * np.sin(t) for n in names], "velocity": [-val[n] for n in names]}


@pytest.fixture(scope="module")
def state_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("state_model")
    return make_model(str(d / "m"), preset="micro", seed=3, state_joints=JOINTS, state_fields=FIELDS)


def _engine(path, **kw):
    from vla_edge_ros.engine import Engine

    return Engine(path, backend="numpy", kv_capacity_tokens=kw.pop("capacity", 256), **kw)


def _frame(seed=0):
    return np.random.default_rng(seed).integers(0, 256, (FRAME_H, FRAME_W, FRAME_C), dtype=np.uint8)


# --- matching by name ----------------------------------------------------------------------------------------------

def test_a_message_is_matched_by_name_in_any_order():
    m = rs.StateMapper(JOINTS, FIELDS)
    want = m.vector(list(JOINTS), _arrays(JOINTS))
    assert want.tolist() == pytest.approx([np.sin(0.3), 2 * np.sin(0.3), 3 * np.sin(0.3), -1, -2, -3], abs=1e-6)
    for order in (("wrist", "shoulder", "elbow"), ("elbow", "wrist", "shoulder")):
        names = list(order) + ["gripper"]  # another joint the model does not read: ignored
        arrays = {k: v + [9.0] for k, v in _arrays(order).items()}
        assert np.array_equal(m.vector(names, arrays), want)


@pytest.mark.parametrize("names, arrays, why", [
    (["shoulder", "elbow"], None, "'wrist' missing"),
    (list(JOINTS), {"position": [0.0, float("nan"), 0.0], "velocity": [0.0] * 3}, "position of joint 'elbow' is nan"),
    (list(JOINTS), {"position": [0.0, 0.0, 0.0], "velocity": [0.0, float("inf"), 0.0]}, "velocity of joint 'elbow'"),
    (list(JOINTS), {"position": [0.0, 0.0], "velocity": [0.0] * 3}, "position has 2 values for 3 names"),
    (list(JOINTS), {"position": [0.0] * 3, "velocity": []}, "no velocity values"),
    (["shoulder", "elbow", "wrist", "elbow"], {"position": [0.0] * 4, "velocity": [0.0] * 4}, "named twice"),
    ([f"j{i}" for i in range(10_000)], {"position": [0.0] * 10_000}, "10000 joints in one message"),
    (["x" * 1_000_000] + list(JOINTS), {"position": [0.0] * 4, "velocity": [0.0] * 4}, "longer than 256"),
    (list(JOINTS), {"position": [1e39, 0.0, 0.0], "velocity": [0.0] * 3}, "overflows float32"),
])
def test_a_message_that_cannot_give_every_value_is_refused_whole(names, arrays, why):
    buf = rs.StateBuffer(rs.StateMapper(JOINTS, FIELDS))
    buf.offer(list(JOINTS), _arrays(JOINTS), 0, 0)
    before = buf.latest()
    got = buf.offer(names, arrays if arrays is not None else _arrays(names), 0, 0)
    assert got is not None and why in got, got
    assert len(got) < 300 and "\n" not in got  # one line, never the hostile name itself
    assert buf.refused == 1 and buf.accepted == 1 and buf.last_refusal == got
    assert buf.latest() is before  # nothing zero-filled, nothing replaced


def test_the_joint_count_is_read_from_the_cdr_before_decoding():
    pytest.importorskip("rclpy")
    from rclpy.serialization import serialize_message
    from sensor_msgs.msg import JointState

    for frame_id in ("", "b", "base_link", "x" * 7):
        for n in (0, 3, 10_000):
            msg = JointState(name=[f"j{i}" for i in range(n)])
            msg.header.frame_id = frame_id
            assert rs.joint_count_from_cdr(serialize_message(msg)) == n, (frame_id, n)
    assert rs.joint_count_from_cdr(b"\x00\x01\x00") is None


def test_the_age_counts_from_the_stamp_on_the_receivers_clock():
    clock = [100.0]
    buf = rs.StateBuffer(rs.StateMapper(JOINTS, ("position",)), clock=lambda: clock[0])
    now_ns = 50 * 10**9
    assert buf.offer(list(JOINTS), _arrays(JOINTS), now_ns - 30_000_000, now_ns) is None  # stamped 30 ms ago
    clock[0] += 0.02
    assert buf.latest().age_ms(clock[0]) == pytest.approx(50.0)
    assert buf.offer(list(JOINTS), _arrays(JOINTS), 0, now_ns) is None  # unstamped: aged from its receipt
    assert buf.latest().age_ms(clock[0]) == pytest.approx(0.0) and buf.unstamped == 1
    why = buf.offer(list(JOINTS), _arrays(JOINTS), now_ns + 2 * 10**9, now_ns)
    assert "ahead of this node's clock" in why
    assert buf.offer(list(JOINTS), _arrays(JOINTS), now_ns + 10**8, now_ns) is None  # 0.1 s ahead: age 0


def test_the_models_joints_come_from_the_checkpoint_or_the_parameter():
    m = rs.model_mapper(6, JOINTS, FIELDS, [""])
    assert m.joints == JOINTS and m.dim == 6
    assert rs.model_mapper(3, (), ("position",), list(JOINTS)).joints == JOINTS
    assert rs.model_mapper(0, (), ("position",), [""]) is None
    with pytest.raises(ValueError, match="names no joints: set state_joints to its 3 joint names"):
        rs.model_mapper(6, (), FIELDS, [""])
    with pytest.raises(ValueError, match="differ from the checkpoint's"):
        rs.model_mapper(6, JOINTS, FIELDS, ["a", "b", "c"])
    with pytest.raises(ValueError, match="names 2 joints, the model takes 3"):
        rs.model_mapper(6, (), FIELDS, ["a", "b"])


# --- the checkpoint ------------------------------------------------------------------------------------------------

def test_the_state_keys_are_checked_at_load(tmp_path):
    ok = model_config("micro", state_joints=JOINTS, state_fields=FIELDS)
    assert (ok.state_dim, ok.state_tokens, ok.transient_tokens) == (6, 1, 9)
    bad = [
        (dict(state_dim=MAX_STATE_DIM + 1), "must be an integer 0..64"),
        (dict(state_dim=5, state_joints=JOINTS, state_fields=FIELDS), "must be 3 joints x 2 fields = 6"),
        (dict(state_dim=6, state_joints=("a", "a", "b"), state_fields=FIELDS), "names a joint twice"),
        (dict(state_dim=4, state_fields=("position", "effort")), "must name each of position, velocity"),
        (dict(state_dim=3, state_fields=FIELDS), "not a whole number of joints"),
        (dict(state_joints=JOINTS), "vla_state_joints needs vla_state_dim"),
    ]
    base = model_config("micro")
    for kw, why in bad:
        cfg = ModelConfig(**{**base.__dict__, **kw})
        assert any(why in p for p in cfg.state_problems()), (kw, cfg.state_problems())
    d = make_model(str(tmp_path / "m"), preset="micro", state_joints=JOINTS, state_fields=FIELDS)
    raw = json.loads(open(os.path.join(d, "config.json")).read())
    assert (raw["vla_state_dim"], raw["vla_state_joints"], raw["vla_state_fields"]) == (6, list(JOINTS), list(FIELDS))
    for key, value, why in (("vla_state_dim", "6", "bad value '6'"), ("vla_state_joints", ["x" * 300] * 3, "1..256"),
                            ("vla_state_fields", "position", "expected a list")):
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump({**raw, key: value}, f)
        with pytest.raises(ModelLoadError, match=why):
            ModelConfig.from_dir(d)


def test_a_missing_projector_is_a_seeded_stand_in_with_one_warning(tmp_path, state_model, caplog):
    from vla_edge_ros.model.checkpoint import load_model
    from vla_edge_ros.model.weights import STATE_PREFIX

    w = load_model(state_model)
    assert w.vision.state.trained
    d = tmp_path / "copy"
    d.mkdir()
    for name in os.listdir(state_model):
        os.link(os.path.join(state_model, name), d / name) if name != "vision.safetensors" else None
    vis = load_file(os.path.join(state_model, "vision.safetensors"))  # {name: (dtype, array)}
    save_file({k: v for k, v in vis.items() if not k.startswith(STATE_PREFIX)}, str(d / "vision.safetensors"))
    caplog.clear()
    a, b = load_model(str(d)), load_model(str(d))
    assert not a.vision.state.trained
    assert np.array_equal(a.vision.state.fc2_w, b.vision.state.fc2_w)  # seeded: the same stand-in each load
    warned = [r for r in caplog.records if "without a state projector" in r.getMessage()]
    assert len(warned) == 2 and all(r.levelname == "WARNING" for r in warned)  # one a load
    broken = dict(vis)
    broken[STATE_PREFIX + "low"] = ("F32", np.full(6, 2.0, np.float32))  # low > high
    save_file(broken, str(d / "vision.safetensors"))
    with pytest.raises(ModelLoadError, match="high"):
        load_model(str(d))


def test_normalization_is_the_bounds_q01_q99_rule():
    low, high = np.array([0.0, -2.0, 1.0], np.float32), np.array([2.0, 2.0, 1.0], np.float32)
    got = ops.normalize_state(np.array([1.5, 5.0, 7.0], np.float32), low, high)
    assert got.tolist() == pytest.approx([0.5, 1.0, 0.0])  # clipped to [-1, 1]; a zero span gives 0


# --- the KV layout ------------------------------------------------------------------------------------------------

def test_the_state_slot_sits_between_the_frame_and_the_action_slots():
    cache = KvCache(200, 10, make_policy("fifo"), action_tokens=8, state_tokens=1)
    assert cache.state_slots.tolist() == [10] and cache.action_slots.tolist() == list(range(11, 19))
    for fid in range(8):
        plan = cache.plan_frame(fid)
        cache.check_invariants()
        n = plan.n_prefix
        assert plan.order[n + 32] == 10 and plan.order[n + 33:].tolist() == list(range(11, 19))
        assert 10 not in plan.order[:n]  # never retained: no later chunk attends to an old state
    assert min_capacity(10, state_tokens=1) == min_capacity(10) + 1
    assert "1 state token" in capacity_problem(50, 10, state_tokens=1)


def test_cuda_shapes_take_seven_actions_with_a_state():
    from vla_edge_ros.vram_plan import cuda_shape_problems

    base = dict(action_decoding="parallel")
    assert not cuda_shape_problems(model_config("qwen2.5-0.5b", action_chunk=7, state_joints=JOINTS, **base))
    assert not cuda_shape_problems(model_config("qwen2.5-0.5b", action_chunk=8, **base))
    k8_state = model_config("qwen2.5-0.5b", action_chunk=8, state_joints=JOINTS, **base)
    assert any("96" in p for p in cuda_shape_problems(k8_state))


# --- the engine and the golden model -------------------------------------------------------------------------------

def test_the_state_changes_the_action_and_the_order_of_names_does_not(state_model):
    m = rs.StateMapper(JOINTS, FIELDS)
    e = _engine(state_model)
    try:
        rows = {}
        for tag, order, t in (("a", JOINTS, 0.3), ("shuffled", ("wrist", "shoulder", "elbow"), 0.3),
                              ("other", JOINTS, 2.0)):
            vec = m.vector(list(order), _arrays(order, t))
            rows[tag] = e.backend.frame_rows(_frame(), e.normalized_state(vec))
        assert np.array_equal(rows["a"], rows["shuffled"])  # the model input itself, not an assumption
        assert np.array_equal(rows["a"][:32], rows["other"][:32])  # the vision tokens do not see the state
        assert not np.allclose(rows["a"][32], rows["other"][32])  # the state token does
        logits = {}
        for tag, t in (("a", 0.3), ("other", 2.0)):
            e.warmup(0)
            r = e.run_chunk(_frame(), collect_logits=True, state=m.vector(list(JOINTS), _arrays(JOINTS, t)))
            logits[tag] = np.asarray(r.logits)
        assert np.abs(logits["a"] - logits["other"]).max() > 1e-3
    finally:
        e.close()


@pytest.mark.parametrize("state, why", [(None, "got none"), (np.zeros(5, np.float32), r"shape \(5,\)"),
                                        (np.array([0, 0, np.nan, 0, 0, 0], np.float32), "non-finite")])
def test_the_engine_never_runs_on_a_state_it_did_not_get(state_model, state, why):
    e = _engine(state_model)
    try:
        with pytest.raises(ValueError, match=why):
            e.run_chunk(_frame(), state=state)
    finally:
        e.close()


def test_a_model_without_a_state_input_refuses_one(tmp_path):
    e = _engine(make_model(str(tmp_path / "m"), preset="micro"))
    try:
        with pytest.raises(ValueError, match="no state input"):
            e.run_chunk(_frame(), state=np.zeros(3, np.float32))
    finally:
        e.close()


# --- the cycle ----------------------------------------------------------------------------------------------------

def test_the_cycle_never_acts_on_a_state_older_than_its_bound(state_model):
    import time

    buf = rs.StateBuffer(rs.StateMapper(JOINTS, FIELDS))
    fb = FrameBuffer()
    e = _engine(state_model)
    try:
        adm = AdmissionController(period_ms=10_000.0, safety_margin_ms=1.0)
        cyc = ReasoningCycle(e, fb, adm, period_ms=10_000.0, safety_margin_ms=1.0, state=buf, max_state_age_ms=100.0)
        for t in e.warmup(2):
            adm.update(t)
        got = []
        for k in range(6):
            t0 = time.monotonic()
            fb.publish(_frame(k), stamp_ns=k + 1, recv_time=t0)
            # a message 40 ms old when it arrived: just now (fresh), or 90 ms before the tick (130 ms old: stale)
            if k:
                buf.offer(list(JOINTS), _arrays(JOINTS, k), 10**9 - 40_000_000, 10**9,
                          recv_time=t0 - (0.0 if k in (1, 2, 4) else 0.09))
            out = cyc.tick(t0)
            got.append((out.reason, None if out.state_age_ms is None else round(out.state_age_ms)))
        assert got == [("stale_state", None), ("fresh", 40), ("fresh", 40), ("stale_state", 130), ("fresh", 40),
                       ("stale_state", 130)], got
        assert cyc.stale_states == 3
    finally:
        e.close()


# --- the bench ----------------------------------------------------------------------------------------------------

def test_the_bench_takes_the_state_from_a_bag_by_stamp(tmp_path, state_model):
    from vla_edge_ros.clips import BagJointStates
    from vla_edge_ros.synthetic_bag import joint_values, make_test_bag

    bag = make_test_bag(tmp_path / "bag", frames=30, fps=10.0, joints=JOINTS, joint_hz=50.0, joint_gap=(1.0, 2.0))
    js = BagJointStates(str(bag), "/joint_states")
    start = 1_700_000_000_000_000_000
    assert len(js) == 151 - 50 and js.skipped_corrupt == 0  # 3 s at 50 Hz, none in the second one
    idx = js.at([start, start + 15_000_000, start + 1_500_000_000, start - 1])
    assert [None if i is None else int(js.stamps[i] - start) for i in idx] == [0, 0, 980_000_000, None]
    m = rs.StateMapper(JOINTS, FIELDS)
    names, arrays = js.messages[idx[2]]
    assert names != list(JOINTS)  # written shuffled: matched by name it is the state of its time
    want = joint_values(JOINTS, 0.98)
    assert m.vector(names, arrays) == pytest.approx(np.concatenate([want["position"], want["velocity"]]), abs=1e-6)
    with pytest.raises(Exception, match="no sensor_msgs/msg/JointState topic '/camera/image_raw'"):
        BagJointStates(str(bag), "/camera/image_raw")
