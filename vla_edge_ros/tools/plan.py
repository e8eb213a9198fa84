# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""vla-edge-plan: what a model's chunk costs on edge boards, without a GPU.

Prints the VRAM plan, the bytes one chunk must move (by phase, cache full) and, per board, the projected
chunk time (bytes / (board bandwidth x efficiency)) with a fits / does-not-fit verdict against
period - margin. The efficiency and the SM-confined compute/latency bound are the ones measured for the model's own
shape (config/boards.yaml measured.shapes); a shape without a measurement gets floors at 100 % of the bandwidth and
says so (one shape's time is never scaled to another). Last, the measured shapes side by side on every board.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

from .. import edge
from ..constants import ACTION_TOKENS
from ..model.config import ACTION_DECODING
from ..output_dir import write_json_atomic

EXAMPLE = """example:
  vla-edge-plan --model ~/models/qwen2.5-1.5b-vla --board agx-orin --capacity 4096
  vla-edge-plan --model ~/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --weights w4 --decoding parallel
  vla-edge-plan --model ~/models/qwen2.5-1.5b-vla-awq --efficiency 0.6 --json plan.json"""

MB = 1e6
GB = 1e9
MIB = 1 << 20
GIB = 1 << 30
MAX_MAGNITUDE = 1e12  # no option means anything beyond this
MIN_EFFICIENCY = 0.01  # below this the projected times are meaningless (and print with hundreds of digits)


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _setting(name: str):
    """The node's setting (settings.REASONING_SPECS): its default and range are this tool's."""
    from ..settings import REASONING_SPECS, spec_table

    return spec_table(REASONING_SPECS)[name]


def _range_problem(flag: str, name: str, v) -> str | None:
    s = _setting(name)
    if s.lo <= v <= s.hi:
        return None
    v, lo, hi = (f"{x:g}" if isinstance(x, float) else str(x) for x in (v, s.lo, s.hi))
    return f"{flag} {v} must be between {lo} and {hi} (the node's {name})"


def _finite(kind):
    def parse(text):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if isinstance(v, float) and not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if abs(v) > MAX_MAGNITUDE:  # make_plan checks each option's range; this keeps its messages short
            raise argparse.ArgumentTypeError(f"{text[:40]} is out of range")
        return v
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="vla-edge-plan", description="\n\n".join(__doc__.split("\n\n")[:2]), epilog=EXAMPLE,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, metavar="PATH",
                   help="model directory (config.json) or GGUF file (its metadata); weights are not read")
    p.add_argument("--board", default="all", metavar="NAME",
                   help="board name or alias from config/boards.yaml, or 'all' (default: %(default)s)")
    p.add_argument("--capacity", type=_finite(int), default=_setting("kv_capacity_tokens").default, metavar="N",
                   help="KV-cache slots (kv_capacity_tokens); the projection assumes the cache full "
                   "(default: %(default)s, the node's default)")
    p.add_argument("--prompt-tokens", type=_finite(int), default=None, metavar="N",
                   help="pinned prompt length in tokens (default: what the engine uses for this model dir)")
    p.add_argument("--period-ms", type=_finite(float), default=_setting("period_ms").default, metavar="MS",
                   help="control period in ms (default: %(default)s)")
    p.add_argument("--margin-ms", type=_finite(float), metavar="MS",
                   default=_setting("safety_margin_ms").default,
                   help="safety margin kept free at the end of each period, in ms (default: %(default)s)")
    p.add_argument("--efficiency", type=_finite(float), default=None, metavar="F",
                   help="fraction of copy bandwidth the engine reaches, in [0.01, 1] (default: the measured value "
                   "for the weight format when one is recorded, else 1.0 = a floor at full bandwidth)")
    p.add_argument("--weights", choices=("model",) + edge.WEIGHT_FORMATS, default="model",
                   help="what-if: count the layer weights as stored this way instead of as the model dir holds "
                   "them (w4 = int4, group 128, zero points, unless the model names its own; default: %(default)s)")
    p.add_argument("--decoding", choices=("model",) + ACTION_DECODING, default="model",
                   help="what-if: action decoding to count instead of the model's own (only a model trained "
                   "for parallel decoding gives good actions with it; default: %(default)s)")
    p.add_argument("--json", default=None, metavar="OUT",
                   help="also write everything as JSON to this file (default: none)")
    return p


def _fmt_bytes(b: float) -> str:
    return f"{b / GB:.3f} GB" if b >= 0.1 * GB else f"{b / MB:.2f} MB"


def make_plan(a) -> dict:
    """Everything the tool prints, as plain data (EdgeError / ModelLoadError on bad input)."""
    from ..engine import system_prompt_ids
    from ..model.checkpoint import Checkpoint
    from ..vram_plan import cuda_shape_problems, vram_plan

    from ..admission import budget_problem
    from ..kv_cache import capacity_problem

    problem = _range_problem("--capacity", "kv_capacity_tokens", a.capacity)
    if problem:
        raise edge.EdgeError(problem)
    if a.efficiency is not None and not (MIN_EFFICIENCY <= a.efficiency <= 1):
        raise edge.EdgeError(f"--efficiency {a.efficiency:g} must be in (0, 1], at least {MIN_EFFICIENCY:g}: "
                             "a fraction of the copy bandwidth")
    problem = (_range_problem("--period-ms", "period_ms", a.period_ms)
               or _range_problem("--margin-ms", "safety_margin_ms", a.margin_ms))
    if problem:
        raise edge.EdgeError(problem)
    problem = budget_problem(a.period_ms, a.margin_ms)  # the node's one budget rule
    if problem:
        raise edge.EdgeError(f"--period-ms / --margin-ms: {problem}")
    if a.json:
        _check_out(a.json)
    if not os.path.exists(a.model):
        raise edge.EdgeError(f"{a.model}: model directory not found")
    checkpoint = Checkpoint(a.model)
    cfg = checkpoint.config
    prompt = a.prompt_tokens
    if prompt is None:
        prompt = int(len(system_prompt_ids(checkpoint, cfg.vocab_size)))
    if prompt < 0:
        raise edge.EdgeError(f"--prompt-tokens {prompt} must be >= 0")
    problem = capacity_problem(a.capacity, prompt, label=f"--capacity {a.capacity}",
                               action_tokens=cfg.action_tokens)  # the engine's one rule, with the model's K
    if problem:
        raise edge.EdgeError(problem)
    boards_all = edge.load_boards()
    boards = list(boards_all.values()) if a.board.strip().lower() == "all" else [edge.find_board(a.board, boards_all)]
    what_if = [f"--{k} {getattr(a, k)}" for k in ("weights", "decoding") if getattr(a, k) != "model"]
    chunk = edge.chunk_bytes(cfg, a.capacity, prompt_tokens=prompt,
                             weights=None if a.weights == "model" else a.weights,
                             decoding=None if a.decoding == "model" else a.decoding)
    measured = edge.load_measured()
    proj = [edge.project(chunk, b, a.efficiency, a.period_ms, a.margin_ms, cfg=cfg, measured=measured) for b in boards]
    floor = [edge.project(chunk, b, 1.0, a.period_ms, a.margin_ms) for b in boards]
    plan = vram_plan(cfg, a.capacity)
    mem = [edge.memory_fit(plan["total"], b) for b in boards]
    kind = edge.chunk_kind(chunk)
    comp = [edge.compute_bound(kind, b, measured, cfg) for b in boards]
    for f, c in zip(floor, comp):
        if c is not None:
            c["binds"] = "compute/latency" if c["chunk_ms"] > f["chunk_ms"] else "bytes"
            c["verdict"] = "fits" if max(c["chunk_ms"], f["chunk_ms"]) <= f["budget_ms"] else "does not fit"
    shape_name, shape_entry = edge.measured_for(cfg, measured)
    return {
        "model": os.path.abspath(a.model),
        "config": {"hidden_size": cfg.hidden_size, "num_hidden_layers": cfg.num_hidden_layers,
                   "num_attention_heads": cfg.num_attention_heads, "num_key_value_heads": cfg.num_key_value_heads,
                   "intermediate_size": cfg.intermediate_size, "vocab_size": cfg.vocab_size},
        "frames_retained_full": edge.frame_capacity(a.capacity, prompt, ACTION_TOKENS * chunk["action_chunk"]),
        "vram_plan_bytes": plan, "chunk_bytes": chunk,
        "boards": [dict(p, memory=m, source=b.source, floor_chunk_ms=f["chunk_ms"], floor_verdict=f["verdict"],
                        compute_bound=c)
                   for p, m, b, f, c in zip(proj, mem, boards, floor, comp)],
        "period_ms": a.period_ms, "margin_ms": a.margin_ms, "boards_file": edge.boards_path(), "what_if": what_if,
        "kind": kind, "measured_shape": shape_name, "measured_device": edge.measured_device(shape_entry),
        "cuda_shape_problems": cuda_shape_problems(cfg),
        "shapes": shapes_table(kind, boards, measured, a.capacity, a.period_ms, a.margin_ms),
    }


def shapes_table(kind: str, boards, measured: dict, capacity: int, period_ms: float, margin_ms: float) -> list[dict]:
    """The measured shapes of config/boards.yaml side by side, for one kind, on every board: the byte floor (100 %
    bandwidth), the byte time at that shape's own measured efficiency, and that shape's own SM-confined
    compute/latency bound; each shape only with its own measurements (64-token prompt, as measured)."""
    from types import SimpleNamespace

    rows = []
    for name, entry in edge.measured_shapes(measured).items():
        shape = entry.get("shape") or {}
        cfg = SimpleNamespace(**{k: int(v) for k, v in shape.items()}, vocab_size=151936)
        cfg.head_dim = cfg.hidden_size // cfg.num_attention_heads
        fmt, dec = (kind.split("-", 1) + [""])[:2]
        cfg.action_chunk = int(kind.rsplit("-k", 1)[1]) if "-k" in kind else 1  # "w4-parallel-k8": 8 actions
        chunk = edge.chunk_bytes(cfg, capacity, weights=fmt, decoding="parallel" if dec else "autoregressive",
                                 prompt_tokens=64)
        eff = (entry.get("efficiency") or {}).get(kind)
        per_board = []
        for b in boards:
            floor = edge.project(chunk, b, 1.0, period_ms, margin_ms)
            at_eff = edge.project(chunk, b, float(eff), period_ms, margin_ms) if eff else None
            comp = edge.compute_bound(kind, b, entry, cfg)
            worst = max([floor["chunk_ms"]] + [c["chunk_ms"] for c in (comp,) if c])
            per_board.append({"board": b.name, "floor_ms": floor["chunk_ms"],
                              "at_measured_efficiency_ms": at_eff["chunk_ms"] if at_eff else None,
                              "compute_bound_ms": comp["chunk_ms"] if comp else None,
                              "verdict": "fits" if worst <= floor["budget_ms"] else "does not fit",
                              "budget_ms": floor["budget_ms"]})
        rows.append({"shape": name, "device": edge.measured_device(entry),
                     "whole_gpu_chunk_ms": (entry.get("whole_gpu_chunk_ms") or {}).get(kind),
                     "efficiency": eff, "boards": per_board})
    return rows


def render(r: dict) -> str:
    c, ch = r["config"], r["chunk_bytes"]
    fmt = ch["weights"] if ch["weights"] == "bf16" else (
        f"W{ch['bits']}A16, group {ch['group_size']}, {'zero points' if ch['zero_points'] else 'symmetric'}")
    out = [f"model {r['model']}",
           f"  hidden {c['hidden_size']}, {c['num_hidden_layers']} layers, {c['num_attention_heads']}/"
           f"{c['num_key_value_heads']} heads, FFN {c['intermediate_size']}; weights {fmt}; action decoding "
           f"{ch['decoding']}" + (f", {ch['action_chunk']} actions a chunk" if ch["action_chunk"] > 1 else ""),
           f"  KV cache {ch['capacity']} slots, {ch['prompt_tokens']}-token prompt: {r['frames_retained_full']} "
           f"frames when full; a decode pass attends {ch['attended_keys']} keys"]
    if r["what_if"]:
        out.append(f"  what-if ({', '.join(r['what_if'])}): counted as if the model were stored/trained so; "
                   f"the engine runs what the model dir holds")
    out.append("")
    plan = r["vram_plan_bytes"]
    parts = ", ".join(f"{k} {v / MIB:.1f} MiB" for k, v in plan.items() if k != "total")
    out.append(f"VRAM plan (vram_plan.py): {parts}"
               + f"; total {plan['total'] / GIB:.3f} GiB ({plan['total'] / GB:.2f} GB)"
               + (" (the model dir as it is: the what-if does not change it)" if r["what_if"] else ""))
    out += ["", "Bytes one chunk must move (cache full):"]
    rows = [("vision", ch["vision"], "projector + frame"),
            ("prefill", ch["prefill"], f"{ch['prefill_rows']} rows: layer weights + KV")]
    if ch["decode_passes"]:
        rows.append(("decode pass", ch["decode_pass"], f"layer weights + 256 head rows + KV of "
                     f"{ch['attended_keys']} keys; x {ch['decode_passes']} passes"))
        rows.append(("decode", ch["decode"], f"{ch['decode_passes']} passes"))
    else:
        rows.append(("decode", 0, f"none: parallel decoding (the prefill holds the {ch['prefill_rows'] - 32} action "
                     "queries)"))
    rows.append(("total", ch["total"], ""))
    for name, b, what in rows:
        out.append(f"  {name:<12} {_fmt_bytes(b) if b else '-':>11}   {what}".rstrip())
    budget = r["period_ms"] - r["margin_ms"]
    out += ["", f"Projected on each board (budget {budget:g} ms = period {r['period_ms']:g} - margin "
            f"{r['margin_ms']:g} ms):"]
    head = (f"  {'board':<24} {'GB/s':>10} {'floor ms':>9} {'(verdict)':<14} {'eff':>5} {'prefill ms':>10} "
            f"{'pass ms':>8} {'chunk ms':>9}  {'verdict':<13} VRAM plan / memory")
    out.append(head)
    for p in r["boards"]:
        m = p["memory"]
        pass_ms = f"{p['decode_pass_ms']:.2f}" if ch["decode_passes"] else "-"
        bw = f"{p['bandwidth_gbps']:g}" + (" copy" if p["bandwidth_kind"] == "measured copy" else " peak")
        out.append(f"  {p['board']:<24} {bw:>10} {p['floor_chunk_ms']:>9.2f} {'(' + p['floor_verdict'] + ')':<14} "
                   f"{100 * p['efficiency']:>4.0f}% "
                   f"{p['prefill_ms']:>10.2f} {pass_ms:>8} {p['chunk_ms']:>9.2f}  {p['verdict']:<13} "
                   f"{m['plan_bytes'] / GB:.2f} / {m['memory_gb']:g} GB ({100 * m['fraction']:.0f} %"
                   f"{', shared with CPU + OS' if m['shared_memory'] else ''})")
    first = r["boards"][0]
    eff = (edge.FLOOR_NOTE if first["basis"] == "floor"
           else f"{first['basis']} efficiency: {100 * first['efficiency']:.1f} % of copy bandwidth")
    if first["basis"] == "measured":
        eff += f", measured on this model's own shape ({r['measured_shape']})"
    out += ["", "Notes:", "  - " + eff]
    if r["measured_shape"] is None:
        out.append("  - this model's shape has no measurement in the boards file (measured: "
                   f"{', '.join(s['shape'] for s in r['shapes']) or 'none'}): byte floors only, no other shape's "
                   "numbers are used; run chunk_bench on it (whole GPU and --sms N) to add one")
    if r["cuda_shape_problems"]:
        out.append("  - the CUDA engine does not run this shape (" + "; ".join(r["cuda_shape_problems"]) + ")")
    if first["basis"] != "floor":
        out.append("  - floor ms: the same bytes at 100 % of the bandwidth (the optimistic bound). The engine's "
                   f"measured efficiency comes from an {r['measured_device']}, where the chunk is bound by its "
                   "chain of dependent "
                   "kernels rather than by bytes, so the measured-efficiency time is the pessimistic bound for a "
                   "board whose bandwidth is far lower")
    if any(p["bandwidth_kind"] != "measured copy" for p in r["boards"]):
        out.append("  - 'peak': " + edge.PEAK_NOTE + "; 'copy': a measured copy rate")
    out.append("  - bytes are a floor (weights, KV, head, frame; activations not counted); those times scale with "
               "the board's bandwidth only, not its compute or clocks")
    cb = [p for p in r["boards"] if p.get("compute_bound")]
    if cb:
        out += ["", f"Compute/latency bound (the chunk measured on an {r['measured_device']} confined to the board's "
                "SM count by a green context, scaled by clock and per-SM tensor rate; boards.yaml "
                "measured.sm_confined):"]
        for p in cb:
            c = p["compute_bound"]
            out.append(f"  {p['board']:<24} {c['chunk_ms']:>8.1f} ms vs byte floor {p['floor_chunk_ms']:.1f} ms: "
                       f"{c['binds']} binds, {c['verdict']} ({c['basis']})")
    elif r["boards"]:
        out.append("  - no compute/latency bound: this kind and model shape were not measured with the GPU confined to "
                   "a board's SMs (chunk_bench --sms)")
    out += render_shapes(r)
    out.append(f"  - boards: {r['boards_file']}")
    return "\n".join(out)


def _ms(v) -> str:
    return "-" if v is None else f"{v:.1f}"


def render_shapes(r: dict) -> list[str]:
    """The measured shapes side by side (one kind: the model's), per board: floor / at measured efficiency /
    compute bound, and the verdict on the worst of the floor and the compute bound."""
    if not r["shapes"]:
        return []
    kind = r["kind"]
    out = ["", f"Measured shapes, {kind}, on each board (chunk ms: byte floor / bytes at that shape's measured "
           f"efficiency / that shape's SM-confined compute bound; verdict on max(floor, compute)); each shape with its "
           f"own measurements only, 64-token prompt, {r['chunk_bytes']['capacity']} slots:"]
    names = [s["shape"] for s in r["shapes"]]
    out.append(f"  {'board':<24} " + " ".join(f"{n:<34}" for n in names).rstrip())
    whole = " ".join(f"{(_ms(s['whole_gpu_chunk_ms']) + ' ms, ' + s['device']) if s['whole_gpu_chunk_ms'] else '-':<34}"
                     for s in r["shapes"])
    out.append(f"  {'(whole GPU, measured)':<24} {whole}".rstrip())
    for i, b in enumerate(r["shapes"][0]["boards"]):
        cells = []
        for s in r["shapes"]:
            c = s["boards"][i]
            cells.append(f"{_ms(c['floor_ms'])} / {_ms(c['at_measured_efficiency_ms'])} / "
                         f"{_ms(c['compute_bound_ms'])} {c['verdict']}")
        out.append(f"  {b['board']:<24} " + " ".join(f"{x:<34}" for x in cells).rstrip())
    return out


def _check_out(path: str) -> str:
    """The folder --json writes into (checked before anything is computed or printed)."""
    if os.path.isdir(path):
        raise edge.EdgeError(f"--json {path}: is a directory")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise edge.EdgeError(f"--json {path}: folder {parent} does not exist")
    return parent


def _write_json(path: str, data: dict) -> None:
    _check_out(path)
    write_json_atomic(path, data)


def main(argv=None) -> int:
    from ..model.safetensors_io import ModelLoadError

    a = build_parser().parse_args(argv)
    try:
        r = make_plan(a)
        print(render(r))
        if a.json:
            _write_json(a.json, r)
            print(f"\nwrote {a.json}")
    except (edge.EdgeError, ModelLoadError, OSError) as e:
        print(f"vla-edge-plan: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
