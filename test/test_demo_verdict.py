# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""vla-edge-demo's decisions (issue 30.7): the preset is chosen on enough chunks with a margin, and a window with
deadline misses or under half model actions is a failure (one line, exit 1; run over DDS in test_round4_ros.py)."""

from __future__ import annotations

from vla_edge_ros.host_fit import ChunkCost
from vla_edge_ros.tools.demo import DEMO_CHUNKS, preset_fits, window_verdict


def cyc(source="model", late=False, missed=0):
    return {"source": source, "reason": "fresh" if source == "model" else "refused", "late": str(late),
            "missed_before": str(missed)}


def test_a_borderline_timing_does_not_pick_the_preset():
    budget = 33.0 - 2.0
    # what picked tiny 1 run in 5: p90 at 70 % of the budget (the old rule: <= 75 %, 10 chunks)
    assert not preset_fits(ChunkCost(18.0, 0.70 * budget, 25.0, DEMO_CHUNKS), 33.0, 2.0)
    assert not preset_fits(ChunkCost(5.0, 0.3 * budget, 9.0, 10), 33.0, 2.0)  # too few chunks to trust a p90
    assert preset_fits(ChunkCost(5.0, 0.3 * budget, 9.0, DEMO_CHUNKS), 33.0, 2.0)


def test_the_window_verdict():
    assert window_verdict([cyc()] * 100) is None
    assert window_verdict([cyc()] * 60 + [cyc("fallback")] * 40) is None
    v = window_verdict([cyc()] * 52 + [cyc("fallback")] * 555)
    assert v and "52 model actions of 607 cycles" in v
    v = window_verdict([cyc()] * 99 + [cyc(late=True)])
    assert v and "1 deadline misses" in v
    v = window_verdict([cyc()] * 99 + [cyc(missed=3)])
    assert v and "3 deadline misses" in v and "\n" not in v
    assert window_verdict([]) == "no cycle in the window"
