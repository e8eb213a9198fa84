# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Every value the loop and the camera report, ROS-free: the typed records, the per-cycle key-values and level, the
1 Hz roll-up's level and message from what happened since the previous one, and the camera's status.

`LoopRecord` is the loop's state (counts, rates, latency quantiles, admission, cache, VRAM, instruction), made by
`Runtime.record`; `CameraRecord` the camera's (`CameraRecord.of`). The node puts `LoopRecord.values()` /
`CameraRecord.values()` in /diagnostics, `Rollup` and `CameraStatus` read the fields, and `vla-edge-bench` writes
`LoopRecord.report()` as the loop section of its report, so a reported value is named once, here.

Levels are the names "OK", "WARN", "ERROR" (diagnostic_msgs/DiagnosticStatus levels).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import numpy as np

from .cycle import ERROR_REASONS, FALLBACK_REASONS, CycleOutcome
from .frame_quality import CHECKS as QUALITY_CHECKS, GRID, names as quality_names
from .image_convert import DROP_KINDS
from .instruction import summary

QUANTILES = ("p50", "p95", "p99", "max")
LATENCIES = ("cycle_ms", "chunk_ms", "timer_jitter_ms", "frame_age_ms", "action_gap_ms", "plan_age_ticks",
             "boundary_jump")  # the last two: action chunks (ticks; action units)


@dataclass
class Quantiles:
    """Percentiles of one latency series (ms; NaN before any sample)."""

    p50: float
    p95: float
    p99: float
    max: float

    @classmethod
    def of(cls, stats) -> "Quantiles":
        """From a metrics.LatencyStats."""
        p = stats.percentiles()
        return cls(*(p[q] for q in QUANTILES))

    def as_dict(self) -> dict:
        return {q: getattr(self, q) for q in QUANTILES}


@dataclass
class LoopRecord:
    """The loop's reported values at one moment (`Runtime.record`)."""

    cycles: int
    model_actions: int
    plan_actions: int  # ticks that published the plan's action for them (action chunks)
    acting_share: float  # (model + plan actions) / cycles
    fresh_actions: int
    repeats: int  # repeats of a model action (a "repeat" before any model action is a fallback)
    fallbacks: dict  # reason -> count, every cycle.FALLBACK_REASONS
    deadline_misses: int  # published late + ticks that never ran
    deadline_miss_rate: float
    missed_ticks: int
    late_publishes: int
    overrun_rate: float
    fallback_rate: float
    late_results: int  # late chunks harvested, their action discarded
    probes: int
    bad_timings: int
    non_finite_blocked: int
    engine_errors: int
    holds_expired: int
    wake_slack_ms: float
    clamped_velocity: int  # twist components the command limits clamped
    clamped_acceleration: int
    limits_restarted_from_zero: int
    cycle_ms: Quantiles
    chunk_ms: Quantiles
    timer_jitter_ms: Quantiles
    frame_age_ms: Quantiles
    action_gap_ms: Quantiles
    plan_age_ticks: Quantiles
    boundary_jump: Quantiles
    ema: dict  # admission.AdmissionController.snapshot()
    admission_decisions: dict  # decide() reasons -> count
    kv_capacity_tokens: int
    cache_tokens: int
    retained_frames: int
    frame_capacity: object  # int, "n/a" when the engine did not say
    evictions: int
    prompt_tokens: object
    policy: str
    backend: str
    weights: str
    action_decoding: str
    peak_vram_bytes: int | None
    vram_ceiling_gb: float
    period_ms: float
    admission_warning: str | None = None
    instruction: dict | None = field(default=None)  # Runtime.instruction_values(), None without a tokenizer
    plan: dict = field(default_factory=dict)  # Runtime.plan_values(): K, chunk_execute, the blend, landing counts
    quality_refused: int = 0  # ticks whose frame had a tripped quality check (fallback frame_quality)
    quality_held: int = 0  # ticks whose frame failed a check not tripped yet (not admitted: the last action again)
    state: dict | None = None  # Runtime.state_values() + stale_state_ticks; None: the model takes no robot state

    @property
    def overruns(self) -> int:
        return self.fallbacks.get("overrun", 0)

    @property
    def clamped(self) -> int:
        return self.clamped_velocity + self.clamped_acceleration

    def values(self) -> dict:
        """The reasoning key-values of /diagnostics."""
        r: dict = {
            "cycles": self.cycles, "model_actions": self.model_actions, "plan_actions": self.plan_actions,
            "plan_share": self.plan_actions / max(1, self.cycles), "acting_share": self.acting_share,
            "deadline_miss_rate": self.deadline_miss_rate, "deadline_misses": self.deadline_misses,
            "missed_ticks": self.missed_ticks, "late_publishes": self.late_publishes,
            "overruns": self.overruns, "overrun_rate": self.overrun_rate,
            "fallback_rate": self.fallback_rate, "late_results_discarded": self.late_results,
            "probes": self.probes, "bad_timings": self.bad_timings, "non_finite_blocked": self.non_finite_blocked,
            "wake_slack_ms": self.wake_slack_ms, "engine_errors": self.engine_errors,
            "clamped_velocity": self.clamped_velocity, "clamped_acceleration": self.clamped_acceleration,
            "limits_restarted_from_zero": self.limits_restarted_from_zero, "holds_expired": self.holds_expired,
        }
        n = max(1, self.cycles)
        for reason in FALLBACK_REASONS:
            r[f"fallback_{reason}"] = self.fallbacks.get(reason, 0)
            r[f"fallback_rate_{reason}"] = r[f"fallback_{reason}"] / n
        r["repeats"] = self.repeats
        r["quality_held_ticks"] = self.quality_held
        for name in LATENCIES:
            r.update({f"{name}_{q}": v for q, v in getattr(self, name).as_dict().items()})
        r.update({f"ema_{k}": v for k, v in self.ema.items()})
        r.update({f"admission_{k}": v for k, v in self.admission_decisions.items()})
        cap = self.kv_capacity_tokens
        r.update(kv_capacity_tokens=cap, cache_tokens=self.cache_tokens,
                 cache_fill=self.cache_tokens / cap if cap else 0.0, retained_frames=self.retained_frames,
                 frame_capacity=self.frame_capacity, evictions=self.evictions, prompt_tokens=self.prompt_tokens,
                 policy=self.policy, backend=self.backend, weights=self.weights, action_decoding=self.action_decoding)
        r["vram_peak_mb"] = self.peak_vram_bytes / 2**20 if self.peak_vram_bytes is not None else "n/a"
        r["vram_ceiling_gb"] = self.vram_ceiling_gb
        r["period_ms"] = self.period_ms
        if self.admission_warning:
            r["admission_warning"] = self.admission_warning
        if self.instruction is not None:
            r.update(self.instruction)
        r.update(self.plan)
        if self.state is not None:
            r.update({k: ("n/a" if v is None else v) for k, v in self.state.items()})
        return r

    def report(self) -> dict:
        """The loop section of a vla-edge-bench run (report.json): counts, rates, quantiles, limits, admission."""
        skip = {"ema", "admission_decisions", "wake_slack_ms", "instruction", "plan", "state", *LATENCIES}
        r = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
        r["fallbacks"] = {reason: self.fallbacks.get(reason, 0) for reason in FALLBACK_REASONS}
        r.update({name: getattr(self, name).as_dict() for name in LATENCIES})
        r["admission"], r["admission_decisions"] = dict(self.ema), dict(self.admission_decisions)
        r["wake_slack_ms_end"] = self.wake_slack_ms
        r["instruction"] = self.instruction
        r["plan"] = dict(self.plan)
        r["state"] = None if self.state is None else dict(self.state)
        return r


def loop_record(cycle, limiter, admission, engine_stats: dict, settings, backend: str, peak_vram_bytes,
                admission_warning: str | None, instruction: dict | None, plan: dict | None = None,
                state: dict | None = None) -> LoopRecord:
    """The record of a running loop from its parts (Runtime.record passes its own)."""
    st, s = cycle.stats, cycle.stats.summary()
    es = engine_stats
    return LoopRecord(
        cycles=s["cycles"], model_actions=s["model_actions"], plan_actions=s["plan_actions"],
        acting_share=s["acting_share"], fresh_actions=s["reasons"].get("fresh", 0),
        repeats=s["repeats"], fallbacks={r: s["fallbacks"].get(r, 0) for r in FALLBACK_REASONS},
        deadline_misses=s["deadline_misses"], deadline_miss_rate=s["deadline_miss_rate"],
        missed_ticks=s["missed_ticks"], late_publishes=s["late_publishes"], overrun_rate=s["overrun_rate"],
        fallback_rate=s["fallback_rate"], late_results=cycle.late_results, probes=cycle.probes,
        bad_timings=cycle.bad_timings, non_finite_blocked=cycle.non_finite, engine_errors=cycle.engine_errors,
        holds_expired=cycle.holds_expired, wake_slack_ms=cycle.wake_slack_s * 1000.0,
        clamped_velocity=limiter.clamped_velocity, clamped_acceleration=limiter.clamped_acceleration,
        limits_restarted_from_zero=limiter.restarts_from_zero,
        **{name: Quantiles.of(getattr(st, name)) for name in LATENCIES},
        ema=admission.snapshot(), admission_decisions=admission.decisions(),
        kv_capacity_tokens=int(es.get("capacity", settings.kv_capacity_tokens)),
        cache_tokens=int(es.get("used_tokens", 0)), retained_frames=es.get("frames_retained", 0),
        frame_capacity=es.get("frame_capacity", "n/a"), evictions=es.get("evictions_total", 0),
        prompt_tokens=es.get("prompt_tokens", "n/a"), policy=settings.policy, backend=backend,
        weights=es.get("weights", "n/a"), action_decoding=es.get("action_decoding", "n/a"),
        peak_vram_bytes=peak_vram_bytes, vram_ceiling_gb=settings.vram_ceiling_gb, period_ms=settings.period_ms,
        admission_warning=admission_warning, instruction=instruction, plan=dict(plan or {}),
        quality_refused=getattr(cycle, "quality_refused", 0), quality_held=getattr(cycle, "quality_held", 0),
        state=None if state is None else {**state, "stale_state_ticks": getattr(cycle, "stale_states", 0)})


CAMERA_PROCESS_KEYS = ("process_pid", "process_state", "process_restarts", "process_last_exit", "process_error",
                       "restarts_no_frames")
CAMERA_LINK_KEYS = ("source_rate_hz", "topic_publishers", "publishers_matched", "qos_reliability")


@dataclass
class CameraRecord:
    """The camera's reported values: the frame buffer's counts, and the camera's own (`camera.stats()`) when the
    node has one; the link fields (publisher rate, QoS match) and the process fields only where the camera says."""

    frame_age_ms: float | None = None  # at the latest cycle
    frames_published: int = 0
    frames_dropped: int = 0
    rate_hz: float | None = None  # None: no camera attached
    received: int | None = None
    valid: int | None = None
    invalid: int | None = None
    invalid_by_kind: dict = field(default_factory=dict)
    transport: str | None = None
    topic: str | None = None
    max_image_bytes: int | None = None
    max_image_pixels: int | None = None
    source_rate_hz: float | None = None
    topic_publishers: int | None = None
    publishers_matched: int | None = None
    qos_reliability: str | None = None
    process_pid: int | None = None
    process_state: str | None = None  # the camera in its own process: running, starting, exited...
    process_restarts: int | None = None
    process_last_exit: str | None = None
    process_error: str | None = None
    restarts_no_frames: int | None = None

    @classmethod
    def of(cls, frame_buffer, camera_stats: dict | None, frame_age_ms: float | None) -> "CameraRecord":
        """From the frame buffer, the camera's stats dict (None: no camera) and the latest cycle's frame age."""
        rec = cls(frame_age_ms=frame_age_ms, frames_published=frame_buffer.published,
                  frames_dropped=frame_buffer.dropped)
        if camera_stats is None:
            return rec
        cs = camera_stats
        rec.rate_hz, rec.received, rec.valid, rec.invalid = cs["rate_hz"], cs["received"], cs["valid"], cs["invalid"]
        rec.transport, rec.topic = cs["transport"], cs["topic"]
        rec.invalid_by_kind = {k: cs["invalid_by_kind"].get(k, 0) for k in DROP_KINDS}
        rec.max_image_bytes, rec.max_image_pixels = cs["max_image_bytes"], cs["max_image_pixels"]
        for key in CAMERA_LINK_KEYS + CAMERA_PROCESS_KEYS:
            if key in cs:
                setattr(rec, key, cs[key])
        return rec

    @property
    def too_large(self) -> int:
        return int(self.invalid_by_kind.get("too_large", 0))

    def values(self) -> dict:
        """The camera key-values of /diagnostics."""
        c: dict = {"frame_age_ms": self.frame_age_ms if self.frame_age_ms is not None else "n/a",
                   "frames_published": self.frames_published, "frames_dropped": self.frames_dropped}
        if self.rate_hz is None:
            c.update(camera_rate_hz="n/a", frames_invalid="n/a")
            return c
        c.update(camera_rate_hz=self.rate_hz, frames_received=self.received, frames_valid=self.valid,
                 frames_invalid=self.invalid, transport=self.transport, topic=self.topic)
        c.update({f"invalid_{k}": v for k, v in self.invalid_by_kind.items()})
        c["max_image_bytes"], c["max_image_pixels"] = self.max_image_bytes, self.max_image_pixels
        c.update({k: getattr(self, k) for k in CAMERA_LINK_KEYS if getattr(self, k) is not None})
        c.update({f"camera_{k}": getattr(self, k) for k in CAMERA_PROCESS_KEYS if getattr(self, k) is not None})
        return c


def cycle_level(out: CycleOutcome) -> str:
    """OK for a model action and for a plan action (action chunks: the model planned it for this tick), ERROR for
    an overrun, an engine error, an internal error or a blocked non-finite action (with or without a plan action),
    WARN for any other fallback."""
    if out.source == "model" or (out.source == "plan" and out.reason not in ERROR_REASONS):
        return "OK"
    return "ERROR" if out.reason in ERROR_REASONS else "WARN"


def cycle_values(out: CycleOutcome, cycle_index: int, t_publish: float, late: bool, stamp_ns: int,
                 twist=None) -> dict:
    """The `~/cycle` key-values of one published outcome (floats are formatted by the caller): `stamp_ns` is the
    header stamp the command carried, `frame_stamp_ns` the source frame's capture stamp (-1: no frame yet), `twist`
    the six components sent (after the limits), `t_command_monotonic` the time the limits were applied at."""
    nan = float("nan")
    start = out.scheduled if out.scheduled is not None else out.t0
    vals = {
        "source": out.source, "reason": out.reason, "cycle": cycle_index, "cycle_ms": (t_publish - out.t0) * 1000.0,
        "since_scheduled_tick_ms": (t_publish - start) * 1000.0,
        "jitter_ms": out.jitter_ms, "missed_before": out.missed_before,
        "tick_monotonic": f"{out.t0:.6f}", "late": late, "stamp_ns": stamp_ns,
        "frame_stamp_ns": out.stamp_ns if out.stamp_ns is not None else -1, "frame_seq": out.frame_seq,
        "frame_age_ms": out.frame_age_ms if out.frame_age_ms is not None else nan,
        "remaining_ms": out.remaining_ms if out.remaining_ms is not None else nan,
        "estimate_ms": out.estimate_ms if out.estimate_ms is not None else nan,
        "probe": out.probe, "clamped": out.clamped, "hold_expired": out.hold_expired,
        "slot": out.slot, "plan_age": out.plan_age if out.plan_age is not None else -1,
        "plan_remaining": out.plan_remaining,
    }
    if out.chunk_late_ticks is not None:  # a chunk landed this tick, this many ticks after its frame's
        vals["chunk_late_ticks"] = out.chunk_late_ticks
    if out.boundary_jump is not None:
        vals["boundary_jump"] = out.boundary_jump
    t = out.timings
    vals.update(vision_ms=t.vision_ms if t else nan, prefill_ms=t.prefill_ms if t else nan,
                decode_ms=t.decode_ms if t else nan, chunk_ms=t.total_ms if t else nan)
    res = out.chunk
    if res is not None:
        vals.update(tokens=",".join(str(int(x)) for x in np.asarray(res.tokens).ravel()),
                    cache_tokens=res.cache_tokens, retained_frames=len(res.retained), evicted=len(res.evicted),
                    frame_id=res.frame_id)
    else:
        vals["tokens"] = ""
    if out.source_seq is not None:
        vals["source_seq"] = out.source_seq
    if out.error:
        vals["error"] = out.error
    vals["action"] = ",".join(f"{x:.4f}" for x in np.asarray(out.action, np.float32))
    if twist is not None:
        vals["twist"] = ",".join(f"{float(x):.6f}" for x in twist)
    if out.t_command is not None:
        vals["t_command_monotonic"] = f"{out.t_command:.6f}"
    # frame quality: the checks this frame fails ("" passes or unchecked), and whether one is tripped (frames refused)
    if out.state_age_ms is not None or out.reason == "stale_state":  # a model with a state input
        vals["state_age_ms"] = out.state_age_ms if out.state_age_ms is not None else nan
    vals["frame_quality"] = out.frame_quality
    vals["frame_quality_tripped"] = out.quality_tripped
    if out.instruction is not None:  # the task this cycle ran under, and since when (monotonic s; -1: start-up)
        vals.update(instruction=summary(out.instruction), instruction_tokens=out.instruction.instruction_tokens,
                    instruction_since_monotonic=(f"{out.instruction_since:.6f}" if out.instruction_since is not None
                                                 else -1))
    return vals


class Rollup:
    """The reasoning status of the 1 Hz roll-up: its level and message from the counters' change since the
    previous roll-up (an overrun, an engine error, a blocked action or a miss in the last period is ERROR)."""

    def __init__(self):
        self._prev: dict[str, int] = {}

    def reset(self) -> None:
        self._prev = {}

    def level(self, r: LoopRecord, warning: str | None) -> tuple[str, str]:
        counts = {"cycles": r.cycles, "overruns": r.overruns, "engine_errors": r.engine_errors,
                  "non_finite": r.non_finite_blocked, "misses": r.deadline_misses, "missed": r.missed_ticks,
                  "fallbacks": sum(r.fallbacks.values()), "clamped": r.clamped, "plan": r.plan_actions}
        d = {k: v - self._prev.get(k, 0) for k, v in counts.items()}
        self._prev = counts
        if d["overruns"] or d["engine_errors"] or d["non_finite"] or d["misses"]:
            gap = r.action_gap_ms.max
            lvl, msg = "ERROR", (f"{d['misses']} deadline misses ({d['missed']} ticks never ran), {d['overruns']} "
                                 f"overruns, {d['engine_errors']} engine errors, {d['non_finite']} non-finite actions "
                                 f"blocked in the last period; longest gap between actions "
                                 f"{0.0 if gap is None or math.isnan(gap) else gap:.0f} ms")
        elif d["fallbacks"]:
            lvl, msg = "WARN", f"{d['fallbacks']} fallbacks of {d['cycles']} cycles in the last period"
        elif d["cycles"] == 0:
            lvl, msg = "ERROR", "no cycles"
        else:
            lvl, msg = "OK", f"{d['cycles']} cycles, all from the model" + (
                f" ({d['plan']} from its plan)" if d["plan"] else "")
        if d["clamped"]:  # the limits doing their job: said, not a fault
            msg += f"; {d['clamped']} command components clamped to the velocity / acceleration limits"
        if warning:
            lvl = "WARN" if lvl == "OK" else lvl
            msg += "; " + warning
        return lvl, msg


class CameraStatus:
    """The camera status of the roll-up: rate, the camera process's state, frames dropped for being too large."""

    def __init__(self):
        self._prev_too_large = 0

    def level(self, c: CameraRecord) -> tuple[str, str]:
        rate = c.rate_hz
        lvl = "OK" if isinstance(rate, float) and rate > 0 else "WARN"
        msg = f"{rate:.1f} Hz" if isinstance(rate, float) else "no camera stats"
        state = c.process_state or "running"
        if state != "running":
            lvl = "ERROR" if state != "starting" else "WARN"
            detail = f": {c.process_error}" if c.process_error else \
                f" ({c.process_last_exit})" if c.process_last_exit else ""
            msg = f"camera process {state}{detail}"
            if c.process_restarts:
                msg += f", {c.process_restarts} restarts"
        pubs, matched, src = c.topic_publishers, c.publishers_matched, c.source_rate_hz
        if isinstance(pubs, int) and isinstance(matched, int) and pubs > 0 and matched == 0 and lvl != "ERROR":
            lvl = "WARN"
            msg += (f"; {pubs} publisher{'s' if pubs != 1 else ''} on {c.topic or 'the image topic'}, none "
                    f"QoS-compatible with this {c.qos_reliability or ''} subscription (qos_reliability)")
        elif isinstance(src, float) and src > 0 and isinstance(rate, float) and rate < 0.5 * src and lvl != "ERROR":
            lvl = "WARN"
            msg += (f"; the camera delivers {rate:.1f} of the publisher's {src:.1f} Hz (frames lost on the way: "
                    f"qos_reliability reliable, or a shared-memory segment large enough at both ends)")
        new = c.too_large - self._prev_too_large
        self._prev_too_large = c.too_large
        if new > 0:
            lvl = "WARN"
            msg += (f"; {new} frames over max_image_bytes={c.max_image_bytes} / "
                    f"max_image_pixels={c.max_image_pixels} dropped")
        return lvl, msg


def block_map(blocks: bytes) -> str:
    """A 5 x 5 block map (frame_quality BLOCK_* bits a block) as numbers: rows separated by ';' ("" when none)."""
    if len(blocks) != GRID * GRID:
        return ""
    return ";".join(",".join(str(b) for b in blocks[r * GRID:(r + 1) * GRID]) for r in range(GRID))


class QualityStatus:
    """The camera-quality status of the roll-up (frame_quality.py): ERROR while a check is tripped or when one
    tripped since the previous roll-up (the loop refused the camera's frames: frame_quality fallbacks; a spell
    shorter than the roll-up's period is not missed), WARN when frames failed a check since the previous roll-up but
    none tripped (a flicker: those frames were not admitted either), OK otherwise; the counts per check and the
    latest frame's block map as values.  `quality`: the camera's counts (CameraProcess / CameraNode stats
    "quality"; {}: the checks are off), `blocks`: the latest cycle's frame's block map."""

    def __init__(self):
        self._prev_failed: dict[str, int] = {}
        self._prev_trips: dict[str, int] = {}

    def reset(self) -> None:
        self._prev_failed, self._prev_trips = {}, {}

    def level(self, quality: dict, blocks: bytes = b"", refused_ticks: int | None = None) -> tuple[str, str, dict]:
        if not quality:
            return "OK", "frame quality checks off (frame_quality: false)", {"quality_checks": "off"}
        tripped = int(quality.get("tripped", 0))
        failed = {c: int(quality.get(f"failed_{c}", 0)) for c in QUALITY_CHECKS}
        trips = {c: int(quality.get(f"trips_{c}", 0)) for c in QUALITY_CHECKS}
        new = {c: n - self._prev_failed.get(c, 0) for c, n in failed.items()}
        new_trips = [c for c in QUALITY_CHECKS if trips[c] > self._prev_trips.get(c, 0)]
        self._prev_failed, self._prev_trips = failed, trips
        vals: dict = {"quality_checks": "on", "quality_tripped": quality_names(tripped) or "none",
                      "quality_frames_checked": quality.get("frames", 0),
                      "quality_frames_refused": quality.get("refused_frames", 0)}
        for c in QUALITY_CHECKS:
            vals[f"quality_failed_{c}"], vals[f"quality_trips_{c}"] = failed[c], int(quality.get(f"trips_{c}", 0))
        vals["quality_block_map"] = block_map(blocks)
        vals["quality_mean_last"], vals["quality_detail_last"] = quality.get("mean_last"), quality.get("detail_last")
        vals["quality_check_ms_last"] = quality.get("check_ms_last")
        if refused_ticks is not None:
            vals["quality_ticks_refused"] = refused_ticks
        if tripped:
            return "ERROR", f"camera blind ({quality_names(tripped)}): its frames are not admitted", vals
        if new_trips:
            return "ERROR", (f"camera was blind ({', '.join(new_trips)}) in the last period, its frames not admitted; "
                             "clear now"), vals
        flicker = [c for c in QUALITY_CHECKS if new[c] > 0]
        if flicker:
            return "WARN", (f"frames failed {', '.join(f'{c} ({new[c]})' for c in flicker)} in the last period, "
                            "not tripped (not admitted)"), vals
        return "OK", "frames pass the checks", vals
