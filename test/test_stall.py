# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Stalls are visible (issue 13.2), ROS-free with an injected clock: ticks that never ran are missed deadlines,
a late tick is measured against its scheduled time, jitter does not wrap at half a period, and the longest
gap between published actions is reported. The real stall (SIGSTOP of the bringup) is test_stall_ros.py."""

from __future__ import annotations

import numpy as np
import pytest

from vla_edge_ros.admission import AdmissionController, PhaseTimings
from vla_edge_ros.cycle import ReasoningCycle
from vla_edge_ros.frame_buffer import FrameBuffer

P = 0.033  # period (s)


def make(clock_box):
    adm = AdmissionController(period_ms=P * 1000.0, safety_margin_ms=2.0, clock=lambda: clock_box[0])
    return ReasoningCycle(None, FrameBuffer(pinned=False), adm, period_ms=P * 1000.0, safety_margin_ms=2.0,
                          clock=lambda: clock_box[0])


def run_tick(cyc, now, t, scheduled=None, publish_after=0.001):
    now[0] = t
    out = cyc.tick(t, scheduled)
    late = cyc.record_published(out, t + publish_after)
    return out, late


def test_ticks_that_never_ran_are_counted_as_missed_and_the_gap_is_reported():
    now = [1000.0]
    cyc = make(now)
    for k in range(10):  # on time
        run_tick(cyc, now, 1000.0 + k * P, 1000.0 + k * P)
    s = cyc.stats.summary()
    assert s["deadline_misses"] == 0 and s["missed_ticks"] == 0
    assert s["action_gap_ms"]["max"] == pytest.approx(P * 1000.0)
    # the process is stopped for ~1 s: the timer's next call lands on the grid slot just before "now"
    resume = 1000.0 + 9 * P + 1.046
    k = int((resume - 1000.0) // P)
    out, late = run_tick(cyc, now, resume, 1000.0 + k * P)
    assert out.missed_before == k - 10 and not late
    s = cyc.stats.summary()
    assert s["missed_ticks"] == k - 10 >= 30 and s["deadline_misses"] == k - 10
    assert s["deadline_miss_rate"] == pytest.approx((k - 10) / (11 + k - 10))
    assert s["action_gap_ms"]["max"] == pytest.approx(1046.0, abs=0.01)
    # back on the grid: nothing more is missed
    run_tick(cyc, now, 1000.0 + (k + 1) * P, 1000.0 + (k + 1) * P)
    assert cyc.stats.summary()["missed_ticks"] == k - 10


def test_a_late_tick_is_measured_against_its_scheduled_time():
    now = [50.0]
    cyc = make(now)
    run_tick(cyc, now, 50.0, 50.0)
    # due at 50.033, runs 20 ms late and publishes 15 ms after it started: 35 ms after it was due
    out, late = run_tick(cyc, now, 50.053, 50.033, publish_after=0.015)
    assert late and out.deadline == pytest.approx(50.033 + P)
    assert out.jitter_ms == pytest.approx(20.0)
    s = cyc.stats.summary()
    assert s["deadline_misses"] == 1 and s["late_publishes"] == 1
    assert s["cycle_ms"]["max"] == pytest.approx(35.0)


def test_the_budget_counts_from_the_scheduled_tick():
    class Refusing:  # the budget is what is checked here; the chunk itself does not matter
        busy = False

        def submit(self, frame):
            raise RuntimeError("not run")

    now = [10.0]
    cyc = make(now)
    cyc.engine = Refusing()
    cyc.admission.update(PhaseTimings(1.0, 1.0, 1.0, 5.0))
    cyc.fb.publish(np.zeros((64, 128, 3), np.uint8), stamp_ns=1, recv_time=10.0)
    now[0] = 10.020
    out = cyc.tick(10.020, 10.0)  # 20 ms late: 33 - 20 - 2 = 11 ms left
    assert out.remaining_ms == pytest.approx(11.0)


def test_jitter_does_not_wrap_at_half_a_period():
    now = [0.0]
    cyc = make(now)
    run_tick(cyc, now, 100.0)  # no scheduled time: the first tick is the grid origin
    out, _ = run_tick(cyc, now, 100.0 + P + 0.7 * P)  # 0.7 periods late, not 0.3 early
    assert out.jitter_ms == pytest.approx(0.7 * P * 1000.0)
    out, _ = run_tick(cyc, now, 100.0 + 2 * P - 0.0001)  # a hair early: the next slot, 0.1 ms jitter
    assert out.jitter_ms == pytest.approx(0.1, abs=1e-6) and out.missed_before == 0
    out, _ = run_tick(cyc, now, 100.0 + 5.2 * P)  # slots 3 and 4 never ran
    assert out.missed_before == 2 and out.jitter_ms == pytest.approx(0.2 * P * 1000.0)
    assert cyc.stats.summary()["missed_ticks"] == 2


def test_a_new_period_or_a_pause_is_not_a_stall():
    now = [0.0]
    cyc = make(now)
    run_tick(cyc, now, 5.0, 5.0)
    cyc.configure(period_ms=50.0)  # a new timer: a new grid
    run_tick(cyc, now, 7.0, 7.0)
    cyc.reset_schedule()  # e.g. the node was deactivated for a while
    run_tick(cyc, now, 60.0, 60.0)
    s = cyc.stats.summary()
    assert s["missed_ticks"] == 0 and s["action_gap_ms"]["count"] == 0
