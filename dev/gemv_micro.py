"""GEMV micro-benchmark on the device (no model needed): qwen2.5-1.5b decode shapes, 28 layers of random bf16
weights (2.6 GB, far over the L2), every measurement a captured CUDA graph of 28 launches (one per layer,
each on its own weights) replayed 20 times; reported per layer (median replay / 28) and as GB/s of weight
bytes. Compares, per shape: a pure streaming read of the same bytes (the load-path reference), the v3 kernel,
the v4 kernel configurations (KVxRB), each with plain launches and with PDL; then the per-layer GEMV chain
(qkv -> o -> gate/up -> down) for v3, v3+PDL, v4, v4+PDL.

  python bench/gemv_micro.py [--json OUT] [--quick]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import cupy as cp  # noqa: E402

from vla_edge_ros.cuda.backend import CudaBackend  # noqa: E402
from vla_edge_ros.cuda.kernels import Kernels  # noqa: E402

H, I, NQ, NKVD, L, D, CAP = 1536, 8960, 1536, 256, 28, 128, 4096
NQKV = NQ + 2 * NKVD
i32, f32 = np.int32, np.float32


def rand_bf16(shape, scale=0.02):
    a = (cp.random.standard_normal(shape, dtype=cp.float32) * scale).view(cp.uint32)
    return (a >> 16).astype(cp.uint16)


class Launcher:
    """CudaBackend's launch path (plain or PDL) without a model."""

    def __init__(self, k, pdl):
        be = CudaBackend.__new__(CudaBackend)
        be.k, be.pdl, be._pdl_prev, be._pdl_suspend = k, pdl, False, False
        if pdl:
            from cuda.bindings import driver as drv

            drv.cuInit(0)
            be._drv = drv
            attr = drv.CUlaunchAttribute()
            attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            be._pdl_attr = attr
        be.sms = cp.cuda.Device().attributes["MultiProcessorCount"]
        self.be = be

    def graph_ms(self, enqueue, reps=20):
        s = cp.cuda.Stream(non_blocking=True)
        self.be._pdl_prev = False
        s.begin_capture()
        enqueue(s)
        g = s.end_capture()
        for _ in range(3):
            g.launch(s)
        s.synchronize()
        ts = []
        for _ in range(reps):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(s)
            g.launch(s)
            e1.record(s)
            e1.synchronize()
            ts.append(cp.cuda.get_elapsed_time(e0, e1))
        return float(np.median(ts))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    W = {"qkv": [rand_bf16((NQKV, H)) for _ in range(L)], "o": [rand_bf16((H, NQ)) for _ in range(L)],
         "gateup": [rand_bf16((2 * I, H)) for _ in range(L)], "down": [rand_bf16((H, I)) for _ in range(L)]}
    ln = ((cp.random.standard_normal(H, dtype=cp.float32) * 0.1 + 1).view(cp.uint32) >> 16).astype(cp.uint16)
    bias = cp.random.standard_normal(NQKV, dtype=cp.float32)
    x = cp.random.standard_normal(H, dtype=cp.float32)
    att = cp.random.standard_normal(NQ, dtype=cp.float32)
    act = cp.random.standard_normal(I, dtype=cp.float32)
    q = cp.zeros(NQ, cp.float32)
    kc = cp.zeros((2, CAP, D), cp.uint16)
    vc = cp.zeros((2, CAP, D), cp.uint16)
    order = cp.arange(CAP, dtype=cp.int32)
    params = cp.asarray(np.array([100, -1, 0, 0], np.int32))
    sink = cp.zeros(4, cp.uint32)
    y = cp.zeros(H, cp.float32)
    gu_out = cp.zeros(I, cp.float32)
    eps = f32(1e-6)
    nbytes = {k: W[k][0].nbytes for k in W}
    res = {"sms": sms, "bytes_per_layer": nbytes, "per_layer_us": {}}
    out = res["per_layer_us"]
    kp, k0 = Kernels(pdl=True), Kernels(pdl=False)

    def rec(key, ms, b):
        us = ms * 1e3 / L
        out[key] = {"us": round(us, 2), "GBps": round(b / (us * 1e-6) / 1e9, 1)}
        print(f"{key:42s} {us:8.2f} us/layer  {b / (us * 1e-6) / 1e9:8.1f} GB/s", flush=True)

    # 1. streaming read of each shape's bytes
    for pdl in (False, True):
        la = Launcher(kp, pdl)
        for key in W:
            n16 = nbytes[key] // 16
            for mult in ((4, 8) if not a.quick else (4,)):
                def enq(s, key=key, n16=n16, mult=mult):
                    for li in range(L):
                        la.be._launch("g4_stream_read", (sms * mult,), (256,), (W[key][li], np.int64(n16), sink),
                                      stream=s)
                rec(f"stream_read {key} x{mult} {'pdl' if pdl else 'plain'}", la.graph_ms(enq), nbytes[key])

    # 2. one kernel family at a time
    def v3_calls(key, li):
        if key == "qkv":
            return ("dec_qkv", (math.ceil(NQKV / 16),), (x, ln, eps, W[key][li], bias, i32(H), i32(NQ), i32(NKVD), q,
                                                         kc, vc, order, params, i32(3), i32(CAP), i32(D)), 4 * H)
        if key == "o":
            return ("dec_proj_residual", (math.ceil(H / 8),), (att, W[key][li], i32(NQ), i32(H), y), 4 * NQ)
        if key == "gateup":
            return ("dec_gateup", (math.ceil(I / 16),), (x, ln, eps, W[key][li], i32(H), i32(I), gu_out), 4 * H)
        return ("dec_proj_residual", (math.ceil(H / 8),), (act, W[key][li], i32(I), i32(H), y), 4 * I)

    def g4_calls(key, li, kv, rb, blocks):
        if key == "qkv":
            return (f"g4_qkv_{kv}x{rb}", (blocks,), (x, ln, eps, W[key][li], bias, i32(H), i32(NQ), i32(NKVD), q,
                                                       kc, vc, order, params, i32(3), i32(CAP), i32(D)), 0)
        if key == "gateup":
            return (f"g4_gateup_{kv}x{rb}", (blocks,), (x, ln, eps, W[key][li], i32(H), i32(I), gu_out), 0)
        K = NQ if key == "o" else I
        return (f"g4_proj_{kv}x{rb}", (blocks,), (att if key == "o" else act, W[key][li], i32(K), i32(H), y,
                                                     i32(K // 256 // kv)), 0)

    def occ(k, name):
        la = Launcher(k, False)
        return CudaBackend._blocks_per_sm(la.be, name)

    configs = {"qkv": [(6, 1), (6, 2)], "o": [(6, 1), (3, 1), (3, 2), (2, 1), (1, 2)],
               "gateup": [(6, 1), (6, 2)], "down": [(7, 1), (7, 2), (5, 1), (5, 2), (1, 2)]}
    if a.quick:
        configs = {"qkv": [(6, 1)], "o": [(3, 1)], "gateup": [(6, 1), (6, 2)], "down": [(7, 1), (5, 2)]}
    best = {}
    for key in W:
        for pdl, k in ((False, k0), (True, kp)):
            la = Launcher(k, pdl)

            def enq(s, key=key):
                for li in range(L):
                    name, grid, args, smem = v3_calls(key, li)
                    la.be._launch(name, grid, (256,), args, shared_mem=smem, stream=s)
            rec(f"v3 {key} {'pdl' if pdl else 'plain'}", la.graph_ms(enq), nbytes[key])
        for kv, rb in configs[key]:
            for pdl in (False, True):
                la = Launcher(kp, pdl)
                name = g4_calls(key, 0, kv, rb, 1)[0]
                bps = occ(kp, name)
                K = H if key in ("qkv", "gateup") else (NQ if key == "o" else I)
                S = K // 256 // kv
                blocks = sms * bps

                def enq(s, key=key, kv=kv, rb=rb, blocks=blocks):
                    for li in range(L):
                        name, grid, args, smem = g4_calls(key, li, kv, rb, blocks)
                        la.be._launch(name, grid, (256,), args, shared_mem=smem, stream=s)
                tag = f"g4 {key} {kv}x{rb} S{S} b{bps} {'pdl' if pdl else 'plain'}"
                ms = la.graph_ms(enq)
                rec(tag, ms, nbytes[key])
                if pdl and (key not in best or ms < best[key][0]):
                    best[key] = (ms, kv, rb)
    res["best_pdl"] = {k: f"{v[1]}x{v[2]}" for k, v in best.items()}
    print("best (pdl):", res["best_pdl"], flush=True)

    # 3. the per-layer GEMV chain
    total = sum(nbytes.values())
    for tag, k, pdl in (("v3", k0, False), ("v3p", kp, True), ("v4-plain", kp, False), ("v4", kp, True)):
        la = Launcher(k, pdl)

        def enq(s, tag=tag):
            for li in range(L):
                for key in ("qkv", "o", "gateup", "down"):
                    if tag.startswith("v4"):
                        _, kv, rb = best[key]
                        name = g4_calls(key, 0, kv, rb, 1)[0]
                        blocks = sms * occ(kp, name)
                        name, grid, args, smem = g4_calls(key, li, kv, rb, blocks)
                    else:
                        name, grid, args, smem = v3_calls(key, li)
                    la.be._launch(name, grid, (256,), args, shared_mem=smem, stream=s)
        rec(f"chain {tag}", la.graph_ms(enq), total)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
