# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""config/boards.yaml's `measured.shapes` entries from one device call's chunk_bench JSON files.

    python bench/boards_measured.py DIR [--source TEXT]

DIR holds `cb_<preset>_<kind>.json` (whole GPU) and `cb_<preset>_<kind>_sm<N>.json` (confined to N SMs by a green
context), as `bench/gpu_run.sh` steps `bench` and `sms` write them. Prints one YAML entry a preset, keyed as edge.py
reads them (edge.chunk_kind: weight format, "-parallel", "-k<K>"), so the file is transcribed by a program, not by
hand. It refuses (one line, exit 1) a file whose device or SM probe disagrees with the others: one card, one tree.
"""
import argparse
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this repository's vla_edge_ros
from vla_edge_ros import edge  # noqa: E402
from vla_edge_ros.model.config import PRESETS  # noqa: E402

NAME = re.compile(r"cb_(qwen2\.5-[0-9.]+b)_(.+?)(?:_sm(\d+))?\.json$")


def kind_key(r: dict) -> str:
    """edge.chunk_kind of a chunk_bench result (its weights, decoding and actions a chunk)."""
    return edge.chunk_kind({"weights": r["weights"], "decoding": r["action_decoding"],
                            "action_chunk": r.get("action_chunk", 1)})


def collect(folder: str) -> tuple[dict, set]:
    """{preset: {"efficiency": {kind: f}, "chunk_ms": {kind: ms}, "sm_confined": {kind: {N: ms}}}}, devices seen."""
    shapes, devices = {}, set()
    for path in sorted(glob.glob(os.path.join(folder, "cb_*.json"))):
        m = NAME.search(os.path.basename(path))
        if not m:
            continue
        preset, name, n = m.groups()
        if "state" in name:  # the state twins: timing of another input, not a kind of boards.yaml
            continue
        r = json.load(open(path))
        devices.add(r["device"])
        e = shapes.setdefault(preset, {"efficiency": {}, "chunk_ms": {}, "sm_confined": {}})
        k = kind_key(r)
        if n is None:
            if r.get("green_context"):
                raise SystemExit(f"{path}: a whole-GPU file that ran on a green context")
            e["efficiency"][k] = r["efficiency_of_copy_bw"]
            e["chunk_ms"][k] = r["chunk_device_ms"]["p50"]
        else:
            if int(r["sms_seen_by_probe"]) != int(n) or int(r["sms"]) != int(n):
                raise SystemExit(f"{path}: asked for {n} SMs, planned {r['sms']}, the probe saw "
                                 f"{r['sms_seen_by_probe']} running")
            e["sm_confined"].setdefault(k, {})[int(n)] = r["chunk_device_ms"]["p50"]
    if len(devices) > 1:
        raise SystemExit(f"{folder}: files from more than one device: {sorted(devices)}")
    return shapes, devices


def render(shapes: dict, device: str, clock_mhz: float, source: str) -> str:
    out = []
    for preset, e in sorted(shapes.items()):
        c = PRESETS[preset]
        out.append(f"    {preset}:")
        out.append(f"      shape: {{hidden_size: {c.hidden_size}, num_hidden_layers: {c.num_hidden_layers}, "
                   f"num_attention_heads: {c.num_attention_heads}, num_key_value_heads: {c.num_key_value_heads},")
        out.append(f"              intermediate_size: {c.intermediate_size}}}")
        out.append("      efficiency: {" + ", ".join(f"{k}: {v:.4f}" for k, v in e["efficiency"].items()) + "}")
        out.append(f"      device: {device}")
        out.append("      whole_gpu_chunk_ms: {" + ", ".join(f"{k}: {v:.3f}" for k, v in e["chunk_ms"].items()) + "}")
        if e["sm_confined"]:
            out += ["      sm_confined:", f"        clock_mhz: {clock_mhz:g}", "        chunk_ms:"]
            for k, runs in e["sm_confined"].items():
                out.append(f"          {k}: {{" + ", ".join(f"{n}: {ms:.3f}" for n, ms in sorted(runs.items())) + "}")
        out.append(f"      source: {json.dumps(source)}")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folder", help="the call's $OUT copy holding cb_<preset>_<kind>[_sm<N>].json")
    p.add_argument("--clock-mhz", type=float, default=1980.0, help="the card's SM clock (nvidia-smi clocks.max.sm)")
    p.add_argument("--source", default="", help="the entries' source text: card, tree, date, commands")
    a = p.parse_args(argv)
    shapes, devices = collect(a.folder)
    if not shapes:
        print(f"boards_measured: no cb_<preset>_<kind>.json in {a.folder}", file=sys.stderr)
        return 1
    print(f"# {', '.join(sorted(devices))}")
    print(render(shapes, devices.pop(), a.clock_mhz, a.source))
    return 0


if __name__ == "__main__":
    sys.exit(main())
