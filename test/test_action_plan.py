# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""ActionPlan (DESIGN.md §17): late chunks skip the ticks that passed, the blends' arithmetic, expiry after
chunk_execute ticks, a non-finite chunk never queued, the settings' checks."""
import numpy as np
import pytest

from vla_edge_ros.action_plan import ActionPlan, check_plan_settings


def chunk(k: int, base: float) -> np.ndarray:
    """K actions whose values say which chunk and which index they are: base + index / 100 in every dimension."""
    return (base + np.arange(k, dtype=np.float32)[:, None] / 100.0 + np.zeros((k, 8), np.float32)).astype(np.float32)


def test_an_on_time_chunk_runs_from_its_own_tick_then_the_plan_is_stale_after_execute_ticks():
    plan = ActionPlan(8, execute=5)
    landing = plan.land(chunk(8, 0.1), t0_slot=10, now_slot=10)
    assert (landing.late_ticks, landing.kept) == (0, 5)
    steps = [plan.take(s) for s in range(10, 17)]
    assert [round(float(st.action[0]), 2) for st in steps[:5]] == [0.1, 0.11, 0.12, 0.13, 0.14]
    assert [st.index for st in steps[:5]] == [0, 1, 2, 3, 4]
    assert [st.first for st in steps[:5]] == [True, False, False, False, False]
    assert steps[5] is None and steps[6] is None  # actions 5..7 are never used: chunk_execute = 5


def test_a_chunk_that_lands_late_skips_exactly_the_ticks_that_passed():
    plan = ActionPlan(8)
    landing = plan.land(chunk(8, 0.5), t0_slot=3, now_slot=6)  # 3 ticks late
    assert (landing.late_ticks, landing.kept) == (3, 5) and plan.actions_skipped == 3
    st = plan.take(6)
    assert st.first and st.index == 3 and float(st.action[0]) == pytest.approx(0.53)
    assert plan.remaining(7) == 4
    stale = plan.land(chunk(8, 0.9), t0_slot=0, now_slot=8)  # every action's tick has passed
    assert stale.kept == 0 and plan.chunks_stale == 1
    assert plan.take(7) is not None  # a stale chunk changes nothing


def test_take_drops_ticks_that_passed_without_a_publish():
    plan = ActionPlan(8)
    plan.land(chunk(8, 0.0), 0, 0)
    st = plan.take(4)  # ticks 0..3 never ran (a stalled process)
    assert st.index == 4 and plan.remaining(5) == 3 and plan.take(3) is None


def test_latest_takes_the_new_chunk_on_overlapping_ticks_and_drops_the_old_ones_beyond():
    plan = ActionPlan(4, blend="latest")
    plan.land(chunk(4, 0.0), 0, 0)
    plan.take(0)
    landing = plan.land(chunk(4, 1.0), t0_slot=1, now_slot=1)
    assert landing.blended == 3  # ticks 1, 2, 3 were the old plan's
    st = plan.take(1)
    assert st.first and float(st.action[0]) == pytest.approx(1.0)
    assert st.replaced is not None and float(st.replaced[0]) == pytest.approx(0.01)
    assert [float(plan.take(s).action[0]) for s in (2, 3, 4)] == pytest.approx([1.01, 1.02, 1.03])


def test_weighted_blends_overlapping_ticks_with_the_weight_on_the_new_chunk():
    plan = ActionPlan(4, blend="weighted", weight=0.7)
    plan.land(chunk(4, 0.0), 0, 0)
    plan.land(chunk(4, 1.0), t0_slot=2, now_slot=2)
    got = [float(plan.take(s).action[0]) for s in (2, 3, 4, 5)]
    # ticks 2, 3 overlap (old 0.02, 0.03); ticks 4, 5 are the new chunk's alone
    assert got == pytest.approx([0.7 * 1.0 + 0.3 * 0.02, 0.7 * 1.01 + 0.3 * 0.03, 1.02, 1.03], abs=1e-6)


def test_a_non_finite_chunk_never_enters_and_the_plan_stays():
    plan = ActionPlan(4)
    plan.land(chunk(4, 0.2), 0, 0)
    bad = chunk(4, 0.3)
    bad[2, 5] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        plan.land(bad, 1, 1)
    assert float(plan.take(1).action[0]) == pytest.approx(0.21)


def test_clear_discards_everything():
    plan = ActionPlan(8)
    plan.land(chunk(8, 0.0), 0, 0)
    assert plan.clear() and plan.take(1) is None and plan.cleared == 1
    assert not plan.clear()  # an empty plan: nothing counted


def test_one_action_a_chunk_has_no_plan_and_no_horizon():
    plan = ActionPlan(1)
    assert not plan.enabled and plan.horizon_ticks() == 0
    assert ActionPlan(8, execute=3).horizon_ticks() == 2


@pytest.mark.parametrize("execute, blend, weight, chunk_k, needle", [
    (9, "latest", 0.7, 8, "chunk_execute=9"), (5, "latest", 0.7, 4, "chunk_execute=5"),
    (-1, "latest", 0.7, 8, "chunk_execute=-1"), ("eight", "latest", 0.7, 8, "chunk_execute='eight'"),
    (True, "latest", 0.7, 8, "chunk_execute=True"), (2, "average", 0.7, 8, "chunk_blend='average'"),
    (2, "weighted", 1.5, 8, "chunk_blend_weight=1.5"), (2, "weighted", -0.1, 8, "chunk_blend_weight=-0.1"),
    (2, "weighted", float("nan"), 8, "chunk_blend_weight=nan"),
])
def test_impossible_settings_are_one_line_each(execute, blend, weight, chunk_k, needle):
    problems = check_plan_settings(execute, blend, weight, chunk_k)
    assert len(problems) == 1 and needle in problems[0] and "\n" not in problems[0]
    with pytest.raises(ValueError, match="chunk_"):
        ActionPlan(chunk_k, execute, blend, weight)


def test_configure_changes_nothing_when_refused():
    plan = ActionPlan(8, execute=4, blend="weighted", weight=0.5)
    with pytest.raises(ValueError):
        plan.configure(execute=3, weight=2.0)
    assert (plan.execute, plan.weight) == (4, 0.5)
    plan.configure(execute=0)
    assert plan.execute == 8
