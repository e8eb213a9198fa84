# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""What `~/cycle` and `/diagnostics` say, ROS-free: the per-cycle key-values and level, the 1 Hz roll-up's level and
message from what happened since the previous one, and the camera's status. The node only puts them in messages.

Levels are the names "OK", "WARN", "ERROR" (diagnostic_msgs/DiagnosticStatus levels).
"""
from __future__ import annotations

import math

import numpy as np

from .cycle import ERROR_REASONS, FALLBACK_REASONS, CycleOutcome
from .instruction import summary


def cycle_level(out: CycleOutcome) -> str:
    """OK for a model action, ERROR for an overrun, an engine error, an internal error or a blocked non-finite
    action, WARN for any other fallback."""
    if out.source == "model":
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
    }
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

    def level(self, r: dict, warning: str | None) -> tuple[str, str]:
        counts = {"cycles": r["cycles"], "overruns": r["overruns"], "engine_errors": r["engine_errors"],
                  "non_finite": r["non_finite_blocked"], "misses": r["deadline_misses"], "missed": r["missed_ticks"],
                  "fallbacks": sum(r[f"fallback_{x}"] for x in FALLBACK_REASONS),
                  "clamped": r.get("clamped_velocity", 0) + r.get("clamped_acceleration", 0)}
        d = {k: v - self._prev.get(k, 0) for k, v in counts.items()}
        self._prev = counts
        if d["overruns"] or d["engine_errors"] or d["non_finite"] or d["misses"]:
            gap = r["action_gap_ms_max"]
            lvl, msg = "ERROR", (f"{d['misses']} deadline misses ({d['missed']} ticks never ran), {d['overruns']} "
                                 f"overruns, {d['engine_errors']} engine errors, {d['non_finite']} non-finite actions "
                                 f"blocked in the last period; longest gap between actions "
                                 f"{0.0 if gap is None or math.isnan(gap) else gap:.0f} ms")
        elif d["fallbacks"]:
            lvl, msg = "WARN", f"{d['fallbacks']} fallbacks of {d['cycles']} cycles in the last period"
        elif d["cycles"] == 0:
            lvl, msg = "ERROR", "no cycles"
        else:
            lvl, msg = "OK", f"{d['cycles']} cycles, all from the model"
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

    def level(self, c: dict) -> tuple[str, str]:
        rate = c.get("camera_rate_hz")
        lvl = "OK" if isinstance(rate, float) and rate > 0 else "WARN"
        msg = f"{rate:.1f} Hz" if isinstance(rate, float) else "no camera stats"
        state = c.get("camera_process_state", "running")
        if state != "running":
            lvl = "ERROR" if state != "starting" else "WARN"
            last_exit = c.get("camera_process_last_exit")
            error = c.get("camera_process_error")
            msg = f"camera process {state}" + (f": {error}" if error else f" ({last_exit})" if last_exit else "")
            if c.get("camera_process_restarts"):
                msg += f", {c['camera_process_restarts']} restarts"
        pubs, matched = c.get("topic_publishers"), c.get("publishers_matched")
        src = c.get("source_rate_hz")
        if isinstance(pubs, int) and isinstance(matched, int) and pubs > 0 and matched == 0 and lvl != "ERROR":
            lvl = "WARN"
            msg += (f"; {pubs} publisher{'s' if pubs != 1 else ''} on {c.get('topic') or 'the image topic'}, none "
                    f"QoS-compatible with this {c.get('qos_reliability') or ''} subscription (qos_reliability)")
        elif isinstance(src, float) and src > 0 and isinstance(rate, float) and rate < 0.5 * src and lvl != "ERROR":
            lvl = "WARN"
            msg += (f"; the camera delivers {rate:.1f} of the publisher's {src:.1f} Hz (frames lost on the way: "
                    f"qos_reliability reliable, or a shared-memory segment large enough at both ends)")
        too_large = c.get("invalid_too_large", 0)
        new = too_large - self._prev_too_large if isinstance(too_large, int) else 0
        self._prev_too_large = too_large if isinstance(too_large, int) else 0
        if new > 0:
            lvl = "WARN"
            msg += (f"; {new} frames over max_image_bytes={c['max_image_bytes']} / "
                    f"max_image_pixels={c['max_image_pixels']} dropped")
        return lvl, msg
