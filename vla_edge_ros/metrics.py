# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Latency, deadline-miss and fallback statistics, and a VRAM peak sampler.

The reasoning timer writes these every cycle while the 1 Hz diagnostics roll-up, the bench's reporter or
a tool on another thread reads them, so every class here takes a lock around its state.

Latency percentiles come from a bounded rolling window (the recent behaviour, bounded memory for a
robot that runs for days); counts and the maximum are all-time.
"""

from __future__ import annotations

import gc
import threading
import time
from collections import deque
from typing import Callable

import numpy as np

from .gpu import cupy_with_gpu

SOURCES = ("model", "plan", "fallback")  # cycle.SOURCES: plan = an action an earlier chunk planned for this tick


class LatencyStats:
    """Rolling window of latency samples (ms) plus all-time count and max."""

    def __init__(self, window: int = 4096):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        self._window = deque(maxlen=int(window))
        self._count = 0
        self._max: float | None = None
        self._lock = threading.Lock()

    def add(self, value_ms: float) -> None:
        value_ms = float(value_ms)
        with self._lock:
            self._window.append(value_ms)
            self._count += 1
            if self._max is None or value_ms > self._max:
                self._max = value_ms

    def __len__(self) -> int:
        """Samples currently in the window (<= window size)."""
        with self._lock:
            return len(self._window)

    @property
    def count(self) -> int:
        """All-time number of samples."""
        with self._lock:
            return self._count

    def percentiles(self) -> dict:
        """p50/p95/p99/mean over the window, max and count all-time. None values when empty."""
        with self._lock:
            values = np.fromiter(self._window, dtype=np.float64, count=len(self._window))
            count, all_time_max = self._count, self._max
        if count == 0:
            return {"p50": None, "p95": None, "p99": None, "max": None, "mean": None, "count": 0}
        p50, p95, p99 = np.percentile(values, [50, 95, 99])
        return {
            "p50": float(p50),
            "p95": float(p95),
            "p99": float(p99),
            "max": float(all_time_max),
            "mean": float(values.mean()),
            "count": count,
        }


class CycleStats:
    """Per-cycle outcome of the reasoning loop: where the action came from, why, and how long it took."""

    def __init__(self, window: int = 4096):
        self.cycle_ms = LatencyStats(window)  # scheduled tick -> action published
        self.chunk_ms = LatencyStats(window)  # engine chunk, only cycles that ran one
        self.timer_jitter_ms = LatencyStats(window)  # |actual tick - scheduled tick|
        self.frame_age_ms = LatencyStats(window)  # tick - frame receive time
        self.action_gap_ms = LatencyStats(window)  # between consecutive published actions
        self.plan_age_ticks = LatencyStats(window)  # plan actions: ticks since their chunk's frame
        self.boundary_jump = LatencyStats(window)  # a new chunk's first action vs the old plan's for that tick
        self._lock = threading.Lock()
        self._cycles = 0
        self._model_actions = 0
        self._plan_actions = 0
        self._fallbacks: dict[str, int] = {}
        self._reasons: dict[str, int] = {}
        self._late = 0
        self._missed_ticks = 0

    def record(
        self,
        source: str,
        reason: str,
        late: bool,
        cycle_ms: float,
        chunk_ms: float | None = None,
        jitter_ms: float | None = None,
        frame_age_ms: float | None = None,
        plan_age: int | None = None,
        boundary_jump: float | None = None,
    ) -> None:
        """One cycle. ``late``: its action was published after the deadline; None latencies are skipped.
        ``plan_age``: a plan action's ticks since its chunk's frame; ``boundary_jump``: a new chunk's first action
        against the old plan's action it replaced (max |delta|)."""
        if source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
        with self._lock:
            self._cycles += 1
            if source == "model":
                self._model_actions += 1
            elif source == "plan":
                self._plan_actions += 1
            else:
                self._fallbacks[reason] = self._fallbacks.get(reason, 0) + 1
            self._reasons[reason] = self._reasons.get(reason, 0) + 1
            if late:
                self._late += 1
        self.cycle_ms.add(cycle_ms)
        if chunk_ms is not None:
            self.chunk_ms.add(chunk_ms)
        if jitter_ms is not None:
            self.timer_jitter_ms.add(jitter_ms)
        if frame_age_ms is not None:
            self.frame_age_ms.add(frame_age_ms)
        if plan_age is not None and source == "plan":
            self.plan_age_ticks.add(plan_age)
        if boundary_jump is not None:
            self.boundary_jump.add(boundary_jump)

    def record_missed(self, ticks: int) -> None:
        """Ticks that never ran (a stalled process, a callback held up past a whole period): each one is
        a cycle whose action was not published by its deadline."""
        if ticks < 0:
            raise ValueError(f"missed ticks must be >= 0, got {ticks!r}")
        with self._lock:
            self._missed_ticks += int(ticks)

    def summary(self) -> dict:
        """Counts, rates (0.0 before any cycle) and latency percentiles, ready for JSON or diagnostics."""
        with self._lock:
            cycles = self._cycles
            model_actions = self._model_actions
            plan_actions = self._plan_actions
            fallbacks = dict(self._fallbacks)
            reasons = dict(self._reasons)
            late = self._late
            missed = self._missed_ticks

        def rate(n: int) -> float:
            return n / cycles if cycles else 0.0

        due = cycles + missed  # every grid slot: ticks that ran and ticks that never did

        return {
            "cycles": cycles,
            "model_actions": model_actions,
            "plan_actions": plan_actions,
            "plan_share": rate(plan_actions),
            "acting_share": rate(model_actions + plan_actions),  # ticks with a model or a plan action
            "fallbacks": fallbacks,
            "reasons": reasons,
            "repeats": reasons.get("repeat", 0) - fallbacks.get("repeat", 0),  # repeats of a model action
            "deadline_misses": late + missed,  # published late + never ran
            "deadline_miss_rate": (late + missed) / due if due else 0.0,
            "late_publishes": late,
            "missed_ticks": missed,
            "overrun_rate": rate(reasons.get("overrun", 0)),
            "fallback_rate": rate(cycles - model_actions - plan_actions),
            "cycle_ms": self.cycle_ms.percentiles(),
            "chunk_ms": self.chunk_ms.percentiles(),
            "timer_jitter_ms": self.timer_jitter_ms.percentiles(),
            "frame_age_ms": self.frame_age_ms.percentiles(),
            "action_gap_ms": self.action_gap_ms.percentiles(),
            "plan_age_ticks": self.plan_age_ticks.percentiles(),
            "boundary_jump": self.boundary_jump.percentiles(),
        }


def command_smoothness(actions, boundaries, period_s: float) -> dict:
    """How smooth a published action series is (action chunks, DESIGN.md §17): `actions` [n, D] one row a tick,
    `boundaries` the boundary jumps measured where a new chunk's first action replaced the old plan's (max |delta|
    over the dimensions), `period_s` the tick. Jerk is the third difference of consecutive ticks / period^3 (action
    units / s^3; the largest dimension a tick), reported as its RMS and maximum."""
    a = np.asarray(actions, np.float64).reshape(len(actions), -1) if len(actions) else np.zeros((0, 1))
    jerk = np.abs(np.diff(a, n=3, axis=0)).max(axis=1) / period_s ** 3 if len(a) > 3 else np.zeros(0)
    b = np.asarray([x for x in boundaries if x is not None], np.float64)
    return {"boundaries": int(b.size),
            "boundary_jump_mean": float(b.mean()) if b.size else None,
            "boundary_jump_p99": float(np.percentile(b, 99)) if b.size else None,
            "boundary_jump_max": float(b.max()) if b.size else None,
            "jerk_rms": float(np.sqrt(np.mean(jerk ** 2))) if jerk.size else None,
            "jerk_max": float(jerk.max()) if jerk.size else None}


class GcPauses:
    """Duration of every garbage collection while installed (``gc.callbacks``), per generation.

    A collection stops every Python thread of the process, the control timer included; a full
    (generation-2) pass over a freshly loaded model's objects took tens of ms. ``summary()`` says how many
    ran, the longest, and the longest generation-2 one, for /diagnostics and the bench. No lock: the
    callback runs inside the collector of whichever thread triggered it, and only assigns and appends.
    """

    def __init__(self, window: int = 256):
        self.count = [0, 0, 0]
        self.max_ms = [0.0, 0.0, 0.0]
        self.recent: deque[tuple[float, int, float]] = deque(maxlen=int(window))  # (end monotonic s, gen, ms)
        self._t0 = None
        self._installed = False

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        if self._t0 is None:
            return
        ms = (time.perf_counter() - self._t0) * 1000.0
        self._t0 = None
        g = min(2, max(0, int(info.get("generation", 0))))
        self.count[g] += 1
        if ms > self.max_ms[g]:
            self.max_ms[g] = ms
        self.recent.append((time.monotonic(), g, ms))

    def install(self) -> "GcPauses":
        if not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True
        return self

    def remove(self) -> None:
        if self._installed:
            try:
                gc.callbacks.remove(self._callback)
            except ValueError:
                pass
            self._installed = False

    def summary(self) -> dict:
        return {"gc_collections": sum(self.count), "gc_full_collections": self.count[2],
                "gc_pause_ms_max": max(self.max_ms), "gc_full_pause_ms_max": self.max_ms[2]}


class VramSampler:
    """Background thread tracking the peak of used GPU memory (bytes).

    By default it samples the whole device (``total - free`` from ``cudaMemGetInfo``), which
    includes other processes and the CUDA context. ``process_bytes_fn`` replaces that source, e.g.
    with the engine's own memory-pool usage; it works without a GPU too. With neither a GPU nor a
    ``process_bytes_fn`` there is nothing to sample: ``peak_bytes`` stays None and no thread starts.
    """

    def __init__(
        self,
        interval_s: float = 0.1,
        process_bytes_fn: Callable[[], int] | None = None,
        device: int | None = None,
    ):
        if not (interval_s > 0):
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.interval_s = float(interval_s)
        self._cupy = None if process_bytes_fn is not None else cupy_with_gpu()
        self._process_bytes_fn = process_bytes_fn
        self._device = device
        if self._cupy is not None and device is None:
            self._device = self._cupy.cuda.runtime.getDevice()
        self._lock = threading.Lock()
        self._peak: int | None = None
        self._last: int | None = None
        self.total_bytes: int | None = None  # device capacity, when sampling the device
        self.error: BaseException | None = None  # why the thread stopped early, if it did
        self.first_bytes: int | None = None  # the first sample: with last_bytes, whether memory stayed flat
        # (seconds since the first sample, bytes) once a second at most, for a memory-over-time plot of a long run
        self.timeline: list[tuple[float, int]] = []
        self._t_first: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def available(self) -> bool:
        """Is there anything to sample (a GPU or a process_bytes_fn)?"""
        return self._cupy is not None or self._process_bytes_fn is not None

    @property
    def peak_bytes(self) -> int | None:
        with self._lock:
            return self._peak

    @property
    def last_bytes(self) -> int | None:
        with self._lock:
            return self._last

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def sample_once(self) -> int | None:
        """Take one sample now (also useful right after a known allocation peak); None if unavailable."""
        if self._process_bytes_fn is not None:
            used = int(self._process_bytes_fn())
        elif self._cupy is not None:
            with self._cupy.cuda.Device(self._device):
                free, total = self._cupy.cuda.runtime.memGetInfo()
            self.total_bytes = int(total)
            used = int(total - free)
        else:
            return None
        now = time.monotonic()
        with self._lock:
            self._last = used
            if self._peak is None or used > self._peak:
                self._peak = used
            if self.first_bytes is None:
                self.first_bytes, self._t_first = used, now
            if not self.timeline or now - self._t_first - self.timeline[-1][0] >= 1.0:
                self.timeline.append((now - self._t_first, used))
        return used

    def start(self) -> bool:
        """Start the sampling thread; False (and no thread) when there is nothing to sample."""
        if not self.available:
            return False
        if self.running:
            return True
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="vram-sampler", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        try:
            self.sample_once()
            while not self._stop.wait(self.interval_s):
                self.sample_once()
        except Exception as exc:  # noqa: BLE001 - keep the reason; diagnostics can report it
            self.error = exc

    def __enter__(self) -> "VramSampler":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
