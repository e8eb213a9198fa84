# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""vla-edge-soak: run the whole loop for minutes and check that nothing leaks or slips.

Starts the bringup (``python -m vla_edge_ros.nodes.bringup``) and a 60 Hz replay
(``python -m vla_edge_ros.tools.replay SOURCE --loop``) as subprocesses, like vla-edge-demo, and
samples once a second:

* RSS of the bringup process (``/proc/PID/status`` VmRSS),
* VRAM (``vram_peak_mb`` of /diagnostics; null on the NumPy backend),
* cycles, model actions, fallbacks and late (deadline-missed) cycles of that second (``~/cycle``),
  cycle latency p50/p99 of that second, the node's own /diagnostics counters (deadline misses,
  FrameBuffer drops, camera rate, invalid frames, cache fill).

Writes ``samples.csv`` and ``summary.json`` into ``--out`` and prints a verdict:

* RSS growth after warm-up < 2 % (median of the first 10 post-warm-up samples vs the last 10),
* VRAM growth after warm-up < 2 % (when there is a GPU),
* deadline-miss rate 0 after warm-up (actions published after their deadline and timer ticks that never ran,
  as the node counts them); misses during warm-up, which covers the camera's start, are reported beside it but
  not judged (when the replay's publisher appears, one cycle of the node has been seen to take ~325 ms, 8 ticks
  missed; the cause, DDS matching or the first messages, is not established),
* the node stayed alive and kept publishing.

Exit status 0 when the verdict passes, 1 when it fails, 2 when the run could not start.

Also writes ``samples.png`` (RSS, VRAM and cycle latency over time, the warm-up shaded) beside the CSV,
and shows a progress bar (elapsed seconds, RSS, cycles, late cycles) on stderr.

Generated assets go to the cache dir of vla-edge-demo ($VLA_EDGE_CACHE, else out/cache in-tree,
else $XDG_CACHE_HOME/vla_edge_ros); results only to ``--out``.

Usage examples:
  vla-edge-soak --minutes 10                      # tiny preset, kv 512 on CPU, generated 60 Hz clip
  vla-edge-soak --seconds 60 --preset micro --out /tmp/soak
  vla-edge-soak --minutes 60 --model DIR --source BAG --backend cuda -p realtime_priority:=10
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import math
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..cache import cache_root
from ..constants import CPU_KV_CAPACITY_TOKENS, PERIOD_MS
from ..model.checkpoint import check_model_path
from .cli import (Parser, add_setting_options, check_out_dir, check_source, fail, finite_non_negative, finite_positive,
                  positive_int)
from .outputs import bringup_commands, child_env, ensure_model, stop_processes

CSV_FIELDS = ("t_s", "rss_mb", "vram_mb", "cycles", "model", "fallback", "late", "cycle_ms_p50", "cycle_ms_p99",
              "chunk_ms_p50", "reasons", "diag_cycles", "diag_deadline_misses", "frames_dropped", "frames_published",
              "camera_rate_hz", "frames_invalid", "cache_fill", "retained_frames", "ema_estimate_ms")


def read_rss_mb(pid: int) -> float | None:
    """Return the resident set size (VmRSS) of a process in MiB (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        return None
    return None


def _num(v) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def growth_pct(values: list[float], n: int = 10) -> float | None:
    """Growth (%) from the median of the first ``n`` values to the median of the last ``n``."""
    vals = [v for v in values if v is not None]
    if len(vals) < 2:
        return None
    k = max(1, min(n, len(vals) // 2))
    a, b = float(np.median(vals[:k])), float(np.median(vals[-k:]))
    return (b - a) / a * 100.0 if a > 0 else None


def quality_summary(diag: dict) -> dict:
    """The camera-quality status's counts at the end of the soak (/diagnostics, cumulative over the run): frames
    checked and refused, failing frames and trips per check, the ticks given frame_quality fallbacks."""
    from ..frame_quality import CHECKS

    if diag.get("quality_checks") != "on":
        return {"checks": diag.get("quality_checks", "unknown")}
    keys = ["quality_frames_checked", "quality_frames_refused", "quality_ticks_refused", "quality_tripped",
            *(f"quality_{kind}_{c}" for c in CHECKS for kind in ("failed", "trips"))]
    out = {"checks": "on"}
    for k in keys:
        v = diag.get(k)
        out[k[len("quality_"):]] = v if k == "quality_tripped" else _num(v)
    return out


def quality_line(q: dict) -> str:
    """One line of the printed summary: the camera-quality counts."""
    if q.get("checks") != "on":
        return f"checks {q.get('checks')}"
    failed = ", ".join(f"{k[len('failed_'):]} {int(v)} ({int(q.get('trips_' + k[len('failed_'):]) or 0)} trips)"
                       for k, v in q.items() if k.startswith("failed_") and v)
    return (f"{int(q.get('frames_checked') or 0)} frames checked, {int(q.get('frames_refused') or 0)} refused, "
            f"{int(q.get('ticks_refused') or 0)} frame_quality ticks; tripped now {q.get('tripped')}"
            + (f"; failing: {failed}" if failed else ""))


def verdict(summary: dict, max_rss_growth: float, max_vram_growth: float, max_miss_rate: float) -> list[str]:
    """Return the failed checks (empty: pass)."""
    bad = []
    g = summary["rss_growth_pct"]
    if g is None:
        bad.append("no RSS samples after warm-up")
    elif g >= max_rss_growth:
        bad.append(f"RSS grew {g:.2f} % after warm-up (limit {max_rss_growth} %)")
    v = summary["vram_growth_pct"]
    if v is not None and v >= max_vram_growth:
        bad.append(f"VRAM grew {v:.2f} % after warm-up (limit {max_vram_growth} %)")
    if summary["cycles"] == 0:
        bad.append("no cycles")
    elif summary["deadline_miss_rate_after_warmup"] > max_miss_rate:
        bad.append(f"deadline-miss rate after warm-up {summary['deadline_miss_rate_after_warmup']:.5f} "
                   f"({summary['deadline_misses_after_warmup']} of {summary['cycles_after_warmup']} cycles; limit "
                   f"{max_miss_rate})")
    if not summary["node_alive"]:
        bad.append(f"vla_edge exited during the soak (status {summary['node_exit']})")
    if summary["cycles"] and abs(summary["action_rate_hz"] - summary["expected_rate_hz"]) > 3.0:
        bad.append(f"action rate {summary['action_rate_hz']:.1f} Hz, want {summary['expected_rate_hz']:.1f} +- 3")
    return bad


def _pct_text(x) -> str:
    return "n/a" if x is None else f"{x:+.2f} %"


def write_plot(rows: list[dict], path: Path, warmup_s: float, period_ms: float, summary: dict) -> None:
    """samples.png: RSS, VRAM and cycle latency (p50/p99 of each second) on one time axis, warm-up shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["t_s"] for r in rows]

    def series(key):
        return [np.nan if r[key] is None else r[key] for r in rows]

    fig, axes = plt.subplots(3, 1, figsize=(9, 7.5), sharex=True)
    panels = [
        (axes[0], [("rss_mb", "RSS", "tab:blue")], "RSS (MiB)",
         f"vla_edge RSS: growth {_pct_text(summary.get('rss_growth_pct'))} after warm-up"),
        (axes[1], [("vram_mb", "VRAM peak", "tab:purple")], "VRAM (MiB)",
         "VRAM peak (none on the NumPy backend)" if all(r["vram_mb"] is None for r in rows) else
         f"VRAM peak: growth {_pct_text(summary.get('vram_growth_pct'))} after warm-up"),
        (axes[2], [("cycle_ms_p50", "cycle p50", "tab:green"), ("cycle_ms_p99", "cycle p99", "tab:orange"),
                   ("chunk_ms_p50", "chunk p50", "tab:gray")], "ms (per second)",
         f"cycle latency (tick -> publish); deadline misses {summary.get('deadline_misses')}"),
    ]
    for ax, keys, ylabel, title in panels:
        for key, label, color in keys:
            ax.plot(t, series(key), label=label, color=color, linewidth=1)
        ax.axvspan(0, warmup_s, color="0.9", label="warm-up (not judged)")
        ax.set(ylabel=ylabel, title=title)
        ax.legend(fontsize=7, loc="upper right")
    axes[2].axhline(period_ms, color="red", linestyle="--", linewidth=1, label=f"deadline {period_ms:g} ms")
    late_t = [r["t_s"] for r in rows if r["late"]]
    if late_t:
        axes[2].plot(late_t, [period_ms] * len(late_t), "rv", markersize=5, label="second with a late cycle")
    axes[2].legend(fontsize=7, loc="upper right")
    axes[2].set_xlabel("time since the first cycle (s)")
    fig.suptitle(f"vla-edge-soak: {summary.get('verdict', '?').upper()} ({summary.get('backend')}, "
                 f"{summary.get('duration_s')} s)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def ensure_clip(cache: Path, fps: float, width: int, height: int) -> Path:
    from ..synthetic_bag import make_test_bag

    clip = cache / f"soak_clip_{width}x{height}_{fps:g}hz_v1"
    if not (clip / "metadata.yaml").is_file():
        print(f"[soak] generating a {fps:g} Hz synthetic clip into {clip}", flush=True)
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cache / f"soak_clip_tmp{os.getpid()}"
        make_test_bag(tmp, frames=int(round(5 * fps)), fps=fps, width=width, height=height)
        tmp.rename(clip)
    return clip


def build_parser() -> Parser:
    from ..model.config import PRESETS

    ap = Parser(prog="vla-edge-soak", description=__doc__.split("\n\n")[0],
                epilog=__doc__[__doc__.index("Usage examples:"):], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=finite_positive, default=None, help="soak length in minutes (default: 10)")
    ap.add_argument("--seconds", type=finite_positive, default=None,
                    help="soak length in seconds; overrides --minutes (default: unset)")
    ap.add_argument("--warmup", type=finite_non_negative, default=None,
                    help="seconds excluded from the growth checks (default: 60, at most a quarter of the run)")
    ap.add_argument("--source", help="bag / video / image folder to replay (default: a generated clip)")
    ap.add_argument("--fps", type=finite_positive, default=60.0, help="frame rate of the generated clip (default: 60)")
    ap.add_argument("--width", type=positive_int, default=320, help="width of the generated clip (default: 320)")
    ap.add_argument("--height", type=positive_int, default=240, help="height of the generated clip (default: 240)")
    ap.add_argument("--model", help="model dir (default: the generated --preset model)")
    ap.add_argument("--preset", default="tiny", choices=sorted(PRESETS),
                    help="model to generate when --model is not given (default: tiny)")
    add_setting_options(ap, ("policy", "backend", "kv_capacity_tokens"), flags={"kv_capacity_tokens": "--kv-capacity"},
                        defaults={"kv_capacity_tokens": None},
                        helps={"kv_capacity_tokens": f"{CPU_KV_CAPACITY_TOKENS} on the NumPy backend, as "
                                                     "vla-edge-demo; the config's on CUDA"})
    ap.add_argument("-p", "--param", action="append", default=[], metavar="NAME:=VALUE",
                    help="extra vla_edge parameter, repeatable (default: none)")
    ap.add_argument("--out", help="output directory, must be new or empty (default: ./soak-YYYYmmdd-HHMMSS)")
    ap.add_argument("--max-rss-growth", type=finite_non_negative, default=2.0,
                    help="largest RSS growth after warm-up that passes, percent (default: 2)")
    ap.add_argument("--max-vram-growth", type=finite_non_negative, default=2.0,
                    help="largest VRAM growth after warm-up that passes, percent (default: 2)")
    ap.add_argument("--max-miss-rate", type=finite_non_negative, default=0.0,
                    help="largest deadline-miss rate that passes (default: 0)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar (default: show it)")
    ap.add_argument("--verbose", action="store_true",
                    help="kept for compatibility: the children's logs always go to --out (default: off)")
    return ap


def parse_args(argv=None):
    ap = build_parser()
    a = ap.parse_args(argv)
    a.duration = a.seconds if a.seconds is not None else 60.0 * (a.minutes if a.minutes is not None else 10.0)
    if a.warmup is None:
        a.warmup = min(60.0, a.duration / 4.0)
    if not a.warmup < a.duration:
        ap.error("--warmup must be shorter than the soak")
    for p in a.param:
        if ":=" not in p or not p.split(":=", 1)[0]:
            ap.error(f"-p {p!r}: expected NAME:=VALUE")
    if any(p.startswith("period_ms:=") for p in a.param):
        try:
            a.period_ms = finite_positive([p for p in a.param if p.startswith("period_ms:=")][-1].split(":=", 1)[1])
        except argparse.ArgumentTypeError as e:
            ap.error(f"-p period_ms: {e}")
    else:
        a.period_ms = PERIOD_MS
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    out_dir = Path(a.out or f"soak-{time.strftime('%Y%m%d-%H%M%S')}").expanduser().resolve()
    for problem in (check_out_dir(str(out_dir)), check_source(a.source) if a.source else None,
                    check_model_path(a.model) if a.model else None):
        if problem:
            return fail("vla-edge-soak", problem)
    out_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    if "ROS_DOMAIN_ID" not in os.environ:
        os.environ["ROS_DOMAIN_ID"] = str(random.randint(1, 100))
    cache = cache_root()
    model = ensure_model(cache, a.model, a.preset, tag="soak")
    source = a.source or str(ensure_clip(cache, a.fps, a.width, a.height))

    import rclpy

    from ..engine import cuda_available
    from .outputs import OutputListener

    env = child_env()
    on_gpu = a.backend == "cuda" or (a.backend == "auto" and cuda_available())
    kv_cap = a.kv_capacity_tokens or (None if on_gpu else CPU_KV_CAPACITY_TOKENS)
    node_cmd, replay_cmd = bringup_commands(model, source, a.policy, a.backend, kv_cap, a.param, quiet_replay=True)
    period_ms = a.period_ms

    print(f"[soak] ROS_DOMAIN_ID={os.environ['ROS_DOMAIN_ID']} model={model} source={source} "
          f"duration={a.duration:.0f} s warm-up={a.warmup:.0f} s out={out_dir}", flush=True)
    (out_dir / "command.txt").write_text(" ".join(node_cmd) + "\n" + " ".join(replay_cmd) + "\n")

    rclpy.init()
    n = rclpy.create_node("vla_edge_soak")
    outputs = OutputListener(n, cycle_depth=200)
    lock, cyc_buf = outputs.lock, outputs.cycles
    stop_spin = threading.Event()

    def spin():
        while not stop_spin.is_set():
            try:
                rclpy.spin_once(n, timeout_sec=0.05)
            except Exception:  # noqa: BLE001 - shutdown race
                break

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    node_log = open(out_dir / "vla_edge.log", "wb")
    replay_log = open(out_dir / "replay.log", "wb")
    procs: list[subprocess.Popen] = []
    rows: list[dict] = []
    totals = collections.Counter()
    reason_totals = collections.Counter()
    all_cycle_ms: list[float] = []
    all_chunk_ms: list[float] = []
    late_cycles: list[dict] = []  # the first late cycles in full, for the post-mortem
    rc = 0
    summary: dict = {}
    try:
        procs.append(subprocess.Popen(node_cmd, env=env, stdout=node_log, stderr=subprocess.STDOUT))
        node = procs[0]
        t_start = time.monotonic()
        while True:
            with lock:
                if cyc_buf and outputs.diag:
                    break
            if node.poll() is not None:
                print(f"[soak] vla_edge exited with {node.returncode} before its first cycle; see "
                      f"{out_dir / 'vla_edge.log'}", file=sys.stderr)
                return 2
            if time.monotonic() - t_start > 180:
                print("[soak] no cycle within 180 s", file=sys.stderr)
                return 2
            time.sleep(0.1)
        procs.append(subprocess.Popen(replay_cmd, env=env, stdout=replay_log, stderr=subprocess.STDOUT))
        with lock:
            cyc_buf.clear()
            d0 = dict(outputs.diag)
        t0 = time.monotonic()
        print(f"[soak] first cycle after {t0 - t_start:.1f} s; soaking {a.duration:.0f} s", flush=True)
        diag_cycles0 = int(_num(d0.get("cycles")) or 0)
        diag_miss0 = int(_num(d0.get("deadline_misses")) or 0)
        with open(out_dir / "samples.csv", "w", newline="") as fcsv:
            w = csv.DictWriter(fcsv, fieldnames=CSV_FIELDS)
            w.writeheader()
            k = 1
            progress = tqdm(total=int(math.ceil(a.duration)), unit="s", file=sys.stderr, disable=a.quiet,
                            mininterval=2.0, desc="vla-edge-soak", leave=False)
            while True:
                target = t0 + k
                time.sleep(max(0.0, target - time.monotonic()))
                now = time.monotonic() - t0
                with lock:
                    batch, cyc_buf[:] = list(cyc_buf), []
                    d = dict(outputs.diag)
                rss = read_rss_mb(node.pid)
                reasons = collections.Counter(c.get("reason", "?") for c in batch)
                cms = [x for x in (_num(c.get("cycle_ms")) for c in batch) if x is not None]
                chk = [x for x in (_num(c.get("chunk_ms")) for c in batch if c.get("reason") == "fresh")
                       if x is not None]
                late = sum(c.get("late") == "True" for c in batch)
                late_cycles += [dict(c, t_s=round(now, 1)) for c in batch if c.get("late") == "True"][
                    :max(0, 50 - len(late_cycles))]
                model_n = sum(c.get("source") == "model" for c in batch)
                all_cycle_ms += cms
                all_chunk_ms += chk
                totals.update(cycles=len(batch), model=model_n, fallback=len(batch) - model_n, late=late)
                reason_totals.update(reasons)
                row = {
                    "t_s": round(now, 3), "rss_mb": rss, "vram_mb": _num(d.get("vram_peak_mb")),
                    "cycles": len(batch), "model": model_n, "fallback": len(batch) - model_n, "late": late,
                    "cycle_ms_p50": float(np.percentile(cms, 50)) if cms else None,
                    "cycle_ms_p99": float(np.percentile(cms, 99)) if cms else None,
                    "chunk_ms_p50": float(np.percentile(chk, 50)) if chk else None,
                    "reasons": ";".join(f"{r}={c}" for r, c in sorted(reasons.items())),
                    "diag_cycles": _num(d.get("cycles")), "diag_deadline_misses": _num(d.get("deadline_misses")),
                    "frames_dropped": _num(d.get("frames_dropped")),
                    "frames_published": _num(d.get("frames_published")),
                    "camera_rate_hz": _num(d.get("camera_rate_hz")), "frames_invalid": _num(d.get("frames_invalid")),
                    "cache_fill": _num(d.get("cache_fill")), "retained_frames": _num(d.get("retained_frames")),
                    "ema_estimate_ms": _num(d.get("ema_estimate")),
                }
                rows.append(row)
                w.writerow(row)
                fcsv.flush()
                if node.poll() is not None or now >= a.duration:
                    break
                progress.update(1)
                progress.set_postfix_str(f"rss {rss if rss is None else round(rss, 1)} MiB, cycles "
                                         f"{totals['cycles']}, model {totals['model']}, late {totals['late']}",
                                         refresh=False)
                k += 1
            progress.close()
        t1 = time.monotonic()
        time.sleep(1.5)  # one more /diagnostics roll-up
        with lock:
            d_end = dict(outputs.diag)
        window = t1 - t0
        post = [r for r in rows if r["t_s"] >= a.warmup]
        rss_post = [r["rss_mb"] for r in post if r["rss_mb"] is not None]
        vram_post = [r["vram_mb"] for r in post if r["vram_mb"] is not None]
        diag_cycles = int(_num(d_end.get("cycles")) or 0) - diag_cycles0
        diag_miss = int(_num(d_end.get("deadline_misses")) or 0) - diag_miss0
        cycles = max(totals["cycles"], diag_cycles)
        misses = max(totals["late"], diag_miss)
        # after warm-up: the node's counters at the first post-warm-up sample, and the late cycles seen since
        first_post = post[0] if post else None
        miss_at_warmup = int(_num(first_post["diag_deadline_misses"]) or 0) - diag_miss0 if first_post else misses
        cycles_at_warmup = int(_num(first_post["diag_cycles"]) or 0) - diag_cycles0 if first_post else cycles
        late_post = sum(r["late"] for r in post[1:])
        cycles_post = max(sum(r["cycles"] for r in post[1:]), diag_cycles - cycles_at_warmup)
        misses_post = max(late_post, diag_miss - miss_at_warmup)
        summary = {
            "duration_s": round(window, 1), "warmup_s": a.warmup, "model": model, "source": source,
            "backend": d_end.get("backend"), "policy": a.policy, "kv_capacity_tokens": kv_cap,
            "node_command": node_cmd, "replay_command": replay_cmd,
            "rss_mb_start": rss_post[0] if rss_post else None, "rss_mb_end": rss_post[-1] if rss_post else None,
            "rss_mb_min": min(rss_post) if rss_post else None, "rss_mb_max": max(rss_post) if rss_post else None,
            "rss_mb_first_sample": rows[0]["rss_mb"] if rows else None,
            "rss_growth_pct": growth_pct(rss_post),
            "vram_mb_start": vram_post[0] if vram_post else None, "vram_mb_end": vram_post[-1] if vram_post else None,
            "vram_growth_pct": growth_pct(vram_post),
            "cycles": cycles, "cycles_seen": totals["cycles"], "model_actions": totals["model"],
            "fallbacks": totals["fallback"], "reasons": dict(reason_totals),
            "deadline_misses": misses, "deadline_miss_rate": misses / cycles if cycles else 0.0,
            "cycles_after_warmup": cycles_post, "model_actions_after_warmup": sum(r["model"] for r in post[1:]),
            "deadline_misses_after_warmup": misses_post,
            "deadline_miss_rate_after_warmup": misses_post / cycles_post if cycles_post else 0.0,
            "expected_rate_hz": 1000.0 / period_ms, "action_rate_hz": totals["cycles"] / window if window else 0.0,
            "cycle_ms_p50": float(np.percentile(all_cycle_ms, 50)) if all_cycle_ms else None,
            "cycle_ms_p99": float(np.percentile(all_cycle_ms, 99)) if all_cycle_ms else None,
            "cycle_ms_max": max(all_cycle_ms) if all_cycle_ms else None,
            "chunk_ms_p50": float(np.percentile(all_chunk_ms, 50)) if all_chunk_ms else None,
            "chunk_ms_p99": float(np.percentile(all_chunk_ms, 99)) if all_chunk_ms else None,
            "camera_rate_hz": _num(d_end.get("camera_rate_hz")),
            "frames_published": _num(d_end.get("frames_published")),
            "frames_dropped": _num(d_end.get("frames_dropped")),
            "frames_invalid": _num(d_end.get("frames_invalid")),
            "frame_quality": quality_summary(d_end),
            "node_alive": node.poll() is None, "node_exit": node.returncode,
            "late_cycles": [{k: c.get(k) for k in ("t_s", "cycle", "reason", "cycle_ms", "since_scheduled_tick_ms",
                                                   "jitter_ms", "chunk_ms", "probe")} for c in late_cycles],
        }
        bad = verdict(summary, a.max_rss_growth, a.max_vram_growth, a.max_miss_rate)
        summary["verdict"] = "pass" if not bad else "fail"
        summary["failures"] = bad
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        write_plot(rows, out_dir / "samples.png", a.warmup, period_ms, summary)
        rc = 0 if not bad else 1

        def f(x, fmt=".2f"):
            return "n/a" if x is None else format(x, fmt)

        print("\n==== vla-edge-soak summary ====")
        print(f"window        {window:.0f} s (warm-up {a.warmup:.0f} s), backend {summary['backend']}, "
              f"model {model}")
        print(f"RSS           {f(summary['rss_mb_start'], '.1f')} -> {f(summary['rss_mb_end'], '.1f')} MiB after "
              f"warm-up (growth {f(summary['rss_growth_pct'])} %, max {f(summary['rss_mb_max'], '.1f')})")
        print(f"VRAM peak     {f(summary['vram_mb_start'], '.1f')} -> {f(summary['vram_mb_end'], '.1f')} MiB "
              f"(growth {f(summary['vram_growth_pct'])} %)")
        print(f"cycles        {cycles} at {summary['action_rate_hz']:.1f} Hz; model {totals['model']}, "
              f"fallbacks {totals['fallback']} {dict(reason_totals)}")
        print(f"deadline miss {misses} (rate {summary['deadline_miss_rate']:.5f}); after warm-up {misses_post} of "
              f"{cycles_post} (rate {summary['deadline_miss_rate_after_warmup']:.5f})")
        print(f"cycle latency p50 {f(summary['cycle_ms_p50'])} ms, p99 {f(summary['cycle_ms_p99'])} ms, max "
              f"{f(summary['cycle_ms_max'])} ms; chunk p50 {f(summary['chunk_ms_p50'])} ms, p99 "
              f"{f(summary['chunk_ms_p99'])} ms")
        print(f"camera        {f(summary['camera_rate_hz'], '.1f')} Hz, published "
              f"{f(summary['frames_published'], '.0f')}, dropped {f(summary['frames_dropped'], '.0f')}, invalid "
              f"{f(summary['frames_invalid'], '.0f')}")
        print(f"frame quality {quality_line(summary['frame_quality'])}")
        print(f"verdict       {summary['verdict'].upper()}" + ("" if not bad else ": " + "; ".join(bad)))
        print(f"files         {out_dir / 'samples.csv'}, {out_dir / 'samples.png'}, {out_dir / 'summary.json'}",
              flush=True)
    except KeyboardInterrupt:
        rc = 130
    finally:
        stop_processes(procs)
        node_log.close()
        replay_log.close()
        stop_spin.set()
        spinner.join(2)
        n.destroy_node()
        rclpy.try_shutdown()
        if summary and procs and procs[0].returncode not in (0, None) and summary.get("node_alive"):
            print(f"[soak] note: vla_edge exited with {procs[0].returncode} at shutdown", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
