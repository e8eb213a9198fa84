# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""vla-edge-fleet's report from its per-bag results: fleet.json, fleet.md and fleet.png.

fleet.json has the keys of vla-edge-bench's report.json (the header, then "clips": one bench clip entry per bag
that ran, with its "fleet" row added), so one reader serves both; beside them "bags" (every bag's status, the failed
ones with their one-line reason) and "fleet" (the aggregates). No Ray here: the report is plain data.
"""
from __future__ import annotations

import numpy as np

from ..diagnostics import FALLBACK_REASONS

# The per-bag scalars the aggregates are taken over (a row: one bag x one model/policy key)
ROW_METRICS = ("cycles", "model_actions", "model_share", "plan_share", "acting_share", "deadline_misses",
               "fallbacks_total", "chunk_ms_p50", "chunk_ms_p99", "frame_age_ms_p50", "frame_age_ms_p99",
               "boundary_jump_mean", "wall_s")
WORST_BAGS = 10
WORST_KEYS = ("name", "bag", "key", "deadline_misses", "fallbacks_total", "cycles", "model_share")
CLIP_FLEET_KEYS = ("bag", "metadata", "seconds", "camera_hz", "wall_s", "worker", "worker_restarted")


def bag_rows(result: dict) -> list[dict]:
    """One row per model/policy key of a bag that ran: the scalars of ROW_METRICS and its fallbacks by reason."""
    rows = []
    clip = result["clip"]
    for key, m in clip["policies"].items():
        cycles = m["cycles"]
        sm = m.get("smoothness") or {}
        rows.append({
            "bag": result["bag"], "name": clip["name"], "key": key, "metadata": result.get("metadata", {}),
            "cycles": cycles, "model_actions": m["model_actions"], "model_share": m["model_actions"] / max(1, cycles),
            "plan_share": m.get("plan_share"), "acting_share": m.get("acting_share"),
            "deadline_misses": m["deadline_misses"], "fallbacks": dict(m["fallbacks"]),
            "fallbacks_total": sum(m["fallbacks"].values()),
            "chunk_ms_p50": m["chunk_ms"]["p50"], "chunk_ms_p99": m["chunk_ms"]["p99"],
            "frame_age_ms_p50": m["frame_age_ms"]["p50"], "frame_age_ms_p99": m["frame_age_ms"]["p99"],
            "boundary_jump_mean": sm.get("boundary_jump_mean"), "wall_s": result.get("wall_s"),
        })
    return rows


def spread(values) -> dict | None:
    """p50 / p90 / p99 / min / max / mean of the values that are numbers (None where there are none)."""
    x = np.array([v for v in values if isinstance(v, (int, float)) and np.isfinite(v)], dtype=float)
    if not x.size:
        return None
    return {"p50": float(np.percentile(x, 50)), "p90": float(np.percentile(x, 90)),
            "p99": float(np.percentile(x, 99)), "min": float(x.min()), "max": float(x.max()),
            "mean": float(x.mean()), "n": int(x.size)}


def _totals(rows: list[dict]) -> dict:
    cycles = sum(r["cycles"] for r in rows)
    fb = {reason: sum(r["fallbacks"].get(reason, 0) for r in rows) for reason in FALLBACK_REASONS}
    return {"rows": len(rows), "cycles": cycles, "model_actions": sum(r["model_actions"] for r in rows),
            "model_share": sum(r["model_actions"] for r in rows) / max(1, cycles),
            "deadline_misses": sum(r["deadline_misses"] for r in rows),
            "rows_with_misses": sum(r["deadline_misses"] > 0 for r in rows),
            "fallbacks": {k: v for k, v in fb.items() if v}, "fallbacks_total": sum(fb.values())}


def aggregate(results: list[dict], run: dict) -> dict:
    """The fleet section: per model/policy key the totals and the spread of every ROW_METRICS value over the bags,
    the worst rows by misses then fallbacks, the totals per metadata value, and the run's own counts."""
    ok = [r for r in results if r["status"] == "ok"]
    rows = [row for r in ok for row in bag_rows(r)]
    keys = sorted({row["key"] for row in rows})
    per_key = {}
    for key in keys:
        sel = [row for row in rows if row["key"] == key]
        per_key[key] = {"totals": _totals(sel), "over_bags": {m: spread(row[m] for row in sel) for m in ROW_METRICS}}
    worst = sorted(rows, key=lambda r: (-r["deadline_misses"], -r["fallbacks_total"], r["name"]))[:WORST_BAGS]
    groups: dict = {}
    for field in sorted({k for row in rows for k in row["metadata"]}):
        values = sorted({str(row["metadata"].get(field, "")) for row in rows})
        groups[field] = {v: {"bags": len({row["bag"] for row in rows if str(row["metadata"].get(field, "")) == v}),
                             **_totals([row for row in rows if str(row["metadata"].get(field, "")) == v])}
                         for v in values}
    failed = [r for r in results if r["status"] != "ok"]
    return {"bags": len(results), "bags_ok": len(ok), "bags_failed": len(failed), **run,
            "per_key": per_key,
            "worst": [{k: row[k] for k in WORST_KEYS} for row in worst],
            "groups": groups}


def build_report(header: dict, results: list[dict], run: dict) -> dict:
    """fleet.json: the bench header, the bench clip entries of the bags that ran (each with its "fleet" row), every
    bag's status, the aggregates."""
    clips = []
    for r in results:
        if r["status"] == "ok":
            clips.append({**r["clip"], "fleet": {k: r.get(k) for k in CLIP_FLEET_KEYS}})
    bags = [{k: r.get(k) for k in ("bag", "name", "status", "error", "metadata", "wall_s", "worker",
                                   "worker_restarted", "resumed")} for r in results]
    return {**header, "clips": clips, "bags": bags, "fleet": aggregate(results, run)}


def _cell(x) -> str:
    """Text for a Markdown table cell: a '|' in a bag name, an error or a metadata value would end the cell."""
    return str(x).replace("|", "\\|")


def _f(x, digits=1) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def write_markdown(report: dict, path: str) -> None:
    """fleet.md: what ran, the fleet totals and spreads per key, the worst bags, the groups, one row per bag."""
    f = report["fleet"]
    c = report["config"]
    lines = [f"# vla-edge-fleet report ({report['date']})", "",
             f"{'Complete' if f['complete'] else '**Incomplete** (interrupted)'}: {f['bags_ok']} of {f['bags']} bags "
             f"ran, {f['bags_failed']} failed, {f['bags_pending']} not run; {f['bags_resumed']} taken from an earlier "
             f"run (--resume). {f['workers']} workers on Ray {f['ray_version']} ({f['ray_mode']}), "
             f"{_f(f['wall_s'], 0)} s wall, {_f(f['bags_per_hour'], 0)} bags/hour"
             + (f", GPU utilisation mean {_f(f['gpu_utilization']['mean'], 0)} % "
                f"(max {_f(f['gpu_utilization']['max'], 0)} %)" if f.get("gpu_utilization") else "") + ".", "",
             f"Backend `{report['backend']}` on {report['machine']['cpu']} ({report['machine']['cpu_count']} cores)"
             + (f", GPU {report['machine']['gpu']}" if report["machine"]["gpu"] else "")
             + f"; model {report['model']['name']}; period {c['period_ms']} ms (margin {c['safety_margin_ms']} ms); "
               f"each bag at {'its own rate' if c['camera_hz'] is None else str(c['camera_hz']) + ' Hz'} for "
               f"{'its own length' if c['seconds'] is None else str(c['seconds']) + ' s'}.", "",
             f"Command: `{report['command']}`", ""]
    lines += ["## Fleet", "", "| key | bags | cycles | model share | deadline misses (bags with any) | fallbacks | "
              "chunk p50 ms over bags p50/p99 | chunk p99 ms over bags p50/max | frame age p50 ms |",
              "|---|---|---|---|---|---|---|---|---|"]
    for key, k in f["per_key"].items():
        t, ob = k["totals"], k["over_bags"]
        fb = ", ".join(f"{r} {n}" for r, n in t["fallbacks"].items())
        c50, c99, age = ob["chunk_ms_p50"] or {}, ob["chunk_ms_p99"] or {}, ob["frame_age_ms_p50"] or {}
        lines.append(f"| {key} | {t['rows']} | {t['cycles']} | {t['model_share']:.3f} | {t['deadline_misses']} "
                     f"({t['rows_with_misses']}) | {t['fallbacks_total']}{' (' + fb + ')' if fb else ''} | "
                     f"{_f(c50.get('p50'))}/{_f(c50.get('p99'))} | {_f(c99.get('p50'))}/{_f(c99.get('max'))} | "
                     f"{_f(age.get('p50'))} |")
    lines += ["", "## Worst bags (by deadline misses, then fallbacks)", "",
              "| bag | key | misses | fallbacks | cycles | model share |", "|---|---|---|---|---|---|"]
    lines += [f"| {_cell(w['name'])} | {w['key']} | {w['deadline_misses']} | {w['fallbacks_total']} | {w['cycles']} | "
              f"{w['model_share']:.3f} |" for w in f["worst"]]
    for field, values in f["groups"].items():
        lines += ["", f"## By {_cell(field)}", "", f"| {_cell(field)} | bags | cycles | model share | misses | "
                  "fallbacks |", "|---|---|---|---|---|---|"]
        lines += [f"| {_cell(v)} | {g['bags']} | {g['cycles']} | {g['model_share']:.3f} | {g['deadline_misses']} | "
                  f"{g['fallbacks_total']} |" for v, g in values.items()]
    lines += ["", "## Bags", "", "| bag | status | key | cycles | model | plan share | misses | fallbacks | "
              "chunk p50/p99 ms | frame age p50 ms | wall s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    by_bag = {clip["fleet"]["bag"]: clip for clip in report["clips"]}
    for b in report["bags"]:
        clip = by_bag.get(b["bag"])
        if clip is None:
            lines.append(f"| {_cell(b['name'])} | {b['status']}: {_cell(b['error'] or '')} | | | | | | | | | |")
            continue
        for key, m in clip["policies"].items():
            fb = ", ".join(f"{r} {n}" for r, n in m["fallbacks"].items() if n)
            lines.append(f"| {_cell(b['name'])} | ok{' (resumed)' if b.get('resumed') else ''}"
                         f"{' (worker restarted)' if b.get('worker_restarted') else ''} | {key} | {m['cycles']} | "
                         f"{m['model_actions']} | {_f(m.get('plan_share'), 3)} | {m['deadline_misses']} | "
                         f"{sum(m['fallbacks'].values())}{' (' + fb + ')' if fb else ''} | "
                         f"{_f(m['chunk_ms']['p50'])}/{_f(m['chunk_ms']['p99'])} | {_f(m['frame_age_ms']['p50'])} | "
                         f"{_f(b.get('wall_s'))} |")
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")


def write_plot(report: dict, path: str, max_rows: int = 40) -> None:
    """fleet.png: per bag and key, the share of ticks by what was published (model, plan, each fallback reason),
    worst first; beside it the chunk p50 / p99 of the same rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .bench import OUTCOME_COLORS

    rows = [row for clip in report["clips"] for row in bag_rows({"bag": clip["fleet"]["bag"], "clip": clip})]
    rows = sorted(rows, key=lambda r: (-r["deadline_misses"], -r["fallbacks_total"], r["name"]))[:max_rows]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 1.5 + 0.28 * max(1, len(rows))), sharey=True,
                                  gridspec_kw={"width_ratios": [3, 1]})
    labels = [f"{r['name']} {r['key']}" for r in rows]
    y = np.arange(len(rows))
    left = np.zeros(len(rows))
    parts = [("model", [r["model_share"] for r in rows], OUTCOME_COLORS["fresh"])]
    if any(r["plan_share"] for r in rows):
        parts.append(("plan", [r["plan_share"] or 0.0 for r in rows], OUTCOME_COLORS["plan"]))
    parts += [(reason, [r["fallbacks"].get(reason, 0) / max(1, r["cycles"]) for r in rows],
               OUTCOME_COLORS.get(reason, "#000000")) for reason in FALLBACK_REASONS
              if any(r["fallbacks"].get(reason, 0) for r in rows)]
    for name, share, color in parts:
        ax.barh(y, share, left=left, color=color, label=name, height=0.8)
        left += np.array(share)
    for yi, r in zip(y, rows):
        if r["deadline_misses"]:
            ax.text(1.01, yi, f"{r['deadline_misses']} missed", va="center", fontsize=7, color="#d62728")
    ax.set_yticks(y, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.15)
    ax.set_xlabel("share of ticks")
    ax.legend(fontsize=7, ncol=min(6, len(parts)), loc="lower center", bbox_to_anchor=(0.5, 1.0))
    ax2.scatter([r["chunk_ms_p50"] or np.nan for r in rows], y, s=12, label="chunk p50")
    ax2.scatter([r["chunk_ms_p99"] or np.nan for r in rows], y, s=12, marker="x", label="chunk p99")
    ax2.axvline(report["config"]["period_ms"], color="#d62728", lw=0.8, label="period")
    ax2.set_xlabel("ms")
    ax2.legend(fontsize=7)
    f = report["fleet"]
    fig.suptitle(f"vla-edge-fleet: {f['bags_ok']} of {f['bags']} bags, {f['bags_failed']} failed"
                 + ("" if f["complete"] else " (incomplete)"), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90, format="png")  # the path may be a temporary name
    plt.close(fig)
