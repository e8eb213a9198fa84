# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The persistent decode pass (dev/cuda/decode_persistent.cu, an exploration) against the shipped kernel-per-op
pass, on a model directory with a full KV cache.

Builds the CudaBackend of MODEL (chunk_bench's fill: a 64-token prompt, then frames until the cache is full), then
times the layers of one decode token, each captured as a CUDA graph (median of 50 replays): the shipped per-op chain
("per_op": the backend's own kernels, as in its decode pass without the embedding gather and the head), and the
persistent kernel (the counters' memset + one cooperative decode_pass launch) as measured ("persistent") and in the
variants of its -D knobs:
  skip_all     DEC_SKIP=63: every step left out, the 6 barriers a layer kept (what the barriers cost)
  skip_attn    DEC_SKIP=6: no attention partials / combine
  skip_gemv    DEC_SKIP=57: no q/k/v, o, gate/up, down
  fence0       DEC_FENCE=0: no __threadfence() beside the release / acquire pair
  minb2        DEC_MINB=2: two blocks an SM (128 registers; 4-bit models only: bf16's ring fills the SM)
A variant with fewer registers gets more blocks an SM from the occupancy API (printed: blocks). x after one pass from
the same input is compared with the per-op chain's (the skip variants are expected to differ).

  python dev/cuda/decode_micro.py --model DIR [--variants a,b] [--sms N] [--json OUT]
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

from vla_edge_ros.cuda.backend import CudaBackend  # noqa: E402
from vla_edge_ros.cuda.kernels import kernel_dir  # noqa: E402
from vla_edge_ros.cuda.launch import _set_max_dynamic_smem, gemv_smem_bytes  # noqa: E402
from vla_edge_ros.model.checkpoint import load_model  # noqa: E402
from vla_edge_ros.tools.chunk_bench import fill_cache, green_stream  # noqa: E402

from _timing import KEEP, graph_ms  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEC_STEPS, DEC_THREADS = 6, 256  # decode_persistent.cu
# decode_persistent.cu DecLayer, in order: one row of uint64 device pointers a layer (0 for an absent scale array)
DEC_LAYER_FIELDS = ("ln1", "ln2", "bqkv", "wqkv", "sqkv", "wo", "so", "wgu", "sgu", "wd", "sd", "kc", "vc")


def decode_instance(be) -> str:
    """The decode_pass instance of a backend's shape: the GEMV instances its per-op plan runs (be.gemv: kv and
    whether the last segment is partial, for the hidden rows (q/k/v, gate/up), o and down)."""
    F = {"bf16": "Bf16W", "f16": "F16W", "w4": "Q4W"}[be.device_format]
    steps = [be.gemv[key] for key in ("qkv", "o", "down")]
    return f"decode_pass<{F}, {be.D}, " + ", ".join(f"{p['kv']}, {str(not p['partial']).lower()}" for p in steps) + ">"


def decode_smem_bytes(be) -> int:
    """Dynamic shared memory of a block: the largest GEMV ring of the plan, one attention body's tiles (attention.cuh
    ATT_SMEM_BYTES(D, 4): its 4-warp body), the combine's row groups."""
    gv = be.gemv_launch
    ring = max(gemv_smem_bytes(gv.fmt, op, be.gemv[key]["kv"], gv.rb[op], gv.stages)
               for key, op in (("qkv", "qkv"), ("gateup", "gateup"), ("o", "proj"), ("down", "proj")))
    return max(ring, (64 + 3 * 32) * (be.D + 8) * 2, (DEC_THREADS // be.D) * 3 * 128 * 4)


class DecodePass:
    """The persistent pass of one backend's shape, compiled with ``defines`` (the -D knobs)."""

    def __init__(self, be, defines: dict):
        self.expr = decode_instance(be)
        with open(os.path.join(HERE, "decode_persistent.cu")) as f:
            src = "".join(f"#define {k} {v}\n" for k, v in defines.items()) + f.read()
        mod = cp.RawModule(code=src, options=("-std=c++17", f"-I{kernel_dir()}"), name_expressions=(self.expr,))
        self.fn = mod.get_function(self.expr)
        KEEP.append(mod)
        self.smem = decode_smem_bytes(be)
        _set_max_dynamic_smem(self.fn, self.smem)
        be.launch.k.functions[self.expr] = self.fn  # the Launcher finds the instance by name
        self.blocks = be.sms * be.launch.blocks_per_sm(self.expr, DEC_THREADS, fallback=1, smem=self.smem)
        self.nsplit = max(1, min(be.lay.decode_splits, self.blocks // be.NKV))
        self.s_o, self.s_d = be.gemv["o"]["S"], be.gemv["down"]["S"]

    def enqueue(self, be, table, bar, q_off):
        i = np.int32
        cp.cuda.runtime.memsetAsync(bar.data.ptr, 0, bar.nbytes, be.stream.ptr)
        be.launch.barrier()
        args = (table, i(be.L), i(be.sbf), be.xdec, be.qdec, be.attdec, be.act, be.part_o, be.part_ml, be.order_dev,
                be.params_dev, i(q_off), i(be.capacity), be.cos, be.sin, np.float32(np.log2(np.e) / np.sqrt(be.D)),
                i(self.nsplit), i(be.H), i(be.I), i(be.NQ), i(be.NKVD), i(be.NKV), i(be.group),
                np.float32(be.cfg.rms_norm_eps), i(self.s_o), i(self.s_d), bar)
        be.launch(self.expr, (self.blocks,), (DEC_THREADS,), args, shared_mem=self.smem, cooperative=True)


def layer_table(be) -> cp.ndarray:
    """DecLayer rows: the device pointers of every layer's weights and cache."""
    rows = []
    for li, lw in enumerate(be.layers):
        ptr = {"ln1": lw["ln1"], "ln2": lw["ln2"], "bqkv": lw["bqkv"], "kc": be.kc[li], "vc": be.vc[li]}
        for key, name in (("wqkv", "qkv"), ("wo", "o"), ("wgu", "gu"), ("wd", "d")):
            w = lw[key]
            ptr[key], ptr["s" + name] = (w[0], w[1]) if be.w4 else (w, None)
        rows.append([0 if ptr[f] is None else ptr[f].data.ptr for f in DEC_LAYER_FIELDS])
    return cp.asarray(np.asarray(rows, dtype=np.uint64))


VARIANTS = {"persistent": {}, "skip_all": {"DEC_SKIP": 63}, "skip_attn": {"DEC_SKIP": 6},
            "skip_gemv": {"DEC_SKIP": 57}, "fence0": {"DEC_FENCE": 0}, "minb2": {"DEC_MINB": 2}}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--sms", type=int, default=0)
    p.add_argument("--capacity", type=int, default=4096)
    p.add_argument("--json")
    a = p.parse_args()
    w = load_model(a.model)
    stream, sms = green_stream(a.sms) if a.sms else (None, 0)
    be = CudaBackend(w, a.capacity, 40.0, sms=sms or None, stream=stream)
    fill_cache(be, a.capacity, 64, extra_chunks=2)
    rng = np.random.default_rng(1)
    s = be.stream
    x0 = cp.asarray(rng.standard_normal(be.H).astype(np.float32))
    table = layer_table(be)
    bar = cp.zeros(DEC_STEPS * be.L, cp.uint32)
    q_off = 32 + 4  # decode pass 4's position
    out, ref = [], None
    for name in ["per_op"] + [v for v in a.variants.split(",") if v]:
        if name == "minb2" and be.weight_format != "w4":
            continue
        if name == "per_op":
            blocks, nsplit, smem, defs = 0, be.lay.decode_splits, 0, {}

            def enqueue():
                be.enqueue_decode_layers(q_off)
        else:
            defs = VARIANTS[name]
            dp = DecodePass(be, defs)
            blocks, nsplit, smem = dp.blocks, dp.nsplit, dp.smem

            def enqueue(dp=dp):
                dp.enqueue(be, table, bar, q_off)
        with s:
            be.xdec[:] = x0
            be.launch.barrier()
            enqueue()
            s.synchronize()
            x1 = be.xdec.get()
            ms = graph_ms(s, enqueue, reps=50)
        if ref is None:
            ref = x1
        err = float(np.max(np.abs(x1 - ref)) / (np.max(np.abs(ref)) + 1e-30))
        row = {"variant": name, "defines": defs, "pass_ms": round(ms, 4), "us_a_layer": round(1e3 * ms / be.L, 2),
               "blocks": blocks, "splits": nsplit, "smem": smem, "rel_err_vs_per_op": err,
               "finite": bool(np.isfinite(x1).all())}
        out.append(row)
        print("DECODE_MICRO", json.dumps(row), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "weights": be.weight_format, "sms": be.sms, "rows": out}, f, indent=1)


if __name__ == "__main__":
    main()
