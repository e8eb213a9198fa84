# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Whose fault a late cycle is: the node's, or a host that did not give the node a CPU.

A test that asserts "no deadline miss" of a node sharing 2 cores with the camera, the replay, DDS and the test itself
judged the host as much as the node: one fresh-clone run in three had one late cycle somewhere. `CpuWaits` samples,
every few milliseconds, how long each thread of the node has waited for a CPU while runnable (the kernel's run-queue
wait, the second field of /proc/PID/task/TID/schedstat) and how long the hypervisor took the CPUs away (steal,
/proc/stat). `check_misses` then fails on the late cycles and skipped ticks the node owns: those in whose window
no thread of the node waited for a CPU half as long as the cycle was late. Slow code, a held GIL, a sleep or a GC
pause in the node wait on nothing the kernel counts here, so they stay unexplained and the test stays red for them.
"""
from __future__ import annotations

import bisect
import os
import threading
import time

INTERVAL_S = 0.005
EXPLAINED_SHARE = 0.5  # a miss is the host's when the node waited for a CPU at least this share of how late it was


def _steal_ms() -> float:
    """The largest per-CPU steal time so far (ms); 0 where /proc/stat does not say."""
    try:
        with open("/proc/stat") as f:
            lines = [ln.split() for ln in f if ln.startswith("cpu") and not ln.startswith("cpu ")]
        return max(int(p[8]) for p in lines) * 1000.0 / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


class CpuWaits:
    """Samples the run-queue wait of every thread of process `pid` (and the host's steal) in a daemon thread."""

    def __init__(self, pid: int, interval_s: float = INTERVAL_S):
        self.pid, self.interval_s = pid, interval_s
        self.times: list[float] = []  # sample times (time.monotonic, the clock the node's ~/cycle uses)
        self.steal: list[float] = []  # steal (ms) at each sample
        self.waits: dict[int, tuple[list[int], list[float]]] = {}  # tid -> (sample indices, run-queue wait ms)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.available = os.path.exists(f"/proc/{pid}/schedstat")

    def start(self) -> "CpuWaits":
        if self.available:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2)

    def _run(self) -> None:
        task = f"/proc/{self.pid}/task"
        while not self._stop.is_set():
            try:
                tids = os.listdir(task)
            except OSError:
                return  # the process is gone
            i = len(self.times)
            for tid in tids:
                try:
                    with open(f"{task}/{tid}/schedstat") as f:
                        wait_ms = int(f.read().split()[1]) / 1e6
                except (OSError, IndexError, ValueError):
                    continue
                idx, vals = self.waits.setdefault(int(tid), ([], []))
                if not vals or vals[-1] != wait_ms:
                    idx.append(i)
                    vals.append(wait_ms)
            self.steal.append(_steal_ms())
            self.times.append(time.monotonic())
            self._stop.wait(self.interval_s)

    def waited_ms(self, t_a: float, t_b: float) -> float:
        """The longest any one thread of the process waited for a CPU between `t_a` and `t_b` (monotonic s), plus the
        steal in that time, bracketed by the last sample at or before `t_a` and the first at or after `t_b`."""
        n = len(self.times)
        a = max(0, bisect.bisect_right(self.times, t_a, 0, n) - 1)
        b = min(n - 1, bisect.bisect_left(self.times, t_b, 0, n))
        if n == 0 or b <= a:
            return 0.0
        longest = 0.0
        for idx, vals in list(self.waits.values()):
            ia = bisect.bisect_right(idx, a) - 1  # the value at sample a (none yet: the thread started later)
            ib = bisect.bisect_right(idx, b) - 1
            if ib < 0:
                continue
            longest = max(longest, vals[ib] - (vals[ia] if ia >= 0 else 0.0))
        return longest + (self.steal[b] - self.steal[a])


def _publish_time(v: dict) -> float:
    return float(v["tick_monotonic"]) + float(v["cycle_ms"]) / 1000.0


def misses(cycles, period_ms: float, before=None) -> list[dict]:
    """The late cycles and the skipped ticks in a ~/cycle stream (Listener tuples), each with its window (monotonic
    s) and how late it was (ms): a late publish from its scheduled tick to the publish, skipped ticks from the previous
    publish (`before`'s, the cycle ahead of the stream, for the first) to the tick that ran next."""
    out, prev_publish = [], (None if before is None else _publish_time(before[1]))
    for _, v, _ in cycles:
        t0 = float(v["tick_monotonic"])
        publish = _publish_time(v)
        since_tick = float(v["since_scheduled_tick_ms"])
        if v["late"] == "True":
            out.append({"cycle": v["cycle"], "kind": "late", "ticks": 1,
                        "window": (publish - since_tick / 1000.0, publish),
                        "late_ms": round(since_tick - period_ms, 2), "jitter_ms": v.get("jitter_ms"),
                        "reason": v.get("reason")})
        skipped = int(v.get("missed_before", 0))
        if skipped and prev_publish is not None:
            out.append({"cycle": v["cycle"], "kind": f"{skipped} skipped", "ticks": skipped,
                        "window": (prev_publish, t0), "late_ms": skipped * period_ms})
        prev_publish = publish
    return out


def judge_misses(cycles, waits: CpuWaits, period_ms: float, before=None) -> list[dict]:
    """The misses of `cycles`, each with how long the node waited for a CPU in its window (`cpu_wait_ms`) and whether
    that explains it (`host`: module docstring)."""
    out = misses(cycles, period_ms, before)
    for m in out:
        m["cpu_wait_ms"] = round(waits.waited_ms(*m["window"]), 2)
        m["host"] = m["cpu_wait_ms"] >= EXPLAINED_SHARE * m["late_ms"]
    return out


def check_misses(cycles, waits: CpuWaits, period_ms: float, counted: int, before=None) -> list[dict]:
    """Every miss the node counted (`counted`: /diagnostics' deadline_misses over the stream's time) is in the ~/cycle
    stream `cycles`, and the host explains each one; returns the misses (all explained)."""
    seen = judge_misses(cycles, waits, period_ms, before)
    stream = sum(m["ticks"] for m in seen)
    assert counted <= stream, f"/diagnostics counts {counted} deadline misses, ~/cycle shows {stream}: {seen[:5]}"
    assert waits.available or not seen, f"{len(seen)} misses and no /proc schedstat to judge them: {seen[:5]}"
    bad = [m for m in seen if not m["host"]]
    assert not bad, f"{len(bad)} of {len(seen)} misses with no CPU wait of the node to explain them: {bad[:5]}"
    if seen:
        print(f"[cpu waits] {len(seen)} misses, each explained by the node waiting for a CPU: {seen[:5]}")
    return seen
