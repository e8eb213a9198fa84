# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Issue 41's targets against one device call's files: each target, what the call measured, met / missed.

    python bench/targets.py OUT [OUT ...]

Each OUT is one device call's files; several are read together, and the first folder that has a file wins (name the
peers' call first, so the peers are compared with the autoregressive chunks timed beside them). They hold what
`STEPS=targets bash bench/gpu_run.sh` writes: chunk_bench's `cb_<preset>_<kind>[_sm8].json`, the
peers' `torch_peer_<shape>_<bf16|int4>.txt` (a RESULTS line), text_speed's `ts_<preset>_<kind>.json`, and the junit
files `tests_05b.xml` / `tests_15b.xml` of the full-depth tests (`STEPS=verify`). A target whose file is missing
reads "not measured", never met. Chunk times are device-stamp p50s (the host p50 beside them); the targets are the
issue's, set for an H200, and the card each file names is printed with it.
"""
import argparse
import glob
import json
import os
import sys
import xml.etree.ElementTree as ET

# (label, preset, kind, SMs (0: whole GPU), bound ms, peer weights for the ratio)
CHUNK_TARGETS = [
    ("1.5B bf16 autoregressive", "qwen2.5-1.5b", "bf16", 0, 7.5, "bf16"),
    ("1.5B 4-bit autoregressive", "qwen2.5-1.5b", "awq", 0, 5.0, "int4"),
    ("1.5B bf16 parallel", "qwen2.5-1.5b", "bf16-parallel", 0, 1.2, None),
    ("1.5B 4-bit parallel", "qwen2.5-1.5b", "awq-parallel", 0, 1.2, None),
    ("1.5B 4-bit parallel, 8 SMs", "qwen2.5-1.5b", "awq-parallel", 8, 8.0, None),
    ("0.5B bf16 autoregressive", "qwen2.5-0.5b", "bf16", 0, 3.5, None),
    ("0.5B 4-bit autoregressive", "qwen2.5-0.5b", "awq", 0, 3.0, None),
    ("0.5B 4-bit parallel, 8 SMs", "qwen2.5-0.5b", "awq-parallel", 8, 3.0, None),
]
# (label, preset, numerator kind, denominator kind, SMs, bound on the ratio)
RATIO_TARGETS = [
    ("1.5B K = 8 / K = 1, 4-bit parallel", "qwen2.5-1.5b", "awq-parallel-k8", "awq-parallel", 0, 1.3),
    ("0.5B K = 8 / K = 1, 4-bit parallel", "qwen2.5-0.5b", "awq-parallel-k8", "awq-parallel", 0, 1.3),
    ("1.5B 4-bit / bf16 autoregressive, 8 SMs", "qwen2.5-1.5b", "awq", "bf16", 8, 1.0),
]
FULL_DEPTH = [("0.5B full depth, every kind", "tests_05b.xml"), ("1.5B full depth, every kind", "tests_15b.xml")]


def _first(out, name):
    """The path of ``name`` in the first of the folders ``out`` (one folder or a list) that has it, else None."""
    for d in [out] if isinstance(out, str) else out:
        if os.path.exists(os.path.join(d, name)):
            return os.path.join(d, name)
    return None


def _load(out, name):
    path = _first(out, name)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, TypeError, ValueError):
        return None


def chunk(out, preset, kind, sms):
    return _load(out, f"cb_{preset}_{kind}" + (f"_sm{sms}" if sms else "") + ".json")


def peer(out, shape, weights):
    """The peer's RESULTS json (torch_peer.py) or None."""
    try:
        with open(_first(out, f"torch_peer_{shape}_{weights}.txt")) as f:
            for line in f:
                if line.startswith("RESULTS "):
                    return json.loads(line[len("RESULTS "):])
    except (OSError, TypeError, ValueError):
        pass
    return None


def junit(path):
    """(tests, failures + errors, skipped) of a junit file, or None."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, TypeError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    n = sum(int(s.get("tests", 0)) for s in suites)
    bad = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    return n, bad, sum(int(s.get("skipped", 0)) for s in suites)


def _confined_ok(r, sms):
    return not sms or (int(r.get("sms", 0)) == sms and int(r.get("sms_seen_by_probe", 0)) == sms)


def rows(out):
    """[(target, measured, verdict)] for every target, from ``out`` (a folder or a list of them); devices seen."""
    res, devices = [], set()
    for label, preset, kind, sms, bound, pw in CHUNK_TARGETS:
        r = chunk(out, preset, kind, sms)
        if r is None or not _confined_ok(r, sms):
            res.append((f"{label} <= {bound:g} ms", "-", "not measured" if r is None else "SM probe disagrees"))
            continue
        devices.add(r["device"])
        ms = r["chunk_device_ms"]["p50"]
        got = f"{ms:.3f} ms (host {r['chunk_host_ms']['p50']:.3f})"
        if "decode_pass_ms" in r:
            got += f", pass {r['decode_pass_ms']['p50']:.3f} ms"
        p = peer(out, preset.split("-")[-1], pw) if pw else None
        if p:
            devices.add(p.get("device", r["device"]))
            pm = p["torch_compiled_graph_chunk_ms"]["p50"]  # torch_peer.py prints p50 / p99 / min
            got += f"; peer {pm:.2f} ms ({pm / r['chunk_host_ms']['p50']:.2f}x the host p50)"
        res.append((f"{label} <= {bound:g} ms", got, "met" if ms <= bound else "missed"))
    for label, preset, num, den, sms, bound in RATIO_TARGETS:
        a, b = chunk(out, preset, num, sms), chunk(out, preset, den, sms)
        if a is None or b is None or not (_confined_ok(a, sms) and _confined_ok(b, sms)):
            res.append((f"{label} <= {bound:g}x", "-", "not measured"))
            continue
        x, y = a["chunk_device_ms"]["p50"], b["chunk_device_ms"]["p50"]
        res.append((f"{label} <= {bound:g}x", f"{x:.3f} / {y:.3f} ms = {x / y:.2f}x",
                    "met" if x / y <= bound else "missed"))
    for kind in ("bf16", "awq"):
        t = _load(out, f"ts_qwen2.5-0.5b_{kind}.json")
        if t is None:
            res.append((f"0.5B {kind} text >= 1000 tokens/s; 352-token prompt <= 5 ms", "-", "not measured"))
            continue
        devices.add(t["device"])
        tok = t["decode_tokens_per_s"]
        res.append((f"0.5B {kind} greedy text >= 1000 tokens/s", f"{tok:.0f} tokens/s",
                    "met" if tok >= 1000 else "missed"))
        ok = t["prompt_tokens"] == 352
        res.append((f"0.5B {kind} 352-token prompt <= 5 ms",
                    f"{t['prompt_ms_p50']:.2f} ms ({t['prompt_tokens']} tokens)",
                    ("met" if t["prompt_ms_p50"] <= 5.0 else "missed") if ok else "not measured (another length)"))
    for label, name in FULL_DEPTH:
        j = junit(_first(out, name))
        if j is None:
            res.append((label, "-", "not run"))
            continue
        n, bad, skipped = j
        verdict = "passed" if n and not bad and not skipped else "FAILED" if bad else "incomplete"
        res.append((label, f"{n - bad - skipped} passed, {bad} failed, {skipped} skipped of {n}", verdict))
    return res, devices


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="+", help="the device calls' $OUT copies (the first that has a file wins)")
    a = p.parse_args(argv)
    for d in a.out:
        if not os.path.isdir(d):
            print(f"targets: {d} is not a folder", file=sys.stderr)
            return 1
    res, devices = rows(a.out)
    print(f"cards: {', '.join(sorted(devices)) or 'none'}" + (" (MORE THAN ONE)" if len(devices) > 1 else ""))
    print(f"files: {sum(len(glob.glob(os.path.join(d, '*'))) for d in a.out)} in {', '.join(a.out)}")
    print("| target (issue 41, set for an H200) | measured | verdict |\n|---|---|---|")
    for t, m, v in res:
        print(f"| {t} | {m} | {v} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
