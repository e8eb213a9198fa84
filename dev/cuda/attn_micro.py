# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Prefill / decode attention micro-benchmark on the device (no model needed): kernels/attention.cu against the
previous kernel (dev/cuda/attention_v4.cu, the round-3 tree), the qwen2.5-1.5b shape (2 KV heads, group 6, D 128;
--shape 0.5b: group 7, D 64, 24 layers; 3b: group 8, 36 layers), full 4096-slot cache, every layer its own random K/V
(4 MB a layer at 1.5B, over the L2 together). Each measurement is a
captured CUDA graph of 28 layers (plain launches, as the prefill) replayed 20 times; reported per layer (median
replay / 28): partial + combine, partial alone, combine alone. Each kernel's output (layer 0) is first checked
against the NumPy twin (ops.apply_rope + ops.attention).

  python dev/cuda/attn_micro.py [--json OUT] [--decode-splits 128,64,32] [--prefill-splits auto,2,4] [--new-only]
                                [--pdl] [--sms N] [--shape 0.5b|1.5b|3b] [--variant NAME:DEF=V[,DEF=V]] ...
                                [--base-dir TREE]

Prefill shapes: T = 32 (the autoregressive kinds), 40 (one parallel action) and 96 (8 actions a chunk).
--sms N runs on a stream of a green context of N SMs (chunk_bench.green_stream); "auto" splits are then the backend's
plan for N SMs (vram_plan.prefill_attention_splits). --base-dir adds TREE/kernels/attention.cu + attention.cuh (e.g. a
`git archive` of an earlier commit) as the variant "base", launched with the same launcher (its partial kernels
must take the same arguments). --variant adds kernels/attention.cu compiled with those -D defines (e.g.
minb3:ATT_MINB=3, the register cap of 3 resident blocks an SM).
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

from vla_edge_ros.cuda.launch import Launcher, attention  # noqa: E402
from vla_edge_ros.model import ops  # noqa: E402
from vla_edge_ros.vram_plan import prefill_attention_splits, wave_splits  # noqa: E402

from _timing import graph_ms, variant_kernels  # noqa: E402

CAP = 4096
SHAPES = {"0.5b": (2, 7, 64, 24), "1.5b": (2, 6, 128, 28), "3b": (2, 8, 128, 36)}  # KV heads, group, head dim, layers


def bf16(rng, shape):
    x = rng.standard_normal(shape).astype(np.float32)
    return (x.view(np.uint32) >> 16).astype(np.uint16)  # truncation is fine for random data


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--decode-splits", default="128", help="comma-separated split counts of the decode shape")
    ap.add_argument("--prefill-splits", default="auto",
                    help="comma-separated split counts of the prefill shapes (auto: the backend's plan)")
    ap.add_argument("--new-only", action="store_true", help="skip the previous kernel")
    ap.add_argument("--pdl", action="store_true",
                    help="launch through cuda.launch.Launcher: PDL between the kernels, as in a decode pass")
    ap.add_argument("--sms", type=int, default=0, help="confine to a green context of N SMs (0: the whole GPU)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1.5b")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:DEF=V[,DEF=V]",
                    help="kernels/attention.cu with these defines, measured beside the shipped one")
    ap.add_argument("--base-dir", help="a tree whose kernels/attention.cu(h) run as the variant 'base'")
    a = ap.parse_args(argv)
    NKV, GROUP, D, L = SHAPES[a.shape]
    NH = NKV * GROUP
    prev = os.path.join(ROOT, "dev", "cuda", "attention_v4.cu")
    # name -> (kernels, warps of the prefill's partial blocks: None the launcher's choice, 4 the 64-row instance)
    new = variant_kernels()
    variants = {"new": (new, None), "new, 4 warps": (new, 4)}
    if not a.new_only:
        variants["v4 (previous)"] = (variant_kernels(replace={"attention.cu": prev}, only=["attention.cu"]), 4)
    if a.base_dir:
        kd = os.path.join(a.base_dir, "kernels")
        variants["base"] = (variant_kernels(replace={f: os.path.join(kd, f) for f in ("attention.cu", "attention.cuh")},
                                            only=["attention.cu"]), 4)
    for spec in a.variant:
        name, _, defs = spec.partition(":")
        variants[name] = (variant_kernels(defines=dict(d.split("=", 1) for d in defs.split(",") if d),
                                          only=["attention.cu"]), None)
    rng = np.random.default_rng(0)
    if a.sms:
        from vla_edge_ros.tools.chunk_bench import green_stream

        stream, SMS = green_stream(a.sms)
    else:
        stream, SMS = cp.cuda.Stream(non_blocking=True), cp.cuda.Device().attributes["MultiProcessorCount"]
    res = {"shape": a.shape, "sms": SMS}
    print(f"ATTN_MICRO shape {a.shape}, {SMS} SMs", flush=True)
    with stream:
        kcs = [cp.asarray(bf16(rng, (NKV, CAP, D))) for _ in range(L)]
        vcs = [cp.asarray(bf16(rng, (NKV, CAP, D))) for _ in range(L)]
        cos, sin = ops.rope_cos_sin(np.arange(CAP), D, 1e6)
        cos_d, sin_d = cp.asarray(cos), cp.asarray(sin)
        order = rng.permutation(CAP).astype(np.int32)
        order_d = cp.asarray(order)
        # (label, T, bidir_from, splits): the 32-row prefill, the 40-row (one action) and 96-row (8 actions) parallel
        # passes, a decode pass's attention; "auto": the plan's splits for the variant's blocks (8 warps: the
        # backend's; 4 warps: whole waves of the 64-row blocks, as many an SM as the occupancy API says)
        shapes = [(f"prefill T{T}", T, 32, ns) for T in (32, 40, 96) for ns in a.prefill_splits.split(",")]
        shapes += [("decode T1", 1, 1, ns) for ns in a.decode_splits.split(",")]
        for label, T, bidir, ns in shapes:
            n_prefix = CAP - T if T > 1 else CAP - 1
            nrg = math.ceil(T * GROUP / 64)
            part_o = cp.zeros(NKV * nrg * 64 * 128 * D, cp.float32)  # up to 64 splits (128 at T = 1)
            part_ml = cp.zeros(NKV * nrg * 64 * 128 * 2, cp.float32)
            params = cp.asarray(np.array([n_prefix, -1, 0, 0], np.int32))
            q = rng.standard_normal((T, NH * D)).astype(np.float32)
            qd = cp.asarray(q)
            out = cp.zeros((T, NH * D), cp.float32)
            outb = cp.zeros((T, NH * D), cp.uint16)
            # the twin, layer 0
            kf = (kcs[0].get().astype(np.uint32) << 16).view(np.float32)
            vf = (vcs[0].get().astype(np.uint32) << 16).view(np.float32)
            ref = ops.cache_attention(q, kf, vf, order, cos, sin, n_prefix, bidir)
            for vname, (k, warps) in variants.items():
                if T == 1 and vname == "new, 4 warps":
                    continue  # a decode pass is the 4-warp instance anyway
                go = Launcher(k, stream, pdl=a.pdl)
                if ns != "auto":
                    nsplit = int(ns)
                elif warps == 4:
                    per_sm = go.blocks_per_sm(f"attn_partial_{D}", 128, fallback=2)
                    nsplit = wave_splits(SMS * per_sm, NKV * nrg)
                else:
                    nsplit = prefill_attention_splits(SMS, NKV, T, GROUP, D)

                def layers(only=None, k=k, go=go, nsplit=nsplit, warps=warps):
                    def run(name, grid, block, args, shared_mem=0, dependent=True):
                        if only is None or name.startswith(only):  # attn_partial_<D>, attn_combine_<D>
                            go(name, grid, block, args, shared_mem=shared_mem, dependent=dependent)
                    go.barrier()
                    for li in range(L):
                        attention(k, qd, NH * D, kcs[li], vcs[li], order_d, params, 0, T, NKV, GROUP, CAP, cos_d, sin_d,
                                  bidir, nsplit, part_o, part_ml, out, outb, run=run, warps=warps)
                out.fill(np.nan)
                layers()
                stream.synchronize()
                # layers() leaves layer 27's result; check layer 0 alone
                attention(k, qd, NH * D, kcs[0], vcs[0], order_d, params, 0, T, NKV, GROUP, CAP, cos_d, sin_d, bidir,
                          nsplit, part_o, part_ml, out, outb, warps=warps)
                stream.synchronize()
                o = out.get()
                err = float(np.linalg.norm(o - ref) / np.linalg.norm(ref))
                r = {"nsplit": nsplit, "rel_err": err,
                     "both_us": graph_ms(stream, layers) * 1000 / L,
                     "partial_us": graph_ms(stream, lambda: layers("attn_partial")) * 1000 / L,
                     "combine_us": graph_ms(stream, lambda: layers("attn_combine")) * 1000 / L}
                res[f"{label} s{nsplit} | {vname}"] = r
                print(f"ATTN_MICRO {label:12s} {vname:14s} nsplit {nsplit:3d} rel_err {err:.2e}  partial+combine "
                      f"{r['both_us']:6.2f} us  partial {r['partial_us']:6.2f}  combine {r['combine_us']:6.2f} "
                      "(a layer)", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
