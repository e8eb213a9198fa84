# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""ReasoningCycle (DESIGN.md §4) with the real Engine (numpy backend, tiny generated model) and the real
FrameBuffer: every reason is reachable and an overrun returns at its deadline."""
import time

import numpy as np
import pytest

from vla_edge_ros.admission import AdmissionController, PhaseTimings
from vla_edge_ros.cycle import ReasoningCycle
from vla_edge_ros.engine import Engine
from vla_edge_ros.frame_buffer import FrameBuffer
from vla_edge_ros.model.generate import make_model

CAPACITY = 16 + 8 + 32 * 4  # prompt + action slots + 4 frames: small and fast on the CPU


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_model(str(tmp_path_factory.mktemp("cycle") / "tiny"), "tiny", seed=3)


@pytest.fixture
def engine(tiny):
    eng = Engine(tiny, backend="numpy", kv_capacity_tokens=CAPACITY)
    eng.warmed_timings = eng.warmup(2)
    yield eng
    eng.fault_hook = None
    eng.close()


def frame(value: int) -> np.ndarray:
    rng = np.random.default_rng(value)
    return rng.integers(0, 256, (64, 128, 3), dtype=np.uint8)


CHEAP = PhaseTimings(vision_ms=1.0, prefill_ms=1.0, decode_ms=1.0, total_ms=5.0)
# Wake-up lateness the real-time checks tolerate on a loaded 2-core machine. The guard tests use a margin
# larger than this, so a guard that waits until the deadline (margin dropped) still fails them.
LATE_S = 0.040


def uptime_clock():
    """The monotonic clock of a machine up for ~28 hours: only differences of its readings may be compared
    (a relative tolerance on the absolute values would grow with uptime)."""
    return time.monotonic() + 100_000.0


def make_cycle(engine, period_ms=1000.0, margin_ms=2.0, clock=time.monotonic, warm=True, **kw):
    """A generous period by default so a loaded CI machine still admits every chunk. warm="cheap" seeds
    the EMAs with a 5 ms chunk, so admission says yes whatever the machine's load (overrun tests)."""
    adm = AdmissionController(period_ms=period_ms, safety_margin_ms=margin_ms, require_warm=True, clock=clock)
    for t in ([CHEAP] if warm == "cheap" else engine.warmed_timings if warm else []):
        adm.update(t)
    fb = FrameBuffer(pinned=False)
    cyc = ReasoningCycle(engine, fb, adm, period_ms=period_ms, safety_margin_ms=margin_ms,
                         max_frame_age_ms=kw.pop("max_frame_age_ms", 500.0), clock=clock, **kw)
    return cyc, fb


def test_no_frame(engine):
    cyc, _ = make_cycle(engine)
    out = cyc.tick()
    assert (out.source, out.reason, out.frame_seq, out.stamp_ns) == ("fallback", "no_frame", -1, None)
    assert out.action.dtype == np.float32 and out.action.shape == (8,) and not out.action.any()


def test_stale_frame_with_injected_clock(engine):
    now = [100.0]
    cyc, fb = make_cycle(engine, clock=lambda: now[0])
    fb.publish(frame(1), stamp_ns=7, recv_time=100.0)
    now[0] = 100.3  # 300 ms later, max age 500 ms: still fresh enough to be looked at
    assert cyc.tick(now[0]).reason not in ("stale_frame", "no_frame")
    fb.publish(frame(2), stamp_ns=8, recv_time=100.3)
    now[0] = 101.0  # 700 ms after receive
    out = cyc.tick(now[0])
    assert (out.source, out.reason, out.stamp_ns) == ("fallback", "stale_frame", 8)
    assert out.frame_age_ms == pytest.approx(700.0, abs=1e-6)


def test_fresh_then_repeat_without_engine_work(engine):
    cyc, fb = make_cycle(engine)
    fb.publish(frame(1), stamp_ns=111)
    out = cyc.tick()
    assert (out.source, out.reason) == ("model", "fresh")
    assert out.action.dtype == np.float32 and out.action.shape == (8,) and (np.abs(out.action) <= 1).all()
    assert out.chunk is not None and out.timings.total_ms > 0 and out.stamp_ns == 111 and out.frame_seq == 0
    assert out.remaining_ms > out.estimate_ms > 0
    assert not cyc.record_published(out, time.monotonic())
    samples = cyc.admission.samples

    chunks_before = engine._next_frame_id
    again = cyc.tick()
    assert (again.source, again.reason, again.source_seq, again.stamp_ns) == ("model", "repeat", 0, 111)
    assert np.array_equal(again.action, out.action) and again.chunk is None
    assert engine._next_frame_id == chunks_before and cyc.admission.samples == samples  # no engine work

    cyc.record_published(again, again.deadline + 0.001)  # a late publish counts as a deadline miss
    s = cyc.stats.summary()
    assert s["cycles"] == 2 and s["model_actions"] == 2 and s["deadline_misses"] == 1
    assert s["chunk_ms"]["count"] == 1  # only the fresh cycle ran a chunk


def test_refused_when_the_period_is_tiny(engine):
    cyc, fb = make_cycle(engine, period_ms=1.0, margin_ms=0.5)
    fb.publish(frame(1), stamp_ns=1)
    out = cyc.tick()
    assert (out.source, out.reason) == ("fallback", "refused")
    assert out.estimate_ms > out.remaining_ms and out.chunk is None and not engine.busy


def test_probe_after_refusals_re_measures_the_cost(engine):
    cyc, fb = make_cycle(engine, period_ms=100.0, margin_ms=2.0, probe_after=2, warm=False)
    # a first sample that is an outlier sets the EMAs outright (later ones are clipped)
    cyc.admission.update(PhaseTimings(vision_ms=0.0, prefill_ms=0.0, decode_ms=0.0, total_ms=5000.0))
    reasons = []
    for i in range(3):
        fb.publish(frame(i), stamp_ns=i)
        reasons.append(cyc.tick())
    assert [o.reason for o in reasons[:2]] == ["refused", "refused"] and not any(o.probe for o in reasons[:2])
    probe = reasons[2]
    # The probe runs in the background: its cycle publishes the refusal fallback at once, on time.
    assert probe.probe and (probe.source, probe.reason) == ("fallback", "refused") and cyc.probes == 1
    assert probe.wait_until is None and cyc.pending and engine.busy
    fb.publish(frame(9), stamp_ns=9)
    assert cyc.tick().reason == "busy"  # until the probe finishes
    cyc.drain(timeout=5.0)
    assert cyc.admission.estimate_ms() < 5000.0  # the EMAs learned from the probe


def test_probes_come_quickly_then_back_off_while_refusing(engine):
    """While refusing, the first probe comes after PROBE_FIRST_AFTER refusals in a row, the next after twice as
    many, up to probe_after; an admitted cycle starts the schedule over."""
    from vla_edge_ros.cycle import PROBE_FIRST_AFTER

    cyc, fb = make_cycle(engine, period_ms=100.0, margin_ms=2.0, probe_after=10, warm=False)
    big = PhaseTimings(vision_ms=0.0, prefill_ms=0.0, decode_ms=0.0, total_ms=5000.0)
    cyc.admission.update(big)  # the first sample sets the EMAs outright: every cycle refused
    engine.fault_hook = lambda plan: (_ for _ in ()).throw(RuntimeError("probe"))  # probes end at once
    refusals_before_probe, run = [], 0
    for i in range(60):
        fb.publish(frame(i), stamp_ns=i)
        out = cyc.tick()
        cyc.drain(timeout=5.0)
        if out.probe:
            refusals_before_probe.append(run)
            run = 0
        elif out.reason == "refused":
            run += 1
    engine.fault_hook = None
    assert PROBE_FIRST_AFTER == 3
    assert refusals_before_probe[:4] == [3, 6, 10, 10], refusals_before_probe
    # an admitted chunk resets the schedule: the next refusing spell probes after 3 again
    cyc.admission = AdmissionController(period_ms=100.0, safety_margin_ms=2.0)
    fb.publish(frame(100), stamp_ns=100)
    # admitted (an overrun is admitted too: its chunk ran past the 100 ms under slow_host.sh -f 3)
    assert cyc.tick().reason in ("fresh", "overrun")
    cyc.drain(timeout=5.0)
    cyc.admission = AdmissionController(period_ms=100.0, safety_margin_ms=2.0)
    cyc.admission.update(big)
    run = 0
    for i in range(10):
        fb.publish(frame(200 + i), stamp_ns=200 + i)
        out = cyc.tick()
        cyc.drain(timeout=5.0)
        if out.probe:
            break
        run += 1
    assert out.probe and run == 3


def probes_from_a_high_estimate(engine, ticks: int, until: str):
    """A 1 s cycle whose estimate starts at 5 s (every chunk refused, probes from the third refusal): what each of up to
    `ticks` ticks (a new frame each, the engine drained) was, "probe" or its reason, up to the first `until`; and
    the cycle."""
    cyc, fb = make_cycle(engine, period_ms=1000.0, margin_ms=2.0, probe_after=30, warm=False)
    cyc.admission.update(PhaseTimings(vision_ms=0.0, prefill_ms=0.0, decode_ms=0.0, total_ms=5000.0))
    kinds = []
    for i in range(ticks):
        fb.publish(frame(i), stamp_ns=i)
        out = cyc.tick()
        cyc.drain(timeout=5.0)
        kinds.append("probe" if out.probe else out.reason)
        if out.reason == until:
            break
    return kinds, cyc


def test_a_probe_that_fits_its_budget_is_followed_by_another_at_once(engine):
    """A probe that fitted the budget it was refused with: the next refused cycle probes again (the EMAs then come
    down within a few cycles instead of one step per backed-off probe)."""
    # an estimate far above the budget, but the real chunk (tiny model, 4 frames) fits 998 ms on any host
    kinds, _ = probes_from_a_high_estimate(engine, 8, until="fresh")
    assert kinds[:4] == ["refused", "refused", "refused", "probe"], kinds
    assert kinds[4] == "probe", kinds  # the first probe fitted: the very next refused cycle probes again


def test_probes_that_fail_non_finite_still_teach_the_chunk_cost(tmp_path):
    """A model that overflows on every frame: each chunk raises NonFiniteOutput after running to its end, a real
    cost. A probe that fails so still measures the chunk: the next refused cycle probes again, the estimate comes
    down, and chunks are admitted again (each a non_finite fallback). In a fresh-clone run the node refused for a
    minute after one slow chunk: failed probes taught nothing and backed off (test_robot_output_ros saw 1 non_finite
    fallback in 60 s)."""
    from overflow_models import make_overflow_model

    eng = Engine(make_overflow_model(str(tmp_path / "m"), "final_norm"), backend="numpy", kv_capacity_tokens=512)
    try:
        kinds, cyc = probes_from_a_high_estimate(eng, 40, until="non_finite")
        assert kinds[:5] == ["refused", "refused", "refused", "probe", "probe"], kinds
        assert kinds[-1] == "non_finite", kinds
        assert cyc.non_finite >= 3
    finally:
        eng.close()


def test_cold_without_measurements(engine):
    cyc, fb = make_cycle(engine, warm=False)
    fb.publish(frame(1), stamp_ns=1)
    assert cyc.tick().reason == "cold"


def test_overrun_returns_at_the_deadline_then_busy_then_late_result_is_learned(engine):
    period_ms, margin_ms = 300.0, 60.0  # generous: a loaded machine must still admit the chunk
    clock = uptime_clock
    cyc, fb = make_cycle(engine, period_ms=period_ms, margin_ms=margin_ms, warm="cheap", clock=clock)
    engine.fault_hook = lambda plan: time.sleep(0.8)  # the chunk runs far past the deadline
    fb.publish(frame(1), stamp_ns=1, recv_time=clock())
    t0 = clock()
    out = cyc.tick(t0)
    waited = clock() - t0
    assert (out.source, out.reason) == ("fallback", "overrun") and not out.action.any()
    wait_s = (period_ms - margin_ms) / 1000.0
    assert out.wait_until - t0 == pytest.approx(wait_s, abs=1e-6)  # the guard stops at deadline - margin
    assert out.deadline - t0 == pytest.approx(period_ms / 1000.0, abs=1e-6)
    # ...and really returns then: not before, and not as late as the deadline (LATE_S < margin).
    assert wait_s - 0.001 <= waited <= wait_s + LATE_S, f"returned after {waited * 1e3:.1f} ms"
    assert cyc.record_published(out, t0 + waited) == (waited > period_ms / 1000.0)  # late flag follows the deadline
    assert cyc.pending and engine.busy

    fb.publish(frame(2), stamp_ns=2, recv_time=clock())
    busy = cyc.tick()
    assert (busy.source, busy.reason) == ("fallback", "busy") and busy.late_chunk is None

    engine.fault_hook = None
    deadline = time.monotonic() + 5.0
    while engine.busy and time.monotonic() < deadline:
        time.sleep(0.01)
    samples = cyc.admission.samples
    fb.publish(frame(3), stamp_ns=3, recv_time=clock())
    after = cyc.tick()
    assert after.late_chunk is not None and after.late_frame_seq == 0  # the overrun chunk, discarded
    assert cyc.late_results == 1 and cyc.admission.samples >= samples + 1  # the late chunk's cost was learned
    assert after.frame_seq == 2 and after.reason in ("fresh", "refused")  # refused only if the machine is slow
    cyc.drain(timeout=5.0)


def test_engine_error_becomes_a_fallback(engine):
    cyc, fb = make_cycle(engine)

    def boom(plan):
        raise RuntimeError("kernel exploded")

    engine.fault_hook = boom
    fb.publish(frame(1), stamp_ns=1)
    out = cyc.tick()
    assert (out.source, out.reason) == ("fallback", "engine_error")
    assert "RuntimeError: kernel exploded" in out.error and cyc.engine_errors == 1
    # Same frame again: nothing new, and the model never produced an action -> a fallback repeat.
    again = cyc.tick()
    assert (again.source, again.reason) == ("fallback", "repeat")
    engine.fault_hook = None
    fb.publish(frame(2), stamp_ns=2)
    assert cyc.tick().reason == "fresh"
    engine.cache.check_invariants()


def test_hold_fallback_repeats_the_last_action(engine):
    offset = [0.0]
    cyc, fb = make_cycle(engine, clock=lambda: time.monotonic() + offset[0], fallback="hold")
    fb.publish(frame(5), stamp_ns=5)
    fresh = cyc.tick()
    assert fresh.reason == "fresh"
    offset[0] = 10.0  # ten seconds later the frame is stale
    stale = cyc.tick()
    assert stale.reason == "stale_frame" and np.array_equal(stale.action, fresh.action)


def test_hold_fallback_ends_after_hold_timeout(engine):
    """Issue 30.2: with the camera gone, hold repeats the last action for at most hold_timeout_s from the first
    fallback of the spell, then zero (counted once); the next model action starts a new spell."""
    offset = [0.0]
    cyc, fb = make_cycle(engine, clock=lambda: time.monotonic() + offset[0], fallback="hold", hold_timeout_s=0.2)
    fb.publish(frame(5), stamp_ns=5)
    fresh = cyc.tick()
    assert fresh.reason == "fresh" and np.any(fresh.action != 0)
    offset[0] = 10.0
    t = time.monotonic() + offset[0]
    outs = [cyc.tick(t + dt) for dt in (0.0, 0.1, 0.19, 0.25, 0.5, 6.0)]
    assert [o.reason for o in outs] == ["stale_frame"] * 6
    assert [bool(np.any(o.action != 0)) for o in outs] == [True, True, True, False, False, False]
    assert [o.hold_expired for o in outs] == [False, False, False, True, True, True] and cyc.holds_expired == 1
    offset[0] = 0.0
    fb.publish(frame(6), stamp_ns=6)
    assert cyc.tick().reason == "fresh"
    offset[0] = 20.0
    assert np.any(cyc.tick().action != 0)  # a new spell holds again


def test_drain_harvests_a_late_chunk(engine):
    cyc, fb = make_cycle(engine, period_ms=300.0, warm="cheap")
    engine.fault_hook = lambda plan: time.sleep(0.6)
    fb.publish(frame(1), stamp_ns=1)
    assert cyc.tick().reason == "overrun"
    probe = cyc.drain(timeout=5.0)
    assert probe.late_chunk is not None and not cyc.pending and cyc.late_results == 1


def test_guard_learns_its_wake_up_lag_and_stops_waiting_earlier(engine):
    """An overrun fallback published 30 ms after the guard stopped waiting (a loaded CPU) makes the next
    cycles stop waiting 30 ms - margin earlier, and admission counts that reserve against the budget."""
    period_ms, margin_ms = 300.0, 5.0
    clock = uptime_clock
    cyc, fb = make_cycle(engine, period_ms=period_ms, margin_ms=margin_ms, warm="cheap", clock=clock)
    assert cyc.wake_slack_s == 0.0
    engine.fault_hook = lambda plan: time.sleep(0.6)
    fb.publish(frame(1), stamp_ns=1, recv_time=clock())
    t0 = clock()
    out = cyc.tick(t0)
    assert out.reason == "overrun"
    assert out.wait_until - t0 == pytest.approx((period_ms - margin_ms) / 1000.0, abs=1e-6)
    cyc.record_published(out, out.wait_until + 0.030)  # woke and published 30 ms late
    assert cyc.wake_slack_s == pytest.approx(0.030 - margin_ms / 1000.0, abs=1e-6)
    cyc.drain(timeout=5.0)

    engine.fault_hook = lambda plan: time.sleep(0.6)
    fb.publish(frame(2), stamp_ns=2, recv_time=clock())
    t1 = clock()
    out2 = cyc.tick(t1)
    waited = clock() - t1
    assert out2.reason == "overrun"
    expected_s = (period_ms - margin_ms) / 1000.0 - 0.025  # 25 ms earlier: the 30 ms lag less the margin
    assert out2.wait_until - t1 == pytest.approx(expected_s, abs=1e-6)
    assert expected_s - 0.001 <= waited <= expected_s + LATE_S, f"returned after {waited * 1e3:.1f} ms"
    # admission saw a budget smaller by the 25 ms reserve
    assert out2.remaining_ms <= period_ms - margin_ms - 25.0 + 1e-6
    cyc.drain(timeout=5.0)
    engine.fault_hook = None


def test_wake_slack_is_capped_at_half_the_budget(engine):
    cyc, fb = make_cycle(engine, period_ms=100.0, margin_ms=2.0, warm="cheap")
    engine.fault_hook = lambda plan: time.sleep(0.3)
    fb.publish(frame(1), stamp_ns=1)
    out = cyc.tick()
    cyc.record_published(out, out.wait_until + 0.080)  # 80 ms late on a 100 ms period: 78 ms wanted
    assert cyc.wake_slack_s == pytest.approx(0.5 * 0.098, abs=1e-9)
    cyc.drain(timeout=5.0)
    engine.fault_hook = None


def test_a_stall_of_the_process_is_not_learned_as_wake_up_lag(engine):
    """A publish 2 s late (a suspended process, a VM pause) is a stall, counted as late and as missed ticks; kept
    back as wake-up slack for a minute it left a 33 ms node refusing every 16 ms chunk after a 2 s SIGSTOP."""
    cyc, fb = make_cycle(engine, period_ms=100.0, margin_ms=2.0, warm="cheap")
    engine.fault_hook = lambda plan: time.sleep(0.3)
    fb.publish(frame(1), stamp_ns=1)
    out = cyc.tick()
    assert out.reason == "overrun"
    assert cyc.record_published(out, out.wait_until + 2.0)  # late
    assert cyc.wake_slack_s == 0.0
    cyc.drain(timeout=5.0)
    engine.fault_hook = None


def test_wake_slack_forgets_after_a_minute(engine):
    now = [1000.0]
    cyc, fb = make_cycle(engine, period_ms=100.0, margin_ms=2.0, warm="cheap")
    out = cyc.tick()
    cyc.record_published(out, time.monotonic())  # no_frame: nothing waited, nothing learned
    assert cyc.wake_slack_s == 0.0
    cyc.clock = lambda: now[0]
    out.reason, out.wait_until = "overrun", now[0] - 0.010
    cyc.record_published(out, now[0])  # published 10 ms after the wait ended
    assert cyc.wake_slack_s == pytest.approx(0.008, abs=1e-9)
    now[0] += 59.0
    assert cyc.wake_slack_s == pytest.approx(0.008, abs=1e-9)
    now[0] += 2.0  # more than a minute later: forgotten
    assert cyc.wake_slack_s == 0.0
