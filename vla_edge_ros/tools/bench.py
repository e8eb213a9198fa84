# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""vla-edge-bench: replay clips through the ROS-free core and compare the KV eviction policies.

For each clip and each policy (in turn, same clip, same seed, a fresh engine cache on the same loaded
weights): a camera thread replays the clip into a FrameBuffer at `--camera-hz` (looping as needed), and
the reasoning loop runs the real ReasoningCycle on an absolute `--period-ms` schedule, exactly the
cycle the ReasoningNode runs. Writes OUT/report.json, OUT/report.md and OUT/report.png.

history_coverage: every frame the camera produced during the run is embedded offline with the model's
vision encoder (pooled = mean of its 32 vision embeddings); its coverage is the highest cosine
similarity to any frame the cache retains at the end of the run; the report gives the mean.

report.png shows, per clip, what every cycle of each policy published (an outcome bar: model actions and
each fallback reason), then per policy a per-cycle latency timeline on one time axis with the deadline,
the admission estimate against the time left, and refused stretches shaded; the report notes when a clip
is played faster than its own rate or looped, and damaged frames that were skipped.  The report is
written to a temporary folder and renamed to --out when complete; a non-empty --out is refused unless --force.

Usage examples:
  vla-edge-bench --clip synthetic-cut --seconds 10 --out /tmp/bench
  vla-edge-bench --model /models/qwen15b --clip drive.mp4 --clip bag_dir/ --backend cuda --seconds 30 --out h200
  vla-edge-bench --clip synthetic --policies fifo,semantic --period-ms 60 --probe-after 2 --out /tmp/b --force
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..admission import AdmissionController, Decision, budget_problem
from ..clips import SYNTHETIC, BagClip, BagJointStates, ClipError, SyntheticClip, load_model_frames, open_clip
from ..constants import CPU_KV_CAPACITY_TOKENS, KV_CAPACITY_TOKENS
from ..cycle import REPROBE_AFTER_S, probe_after_cycles
from ..engine import cuda_available
from ..eviction import POLICY_NAMES
from ..frame_buffer import FrameBuffer
from ..frame_quality import CHECKS as QUALITY_CHECKS, QualityGate, QualitySettings, names as quality_names, unpack_word
from ..instruction import InstructionError, InstructionFeed, shorten
from ..metrics import CycleStats, command_smoothness
from ..model import ops
from ..model.safetensors_io import ModelLoadError, bf16_to_f32
from ..model.checkpoint import check_model_path, load_model
from ..output_dir import OutputDirError, atomic_output_dir
from ..realtime import normal_scheduling, set_realtime_priority, tighten_gil_switch
from ..robot_state import synthetic_state
from ..runtime import Runtime, StartupError
from ..settings import CAMERA_SPECS, ReasoningSettings
from .cli import (Parser, add_setting_options, bounded, check_out_dir, fail, finite_non_negative, non_negative_int,
                  positive_int, setting_values)


class CameraReplay(threading.Thread):
    """Publishes clip frames into the FrameBuffer on an absolute `hz` schedule, looping the clip.

    Camera frame k shows clip frame k % N and is stamped k / hz. If the thread wakes up late it skips
    to the frame that is due now (a real camera does not wait either); skipped frames still count as
    produced. `clip_index_of_seq[seq]` maps a FrameBuffer seq back to its camera frame index.
    """

    def __init__(self, frames: np.ndarray, hz: float, fb: FrameBuffer, verdicts: list | None = None,
                 state=None, states: "ClipStates | None" = None, seed: int = 0):
        """`verdicts[i]`: clip frame i's frame-quality verdict (word, block map), published with it; None: no
        check (as a node with frame_quality false). `state`: the runtime's StateBuffer (a model with a state input):
        with each frame the robot state of its time is offered to it, as ~/joint_states would, from `states` (a
        bag's JointState topic aligned to the clip) or else a synthetic one (robot_state.synthetic_state)."""
        super().__init__(name="camera-replay", daemon=True)
        self.frames, self.hz, self.fb, self.verdicts = frames, float(hz), fb, verdicts
        self.state, self.states, self.seed = state, states, seed
        self._last_state = None  # (clip pass, bag message index) last offered
        self.camera_index_of_seq: list[int] = []
        self.produced = 0  # camera frames 0..produced-1 happened
        self._halt = threading.Event()
        self.start_time: float | None = None

    def run(self) -> None:
        self.start_time = start = time.monotonic()
        k = 0
        while not self._halt.is_set():
            due = start + k / self.hz
            delay = due - time.monotonic()
            if delay > 0 and self._halt.wait(delay):
                break
            k = max(k, int((time.monotonic() - start) * self.hz))  # late wake-up: publish what is due now
            i = k % len(self.frames)
            word, blocks = self.verdicts[i] if self.verdicts else (0, None)
            self.fb.publish(self.frames[i], stamp_ns=int(round(k * 1e9 / self.hz)), quality=word, blocks=blocks)
            self.camera_index_of_seq.append(k)
            if self.state is not None:
                self._offer_state(i, k)
            self.produced = k + 1
            k += 1

    def stop(self) -> None:
        self._halt.set()
        self.join()

    def _offer_state(self, i: int, k: int) -> None:
        """Camera frame k (clip frame i): the state a JointState publisher would have sent by then."""
        now_ns = STATE_STAMP_BASE_NS + int(round(k * 1e9 / self.hz))
        if self.states is None:
            m = self.state.mapper
            v, n = synthetic_state(m.dim, k / self.hz, self.seed), len(m.joints)
            self.state.offer(m.joints, {f: v[j * n:(j + 1) * n] for j, f in enumerate(m.fields)}, now_ns, now_ns)
            return
        j = self.states.index[i]
        key = (k // len(self.frames), j)
        if j is None or key == self._last_state:  # no message yet / none since: the one held ages
            return
        self._last_state = key
        names, arrays = self.states.bag.messages[j]
        self.state.offer(names, arrays, now_ns - self.states.age_ns[i], now_ns)


class ClipStates:
    """A bag's JointState topic aligned to the clip's frames: for frame i the latest message stamped at or before
    it (`index[i]`, None: none yet) and how much older than the frame it is (`age_ns[i]`)."""

    def __init__(self, bag: BagJointStates, frame_stamps: np.ndarray):
        self.bag = bag
        self.index = bag.at(frame_stamps)
        self.age_ns = [0 if j is None else int(s - bag.stamps[j]) for j, s in zip(self.index, frame_stamps)]

    def report(self) -> dict:
        """What the clip's state source was, for report.json."""
        return {"source": f"bag topic {self.bag.topic}", "messages": len(self.bag),
                "damaged_messages": self.bag.skipped_corrupt,
                "frames_without_state": sum(j is None for j in self.index)}


def pooled_embeddings(weights, frames: np.ndarray) -> np.ndarray:
    """Unit-norm pooled vision embedding [N, H] of each frame, computed offline on the engine's weights."""
    v = weights.vision
    w, b, pos = bf16_to_f32(v.patch_w), bf16_to_f32(v.patch_b), bf16_to_f32(v.pos_embed)
    pooled = np.stack([ops.vision_encode(f, w, b, pos).mean(axis=0) for f in frames]).astype(np.float64)
    norms = np.linalg.norm(pooled, axis=1, keepdims=True)
    return pooled / np.where(norms > 0, norms, 1.0)


def history_coverage(embeddings: np.ndarray, produced: int, retained_clip_indices: list[int]) -> float | None:
    """Mean over camera frames 0..produced-1 (clip frame k % N) of the best cosine to a retained frame."""
    if produced == 0 or not retained_clip_indices:
        return None
    best = (embeddings @ embeddings[retained_clip_indices].T).max(axis=1)  # per clip frame
    counts = np.bincount(np.arange(produced) % len(embeddings), minlength=len(embeddings))
    return float((counts * best).sum() / produced)


def _median(values) -> float | None:
    xs = [x for x in values if x is not None]
    return float(np.median(xs)) if xs else None


def _mb(n) -> str:
    return "n/a" if n is None else f"{n / 2**20:.0f}"


def _rss_mb() -> float | None:
    """This process's resident memory now (Linux), MB."""
    try:
        with open("/proc/self/status") as f:
            return next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS")) / 1024.0
    except (OSError, StopIteration, ValueError):
        return None


class AdmitAll(AdmissionController):
    """Admission switched off for a measurement (`--admit-all`): every chunk that is not `busy` runs, and the
    guard still publishes at the deadline. The share of these chunks that fit the budget is the oracle that
    an admission controller is judged against."""

    def decide(self, t0: float, busy: bool = False, reserve_ms: float = 0.0, horizon_ms: float = 0.0) -> Decision:
        d = super().decide(t0, busy, reserve_ms, horizon_ms)
        return Decision(True, "admit", d.remaining_ms, d.estimate_ms) if d.reason == "refused" else d


# The node settings the bench takes as options (generated from the settings table by tools/cli.py); the policy comes
# from --policies, the re-probe wait from --probe-after (in cycles).
BENCH_SETTINGS = ("period_ms", "safety_margin_ms", "ema_alpha", "tail_k", "max_frame_age_ms", "backend",
                  "kv_capacity_tokens", "window_frames", "vram_ceiling_gb", "warmup_chunks", "realtime_priority",
                  "fallback", "hold_timeout_s", "action_low", "action_high", "twist_map", "twist_scale",
                  "velocity_limits", "acceleration_limits", "base_command_timeout_s", "instruction",
                  "instruction_min_interval_cycles", "chunk_execute", "chunk_blend", "chunk_blend_weight",
                  "max_state_age_ms", "state_joints")
STATE_STAMP_BASE_NS = 10**9  # the replayed camera's clock starts here: a state stamp is never the unset 0


# The camera's frame-quality thresholds the bench takes as options (the checks themselves: --frame-quality-checks).
BENCH_QUALITY_SETTINGS = tuple(spec.name for spec in CAMERA_SPECS if spec.name.startswith("frame_quality_")
                               and spec.name != "frame_quality_checks")


def quality_gate(args) -> QualityGate | None:
    """The camera node's frame-quality gate with the bench's options; None with --frame-quality-checks none."""
    if not args.frame_quality_checks:
        return None
    values = dict(setting_values(args, BENCH_QUALITY_SETTINGS), frame_quality_checks=args.frame_quality_checks)
    return QualityGate(QualitySettings.from_values(values))


def bench_settings(args, policy: str) -> ReasoningSettings:
    """The node's settings for one bench run: the options, the policy, the probe wait in seconds."""
    return ReasoningSettings.from_values(dict(setting_values(args, BENCH_SETTINGS), policy=policy,
                                              reprobe_after_s=args.probe_after * args.period_ms / 1000.0))


def run_policy(args, weights, model_path: str, policy: str, frames: np.ndarray, embeddings: np.ndarray,
               progress, verdicts: list | None = None, states: ClipStates | None = None) -> tuple[dict, dict]:
    """One policy on one clip: `Runtime.step` every period, as the node's timer calls it (the last guard and the
    command limits included), the "publish" only an instant. Returns (metrics for report.json, raw series for the
    plot)."""
    normal_scheduling()  # the engine's worker thread inherits the scheduling of the thread that creates it
    settings = bench_settings(args, policy)
    fb = FrameBuffer()
    stats = CycleStats(window=10**7)  # keep every sample: percentiles over the whole run
    # as the node: the same assembly (warm-up on the worker thread, EMAs seeded, collector settled and frozen)
    rt = Runtime.build(model_path, settings, fb, weights=weights, stats=stats, seed=args.seed, vram_interval_s=0.05,
                       admission_class=AdmitAll if args.admit_all else AdmissionController,
                       warn=lambda msg: print(f"vla-edge-bench: {msg}", file=sys.stderr, flush=True))
    feed = None
    try:
        # this thread runs the cycle, as the node's timer (the runtime put the engine worker one level below it)
        refused = set_realtime_priority(args.realtime_priority)
        if refused:
            print(f"vla-edge-bench: {refused}", file=sys.stderr, flush=True)
        camera = CameraReplay(frames, args.camera_hz, fb, verdicts, rt.state, states, args.seed)
        camera_index_of_frame_id: dict[int, int] = {}
        chunk_totals: list[float] = []  # every measured chunk: fresh, late and probes
        publish_lags: list[float] = []  # overruns: publish time - the guard's wait end (ms)
        cycle_ms, timeline = [], []  # timeline: (seconds into the run, camera indices retained) per chunk
        per_cycle = {"t": [], "cycle_ms": [], "reason": [], "estimate_ms": [], "remaining_ms": [], "clamped": [],
                     "outcome": [], "action": [], "boundary_jump": []}
        period = args.period_ms / 1000.0
        n_ticks = max(1, int(round(args.seconds / period)))
        skipped = 0

        def note_chunk(res, seq, t):
            camera_index_of_frame_id[res.frame_id] = camera.camera_index_of_seq[seq]
            timeline.append((t, [camera_index_of_frame_id[f] for f in res.retained]))

        def publish(twist, out) -> float:
            return time.monotonic()  # the bench's "publish": nothing to send, only the instant

        camera.start()
        while camera.start_time is None:
            time.sleep(0.001)
        start = camera.start_time + period  # the first tick finds a frame, as on a running robot
        schedule = sorted(args.instruction_at or [], key=lambda x: x[0])  # (seconds into the run, text)
        feed = InstructionFeed(rt.check_instruction)
        refusals = []
        i = 0
        while i < n_ticks:
            scheduled = start + i * period
            delay = scheduled - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            t0 = time.monotonic()
            # the bench's ~/instruction, as the node's: what fell due is coalesced before any work (only the latest
            # is rendered, off this thread), and the tick applies at most one checked request, after its publish
            while schedule and t0 - start >= schedule[0][0]:
                at, text = schedule.pop(0)
                feed.offer(text, "bench", at)
            step = rt.step(t0, scheduled, publish)
            ready = feed.take()
            if ready is not None:
                try:
                    rt.set_instruction(ready[0], "bench")
                except InstructionError as e:
                    refusals.append({"at_s": ready[2], "text": shorten(ready[0], 120), "error": str(e)})
            out, t_publish = step.outcome, step.t_publish
            cycle_ms.append((t_publish - t0) * 1000.0)
            per_cycle["t"].append(t0 - start)
            per_cycle["cycle_ms"].append(cycle_ms[-1])
            per_cycle["reason"].append(out.reason)
            per_cycle["estimate_ms"].append(out.estimate_ms)
            per_cycle["remaining_ms"].append(out.remaining_ms)
            per_cycle["clamped"].append(out.clamped)
            per_cycle["outcome"].append("plan" if out.source == "plan" else out.reason)  # what was published
            per_cycle["action"].append([float(x) for x in out.action])
            per_cycle["boundary_jump"].append(out.boundary_jump if out.boundary_replaced_plan else None)
            if out.wait_until is not None and (out.reason == "overrun" or t_publish > out.deadline):
                publish_lags.append((t_publish - out.wait_until) * 1000.0)  # how late the guard really published
            if out.late_chunk is not None:
                note_chunk(out.late_chunk, out.late_frame_seq, t0 - start)
                chunk_totals.append(out.late_chunk.timings.total_ms)
            if out.chunk is not None:
                note_chunk(out.chunk, out.frame_seq, t0 - start)
                chunk_totals.append(out.chunk.timings.total_ms)
            # Absolute schedule; a tick more than a period late is skipped, as a ROS timer would.
            nxt = max(i + 1, int((time.monotonic() - start) / period))
            skipped += nxt - i - 1
            progress.update(nxt - i)
            i = nxt
        feed.close()
        normal_scheduling()
        camera.stop()
        drained = rt.finish(timeout=30.0)  # a late chunk still running: let it land before reading the cache
        if drained is not None and drained.late_chunk is not None:
            note_chunk(drained.late_chunk, drained.late_frame_seq, time.monotonic() - start)
        budget_ms = args.period_ms - args.safety_margin_ms

        rec = rt.record()
        retained_camera = [camera_index_of_frame_id[f] for f in rt.retained_frame_ids()]
        retained_clip = [k % len(frames) for k in retained_camera]
        vram = rt.vram_memory()
        metrics = rec.report()  # the loop section: the values the node's /diagnostics reports
        metrics.update({
            # whole-device used memory at the first and last sample of the run, and once a second in between
            "vram_first_bytes": vram["first_bytes"],
            "vram_last_bytes": vram["last_bytes"],
            "vram_timeline_mb": [[round(t, 1), round(b / 2**20, 1)] for t, b in vram["timeline"]],
            "host_rss_mb": _rss_mb(),
            "frames_produced": camera.produced,
            "frames_seen": len(camera_index_of_frame_id),
            "frames_retained": len(retained_camera),
            "history_coverage": history_coverage(embeddings, camera.produced, retained_clip),
            "retained_camera_frames": retained_camera,
            "skipped_ticks": skipped,
            # admitted: share of cycles that published a fresh model action; chunks_fit: share of the measured
            # chunks that took <= period - margin (with --admit-all, an unbiased sample: the oracle share)
            "admitted_share": rec.fresh_actions / max(1, rec.cycles),
            "chunks_fit_share": (sum(x <= budget_ms for x in chunk_totals) / len(chunk_totals)
                                 if chunk_totals else None),
            "chunks_measured": len(chunk_totals),
            "admit_all": bool(args.admit_all),
            "realtime_priority": args.realtime_priority,
            # what admission predicted against what it had: the estimate's median and the median time left
            "admission_estimate_ms_p50": _median(per_cycle["estimate_ms"]),
            "admission_budget_ms_p50": _median(per_cycle["remaining_ms"]),
            "guard_publish_lag_ms": [round(x, 2) for x in publish_lags],
            # action chunks: ticks with a model or plan action, the jump where a new chunk replaced the plan, jerk
            "acting_share": rec.acting_share,
            "plan_share": rec.plan_actions / max(1, rec.cycles),
            "smoothness": command_smoothness(per_cycle["action"], per_cycle["boundary_jump"], period),
        })
        metrics["instruction"] = rt.instruction_values()
        metrics["instruction_changes"] = [
            {"text": shorten(r["text"], 120), "requested_s": r["requested"] - start,
             "applied_s": None if r["applied"] is None else r["applied"] - start, "cycles": r["cycles"],
             "prefill_ms": r["prefill_ms"], "prompt_tokens": r["prompt_tokens"],
             "instruction_tokens": r["instruction_tokens"], "ok": r["ok"], "error": r["error"]}
            for r in rt.instruction_log()]
        metrics["instruction_refusals"] = refusals
        # the schedule's requests, and those a newer one replaced before they were rendered (never worked on)
        metrics["instruction_requests"] = feed.offered
        metrics["instruction_dropped_unrendered"] = feed.dropped
        return metrics, {"cycle_ms": cycle_ms, "timeline": timeline, "cycles": per_cycle}
    finally:
        if feed is not None:
            feed.close()
        rt.close()


def quality_report(gate: QualityGate | None, verdicts: list | None) -> dict:
    """The clip's frame-quality counts (the camera node's, over one pass of the clip in order) and the frames of it
    a tripped check refuses; {"checks": []} when the gate is off."""
    if gate is None:
        return {"checks": []}
    tripped = [unpack_word(word)[0] for word, _ in verdicts]
    refused = [i for i, mask in enumerate(tripped) if mask]
    any_tripped = 0
    for mask in tripped:
        any_tripped |= mask
    return {"checks": list(gate.settings.checks), **gate.counts(), "tripped_checks": quality_names(any_tripped),
            "first_refused_frame": refused[0] if refused else None}


def model_labels(model_paths: list[str], all_weights) -> list[str]:
    """Short, distinct labels for the models of one bench run: directory name + weights / decoding."""
    labels = []
    for d, w in zip(model_paths, all_weights):
        kind = w.cfg.weight_format + ("-parallel" if w.cfg.parallel else "")
        label = f"{os.path.basename(os.path.normpath(d))}[{kind}]"
        while label in labels:
            label += "'"
        labels.append(label)
    return labels


# --- reporting ----------------------------------------------------------------------------------------

def machine_info() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    info = {"cpu": cpu, "cpu_count": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__, "gpu": None}
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
            info["gpu"] = name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # noqa: BLE001 - no CuPy or no GPU
        pass
    return info


def _fmt(x, digits=1) -> str:
    if x is None:
        return "n/a"
    return f"{x:.{digits}f}"


def write_markdown(report: dict, path: str) -> None:
    c = report["config"]
    lines = [f"# vla-edge-bench report ({report['date']})", "",
             f"Backend `{report['backend']}` on {report['machine']['cpu']} ({report['machine']['cpu_count']} cores)"
             + (f", GPU {report['machine']['gpu']}" if report["machine"]["gpu"] else "")
             + f"; model {report['model']['name']}; period {c['period_ms']} ms (margin {c['safety_margin_ms']} ms), "
               f"camera {c['camera_hz']} Hz, {c['seconds']} s per policy, KV capacity {c['kv_capacity_tokens']} "
               f"tokens, window {c['window_frames']} frames, seed {c['seed']}.", "",
             f"Command: `{report['command']}`", ""]
    head = ("| policy | cycles | model | plan | fallback rate | deadline miss | overrun | cycle p50/p99/max ms | "
            "chunk p50/p99 ms | admission estimate / budget p50 ms | jitter p99 ms | frame age p50 ms | "
            "retained/cap | evictions | coverage | boundary jump mean/p99/max | jerk rms |")
    for clip in report["clips"]:
        lines += [f"## {clip['name']} ({clip['frames']} frames)", ""]
        lines += [f"Note: {n}." for n in clip.get("notes", [])] + ([""] if clip.get("notes") else [])
        q = clip.get("frame_quality") or {"checks": []}
        if q["checks"]:
            failed = ", ".join(f"{c} {q['failed_' + c]} ({q['trips_' + c]} trip{'s' if q['trips_' + c] != 1 else ''})"
                               for c in QUALITY_CHECKS if q.get("failed_" + c))
            lines += [f"Frame quality ({','.join(q['checks'])}), one pass of the clip: {q['refused_frames']} of "
                      f"{q['frames']} frames refused by a tripped check"
                      + (f" (the first is frame {q['first_refused_frame']}; checks that tripped: {q['tripped_checks']})"
                         if q["refused_frames"] else "")
                      + (f"; failing frames: {failed}" if failed else "") + ".", ""]
        else:
            lines += ["Frame quality: not checked (--frame-quality-checks none).", ""]
        lines += [head, "|" + "---|" * 17]
        for policy, m in clip["policies"].items():
            fb = ", ".join(f"{k} {v}" for k, v in m["fallbacks"].items() if v)
            sm = m.get("smoothness") or {k: None for k in ("boundary_jump_mean", "boundary_jump_p99",
                                                           "boundary_jump_max", "jerk_rms")}
            lines.append(
                f"| {policy} | {m['cycles']} | {m['model_actions']} | {m['plan_actions']} | {m['fallback_rate']:.3f}"
                f"{' (' + fb + ')' if fb else ''} | {m['deadline_miss_rate']:.3f} | {m['overrun_rate']:.3f} | "
                f"{_fmt(m['cycle_ms']['p50'])}/{_fmt(m['cycle_ms']['p99'])}/{_fmt(m['cycle_ms']['max'])} | "
                f"{_fmt(m['chunk_ms']['p50'])}/{_fmt(m['chunk_ms']['p99'])} | "
                f"{_fmt(m.get('admission_estimate_ms_p50'))} / {_fmt(m.get('admission_budget_ms_p50'))} | "
                f"{_fmt(m['timer_jitter_ms']['p99'], 2)} | "
                f"{_fmt(m['frame_age_ms']['p50'])} | {m['frames_retained']}/{m['frame_capacity']} | {m['evictions']} | "
                f"{_fmt(m['history_coverage'], 4)} | {_fmt(sm['boundary_jump_mean'], 3)}/"
                f"{_fmt(sm['boundary_jump_p99'], 3)}/{_fmt(sm['boundary_jump_max'], 3)} | {_fmt(sm['jerk_rms'], 0)} |")
        lines.append("")
        mem = [f"{policy}: device {_mb(m.get('vram_first_bytes'))} -> {_mb(m.get('vram_last_bytes'))} MB "
               f"(peak {_mb(m.get('peak_vram_bytes'))}), host RSS {_fmt(m.get('host_rss_mb'))} MB at the end"
               for policy, m in clip["policies"].items() if m.get("vram_first_bytes") is not None]
        if mem:
            lines += ["Memory over each run (first -> last sample): " + "; ".join(mem) + ".", ""]
        for policy, m in clip["policies"].items():
            changes, refused = m.get("instruction_changes") or [], m.get("instruction_refusals") or []
            if not changes and not refused and not m.get("instruction", {}).get("instruction"):
                continue
            lines += [f"Instructions, {policy}: active at the end {m['instruction']['instruction']!r} "
                      f"({m['instruction']['instruction_tokens']} tokens, prompt {m['instruction']['prompt_tokens']})."]
            if changes:
                lines += ["", "| requested s | applied s | instruction_change cycles | prefill ms | prompt tokens | "
                          "instruction | result |", "|---|---|---|---|---|---|---|"]
                lines += [f"| {_fmt(c['requested_s'], 2)} | {_fmt(c['applied_s'], 2)} | {c['cycles']} | "
                          f"{_fmt(c['prefill_ms'], 2)} | {c['prompt_tokens']} | {c['text']!r} | "
                          f"{'applied' if c['ok'] else c['error'] or 'pending'} |" for c in changes]
            lines += [f"- refused at {_fmt(r['at_s'], 2)} s: {r['text']!r}: {r['error']}" for r in refused] + [""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


OUTCOME_COLORS = {"fresh": "#2ca02c", "plan": "#bcbd22", "repeat": "#98df8a", "no_frame": "#c7c7c7",
                  "stale_frame": "#8c564b",
                  "refused": "#ff9896", "busy": "#ffbb78", "cold": "#aec7e8", "overrun": "#d62728",
                  "engine_error": "#9467bd", "non_finite": "#e377c2", "inactive": "#7f7f7f",
                  "instruction_change": "#17becf", "frame_quality": "#393b79", "internal_error": "#000000"}


def _stretches(ts: list[float], flags: list[bool], period_s: float) -> list[tuple[float, float]]:
    """Contiguous runs of flagged cycles as (start, end) seconds (each cycle covers one period)."""
    out, start = [], None
    for t, f in zip(ts, flags):
        if f and start is None:
            start = t
        if not f and start is not None:
            out.append((start, t))
            start = None
    if start is not None:
        out.append((start, ts[-1] + period_s))
    return out


def write_plot(report: dict, series: dict, path: str) -> None:
    """Draw report.png: per clip, what each policy published, then per policy its cycles over time.

    One block per clip: an outcome bar per policy, then per policy a per-cycle latency timeline (deadline,
    budget, admission estimate vs the time left, refused stretches shaded) beside the frames its cache retained.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clips = report["clips"]
    policies = list(clips[0]["policies"]) if clips else []  # the run keys: POLICY, or MODEL:POLICY for several models
    period, margin = report["config"]["period_ms"], report["config"]["safety_margin_ms"]
    rows_per_clip = 1 + len(policies)
    fig = plt.figure(figsize=(15, 2.5 * rows_per_clip * len(clips)))
    grid = fig.add_gridspec(rows_per_clip * len(clips), 3, width_ratios=(2.2, 2.2, 1.3))
    for ci, clip in enumerate(clips):
        r0 = ci * rows_per_clip
        # outcome bars: every cycle of every policy, by what was published
        ax = fig.add_subplot(grid[r0, :2])
        left = np.zeros(len(policies))
        for reason, color in OUTCOME_COLORS.items():
            counts = np.array([series[clip["name"]][p]["cycles"]["outcome"].count(reason) for p in policies], float)
            if counts.any():
                ax.barh(policies, counts, left=left, color=color, label=reason, edgecolor="white", linewidth=0.5)
                left += counts
        ax.invert_yaxis()
        ax.set(title=f"{clip['name']}: what each cycle published (green: model actions, olive: plan actions)",
               xlabel="cycles")
        ax.legend(fontsize=7, ncol=6, loc="lower right")
        note = fig.add_subplot(grid[r0, 2])
        note.axis("off")
        note.text(0, 1, "\n".join(clip.get("notes") or ["clip played at its own rate, no loop"]), va="top",
                  fontsize=8, wrap=True)
        t_max = max((max(series[clip["name"]][p]["cycles"]["t"] or [0]) for p in policies), default=0) + 0.1
        for pi, policy in enumerate(policies, start=1):
            cyc = series[clip["name"]][policy]["cycles"]
            t = np.asarray(cyc["t"])
            ax = fig.add_subplot(grid[r0 + pi, :2])
            for (a, b) in _stretches(cyc["t"], [x == "refused" for x in cyc["reason"]], period / 1000.0):
                ax.axvspan(a, b, color=OUTCOME_COLORS["refused"], alpha=0.25, linewidth=0)
            model = np.array([x in ("fresh", "repeat") for x in cyc["reason"]], bool)
            lat = np.asarray(cyc["cycle_ms"])
            if len(t):
                ax.plot(t[model], lat[model], ".", ms=2, color=OUTCOME_COLORS["fresh"], label="cycle: model action")
                ax.plot(t[~model], lat[~model], ".", ms=2, color="tab:red", label="cycle: fallback")
                est = np.array([np.nan if x is None else x for x in cyc["estimate_ms"]], float)
                rem = np.array([np.nan if x is None else x for x in cyc["remaining_ms"]], float)
                ax.plot(t, est, color="tab:blue", linewidth=0.8, label="admission estimate")
                ax.plot(t, rem, color="tab:gray", linewidth=0.8, linestyle=":", label="budget (time left at decision)")
            ax.axhline(period, color="red", linestyle="--", linewidth=1, label=f"deadline {period:g} ms")
            ax.axhline(period - margin, color="orange", linestyle="--", linewidth=0.8,
                       label=f"deadline - margin {period - margin:g} ms")
            ax.plot([], [], color=OUTCOME_COLORS["refused"], alpha=0.5, linewidth=6, label="refused stretch")
            top = np.nanmax([period * 1.3, *(lat if len(lat) else [0])])
            ax.set(xlim=(0, t_max), ylim=(0, min(top, period * 4)), ylabel="ms",
                   title=f"{policy}: per-cycle latency (tick -> publish) and admission",
                   xlabel="run time (s)" if pi == len(policies) else None)
            ax.legend(fontsize=6, ncol=4, loc="upper right")
            if any(x == "plan" for x in cyc["outcome"]):  # action chunks: the published series, by source
                _plot_command(ax.twinx(), t, cyc)
            ax = fig.add_subplot(grid[r0 + pi, 2])
            timeline = series[clip["name"]][policy]["timeline"]
            xs = [tt for tt, kept in timeline for _ in kept]
            ys = [k for _, kept in timeline for k in kept]
            ax.scatter(xs, ys, s=1, marker=".", color="tab:blue")
            m = clip["policies"][policy]
            ax.set(xlim=(0, t_max), title=f"{policy}: retained frames (coverage {_fmt(m['history_coverage'], 3)})",
                   ylabel="camera frame", xlabel="run time (s)" if pi == len(policies) else None)
            ax.title.set_fontsize(8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _plot_command(ax, t: np.ndarray, cyc: dict) -> None:
    """The published action's first dimension over time on its own axis: model, plan and fallback ticks apart."""
    a0 = np.asarray([row[0] for row in cyc["action"]], float)
    kinds = np.asarray(["model" if o in ("fresh", "repeat") else "plan" if o == "plan" else "fallback"
                        for o in cyc["outcome"]])
    for kind, color in (("model", "#2ca02c"), ("plan", "#bcbd22"), ("fallback", "tab:red")):
        sel = kinds == kind
        ax.plot(t[sel], a0[sel], "x", ms=2, color=color, label=f"action[0]: {kind}")
    ax.set_ylabel("action[0]")
    ax.legend(fontsize=6, loc="lower right")


def clip_notes(clip: dict, camera_hz: float, run_frames: int) -> list[str]:
    """Say when the run does not show the clip as recorded: played faster/slower, looped, frames damaged."""
    notes = []
    fps = clip.get("native_fps")
    if fps and abs(camera_hz / fps - 1.0) > 0.02:
        notes.append(f"played at {camera_hz:g} Hz, {camera_hz / fps:.2f}x its recorded {fps:.3g} fps "
                     f"({'faster' if camera_hz > fps else 'slower'} than real time)")
    if run_frames > clip["frames"]:
        notes.append(f"looped: {run_frames} camera frames from a {clip['frames']}-frame clip "
                     f"({run_frames / clip['frames']:.1f} passes)")
    if clip.get("damaged_frames"):
        notes.append(f"{clip['damaged_frames']} damaged frames skipped (of {clip.get('expected_frames') or '?'})")
    return notes


# --- command line -------------------------------------------------------------------------------------

def build_parser() -> Parser:
    p = Parser(prog="vla-edge-bench", description=__doc__.splitlines()[0],
               epilog=__doc__[__doc__.index("Usage examples:"):], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clip", action="append", required=True,
                   help="video file, image folder, rosbag2 bag (.mcap/.db3/folder), synthetic or synthetic-cut; "
                        "repeatable (default: none, required)")
    add_run_options(p)
    p.add_argument("--out", required=True,
                   help="output folder for report.json/.md/.png; must be new or empty (default: none, required)")
    p.add_argument("--force", action="store_true",
                   help="replace a non-empty --out (the old folder is swapped out only once the new report is "
                        "complete) (default: refuse)")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no printed report (default: show them)")
    return p


def add_run_options(p, seconds: float | None = 10.0, camera_hz: float | None = 60.0,
                    seconds_help: str = "10", camera_hz_help: str = "60") -> None:
    """The options of one clip's run (models, policies, timing, every node setting): vla-edge-bench's and
    vla-edge-fleet's, declared once. The fleet defaults --seconds / --camera-hz to each bag's own (None)."""
    from ..model.config import PRESETS

    p.add_argument("--model", action="append",
                   help="model: an HF-layout dir or a GGUF file (default: generate --preset into a temp dir); give "
                        "it more than once to compare models side by side (e.g. bf16 and 4-bit, autoregressive and "
                        "parallel): each model runs every policy, labelled MODEL:POLICY")
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS),
                   help="model preset to generate when --model is omitted (default: tiny)")
    p.add_argument("--policies", default=",".join(POLICY_NAMES),
                   help=f"comma-separated eviction policies (default: {','.join(POLICY_NAMES)})")
    p.add_argument("--seconds", type=bounded(0.01, 86400.0), default=seconds,
                   help=f"run time per clip and policy (default: {seconds_help})")
    p.add_argument("--camera-hz", type=bounded(0.1, 1000.0), default=camera_hz,
                   help="rate the clip is fed to the FrameBuffer; the report notes when it differs from the clip's "
                        f"own rate (default: {camera_hz_help})")
    add_setting_options(p, BENCH_SETTINGS, flags={"kv_capacity_tokens": "--kv-capacity"},
                        defaults={"kv_capacity_tokens": None, "instruction_min_interval_cycles": 1},
                        helps={"kv_capacity_tokens": f"{KV_CAPACITY_TOKENS} on cuda, {CPU_KV_CAPACITY_TOKENS} on "
                                                     "numpy, as the demo and the soak",
                               "instruction_min_interval_cycles": "1, every --instruction-at change as soon as it "
                                                                  "can start"})
    p.add_argument("--frame-quality-checks", type=_quality_checks, default=list(QUALITY_CHECKS),
                   metavar="CHECKS", help="the camera's frame-quality checks, comma-separated, or none: each clip "
                   "frame is checked at full size as the camera node checks it, and a frame a tripped check refuses "
                   "gives frame_quality fallbacks (default: " + ",".join(QUALITY_CHECKS) + "; the camera node's "
                   "frame_quality_checks)")
    add_setting_options(p, BENCH_QUALITY_SETTINGS, specs=CAMERA_SPECS)
    p.add_argument("--probe-after", type=non_negative_int, default=None,
                   help="while refusing, run one background chunk after at most this many refusals in a row to "
                        "re-measure its cost (0: never) (default: the node's reprobe_after_s, 2 s of periods)")
    p.add_argument("--state-topic", default=None, metavar="TOPIC",
                   help="a model with a robot-state input: the sensor_msgs/JointState topic of the bag clips to take "
                        "it from, each frame given the latest message stamped at or before it (matched by name; "
                        "older than --max-state-age-ms at the tick: fallback stale_state). Without it a model with a "
                        "state input gets a synthetic state (default: none)")
    p.add_argument("--admit-all", action="store_true",
                   help="admit every chunk that is not busy (the guard still publishes at the deadline): the share "
                        "of chunks that fit is then the oracle to judge admission against (default: off)")
    p.add_argument("--max-clip-frames", type=positive_int, default=3000,
                   help="frames read from each clip, a memory bound (default: 3000)")
    p.add_argument("--min-clip-fraction", type=finite_non_negative, default=0.5,
                   help="refuse a clip (a damaged file) that decodes fewer than this fraction of the frames it "
                        "declares (default: 0.5)")
    p.add_argument("--instruction-at", action="append", type=_instruction_at, metavar="SECONDS=TEXT",
                   help="change the instruction SECONDS into each run (repeatable: a schedule); the report gives "
                        "the cycles each change cost (default: none)")
    p.add_argument("--seed", type=int, default=0, help="synthetic clips, warm-up frames, generated model (default: 0)")


def _quality_checks(text: str) -> list[str]:
    parts = [x.strip() for x in text.split(",") if x.strip()]
    if parts == ["none"]:
        return []
    bad = [x for x in parts if x not in QUALITY_CHECKS]
    if bad or not parts:
        raise argparse.ArgumentTypeError(f"expected none or checks of {','.join(QUALITY_CHECKS)}, got {text[:60]!r}")
    return parts


def _instruction_at(text: str):
    when, sep, what = text.partition("=")
    try:
        at = float(when)
    except ValueError:
        at = float("nan")
    if not sep or not (0.0 <= at <= 1e6):
        raise argparse.ArgumentTypeError(f"expected SECONDS=TEXT with SECONDS >= 0, got {text[:60]!r}")
    return at, what


def parse_args(argv):
    p = build_parser()
    return finish_run_args(p, p.parse_args(argv))


def finish_run_args(p, a):
    """The checks and derived values of add_run_options' options (p.error on an impossible combination)."""
    a.policies = [x.strip() for x in a.policies.split(",") if x.strip()]
    if not a.policies:
        p.error("--policies: give at least one policy")
    for name in a.policies:
        if name not in POLICY_NAMES:
            p.error(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
    problem = budget_problem(a.period_ms, a.safety_margin_ms)
    if problem:
        p.error(f"--period-ms / --safety-margin-ms: {problem}")
    if a.probe_after is None:
        a.probe_after = probe_after_cycles(REPROBE_AFTER_S, a.period_ms)
    return a


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    for problem in (check_out_dir(args.out, args.force), *(check_model_path(m) for m in args.model or [])):
        if problem:
            return fail("vla-edge-bench", problem)
    try:
        return run(args, argv)
    except StartupError as e:  # a model the runtime refuses (e.g. one that overflows): what the node would say
        return fail("vla-edge-bench", str(e), 3)
    except (ClipError, ModelLoadError, OutputDirError, ValueError, OSError) as e:
        return fail("vla-edge-bench", e if not isinstance(e, OSError) else f"{e.filename or ''}: {e.strerror or e}")
    except KeyboardInterrupt:
        return fail("vla-edge-bench", "interrupted; nothing written", 130)
    except Exception as e:  # noqa: BLE001 - one line for the user; VLA_EDGE_DEBUG=1 shows the traceback
        if os.environ.get("VLA_EDGE_DEBUG"):
            raise
        return fail("vla-edge-bench", f"internal error: {type(e).__name__}: {e} (VLA_EDGE_DEBUG=1 for the traceback)",
                    1)


class PreparedClip(NamedTuple):
    """One clip opened and decoded up front (a damaged clip fails before any run; decoding never competes with the
    engine): its frames, the frame-quality gate and its verdict per frame, the bag's states aligned to the frames."""

    spec: str
    source: object
    frames: np.ndarray
    gate: QualityGate | None
    verdicts: list | None
    states: ClipStates | None


def prepare_clip(args, spec: str) -> PreparedClip:
    """Open and decode `spec` for a run of args.seconds at args.camera_hz."""
    run_frames = int(args.seconds * args.camera_hz)
    # A synthetic clip outlasts the run (+2 s for start-up and drain), so it never loops back to the first scene;
    # the cut comes a third into the run.
    n_frames = min(run_frames + int(2 * args.camera_hz), args.max_clip_frames)
    source = open_clip(spec, n_frames=n_frames, cut_at=run_frames // 3, seed=args.seed)
    gate, verdicts = quality_gate(args), []
    frames, stamps = load_model_frames(source, args.max_clip_frames, min_fraction=args.min_clip_fraction,
                                       gate=gate, verdicts=verdicts)
    states = None
    if args.state_topic:
        if not isinstance(source, BagClip):
            raise ClipError(f"{spec}: --state-topic reads a bag's JointState topic; this clip is not a bag")
        states = ClipStates(BagJointStates(source.path, args.state_topic), stamps)
    return PreparedClip(spec, source, frames, gate, verdicts if gate is not None else None, states)


def clip_native_fps(clip: PreparedClip) -> float | None:
    """The clip's own frame rate (None for a synthetic clip, which has none)."""
    if clip.spec in SYNTHETIC:
        return None
    native = getattr(clip.source, "native_fps", None)
    return clip.source.fps if native is None and not isinstance(clip.source, SyntheticClip) else native


class BenchModels(NamedTuple):
    """The models of one run, loaded once: paths, the names the report gives, weights, short labels."""

    paths: list[str]
    names: list[str]
    weights: list
    labels: list[str]


def open_models(args, tmp_dir: str | None = None) -> BenchModels:
    """Load args.model (or generate --preset into `tmp_dir`), and settle args.backend and args.kv_capacity_tokens
    from the first model and the machine."""
    if not args.model:
        from ..model.generate import make_model

        paths = [make_model(tmp_dir, preset=args.preset, seed=args.seed)]
        names = [f"generated {args.preset} (seed {args.seed})"]
    else:
        paths, names = list(args.model), list(args.model)
    weights = [load_model(m) for m in paths]
    if args.backend == "auto":
        args.backend = "cuda" if cuda_available() else "numpy"
    if args.kv_capacity_tokens is None:
        args.kv_capacity_tokens = KV_CAPACITY_TOKENS if args.backend == "cuda" else CPU_KV_CAPACITY_TOKENS
    return BenchModels(paths, names, weights, model_labels(paths, weights))


def bench_clip(args, clip: PreparedClip, models: BenchModels, progress, name: str) -> tuple[dict, dict]:
    """Every model and policy on one clip, in turn: (the clip's entry of report.json, its raw series per run)."""
    embeddings = [pooled_embeddings(w, clip.frames) for w in models.weights]
    src = clip.source
    entry = {"name": name, "source": clip.spec, "frames": len(clip.frames), "native_fps": clip_native_fps(clip),
             "cut_at": getattr(src, "cut_at", None), "expected_frames": src.expected,
             "damaged_frames": src.counters.skipped_corrupt, "policies": {}}
    entry["frame_quality"] = quality_report(clip.gate, clip.verdicts)
    if models.weights[0].cfg.state_dim:  # the model takes the robot's state: where each run's came from
        entry["state"] = clip.states.report() if clip.states is not None else {"source": "synthetic"}
    entry["notes"] = clip_notes(entry, args.camera_hz, int(args.seconds * args.camera_hz))
    series = {}
    for label, mdir, w, emb in zip(models.labels, models.paths, models.weights, embeddings):
        for policy in args.policies:
            key = policy if len(models.paths) == 1 else f"{label}:{policy}"
            progress.set_postfix_str(f"{name} {key}")
            entry["policies"][key], series[key] = run_policy(
                args, w, mdir, policy, clip.frames, emb, progress, clip.verdicts, clip.states)
            gc.collect()  # drop the previous engine's cache before the next one allocates
    return entry, series


def report_header(args, argv, models: BenchModels, tool: str = "vla-edge-bench") -> dict:
    """report.json's keys before "clips": the tool, the command, the machine, the models and every setting."""
    cfg = models.weights[0].cfg
    return {
        "tool": tool,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": f"{tool} " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine_info(),
        "backend": args.backend,
        "model": {"name": ", ".join(f"{lab} = {n}" if len(models.names) > 1 else n
                                    for lab, n in zip(models.labels, models.names)),
                  "weights": [w.cfg.weight_format for w in models.weights],
                  "action_decoding": [w.cfg.action_decoding for w in models.weights],
                  "config": {k: getattr(cfg, k) for k in (
                      "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                      "intermediate_size", "vocab_size")}},
        "config": {"policies": args.policies, "seconds": args.seconds, "camera_hz": args.camera_hz,
                   "period_ms": args.period_ms, "safety_margin_ms": args.safety_margin_ms,
                   "max_frame_age_ms": args.max_frame_age_ms, "kv_capacity_tokens": args.kv_capacity_tokens,
                   "window_frames": args.window_frames, "tail_k": args.tail_k, "probe_after": args.probe_after,
                   "admit_all": args.admit_all, "realtime_priority": args.realtime_priority,
                   "warmup_chunks": args.warmup_chunks, "seed": args.seed,
                   # every node setting of the run (the policy aside): the limits and the fallback included
                   "settings": setting_values(args, BENCH_SETTINGS),
                   "frame_quality": dict(setting_values(args, BENCH_QUALITY_SETTINGS),
                                         frame_quality_checks=args.frame_quality_checks)},
    }


def run(args, argv) -> int:
    from tqdm import tqdm

    tighten_gil_switch()  # as the node's process
    prepared = [prepare_clip(args, spec) for spec in args.clip]  # every clip opened before any run
    tmp_model = tempfile.mkdtemp(prefix=f"vla-bench-{args.preset}-") if not args.model else None
    try:
        models = open_models(args, tmp_model)
        n_ticks = int(round(args.seconds / (args.period_ms / 1000.0)))
        progress = tqdm(total=n_ticks * len(args.policies) * len(args.clip) * len(models.paths), unit="tick",
                        file=sys.stderr, disable=args.quiet, mininterval=0.5, desc="vla-edge-bench")
        clips, series = [], {}
        for clip in prepared:
            name = clip.source.name if clip.spec not in SYNTHETIC else clip.spec
            while name in series:
                name += "'"
            entry, series[name] = bench_clip(args, clip, models, progress, name)
            clips.append(entry)
        progress.close()
        report = {**report_header(args, argv, models), "clips": clips}
        # written into a temporary folder beside --out that replaces it only when complete
        with atomic_output_dir(args.out, force=args.force) as tmp_dir:
            tmp_out = Path(tmp_dir)
            with open(tmp_out / "report.json", "w") as f:
                json.dump(report, f, indent=1)
            write_markdown(report, str(tmp_out / "report.md"))
            write_plot(report, series, str(tmp_out / "report.png"))
        final = Path(args.out).resolve()
        if not args.quiet:
            print((final / "report.md").read_text())
        return 0
    finally:
        if tmp_model is not None:
            shutil.rmtree(tmp_model, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
