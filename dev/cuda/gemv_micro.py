# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Decode-GEMV micro-benchmark on the device (no model needed): kernels/gemv.cu in both weight formats, compiled
in several shapes (-D overrides of its GV_* defaults, the plan told the same rows in flight), qwen2.5-1.5b decode
shapes, 28 layers of random weights per op (far over the L2). Each measurement is a captured CUDA graph of 28
launches through cuda.launch.Launcher (PDL between them, as in a decode pass), one per layer on its own weights,
replayed 20 times; reported per layer (median replay / 28) and as GB/s of weight bytes, per op and for the chain of
the four ops of a layer (q/k/v, o, gate/up, down: the GEMVs of a pass). The copy bandwidth (D2D memcpy, read +
write; chunk_bench's copy_bandwidth_gbps) is measured in the same process. Each variant's outputs (layer 0) are
first checked against an fp32 CuPy reference on the dequantized weights.

  python dev/cuda/gemv_micro.py [--json OUT] [--variants a,b,...]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import cupy as cp  # noqa: E402

from vla_edge_ros.cuda.launch import Gemv, Launcher, gemv_plan  # noqa: E402
from vla_edge_ros.tools.chunk_bench import copy_bandwidth_gbps  # noqa: E402

from _timing import graph_ms, variant_kernels  # noqa: E402

H, I, NQ, NKVD, D, CAP, L = 1536, 8960, 1536, 256, 128, 4096, 28
NQKV = NQ + 2 * NKVD
EPS = np.float32(1e-6)

# label: (format, -D defines, Gemv(rb=..., stages=...) to match them). "*_v6" = the previous kernel (one body, rows
# held in registers, no shared-memory ring: dev/cuda/gemv_v6.cu), launched without shared memory.
VARIANTS = {
    "bf16_v6": ("bf16", {}, {}),
    "bf16": ("bf16", {}, {}),
    "bf16_ns2": ("bf16", {"GV_NS_BF16": 2}, {"stages": 2}),
    "bf16_ns4": ("bf16", {"GV_NS_BF16": 4}, {"stages": 4}),
    "w4_v6": ("w4", {}, {}),
    "w4": ("w4", {}, {}),
    "w4_ns3": ("w4", {"GV_NS_W4": 3}, {"stages": 3}),
    "w4_ns6": ("w4", {"GV_NS_W4": 6}, {"stages": 6}),
    "w4_pairs2": ("w4", {"GV_RB_W4_PAIRS": 2}, {"rb": {"gateup": 2}}),
    "w4_proj4": ("w4", {"GV_RB_W4_PROJ": 4}, {"rb": {"proj": 4}}),
    "w4_qkv2": ("w4", {"GV_RB_W4_QKV": 2}, {"rb": {"qkv": 2}}),
}
DEFAULT = "bf16_v6,bf16,w4_v6,w4,w4_proj4,w4_qkv2"


class GemvV6(Gemv):
    """The previous kernel (dev/cuda/gemv_v6.cu: no dynamic shared memory)."""

    def smem(self, op, kv):
        return 0


def weights(fmt, N, K, ref=False):
    """(device weight as the launcher takes it, fp32 dequantized copy for the reference when ``ref``, bytes); random
    on the device."""
    if fmt == "bf16":
        w = ((cp.random.standard_normal((N, K), dtype=cp.float32) * 0.05).view(cp.uint32) >> 16).astype(cp.uint16)
        return w, (w.astype(cp.uint32) << 16).view(cp.float32) if ref else None, w.nbytes
    Q = (cp.random.randint(0, 1 << 16, (N, K // 8)).astype(cp.uint32) << 16) \
        | cp.random.randint(0, 1 << 16, (N, K // 8)).astype(cp.uint32)
    scale = cp.random.uniform(0.002, 0.01, (N, K // 128), dtype=cp.float32).astype(cp.float16)
    zero = cp.random.randint(0, 16, (N, K // 128)).astype(cp.uint32)
    SZ = scale.view(cp.uint16).astype(cp.uint32) | (zero << 16)
    wf = None
    if ref:
        nib = (Q[:, :, None] >> (4 * cp.arange(8, dtype=cp.uint32))[None, None, :]) & 15
        wf = (nib.reshape(N, K).astype(cp.float32) - zero.astype(cp.float32).repeat(128, axis=1)) \
            * scale.astype(cp.float32).repeat(128, axis=1)
    return (Q, SZ, 0), wf, Q.nbytes + SZ.nbytes


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--variants", default=DEFAULT, help=f"comma-separated, of: {','.join(VARIANTS)}")
    a = ap.parse_args(argv)
    stream = cp.cuda.Stream(non_blocking=True)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    rng = np.random.default_rng(0)
    res = {}
    with stream:
        res["copy_gbps"] = copy_bandwidth_gbps(cp)
        print(f"copy bandwidth (D2D, read + write): {res['copy_gbps']:.0f} GB/s", flush=True)
        x = cp.asarray(rng.standard_normal(H).astype(np.float32))
        a_o = cp.asarray(rng.standard_normal(NQ).astype(np.float32))
        a_d = cp.asarray(rng.standard_normal(I).astype(np.float32))
        ln = cp.asarray((rng.uniform(0.5, 1.5, H).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))
        lnf = (ln.astype(cp.uint32) << 16).view(cp.float32)
        bias = cp.asarray(rng.standard_normal(NQKV).astype(np.float32) * 0.1)
        kc = cp.zeros((L, 2, CAP, D), cp.uint16)
        vc = cp.zeros((L, 2, CAP, D), cp.uint16)
        order = cp.asarray(np.arange(CAP, dtype=np.int32))
        params = cp.asarray(np.array([100, -1, 0, 0], np.int32))
        q_out = cp.zeros(NQ, cp.float32)
        act = cp.zeros(I, cp.float32)
        y = cp.zeros(H, cp.float32)
        xn = x * cp.sqrt(1.0 / (cp.mean(x * x) + EPS)) * lnf
        made = {}
        for label in a.variants.split(","):
            fmt, defines, cfg = VARIANTS[label]
            if fmt not in made:  # 28 layers of each op, made once per format
                cp.random.seed(1)
                made[fmt] = [{op: weights(fmt, N, K, ref=li == 0)
                              for op, (N, K) in (("qkv", (NQKV, H)), ("gateup", (2 * I, H)), ("o", (H, NQ)),
                                                 ("down", (H, I)))} for li in range(L)]
            Ws = made[fmt]
            if label.endswith("_v6"):
                k = variant_kernels(replace={"gemv.cu": os.path.join(ROOT, "dev", "cuda", "gemv_v6.cu")},
                                    only=["gemv.cu"])
                gv = GemvV6(k, fmt, rb={"qkv": 2, "gateup": 1, "proj": 4} if fmt == "w4" else None)  # v6's RB
            else:
                k = variant_kernels(defines, only=["gemv.cu"])
                gv = Gemv(k, fmt, **cfg)
            go = Launcher(k, stream)
            plan = gemv_plan(gv, go, H, I, NQKV, NQ, sms)
            regs = {op: (getattr(getattr(k, p["name"]), "num_regs", -1),
                         getattr(getattr(k, p["name"]), "local_size_bytes", -1)) for op, p in plan.items()}

            def launch(op, li, run):
                W = Ws[li][op][0]
                p = plan[op]
                if op == "qkv":
                    gv.qkv(x, ln, EPS, W, bias, H, NQ, NKVD, q_out, kc[li], vc[li], order, params, 0, CAP, D,
                           p["blocks"], run=run)
                elif op == "gateup":
                    gv.gateup(x, ln, EPS, W, H, I, act, p["blocks"], run=run)
                elif op == "o":
                    gv.proj(a_o, W, NQ, H, y, p["kv"], p["blocks"], run=run)
                else:
                    gv.proj(a_d, W, I, H, y, p["kv"], p["blocks"], run=run)

            # correctness, layer 0 (plain launches)
            errs = {}
            for op in ("qkv", "gateup", "o", "down"):
                y.fill(0)
                launch(op, 0, None)
                stream.synchronize()
                wf = Ws[0][op][1]
                if op == "qkv":
                    ref = wf @ xn + bias
                    got = cp.concatenate([q_out, (kc[0, :, 100, :].astype(cp.uint32) << 16).view(cp.float32).ravel(),
                                          (vc[0, :, 100, :].astype(cp.uint32) << 16).view(cp.float32).ravel()])
                elif op == "gateup":
                    g, u = wf[:I] @ xn, wf[I:] @ xn
                    ref, got = g / (1 + cp.exp(-g)) * u, act
                else:
                    ref, got = wf @ (a_o if op == "o" else a_d), y
                errs[op] = float(cp.linalg.norm(got - ref) / cp.linalg.norm(ref))
            r = {"format": fmt, "defines": defines, "plan": plan, "regs_spill": regs, "rel_err": errs,
                 "smem": {op: gv.smem("proj" if op in ("o", "down") else op, p["kv"]) for op, p in plan.items()}}
            for op in ("qkv", "o", "gateup", "down"):
                def enq(op=op):
                    go.barrier()
                    for li in range(L):
                        launch(op, li, go)
                us = graph_ms(stream, enq) * 1000 / L
                nbytes = Ws[0][op][2]
                r[op] = {"us": us, "gbps": nbytes / us / 1e3}

            def chain():
                go.barrier()
                for li in range(L):
                    for op in ("qkv", "o", "gateup", "down"):
                        launch(op, li, go)
            us = graph_ms(stream, chain) * 1000 / L
            nbytes = sum(Ws[0][op][2] for op in Ws[0])
            r["chain"] = {"us": us, "gbps": nbytes / us / 1e3}
            res[label] = r
            print(f"{label:10s} " + "  ".join(f"{op} {r[op]['us']:6.2f} us {r[op]['gbps']:5.0f} GB/s"
                                              for op in ("qkv", "o", "gateup", "down"))
                  + f"  | chain {us:6.2f} us {r['chain']['gbps']:5.0f} GB/s | err "
                  + " ".join(f"{v:.1e}" for v in errs.values())
                  + " | regs/spill/smem " + " ".join(f"{op}:{n}/{sp}/{r['smem'][op]}" for op, (n, sp) in regs.items())
                  + " | blocks " + " ".join(f"{op}:{p['blocks']}" for op, p in plan.items()), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1, default=str)


if __name__ == "__main__":
    main()
