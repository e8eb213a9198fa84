# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Action chunks in the loop (DESIGN.md §17, issue 37) with the real Engine (numpy backend, a tiny generated model
that plans K = 8 actions) and the real FrameBuffer: the plan covers ticks without a fresh action, a late chunk skips
the ticks that passed and still counts, admission looks past the tick, an instruction change, deactivate and a
non-finite action discard the plan, the command limits apply to plan actions, impossible settings are one line."""
import time

import numpy as np
import pytest

from vla_edge_ros.action_plan import ActionPlan
from vla_edge_ros.admission import AdmissionController, PhaseTimings
from vla_edge_ros.contract import NonFiniteOutput
from vla_edge_ros.cycle import ReasoningCycle
from vla_edge_ros.engine import Engine
from vla_edge_ros.frame_buffer import FrameBuffer
from vla_edge_ros.instruction import Instruction
from vla_edge_ros.model.generate import make_model
from vla_edge_ros.runtime import Runtime
from vla_edge_ros.settings import ParamError, ReasoningSettings

K = 8
CAPACITY = 16 + 8 * K + 32 * 4  # prompt + K x 8 action slots + 4 frames


@pytest.fixture(scope="module")
def chunk_model(tmp_path_factory):
    return make_model(str(tmp_path_factory.mktemp("chunks") / "tiny8"), "tiny", seed=5, action_decoding="parallel",
                      action_chunk=K)


@pytest.fixture
def engine(chunk_model):
    eng = Engine(chunk_model, backend="numpy", kv_capacity_tokens=CAPACITY)
    eng.warmup(1)
    yield eng
    eng.fault_hook = None
    eng.close()


def frame(value: int) -> np.ndarray:
    return np.random.default_rng(value).integers(0, 256, (64, 128, 3), dtype=np.uint8)


CHEAP = PhaseTimings(vision_ms=1.0, prefill_ms=1.0, decode_ms=0.0, total_ms=3.0, prefill_tokens=32 + 8 * K,
                     decode_tokens=0)


def make_cycle(engine, period_ms=300.0, margin_ms=60.0, seed_timing=CHEAP, **plan_kw):
    adm = AdmissionController(period_ms=period_ms, safety_margin_ms=margin_ms, require_warm=True,
                              prefill_tokens=32 + 8 * K, decode_tokens=0)
    adm.update(seed_timing)
    fb = FrameBuffer(pinned=False)
    cyc = ReasoningCycle(engine, fb, adm, period_ms=period_ms, safety_margin_ms=margin_ms, max_frame_age_ms=60000.0,
                         plan=ActionPlan(engine.action_chunk, **plan_kw))
    return cyc, fb


class Grid:
    """Ticks on a fixed grid of the real monotonic clock, as a ROS timer calls them (sleeping to each)."""

    def __init__(self, period_s: float):
        self.period_s, self.origin, self.i = period_s, time.monotonic(), 0

    def tick(self, cyc: ReasoningCycle, skip: int = 0):
        self.i += skip
        scheduled = self.origin + self.i * self.period_s
        self.i += 1
        delay = scheduled - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        out = cyc.tick(time.monotonic(), scheduled)
        cyc.finalize(out)
        cyc.record_published(out)
        return out


def test_the_engine_plans_k_actions_in_range(engine):
    res = engine.run_chunk(frame(1))
    assert engine.action_chunk == K and res.actions.shape == (K, 8) and res.actions.dtype == np.float32
    assert np.isfinite(res.actions).all() and (np.abs(res.actions) <= 1.0).all()
    assert np.array_equal(res.action, res.actions[0]) and len(res.tokens) == 8 * K


def test_ticks_without_a_new_frame_publish_the_plan_then_it_runs_out(engine):
    cyc, fb = make_cycle(engine, execute=5)
    grid = Grid(cyc.period_s)
    fb.publish(frame(2), stamp_ns=2)
    first = grid.tick(cyc)
    assert (first.source, first.reason, first.plan_age) == ("model", "fresh", 0)
    planned = first.chunk.actions
    assert np.array_equal(first.action, planned[0])
    assert first.trajectory.shape == (5, 8) and np.array_equal(first.trajectory, planned[:5])
    for k in range(1, 5):  # no new frame: the plan's action for each tick, not a repeat of the first
        out = grid.tick(cyc)
        assert (out.source, out.reason, out.plan_age) == ("plan", "repeat", k), k
        assert np.array_equal(out.action, planned[k]) and out.plan_remaining == 4 - k
    out = grid.tick(cyc)  # chunk_execute = 5: the plan is stale, and a repeat never extends it
    assert (out.source, out.reason) == ("fallback", "repeat") and not out.action.any()
    s = cyc.stats.summary()
    assert (s["model_actions"], s["plan_actions"], s["cycles"]) == (1, 4, 6)
    assert s["plan_age_ticks"]["max"] == 4


def test_a_late_chunk_skips_the_ticks_that_passed_and_the_rest_becomes_the_plan(engine):
    cyc, fb = make_cycle(engine, period_ms=200.0, margin_ms=40.0)
    grid = Grid(cyc.period_s)
    engine.fault_hook = lambda plan: time.sleep(0.45)  # the chunk lands 2-3 ticks after its frame's tick
    fb.publish(frame(3), stamp_ns=3)
    out = grid.tick(cyc)
    assert (out.source, out.reason) == ("fallback", "overrun") and cyc.pending
    engine.fault_hook = None
    t_end = time.monotonic() + 10.0
    landed = None
    while time.monotonic() < t_end:
        out = grid.tick(cyc)
        if out.late_chunk is not None:
            landed = out
            break
        assert out.source == "fallback" and out.reason in ("repeat", "busy")  # nothing planned yet
    assert landed is not None, "the late chunk never landed"
    d = landed.slot - 0
    assert d >= 2 and landed.chunk_late_ticks == d
    assert (landed.source, landed.reason, landed.plan_age) == ("model", "fresh", d)
    assert np.array_equal(landed.action, landed.late_chunk.actions[d])  # its first d actions were skipped
    nxt = grid.tick(cyc)  # the same frame: the plan's next action
    assert (nxt.source, nxt.plan_age) == ("plan", d + 1)
    assert np.array_equal(nxt.action, landed.late_chunk.actions[d + 1])
    assert cyc.plan.actions_skipped == d


def test_one_action_models_discard_a_late_chunk_as_before(tmp_path):
    eng = Engine(make_model(str(tmp_path / "k1"), "tiny", seed=5, action_decoding="parallel"), backend="numpy",
                 kv_capacity_tokens=16 + 8 + 32 * 4)
    try:
        assert eng.action_chunk == 1
        cyc, fb = make_cycle(eng, period_ms=200.0, margin_ms=40.0)
        cyc.admission.configure()
        grid = Grid(cyc.period_s)
        eng.fault_hook = lambda plan: time.sleep(0.45)
        fb.publish(frame(3), stamp_ns=3)
        assert grid.tick(cyc).reason == "overrun"
        eng.fault_hook = None
        for _ in range(8):
            out = grid.tick(cyc)
            if out.late_chunk is not None:
                break
        assert out.late_chunk is not None and out.source == "fallback" and out.plan_age is None
    finally:
        eng.close()


def test_admission_admits_a_chunk_that_lands_within_the_plan_not_only_within_the_tick(engine):
    slow = PhaseTimings(vision_ms=10.0, prefill_ms=140.0, decode_ms=0.0, total_ms=150.0, prefill_tokens=32 + 8 * K,
                        decode_tokens=0)  # a 150 ms chunk at a 50 ms period: it never fits one tick
    cyc, fb = make_cycle(engine, period_ms=50.0, margin_ms=5.0, seed_timing=slow)
    fb.publish(frame(4), stamp_ns=4)
    out = cyc.tick()
    assert out.reason != "refused", "admission refused a chunk that lands while its plan is ahead"
    assert out.estimate_ms > out.remaining_ms  # it was admitted by the plan's horizon, not by this tick's budget
    cyc.drain(5.0)
    one, fb1 = make_cycle(engine, period_ms=50.0, margin_ms=5.0, seed_timing=slow, execute=1)
    fb1.publish(frame(4), stamp_ns=4)
    assert one.tick().reason == "refused"  # chunk_execute 1: no horizon, today's rule


def test_an_instruction_change_discards_the_plan(engine):
    cyc, fb = make_cycle(engine)
    grid = Grid(cyc.period_s)
    fb.publish(frame(10), stamp_ns=10)
    old = grid.tick(cyc).chunk.actions
    assert grid.tick(cyc).source == "plan"
    # a new task (the default prompt's ids under another text: the engine prefills it as any instruction)
    cyc.request_instruction(Instruction("turn left", engine.prompts.default().ids, 2, "raw", "test"))
    outs = [grid.tick(cyc)]
    while cyc.instruction_in_progress and len(outs) < 20:
        outs.append(grid.tick(cyc))
    assert outs[0].reason == "instruction_change" and not outs[0].action.any()
    assert outs[0].plan_changed and len(outs[0].trajectory) == 0  # the trajectory controller is told to stop
    assert cyc.instruction_changes == 1 and all(o.source != "plan" for o in outs)
    # the tick the change landed on runs a chunk under the new prompt; the plan after it is that chunk's alone
    new = outs[-1]
    assert (new.source, new.reason) == ("model", "fresh") and new.chunk_late_ticks == 0
    after = grid.tick(cyc)
    assert after.source == "plan" and np.array_equal(after.action, new.chunk.actions[1])
    # it landed on an empty plan: the old one (8 ticks from tick 0) would still cover this tick had it survived
    assert new.slot < len(old) and not new.boundary_replaced_plan and new.chunk.frame_id > 0


def test_a_non_finite_chunk_never_enters_and_the_old_plan_goes_on(engine):
    cyc, fb = make_cycle(engine)
    grid = Grid(cyc.period_s)
    fb.publish(frame(5), stamp_ns=5)
    first = grid.tick(cyc)
    planned = first.chunk.actions

    def overflow(plan):
        raise NonFiniteOutput("action logits", "injected overflow", None)

    engine.fault_hook = overflow
    fb.publish(frame(6), stamp_ns=6)
    out = grid.tick(cyc)
    assert (out.source, out.reason, out.plan_age) == ("plan", "non_finite", 1)
    assert np.array_equal(out.action, planned[1])


def test_a_blocked_non_finite_action_and_deactivate_discard_the_plan(engine):
    cyc, fb = make_cycle(engine)
    grid = Grid(cyc.period_s)
    fb.publish(frame(7), stamp_ns=7)
    grid.tick(cyc)
    out = grid.tick(cyc)
    assert out.source == "plan"
    out.action = np.full(8, np.nan, np.float32)  # the last guard finds a NaN: nothing planned is trusted after it
    cyc.finalize(out)
    assert out.reason == "non_finite" and cyc.plan.remaining(out.slot + 1) == 0 and len(out.trajectory) == 0
    fb.publish(frame(8), stamp_ns=8)
    grid.tick(cyc)
    assert cyc.plan.remaining(cyc._last_slot + 1) > 0
    stop = cyc.stop_outcome()
    assert cyc.plan.remaining(0) == 0 and stop.plan_changed and len(stop.trajectory) == 0


def test_the_runtime_limits_plan_actions_and_checks_chunk_settings_at_configure(chunk_model):
    base = dict(backend="numpy", kv_capacity_tokens=CAPACITY, warmup_chunks=1, period_ms=300.0,
                safety_margin_ms=60.0, velocity_limits=[0.01] * 6, acceleration_limits=[0.0] * 6)
    for bad, needle in ((dict(chunk_execute=9), "chunk_execute"), (dict(chunk_blend="mean"), "chunk_blend"),
                        (dict(chunk_blend_weight=1.5), "chunk_blend_weight")):
        with pytest.raises(ParamError, match=needle):
            Runtime.build(chunk_model, ReasoningSettings.from_values({**base, **bad}), FrameBuffer(pinned=False))
    fb = FrameBuffer(pinned=False)
    rt = Runtime.build(chunk_model, ReasoningSettings.from_values(base), fb)
    try:
        assert rt.check_plan_change({"chunk_execute": 9}) is not None
        assert rt.check_plan_change({"chunk_execute": 4, "chunk_blend": "weighted"}) is None
        grid = Grid(0.3)
        fb.publish(frame(9), stamp_ns=9)
        steps = []
        for _ in range(4):
            delay = grid.origin + grid.i * 0.3 - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            steps.append(rt.step(time.monotonic(), grid.origin + grid.i * 0.3, lambda twist, out: time.monotonic()))
            grid.i += 1
        plan_steps = [s for s in steps if s.outcome.source == "plan"]
        assert plan_steps, [(s.outcome.source, s.outcome.reason) for s in steps]
        for s in steps:
            assert all(abs(c) <= 0.01 + 1e-12 for c in s.twist), s.twist
        assert any(s.outcome.clamped for s in plan_steps)  # the tiny model's actions ask for far more than 0.01
        rec = rt.record()
        assert rec.plan_actions == len(plan_steps) and rec.plan["action_chunk"] == K
        assert rec.values()["plan_share"] == pytest.approx(len(plan_steps) / rec.cycles)
    finally:
        rt.close()


def test_the_capacity_rule_counts_the_k_x_8_action_slots_at_configure(chunk_model):
    # 16-token prompt + 32-token frame + 64 action slots = 112: 100 slots would hold a one-action model, not this one
    with pytest.raises(ParamError, match="64 action tokens need"):
        Runtime.build(chunk_model, ReasoningSettings.from_values(dict(backend="numpy", kv_capacity_tokens=100,
                                                                      warmup_chunks=1)), FrameBuffer(pinned=False))
