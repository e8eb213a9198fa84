# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""AdmissionController: deadline arithmetic, EMA updates, tail allowance, validation (DESIGN.md §4)."""

import pytest

from vla_edge_ros.admission import AdmissionController, Decision, PhaseTimings


class FakeClock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def timings(vision, prefill, decode, total, prefill_tokens=32, decode_tokens=8):
    return PhaseTimings(vision, prefill, decode, total, prefill_tokens, decode_tokens)


def controller(clock, **kwargs):
    return AdmissionController(clock=clock, **kwargs)


def test_cold_start_admits_with_zero_estimate():
    clock = FakeClock()
    ac = controller(clock)
    d = ac.decide(t0=clock.now)
    assert d == Decision(admit=True, reason="admit", remaining_ms=31.0, estimate_ms=0.0)


def test_require_warm_says_cold_until_first_sample():
    clock = FakeClock()
    ac = controller(clock, require_warm=True)
    assert ac.decide(clock.now).reason == "cold"
    ac.update(timings(1, 2, 3, 6))
    assert ac.decide(clock.now).reason == "admit"


def test_busy_wins_over_everything():
    clock = FakeClock()
    ac = controller(clock, require_warm=True)
    d = ac.decide(clock.now, busy=True)
    assert (d.admit, d.reason) == (False, "busy")


def test_remaining_arithmetic_and_boundary():
    clock = FakeClock(10.0)
    ac = controller(clock, period_ms=33.0, safety_margin_ms=2.0)
    # First sample sets the EMAs: 2 + 0.25*32 + 1.5*8 + 1 = 23 ms.
    ac.update(timings(vision=2.0, prefill=8.0, decode=12.0, total=23.0))
    assert ac.estimate_ms() == pytest.approx(23.0)

    t0 = 10.0
    clock.now = t0 + 0.008  # 8 ms into the cycle: remaining = 33 - 8 - 2 = 23 = estimate -> fits
    d = ac.decide(t0)
    assert d.remaining_ms == pytest.approx(23.0)
    assert (d.admit, d.reason) == (True, "admit")

    clock.now = t0 + 0.0081  # 0.1 ms later it no longer fits
    d = ac.decide(t0)
    assert d.remaining_ms == pytest.approx(22.9)
    assert (d.admit, d.reason) == (False, "refused")

    clock.now = t0 + 0.040  # past the deadline: remaining is negative
    assert ac.decide(t0).remaining_ms == pytest.approx(-9.0)


def test_estimate_exactly_equal_to_remaining_is_admitted():
    clock = FakeClock(0.0)
    ac = controller(clock, period_ms=10.0, safety_margin_ms=0.0)
    ac.update(timings(vision=10.0, prefill=0.0, decode=0.0, total=10.0))
    assert ac.decide(0.0).reason == "admit"  # 10 > 10 is false


def test_first_sample_initialises_emas():
    ac = controller(FakeClock())
    ac.update(timings(vision=2.0, prefill=6.4, decode=4.0, total=14.0))
    snap = ac.snapshot()
    assert snap["vision"] == pytest.approx(2.0)
    assert snap["prefill_per_token"] == pytest.approx(0.2)
    assert snap["decode_per_token"] == pytest.approx(0.5)
    assert snap["other"] == pytest.approx(1.6)  # 14 - 2 - 6.4 - 4
    assert snap["dev"] == 0.0
    assert snap["samples"] == 1.0
    assert all(isinstance(v, float) for v in snap.values())


def test_ema_updates_by_hand():
    ac = controller(FakeClock(), ema_alpha=0.25)
    ac.update(timings(vision=2.0, prefill=6.4, decode=4.0, total=14.0))  # estimate now 14.0
    # Second chunk (inside the outlier bound 14 + 7): vision 3, prefill 8 (0.25/token), decode 6 (0.75/token),
    # total 19 -> other 2.0.
    ac.update(timings(vision=3.0, prefill=8.0, decode=6.0, total=19.0))
    snap = ac.snapshot()
    assert snap["vision"] == pytest.approx(0.75 * 2.0 + 0.25 * 3.0)  # 2.25
    assert snap["prefill_per_token"] == pytest.approx(0.75 * 0.2 + 0.25 * 0.25)  # 0.2125
    assert snap["decode_per_token"] == pytest.approx(0.75 * 0.5 + 0.25 * 0.75)  # 0.5625
    assert snap["other"] == pytest.approx(0.75 * 1.6 + 0.25 * 2.0)  # 1.7
    # Deviation against the estimate before learning (14.0); the first deviation sets the EMA.
    assert snap["dev"] == pytest.approx(5.0)
    assert snap["clipped"] == 0.0
    assert ac.estimate_ms() == pytest.approx(2.25 + 0.2125 * 32 + 0.5625 * 8 + 1.7)  # 15.25

    # Third chunk equals the current mean estimate split evenly: deviation 0 -> dev decays.
    ac.update(timings(vision=2.25, prefill=6.8, decode=4.5, total=15.25))
    assert ac.snapshot()["dev"] == pytest.approx(0.75 * 5.0)


def test_one_stall_moves_the_estimate_by_a_bounded_step():
    """A chunk 10x slower than predicted (a preempted worker) is learned as 1.5x the prediction: the estimate
    rises by alpha * 0.5 * prediction, not by alpha * 9 * prediction, and the clip is counted."""
    clock = FakeClock(0.0)
    ac = controller(clock, ema_alpha=0.2)
    for _ in range(5):
        ac.update(timings(2.0, 8.0, 10.0, 20.0))  # steady 20 ms, dev 0
    ac.update(timings(20.0, 80.0, 100.0, 200.0))  # one stall
    snap = ac.snapshot()
    assert ac.estimate_ms() == pytest.approx(20.0 + 0.2 * 10.0)  # learned as 30 ms, not 200
    assert snap["clipped"] == 1.0 and snap["dev"] == pytest.approx(0.2 * 10.0)
    # the phases keep the measured split: vision 2 -> 3 ms learned
    assert snap["vision"] == pytest.approx(2.0 + 0.2 * 1.0)
    # so a 31 ms budget still admits the next cycle (unclipped, 200 ms would have made it 56 ms: refused)
    assert ac.decide(0.0).reason == "admit"


def test_a_cost_that_really_rose_is_still_followed():
    """The clip bounds one sample, not the trend: a chunk that became 2.5x dearer for good is within 10 %
    after a dozen chunks (the bound widens with the deviation EMA)."""
    ac = controller(FakeClock(), ema_alpha=0.2)
    for _ in range(5):
        ac.update(timings(0.0, 0.0, 0.0, 20.0))
    for _ in range(12):
        ac.update(timings(0.0, 0.0, 0.0, 50.0))
    assert ac.estimate_ms() >= 0.9 * 50.0, ac.snapshot()
    assert ac.snapshot()["clipped"] >= 1.0


def test_other_is_clipped_at_zero():
    ac = controller(FakeClock())
    ac.update(timings(vision=5.0, prefill=5.0, decode=5.0, total=12.0))  # phases overlap the total
    assert ac.snapshot()["other"] == 0.0


def test_deviation_uses_sample_token_counts():
    ac = controller(FakeClock(), ema_alpha=0.5)
    ac.update(timings(vision=0.0, prefill=32.0, decode=8.0, total=40.0))  # 1 ms/token both
    # A chunk with 16 prefill tokens predicted at 24 ms; it took exactly that.
    ac.update(timings(vision=0.0, prefill=16.0, decode=8.0, total=24.0, prefill_tokens=16))
    assert ac.snapshot()["dev"] == pytest.approx(0.0)


def test_tail_allowance_refuses_what_the_mean_admits():
    clock = FakeClock(0.0)
    plain = controller(clock, tail_k=0.0)
    tailed = controller(clock, tail_k=3.0)
    samples = [timings(0.0, 0.0, 0.0, total) for total in (20.0, 28.0, 20.0, 28.0)]
    for s in samples:
        plain.update(s)
        tailed.update(s)
    mean = plain.estimate_ms()
    dev = tailed.snapshot()["dev"]
    assert dev > 0
    assert tailed.estimate_ms() == pytest.approx(mean + 3.0 * dev)
    # A cycle with room for the mean but not for the tail.
    clock.now = (33.0 - 2.0 - mean - 0.5 * 3.0 * dev) / 1000.0
    assert plain.decide(0.0).reason == "admit"
    assert tailed.decide(0.0).reason == "refused"


def test_decision_counters():
    clock = FakeClock(0.0)
    ac = controller(clock, require_warm=True)
    ac.decide(0.0)  # cold
    ac.decide(0.0, busy=True)
    ac.update(timings(0.0, 0.0, 0.0, 40.0))
    ac.decide(0.0)  # refused: 40 > 31
    assert ac.decisions() == {"admit": 0, "refused": 1, "busy": 1, "cold": 1}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"period_ms": 2.0, "safety_margin_ms": 2.0}, "period_ms"),
        ({"period_ms": 0.0}, "period_ms"),
        ({"safety_margin_ms": -1.0}, "safety_margin_ms"),
        ({"ema_alpha": 0.0}, "ema_alpha"),
        ({"ema_alpha": 1.5}, "ema_alpha"),
        ({"ema_alpha": float("nan")}, "ema_alpha"),
        ({"tail_k": -0.1}, "tail_k"),
        ({"prefill_tokens": -1}, "token"),
    ],
)
def test_parameter_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AdmissionController(**kwargs)


def test_alpha_one_is_allowed_and_tracks_the_last_sample():
    ac = controller(FakeClock(), ema_alpha=1.0)
    ac.update(timings(1.0, 0.0, 0.0, 1.0))
    ac.update(timings(1.4, 0.0, 0.0, 1.4))  # inside the outlier bound (1.5)
    assert ac.snapshot()["vision"] == pytest.approx(1.4)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_bad_timings_are_rejected(bad):
    ac = controller(FakeClock())
    with pytest.raises(ValueError, match="total_ms"):
        ac.update(timings(1.0, 1.0, 1.0, bad))
    assert ac.samples == 0


def test_budget_arithmetic_holds_at_any_uptime():
    """remaining_ms is a difference of clock readings: the same after 28 hours of uptime as after 10 s, to
    within float rounding (an absolute tolerance: a relative one on the clock values would grow with uptime)."""
    for base in (10.0, 100_000.0, 10_000_000.0):
        clock = FakeClock(base)
        ac = controller(clock, period_ms=33.0, safety_margin_ms=2.0)
        ac.update(timings(vision=2.0, prefill=8.0, decode=12.0, total=23.0))
        clock.now = base + 0.0075  # remaining 33 - 7.5 - 2 = 23.5 ms >= estimate 23 ms
        d = ac.decide(base)
        assert d.remaining_ms == pytest.approx(23.5, abs=1e-6) and d.admit, base
        clock.now = base + 0.0085  # half a millisecond later it no longer fits
        assert ac.decide(base).reason == "refused", base
