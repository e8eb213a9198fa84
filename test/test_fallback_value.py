# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The fallback's value once the model has produced actions (DESIGN.md §4), on the ROS-free ReasoningCycle
with the real Engine (NumPy backend, micro model), FrameBuffer and AdmissionController.

`zero` must publish zeros even right after a model action; `hold` must publish the last model action, also
over several fallbacks in a row, and follow a newer model action. A fallback checked only before any model
action exists cannot tell these apart (both are zero then), so every case starts with a fresh action.
"""
import time

import numpy as np
import pytest

from vla_edge_ros.admission import AdmissionController, PhaseTimings
from vla_edge_ros.cycle import ReasoningCycle
from vla_edge_ros.engine import Engine
from vla_edge_ros.frame_buffer import FrameBuffer
from vla_edge_ros.model.generate import make_model

PERIOD_MS, MARGIN_MS = 1000.0, 2.0  # generous: a loaded machine still admits every chunk
MAX_AGE_MS = 500.0
CHEAP = PhaseTimings(vision_ms=1.0, prefill_ms=1.0, decode_ms=1.0, total_ms=5.0)
HUGE = PhaseTimings(vision_ms=0.0, prefill_ms=0.0, decode_ms=0.0, total_ms=1e6)


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    return make_model(str(tmp_path_factory.mktemp("fallback") / "micro"), "micro", seed=4)


@pytest.fixture
def engine(micro):
    eng = Engine(micro, backend="numpy", kv_capacity_tokens=16 + 8 + 32 * 4)
    yield eng
    eng.fault_hook = None
    eng.close()


class Clock:
    """monotonic() shifted by an offset the test moves: stale frames without waiting for them."""

    def __init__(self):
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


def frame(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (64, 128, 3), dtype=np.uint8)


def seeded_admission(clock, first: PhaseTimings) -> AdmissionController:
    adm = AdmissionController(period_ms=PERIOD_MS, safety_margin_ms=MARGIN_MS, require_warm=True, clock=clock)
    adm.update(first)
    return adm


def setup(engine, mode, hold_timeout_s=60.0):
    """A cycle on a clock the test moves. The hold lasts a minute here: these tests are about which action is held
    (how long, test_cycle.py: test_hold_fallback_ends_after_hold_timeout), and their clock jumps by whole frame ages."""
    clock = Clock()
    adm = seeded_admission(clock, CHEAP)
    fb = FrameBuffer(pinned=False)
    cyc = ReasoningCycle(engine, fb, adm, period_ms=PERIOD_MS, safety_margin_ms=MARGIN_MS,
                         max_frame_age_ms=MAX_AGE_MS, fallback=mode, clock=clock, hold_timeout_s=hold_timeout_s)
    return cyc, fb, clock


def fresh_action(cyc, fb, clock, seed):
    fb.publish(frame(seed), stamp_ns=seed, recv_time=clock())
    out = cyc.tick()
    assert (out.source, out.reason) == ("model", "fresh"), out.reason
    # Bin centres of the action decoder are never 0, so a model action cannot be mistaken for zeros.
    assert out.action.shape == (8,) and np.all(out.action != 0)
    return out.action.copy()


def provoke(reason, cyc, fb, clock, engine, seed):
    """One tick that must end in the fallback `reason`, with a model action already out."""
    if reason == "stale_frame":
        fb.publish(frame(seed), stamp_ns=seed, recv_time=clock())
        clock.offset += 2 * MAX_AGE_MS / 1000.0
    elif reason == "engine_error":
        def boom(plan):
            raise RuntimeError("injected")

        engine.fault_hook = boom
        fb.publish(frame(seed), stamp_ns=seed, recv_time=clock())
    elif reason == "refused":
        # the estimate far above the budget: a controller whose first sample is huge (later samples are clipped)
        cyc.admission = seeded_admission(clock, HUGE)
        fb.publish(frame(seed), stamp_ns=seed, recv_time=clock())
    out = cyc.tick()
    engine.fault_hook = None
    assert (out.source, out.reason) == ("fallback", reason)
    return out


def recover(reason, cyc, clock):
    if reason == "refused":
        cyc.admission = seeded_admission(clock, CHEAP)


REASONS = ["stale_frame", "engine_error", "refused"]


@pytest.mark.parametrize("reason", REASONS)
def test_zero_fallback_publishes_zeros_after_model_actions(engine, reason):
    cyc, fb, clock = setup(engine, "zero")
    fresh_action(cyc, fb, clock, 1)
    out = provoke(reason, cyc, fb, clock, engine, 2)
    assert out.action.dtype == np.float32 and out.action.shape == (8,)
    assert not out.action.any(), f"zero fallback ({reason}) published {out.action}"
    # A second fallback in a row is zero as well, and a later model action is not held back by it.
    again = provoke(reason, cyc, fb, clock, engine, 3)
    assert not again.action.any()
    recover(reason, cyc, clock)
    assert np.all(fresh_action(cyc, fb, clock, 4) != 0)


@pytest.mark.parametrize("reason", REASONS)
def test_hold_fallback_publishes_the_last_model_action(engine, reason):
    cyc, fb, clock = setup(engine, "hold")
    first = fresh_action(cyc, fb, clock, 1)
    out = provoke(reason, cyc, fb, clock, engine, 2)
    assert np.array_equal(out.action, first), f"hold ({reason}) published {out.action}, last model action {first}"
    again = provoke(reason, cyc, fb, clock, engine, 3)  # held across fallbacks in a row
    assert np.array_equal(again.action, first)

    recover(reason, cyc, clock)
    # Two different model actions are needed to tell "the last" from "the first".
    for seed in range(10, 20):
        second = fresh_action(cyc, fb, clock, seed)
        if not np.array_equal(second, first):
            break
    assert not np.array_equal(second, first), "the model gave one action for ten different frames"
    held = provoke(reason, cyc, fb, clock, engine, 5)
    assert np.array_equal(held.action, second)


def test_zero_and_hold_agree_before_any_model_action(engine):
    """Before the first model action both modes publish zeros (nothing to hold)."""
    for mode in ("zero", "hold"):
        cyc, _, _ = setup(engine, mode)
        out = cyc.tick()
        assert out.reason == "no_frame" and not out.action.any()
