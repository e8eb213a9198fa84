"""Prefill-GEMM micro-benchmark on the device (no model needed): kernels/gemm.cu against the previous kernels
(dev/cuda/gemm_v5.cu, gemm_w4_v5.cu), qwen2.5-1.5b prefill shapes, 28 layers of random weights per shape (far
over the L2), each measurement a captured CUDA graph of 28 launches (one per layer, its own weights) replayed
20 times; reported per layer (median replay / 28) and as GB/s of weight bytes. The old gate/up is timed without
its separate SwiGLU kernel; the new one includes the fused SwiGLU.

  python dev/cuda/gemm_micro.py [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import cupy as cp  # noqa: E402

from vla_edge_ros.cuda.kernels import Kernels  # noqa: E402
from vla_edge_ros.cuda.launch import Gemm, Launcher  # noqa: E402

H, I, NQ, NKVD, L = 1536, 8960, 1536, 256, 28
NQKV = NQ + 2 * NKVD
SHAPES = {"qkv": (NQKV, H, "add"), "o": (H, NQ, "add"), "gateup": (2 * I, H, "swiglu"), "down": (H, I, "add")}
i32 = np.int32


def graph_ms(stream, enqueue, reps=20):
    stream.begin_capture()
    enqueue()
    g = stream.end_capture()
    for _ in range(3):
        g.launch(stream)
    stream.synchronize()
    ts = []
    for _ in range(reps):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(stream)
        g.launch(stream)
        e1.record(stream)
        e1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(e0, e1))
    return float(np.median(ts))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    a = p.parse_args()
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    k = Kernels()
    here = os.path.dirname(os.path.abspath(__file__))
    opts = ("-std=c++17", f"-I{k.directory}")
    old = {f: cp.RawModule(code=open(os.path.join(here, f)).read(), options=opts)
           for f in ("gemm_v5.cu", "gemm_w4_v5.cu")}
    s = cp.cuda.Stream(non_blocking=True)
    la = Launcher(k, s, pdl=False)
    res = {"sms": sms, "per_layer_us": {}}
    rng = cp.random.default_rng(0)
    for fmt in ("bf16", "w4"):
        for key, (N, K, mode) in SHAPES.items():
            if fmt == "bf16":
                Ws = [(rng.standard_normal((N, K), dtype=cp.float32) * 0.02).view(cp.uint32) >> 16 for _ in range(L)]
                Ws = [w.astype(cp.uint16) for w in Ws]
                nbytes = N * K * 2
            else:
                Ws = [(rng.integers(0, 2 ** 31, (N, K // 8), dtype=cp.int64).astype(cp.uint32),
                       (cp.full((N, K // 128), 0x2000, cp.uint32) | (8 << 16)), i32(0)) for _ in range(L)]
                nbytes = N * K // 2 + N * K // 128 * 4
            for rows in (32, 48):
                X = (rng.standard_normal((rows, max(K, H)), dtype=cp.float32).view(cp.uint32) >> 16).astype(cp.uint16)
                Y = cp.zeros((rows, N), cp.float32)
                act = cp.zeros((rows, I), cp.uint16)
                g = Gemm(k, fmt, rows)
                slots = sms * la.blocks_per_sm(g.name, g.threads, 1, g.smem)
                ks = g.split(N, K, mode, slots)
                ks2 = g.split(N, K, mode, 2 * slots)  # two waves' worth of split-K slices

                def new(g=g, X=X, Y=Y, act=act, Ws=Ws, N=N, K=K, mode=mode, ks=ks):
                    for w in Ws:
                        if mode == "swiglu":
                            g(X, w, N, K, mode, act=act, run=la)
                        else:
                            g(X, w, N, K, mode, Y=Y, ks=ks, run=la)

                nb_old = 64 if fmt == "bf16" else 128
                ks_old = 1 if mode == "swiglu" else max(1, min(K // 64, math.ceil(2 * sms / (N // nb_old))))
                fn = old["gemm_v5.cu" if fmt == "bf16" else "gemm_w4_v5.cu"].get_function(f"v5_gemm_{fmt}_t{rows}")
                m_old = 0 if mode == "swiglu" else 1

                def prev(fn=fn, X=X, Y=Y, Ws=Ws, N=N, K=K, ks_old=ks_old, m_old=m_old, nb_old=nb_old):
                    for w in Ws:
                        wa = (w,) if fmt == "bf16" else w
                        fn((N // nb_old, ks_old), (128,), (X, *wa, Y, i32(N), i32(K), i32(m_old)), stream=s)

                vers = [("v5", prev, ks_old), ("new", new, ks)]
                if ks2 != ks:
                    vers.append(("new_2waves", lambda new=new, ks2=ks2: new(ks=ks2), ks2))
                for ver, enq, kk in vers:
                    us = graph_ms(s, enq) * 1e3 / L
                    key2 = f"{fmt} t{rows} {key} {ver}"
                    res["per_layer_us"][key2] = {"us": round(us, 2), "GBps": round(nbytes / (us * 1e-6) / 1e9, 1),
                                                 "ks": kk}
                    print(f"{key2:28s} {us:8.2f} us/layer {nbytes / (us * 1e-6) / 1e9:8.1f} GB/s (ks "
                          f"{res['per_layer_us'][key2]['ks']})", flush=True)
            del Ws
            cp.get_default_memory_pool().free_all_blocks()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
