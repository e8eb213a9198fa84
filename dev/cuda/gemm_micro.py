# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Prefill-GEMM micro-benchmark on the device (no model needed): kernels/gemm.cu compiled in several shapes (-D
overrides of its GEMM_*_BF16 / GEMM_*_W4 defaults, the launcher told the same through Gemm(cfg=...)), qwen2.5-1.5b
prefill shapes, 28 layers of random weights per shape (far over the L2), each measurement a captured CUDA graph of
28 launches (one per layer, its own weights) replayed 20 times; reported per layer (median replay / 28) and as
GB/s of weight bytes. Each variant's output is first checked against an fp32 CuPy reference (layer 0).

  python dev/cuda/gemm_micro.py [--json OUT] [--sms N] [--variants a,b,...] [--rows 32,48,96] [--shapes qkv,...]

--sms N runs on a stream of a green context of N SMs (chunk_bench.green_stream) with split-K planned for them.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import cupy as cp  # noqa: E402

from vla_edge_ros.cuda.launch import GEMM_CFG, GEMM_ROWS, Gemm, Launcher  # noqa: E402

from _timing import graph_ms, variant_kernels  # noqa: E402

H, I, NQ, NKVD, L = 1536, 8960, 1536, 256, 28
NQKV = NQ + 2 * NKVD
SHAPES = {"qkv": (NQKV, H, "add"), "o": (H, NQ, "add"), "gateup": (2 * I, H, "swiglu"), "down": (H, I, "add")}
i32 = np.int32

# label: (format, -D defines, launcher cfg overrides). "base" = the shipped shape (no defines).
VARIANTS = {
    "b_base": ("bf16", {}, {}),
    "b_nt4": ("bf16", {"GEMM_NT_BF16": 4}, {"nt": 4}),
    "b_nt2_s6": ("bf16", {"GEMM_STAGES_BF16": 6}, {"stages": 6}),
    "b_kw2_s3": ("bf16", {"GEMM_KW_BF16": 2, "GEMM_STAGES_BF16": 3}, {"kw": 2, "stages": 3}),
    # 3 stages: the 96-row block's shared memory 80 -> 60 KB, room for 3 blocks an SM instead of 2, so the 1.5B
    # gate/up's 280 blocks could fit one wave of 132 SMs; measured -1 % (H100, BENCHMARKS.md "Token slices")
    "b_s3": ("bf16", {"GEMM_STAGES_BF16": 3}, {"stages": 3}),
    "f_base": ("f16", {}, {}),  # the bf16 body on fp16 weights and fp16 X: gemm_f16_* (a bf16 model stored in fp16)
    "w_base": ("w4", {}, {}),
    "w_minb3": ("w4", {"GEMM_MINB_W4": 3}, {}),
    "w_nw4": ("w4", {"GEMM_NW_W4": 4, "GEMM_MINB_W4": 2}, {"nw": 4}),
    "w_s3": ("w4", {"GEMM_STAGES_W4": 3}, {"stages": 3}),
    "w_s6": ("w4", {"GEMM_STAGES_W4": 6}, {"stages": 6}),
    # 8 stages: twice the bytes in flight an SM where a whole GPU holds one block an SM (the 1.5B gate/up)
    "w_s8": ("w4", {"GEMM_STAGES_W4": 8}, {"stages": 8}),
    "w_t96_minb3": ("w4", {"GEMM_MINB_W4_T96": 3}, {}),  # the 96-row instance at 168 registers (small spill)
    "w_f16": ("w4", {}, {"xfmt": "fp16"}),  # the shipped shape, X (and act) in fp16: gemm_w4h_* (issue 41)
    # two warp groups along K (8 warps a block; 128 / 255 registers a thread at 2 / 1 blocks an SM): the per-chunk
    # dequantization and copies over twice the warps, none of it done twice (BENCHMARKS.md "Token slices": the lead
    # for the 1-block-an-SM gate/up); not measured yet
    "w_kw2_s3": ("w4", {"GEMM_KW_W4": 2, "GEMM_STAGES_W4": 3, "GEMM_MINB_W4": 2, "GEMM_MINB_W4_T96": 1},
                 {"kw": 2, "stages": 3, "xfmt": "fp16"}),
    "w_kw2_s4": ("w4", {"GEMM_KW_W4": 2, "GEMM_MINB_W4": 2, "GEMM_MINB_W4_T96": 1}, {"kw": 2, "xfmt": "fp16"}),
    # token slices over grid.z (launch.gemm_token_split): a 96-row buffer as two 48-row slices of the 48-row instance
    "w_z2": ("w4", {}, {"xfmt": "fp16", "zsplit": 2}),
    "b_z2": ("bf16", {}, {"zsplit": 2}),
    "f_z2": ("f16", {}, {"zsplit": 2}),
}
# (The previous 4-bit body, X as the A operand, is dev/cuda/gemm_v3.cu; its numbers are in BENCHMARKS.md.)


def from16(a, xfmt):
    """float32 values of 16-bit activation bits: bf16, or fp16 (xfmt "fp16")."""
    return a.view(cp.float16).astype(cp.float32) if xfmt == "fp16" else (a.astype(cp.uint32) << 16).view(cp.float32)


def reference(fmt, X, W, N, K, mode, xfmt="bf16"):
    """fp32 reference of one launch (CuPy): Y = X W^T, or silu(gate) * up for mode "swiglu"."""
    x = from16(X, xfmt)
    if fmt == "bf16":
        w = (W.astype(cp.uint32) << 16).view(cp.float32)
    elif fmt == "f16":
        w = W.view(cp.float16).astype(cp.float32)
    else:
        Q, SZ, _ = W  # fp16 scales
        nib = ((Q[:, :, None] >> (4 * cp.arange(8, dtype=cp.uint32))) & 15).reshape(N, K).astype(cp.float32)
        sc = (SZ & 0xFFFF).astype(cp.uint16).view(cp.float16).astype(cp.float32)
        z = ((SZ >> 16) & 15).astype(cp.float32)
        w = (nib - cp.repeat(z, 128, axis=1)) * cp.repeat(sc, 128, axis=1)
    y = x @ w.T
    if mode == "swiglu":
        g, u = y[:, :N // 2], y[:, N // 2:]
        y = g / (1 + cp.exp(-g)) * u
    return y


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    p.add_argument("--sms", type=int, default=0)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--rows", default="32,48")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--layers", type=int, default=L, help="layers of weights a shape (default 28)")
    p.add_argument("--shapes", default=",".join(SHAPES))
    a = p.parse_args()
    if a.sms:
        from vla_edge_ros.tools.chunk_bench import green_stream

        s, sms = green_stream(a.sms)
    else:
        s, sms = cp.cuda.Stream(non_blocking=True), cp.cuda.Device().attributes["MultiProcessorCount"]
    with s:  # every CuPy op on the kernels' stream: fills, copies and references ordered with the launches
        names = [v for v in a.variants.split(",") if v]
        rows_list = [int(r) for r in a.rows.split(",")]
        res = {"sms": sms, "per_layer_us": {}, "check": {}, "variants": {n: VARIANTS[n] for n in names}}
        rng = cp.random.default_rng(0)
        weights = {}
        for fmt in sorted({VARIANTS[n][0] for n in names}):
            for key, (N, K, mode) in SHAPES.items():
                if key not in a.shapes.split(","):
                    continue
                if fmt == "bf16":
                    Ws = [((rng.standard_normal((N, K), dtype=cp.float32) * 0.02).view(cp.uint32) >> 16)
                          .astype(cp.uint16) for _ in range(a.layers)]
                    nbytes = N * K * 2
                elif fmt == "f16":
                    Ws = [(rng.standard_normal((N, K), dtype=cp.float32) * 0.02).astype(cp.float16).view(cp.uint16)
                          for _ in range(a.layers)]
                    nbytes = N * K * 2
                else:
                    Ws = [(rng.integers(0, 2 ** 31, (N, K // 8), dtype=cp.int64).astype(cp.uint32),
                           (cp.full((N, K // 128), 0x2000, cp.uint32) | (8 << 16)), i32(0)) for _ in range(a.layers)]
                    nbytes = N * K // 2 + N * K // 128 * 4
                weights[fmt, key] = (Ws, nbytes)
        # N(0, 1) activations as bf16 bits and as fp16 bits (the fp16 instances read theirs as fp16)
        X = {("bf16", r): (rng.standard_normal((r, I), dtype=cp.float32).view(cp.uint32) >> 16).astype(cp.uint16)
             for r in rows_list}
        X.update({("fp16", r): rng.standard_normal((r, I), dtype=cp.float32).astype(cp.float16).view(cp.uint16)
                  for r in rows_list})
        for (_, r), x in X.items():
            if r == 48:
                x[40:] = 0  # a 48-row buffer holds 40 real rows and zeros, as the backend's
        ref_out = {}
        for name in names:
            fmt, defines, over = VARIANTS[name]
            t0 = time.perf_counter()
            k = variant_kernels(defines, only=["gemm.cu"])
            cfg = dict(GEMM_CFG[fmt], **over)
            xfmt = cfg.pop("xfmt", None)  # None: the launcher's default for the weights (fp16 for f16)
            zsplit = cfg.pop("zsplit", 1)
            la = Launcher(k, s, pdl=False)
            print(f"--- {name}: {fmt} {defines} (compiled in {time.perf_counter() - t0:.1f} s)", flush=True)
            for rows in rows_list:
                if rows % zsplit or rows // zsplit not in GEMM_ROWS:
                    continue
                g = Gemm(k, fmt, rows, cfg=cfg, xfmt=xfmt, zsplit=zsplit)
                xfmt = g.xfmt
                per_sm = la.blocks_per_sm(g.name, g.threads, 1, g.smem)
                slots = sms * per_sm
                for key, (N, K, mode) in SHAPES.items():
                    if (fmt, key) not in weights:
                        continue
                    Ws, nbytes = weights[fmt, key]
                    Y = cp.zeros((rows, N), cp.float32)
                    act = cp.zeros((rows, I), cp.uint16)
                    Xr = X[xfmt, rows][:, :K].copy()
                    ks = g.split(N, K, mode, slots)
                    # check: one launch on layer 0 against an fp32 reference of the same weights (CuPy, no tensor cores)
                    Y.fill(0)
                    act.fill(0)
                    if mode == "swiglu":
                        g(Xr, Ws[0], N, K, mode, act=act, run=la)
                        out = from16(act, xfmt)
                    else:
                        g(Xr, Ws[0], N, K, mode, Y=Y, ks=ks, run=la)
                        out = Y
                    s.synchronize()
                    ck = (fmt, xfmt, rows, key)
                    if ck not in ref_out:
                        ref_out[ck] = reference(fmt, Xr, Ws[0], N, K, mode, xfmt)
                    r0 = ref_out[ck]
                    err = float(cp.linalg.norm(out - r0) / max(float(cp.linalg.norm(r0)), 1e-30))
                    res["check"][f"{name} t{rows} {key}"] = err

                    def enq(g=g, X=Xr, Y=Y, act=act, Ws=Ws, N=N, K=K, mode=mode, ks=ks):
                        for w in Ws:
                            if mode == "swiglu":
                                g(X, w, N, K, mode, act=act, run=la)
                            else:
                                g(X, w, N, K, mode, Y=Y, ks=ks, run=la)

                    us = graph_ms(s, enq, a.reps) * 1e3 / len(Ws)
                    key2 = f"{name} t{rows} {key}"
                    real = 40 if rows == 48 else rows
                    tflops = 2 * real * N * K / (us * 1e-6) / 1e12  # of the real rows
                    nblk = g.blocks(N, mode) * zsplit
                    res["per_layer_us"][key2] = {"us": round(us, 2), "GBps": round(nbytes / (us * 1e-6) / 1e9, 1),
                                                 "TFLOPS": round(tflops, 2), "ks": ks, "blocks": nblk,
                                                 "per_sm": per_sm, "kernel": g.name}
                    print(f"{key2:28s} {us:8.2f} us/layer {nbytes / (us * 1e-6) / 1e9:8.1f} GB/s {tflops:6.2f} TFLOPS "
                          f"(ks {ks}, {nblk} blocks, {per_sm}/SM, {g.name}) check {err:.1e}", flush=True)
    # summary: the four shapes a layer, per variant and rows
    print(f"\nSUMMARY ({sms} SMs): us a layer, the four GEMMs")
    for name in names:
        for rows in rows_list:
            keys = [key for key in SHAPES if f"{name} t{rows} {key}" in res["per_layer_us"]]
            if not keys:
                continue
            tot = sum(res["per_layer_us"][f"{name} t{rows} {key}"]["us"] for key in keys)
            parts = " ".join(f"{key} {res['per_layer_us'][f'{name} t{rows} {key}']['us']:.1f}" for key in keys)
            bad = max(res["check"][f"{name} t{rows} {key}"] for key in keys)
            print(f"  {name:14s} t{rows}: {tot:7.1f}  ({parts})  max check {bad:.1e}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
