# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""A real stall (issue 13.2): the bringup process is stopped for ~1 s (SIGSTOP, then SIGCONT). /diagnostics
must report the ticks that never ran as missed deadlines and the gap between actions, as a listener in another
process sees it. Helpers: ros_helpers.py, fixtures: conftest.py."""

from __future__ import annotations

import signal
import time

import pytest

rclpy = pytest.importorskip("rclpy")

from ros_helpers import PERIOD_MS, Listener, start_vla_edge  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]


def test_a_stopped_process_reports_missed_cycles_and_the_gap(domain, tmp_path, procs, micro_model):
    # the timing promise itself (missed ticks counted): at the design's period, whether or not the model fits here
    node = start_vla_edge(procs, domain, tmp_path, micro_model, {"period_ms": PERIOD_MS})
    lst = Listener(domain)
    try:
        lst.wait_for(lambda: len(lst.actions) > 30 and len(lst.diags) > 1, 60, "actions and diagnostics")
        before = lst.last_diag()
        node.signal(signal.SIGSTOP)
        t_stop = time.monotonic()
        time.sleep(1.0)
        node.signal(signal.SIGCONT)
        stopped_s = time.monotonic() - t_stop
        t_cont = time.monotonic()
        lst.wait_for(lambda: lst.diags[-1][0] > t_cont + 1.2, 10, "diagnostics after the stall")
        d = lst.last_diag()
        with lst.lock:
            times = [t for t, _, _ in lst.actions]
        seen_gap = max(b - a for a, b in zip(times, times[1:]))
        assert seen_gap >= 0.9, seen_gap  # the listener saw the hole the node must report
        missed = int(d["missed_ticks"]) - int(before.get("missed_ticks", 0))
        assert missed >= 25, (missed, stopped_s, d)
        assert int(d["deadline_misses"]) - int(before["deadline_misses"]) >= missed
        assert float(d["action_gap_ms_max"]) >= 900.0, d["action_gap_ms_max"]
        assert float(d["deadline_miss_rate"]) > 0.0
        print(f"stopped {stopped_s * 1000:.0f} ms: {missed} missed ticks, gap {float(d['action_gap_ms_max']):.0f} ms "
              f"reported, {seen_gap * 1000:.0f} ms seen")
        assert node.alive()
    finally:
        lst.close()
    assert node.stop() == 0, node.output()[-3000:]
