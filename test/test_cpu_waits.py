# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""cpu_waits, the judge the deadline tests use (a miss is the host's only when the node waited for a CPU): it sees the
run-queue wait of a real process that shares its CPU with another busy one, and none of a process that does not ask
for a CPU (asleep, as a node blocked on its own lock or sleep is), so a late cycle in the second is the node's."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from cpu_waits import CpuWaits, check_misses, judge_misses

pytestmark = [pytest.mark.exclusive,  # pins processes to one CPU: alone, so another test's load is not counted in it
              pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="no /proc schedstat here")]

BUSY = "print('ready', flush=True)\nwhile True: pass"
# busy 0.3 s first (it waits then: only the wait in a window counts), then asleep
ASLEEP = ("import time\nt = time.monotonic()\nwhile time.monotonic() - t < 0.3: pass\n"
          "print('ready', flush=True)\ntime.sleep(60)")


def _child(code: str, cpu: int) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                         preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    assert p.stdout.readline().strip() == "ready"
    return p


def _cycle(n: int, scheduled: float, publish: float, period_ms: float, missed_before: int = 0):
    """A ~/cycle tuple as the Listener keeps it: a tick at `scheduled` published at `publish` (monotonic s)."""
    ms = (publish - scheduled) * 1000.0
    v = {"cycle": str(n), "tick_monotonic": f"{scheduled:.6f}", "cycle_ms": f"{ms:.3f}",
         "since_scheduled_tick_ms": f"{ms:.3f}", "late": str(ms > period_ms), "missed_before": str(missed_before),
         "jitter_ms": "0.0", "reason": "fresh"}
    return (publish, v, 0)


def _watch(procs: list[subprocess.Popen], pid: int, seconds: float) -> tuple[CpuWaits, float]:
    waits = CpuWaits(pid).start()
    t0 = time.monotonic()
    time.sleep(seconds)
    waits.stop()
    for p in procs:
        p.kill()
        p.wait()
    return waits, t0


def test_a_process_sharing_its_cpu_waits_and_its_late_cycle_is_the_hosts():
    cpu = max(os.sched_getaffinity(0))
    a, b = _child(BUSY, cpu), _child(BUSY, cpu)
    waits, t0 = _watch([a, b], a.pid, 0.8)
    waited = waits.waited_ms(t0 + 0.1, t0 + 0.5)
    print(f"[cpu waits] a busy process sharing CPU {cpu}: waited {waited:.0f} ms of 400")
    assert waited >= 100.0, waited  # ~200 ms: half the time, the other process has the CPU
    # a tick 100 ms late (period 300 ms, published 400 ms after it) in that window: the host's
    late = [_cycle(0, t0 + 0.05, t0 + 0.1, 300.0), _cycle(1, t0 + 0.1, t0 + 0.5, 300.0)]
    assert check_misses(late, waits, 300.0, 1)[0]["host"]


def test_a_process_that_does_not_ask_for_a_cpu_waits_for_none_and_its_late_cycle_is_its_own():
    cpu = max(os.sched_getaffinity(0))
    busy = _child(BUSY, cpu)
    asleep = _child(ASLEEP, cpu)  # the CPU is busy; the process is not runnable
    waits, t0 = _watch([asleep, busy], asleep.pid, 0.8)
    waited = waits.waited_ms(t0 + 0.1, t0 + 0.5)
    print(f"[cpu waits] an asleep process on busy CPU {cpu}: waited {waited:.1f} ms of 400")
    assert waited < 5.0, waited
    # its busy start-up did wait, before the window: a window's wait is a difference
    assert max(vals[0] for _, vals in waits.waits.values()) >= 50.0
    late = [_cycle(0, t0 + 0.05, t0 + 0.1, 300.0), _cycle(1, t0 + 0.1, t0 + 0.5, 300.0)]
    judged = judge_misses(late, waits, 300.0)
    assert [m["kind"] for m in judged] == ["late"] and judged[0]["late_ms"] == pytest.approx(100.0, abs=0.1)
    assert not judged[0]["host"]
    with pytest.raises(AssertionError, match="no CPU wait of the node to explain them"):
        check_misses(late, waits, 300.0, 1)
    # two ticks skipped between the first publish and the next tick: their window, 2 periods late
    skipped = [_cycle(0, t0 + 0.05, t0 + 0.1, 100.0), _cycle(3, t0 + 0.35, t0 + 0.4, 100.0, missed_before=2)]
    judged = judge_misses(skipped, waits, 100.0)
    assert [(m["kind"], m["late_ms"]) for m in judged] == [("2 skipped", 200.0)]
    assert judged[0]["window"] == pytest.approx((t0 + 0.1, t0 + 0.35), abs=1e-5)
    with pytest.raises(AssertionError, match="no CPU wait"):
        check_misses(skipped, waits, 100.0, 2)
    # a miss /diagnostics counts that the ~/cycle stream does not show is never excused
    with pytest.raises(AssertionError, match="counts 1 deadline misses, ~/cycle shows 0"):
        check_misses(late[:1], waits, 300.0, 1)
