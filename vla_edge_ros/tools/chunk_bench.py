# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""chunk_bench: time the CUDA chunk (one graph launch) on a full KV cache, and project it onto edge boards.

  python -m vla_edge_ros.tools.chunk_bench --model DIR|FILE.gguf [--capacity 4096] [--chunks 300] [--json OUT]
                                             [--breakdown]

Fills the cache with frames (fifo) until every chunk runs with the cache full, then times the chunks: host
wall time launch -> results (what the robot sees) and device time between the graph's %globaltimer stamps.
Reports p50/p99, the phases, the bytes the chunk must move (edge.chunk_bytes: weights at their format, the
256 action rows, the KV attended), the measured copy bandwidth, the floor (bytes / copy bandwidth), the
fraction of copy bandwidth reached (the efficiency), and from it the projected chunk on each board of
config/boards.yaml with a fits / does-not-fit verdict against 33 - 2 ms. The model dir decides the weights
(bf16 or 4-bit), the action decoding (autoregressive or parallel) and the actions a parallel chunk plans (K,
vla_action_chunk: 32 + 8 K prefill rows, 8 K transient slots), all reported.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def copy_bandwidth_gbps(cp, nbytes=2 << 30, reps=20) -> float:
    a = cp.empty(nbytes // 4, cp.float32)
    a.fill(1.0)
    b = cp.empty_like(a)
    for _ in range(3):
        b[...] = a
    cp.cuda.Device().synchronize()
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    ts = []
    for _ in range(reps):
        e0.record()
        cp.cuda.runtime.memcpyAsync(b.data.ptr, a.data.ptr, a.nbytes, cp.cuda.runtime.memcpyDeviceToDevice, 0)
        e1.record()
        e1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(e0, e1))
    del a, b
    cp.get_default_memory_pool().free_all_blocks()
    return 2 * nbytes / (np.median(ts) * 1e-3) / 1e9  # read + write


class _Skip:
    """Kernel table that turns the named kernels (or name prefixes ending in '*') into no-ops (leave-one-out)."""

    def __init__(self, k, skip):
        self.k, self.skip = k, set(skip)

    def _skipped(self, name):
        return name in self.skip or any(p.endswith("*") and name.startswith(p[:-1]) for p in self.skip)

    def __getattr__(self, name):
        return (lambda *a, **kw: None) if self._skipped(name) else getattr(self.k, name)


def leave_one_out(cp, be, enqueue, families: dict, reps: int) -> dict:
    """Device ms of the work `enqueue()` adds to the stream, captured alone as a graph, once per entry of
    `families` with those kernels (names, or prefixes ending in '*') replaced by no-ops (cache as left)."""
    out = {}
    real = be.launch.k
    s = be.stream
    for name, skip in families.items():
        be.launch.k = _Skip(real, skip)
        be.launch.barrier()
        s.begin_capture()
        try:
            enqueue()
        finally:
            g = s.end_capture()
            be.launch.k = real
        for _ in range(3):
            g.launch(s)
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(s)
        for _ in range(reps):
            g.launch(s)
        e1.record(s)
        e1.synchronize()
        out[name] = round(cp.cuda.get_elapsed_time(e0, e1) / reps, 4)
    return out


def breakdown(cp, be, reps=50) -> dict:
    """Decode pass 4 alone, with kernel families left out."""
    gemv = ["gemv_*"]
    families = {"all": [], "no_attention": ["attn_*"], "no_gemv": gemv,
                "no_gateup_down": [f"gemv_{be.device_format}_{op}_*" for op in ("gateup", "proj")],
                "only_launch_skeleton": ["attn_*", "lm_head_argmax"] + gemv}
    return leave_one_out(cp, be, lambda: be.enqueue_decode_pass(4), families, reps)


def prefill_breakdown(cp, be, reps=30) -> dict:
    """The prefill alone, with kernel families left out."""
    families = {"all": [], "no_gemm": ["gemm_*"], "no_attention": ["attn_*"], "no_norm": ["rmsnorm_bf16"],
                "no_kv_write": ["kv_write"], "only_gemm": ["attn_*", "rmsnorm_bf16", "kv_write"]}
    return leave_one_out(cp, be, be.enqueue_prefill, families, reps)


_GREEN: list = []


def green_stream(n: int):
    """A CUDA stream confined to a green context of (at least) n SMs: cuDevSmResourceSplitByCount ->
    cuGreenCtxCreate -> cuGreenCtxStreamCreate, wrapped as a cupy ExternalStream (kernels loaded in the primary
    context run on it, on those SMs alone). Making the green context current does not confine CuPy work: CuPy
    re-selects the device's primary context (seen on the H200, 2026-12-01: the SM probe saw 132 SMs). Returns
    (stream, SMs granted; Hopper splits in multiples of 8)."""
    import cupy as cp
    from cuda.bindings import driver as drv

    def ok(r):
        err, *vals = r if isinstance(r, tuple) else (r,)
        if err != drv.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"green context: {err}")
        return vals[0] if len(vals) == 1 else vals

    ok(drv.cuInit(0))
    dev = ok(drv.cuDeviceGet(0))
    res = ok(drv.cuDeviceGetDevResource(dev, drv.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM))
    groups, _, _ = ok(drv.cuDevSmResourceSplitByCount(1, res, 0, int(n)))
    desc = ok(drv.cuDevResourceGenerateDesc([groups[0]], 1))
    gctx = ok(drv.cuGreenCtxCreate(desc, dev, drv.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM))
    stream = ok(drv.cuGreenCtxStreamCreate(gctx, drv.CUstream_flags.CU_STREAM_NON_BLOCKING, 0))
    _GREEN.append((gctx, stream))  # the handles live as long as the process
    return cp.cuda.ExternalStream(int(stream)), int(groups[0].sm.smCount)


_SMID_PROBE = r'''
extern "C" __global__ void smid_probe(unsigned* hit) {
    unsigned id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    if (threadIdx.x == 0) hit[id & 1023] = 1u;
    for (int i = 0; i < 20000; ++i) __nanosleep(100);  // long enough that every granted SM gets blocks
}
'''


def sms_in_use(cp, stream=None) -> int:
    """How many distinct SMs a grid of 1024 blocks actually ran on (checks the green-context confinement)."""
    hit = cp.zeros(1024, cp.uint32)
    cp.cuda.Device().synchronize()
    cp.RawKernel(_SMID_PROBE, "smid_probe")((1024,), (32,), (hit,), stream=stream)
    cp.cuda.Device().synchronize()
    return int(hit.sum())


def bench_state(cfg) -> dict:
    """run_chunk's state keyword for a model with a state input (a fixed normalized state), else nothing."""
    if not cfg.state_dim:
        return {}
    return {"state": np.linspace(-0.9, 0.9, cfg.state_dim, dtype=np.float32)}


def fill_cache(be, capacity: int, prompt_tokens: int, extra_chunks: int):
    """A random pinned prompt, then chunks of 8 random frames (fifo) until every frame block is used (the cache full)
    and ``extra_chunks`` more: the state chunk_bench (and dev/cuda/decode_micro.py) measure in. Returns (KvCache, the
    frames, the next frame id)."""
    from ..eviction import make_policy
    from ..kv_cache import KvCache

    cfg = be.cfg
    rng = np.random.default_rng(0)
    kv = KvCache(capacity, prompt_tokens, make_policy("fifo"), action_tokens=cfg.action_tokens,
                 state_tokens=cfg.state_tokens)
    be.load_prompt(rng.integers(0, cfg.vocab_size, prompt_tokens), kv.prompt_slots)
    frames = [rng.integers(0, 256, (64, 128, 3), dtype=np.uint8) for _ in range(8)]
    fid = 0
    while fid < kv.frame_capacity + extra_chunks:
        r = be.run_chunk(frames[fid % 8], kv.plan_frame(fid), cfg.vocab_size - 1, **bench_state(cfg))
        kv.set_embedding(fid, r.pooled)
        fid += 1
    return kv, frames, fid


def pct(a, q):
    return float(np.percentile(np.asarray(a), q))


def main(argv=None) -> int:
    from .. import edge
    from ..model.checkpoint import load_model
    from .cli import add_setting_options, positive_int

    p = argparse.ArgumentParser(prog="chunk_bench", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model directory (bf16 or 4-bit, autoregressive or parallel) or GGUF "
                                                  "file (dequantized to bf16)")
    add_setting_options(p, ("kv_capacity_tokens", "vram_ceiling_gb"), flags={"kv_capacity_tokens": "--capacity"})
    p.add_argument("--prompt-tokens", type=positive_int, default=64, help="pinned prompt length (default 64)")
    p.add_argument("--chunks", type=positive_int, default=300, help="timed chunks after the fill (default 300)")
    p.add_argument("--json", help="also write the results as JSON here")
    p.add_argument("--sms", type=int, default=0,
                   help="run the chunk on a stream of a CUDA green context of this many SMs (a board's count: Orin "
                        "Nano 8, AGX Orin 16, Thor 20; Hopper grants multiples of 8) and plan the grids for them")
    p.add_argument("--breakdown", action="store_true",
                   help="also time one decode pass and the prefill as graphs with kernel families left out "
                        "(differences = cost)")
    a = p.parse_args(argv)
    try:
        import cupy as cp

        cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - no CuPy, no driver or no device: one line
        print(f"chunk_bench: needs CuPy and a CUDA GPU ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    from ..cuda.backend import CudaBackend

    stream, sms = green_stream(a.sms) if a.sms else (None, 0)
    sms_seen = sms_in_use(cp, stream)
    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    bw = copy_bandwidth_gbps(cp)
    w = load_model(a.model)
    cfg = w.cfg
    t0 = time.perf_counter()
    be = CudaBackend(w, a.kv_capacity_tokens, a.vram_ceiling_gb, sms=sms or None, stream=stream)
    kv, frames, fid = fill_cache(be, a.kv_capacity_tokens, a.prompt_tokens, extra_chunks=10)
    setup_s = time.perf_counter() - t0
    host, devc, vis, pre, dec, passes, nkeys = [], [], [], [], [], [], []
    for i in range(a.chunks):
        plan = kv.plan_frame(fid)
        r = be.run_chunk(frames[fid % 8], plan, cfg.vocab_size - 1, **bench_state(cfg))
        kv.set_embedding(fid, r.pooled)
        fid += 1
        host.append(r.timings.total_ms)
        devc.append(be.device_chunk_ms())
        vis.append(r.timings.vision_ms)
        pre.append(r.timings.prefill_ms)
        dec.append(r.timings.decode_ms)
        passes.append(be.last_pass_ms)
        nkeys.append(plan.n_prefix + 32)
    passes = np.asarray(passes)
    n_mid = int(np.median(nkeys)) + 1 + 8 // 2  # edge.chunk_bytes' convention (the middle decode pass)
    cb = edge.chunk_bytes(cfg, a.kv_capacity_tokens, attended_keys=n_mid, prompt_tokens=a.prompt_tokens)
    dev_ms = pct(devc, 50)
    eff = cb["total"] / (dev_ms * 1e-3) / 1e9 / bw
    parallel = be.parallel
    pass_ms = float(np.median(passes))
    res = {
        "device": name, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "model": a.model,
        "weights": be.weight_format, "device_weights": be.device_format,
        "action_decoding": "parallel" if parallel else "autoregressive",
        "action_chunk": cfg.action_chunk, "prefill_tokens": be.lay.tokens, "prefill_rows": be.lay.rows,
        "prefill_gemm": be.gemm.name, "gateup_gemm": be.gemm_gu.name, "gateup_token_slices": be.gemm_gu.zsplit,
        "pdl": bool(be.launch.pdl), "gemv_plan": be.gemv, "sms": be.sms, "green_context": bool(sms),
        "sms_seen_by_probe": sms_seen,
        "capacity": a.kv_capacity_tokens, "keys_attended_median": n_mid, "chunks": a.chunks,
        "setup_s": round(setup_s, 1),
        "copy_GBps": round(bw, 1),
        "chunk_host_ms": {"p50": pct(host, 50), "p99": pct(host, 99), "max": max(host)},
        "chunk_device_ms": {"p50": dev_ms, "p99": pct(devc, 99)},
        "vision_ms_p50": pct(vis, 50), "prefill_ms_p50": pct(pre, 50), "decode_ms_p50": pct(dec, 50),
        "chunk_bytes": cb, "chunk_GBps": round(cb["total"] / (dev_ms * 1e-3) / 1e9, 1),
        "efficiency_of_copy_bw": round(eff, 4),
        "floor_chunk_ms": round(cb["total"] / (bw * 1e9) * 1e3, 4),
        "prefill_GBps": round(cb["prefill"] / (pct(pre, 50) * 1e-3) / 1e9, 1),
        "vram_plan_bytes": be.plan, "vram_peak_bytes": be.peak_vram_bytes,
    }
    if not parallel:
        res["decode_pass_ms"] = {"p50": pass_ms, "p99": pct(passes, 99),
                                 "per_step_p50": np.median(passes, 0).round(4).tolist()}
        res["decode_pass_bytes"] = cb["decode_pass"]
        res["decode_pass_GBps"] = round(cb["decode_pass"] / (pass_ms * 1e-3) / 1e9, 1)
        res["decode_pass_frac_of_copy_bw"] = round(cb["decode_pass"] / (pass_ms * 1e-3) / 1e9 / bw, 3)
        res["floor_pass_ms"] = round(cb["decode_pass"] / (bw * 1e9) * 1e3, 4)
    for k in ("chunk_host_ms", "chunk_device_ms"):
        res[k] = {kk: round(v, 3) for kk, v in res[k].items()}
    boards = edge.load_boards()
    res["projection"] = {bn: edge.project(cb, b, efficiency=min(1.0, eff)) for bn, b in boards.items()}
    if a.breakdown:
        if not parallel:
            res["breakdown_pass_ms"] = breakdown(cp, be)
        res["breakdown_prefill_ms"] = prefill_breakdown(cp, be)
        print("BREAKDOWN " + json.dumps({k: v for k, v in res.items() if k.startswith("breakdown")}))
    print("RESULTS " + json.dumps(res, default=str))
    print(f"\n| metric | value |\n|---|---|\n| device | {name}, {be.sms} SMs{' (green context)' if sms else ''} "
          f"({sms_seen} seen running), "
          f"copy {bw:.0f} GB/s |")
    print(f"| model | {res['weights']} ({be.device_format} on the device), {res['action_decoding']}, "
          f"K = {cfg.action_chunk} action(s) a chunk "
          f"({be.lay.tokens} prefill tokens, {be.lay.rows} GEMM rows: {be.gemm.name}, gate/up "
          f"{be.gemm_gu.name} x {be.gemm_gu.zsplit}) |")
    print(f"| chunk (host wall) p50 / p99 | {res['chunk_host_ms']['p50']:.3f} / {res['chunk_host_ms']['p99']:.3f} ms |")
    print(f"| chunk (device stamps) p50 / p99 | {dev_ms:.3f} / {res['chunk_device_ms']['p99']:.3f} ms |")
    print(f"| vision / prefill / decode p50 | {res['vision_ms_p50']:.3f} / {res['prefill_ms_p50']:.3f} / "
          f"{res['decode_ms_p50']:.3f} ms |")
    print(f"| chunk bytes / floor | {cb['total'] / 1e9:.3f} GB / {res['floor_chunk_ms']:.3f} ms "
          f"({100 * eff:.1f} % of copy bandwidth) |")
    if not parallel:
        print(f"| decode pass p50 | {pass_ms:.4f} ms = {res['decode_pass_GBps']} GB/s "
              f"({100 * res['decode_pass_frac_of_copy_bw']:.1f} % of copy; floor {res['floor_pass_ms']:.4f} ms) |")
    print(f"| VRAM plan total / peak | {be.plan['total'] / 2**30:.3f} / {be.peak_vram_bytes / 2**30:.3f} GiB |")
    for bn, pr in res["projection"].items():
        print(f"| projected on {bn} | {pr.get('chunk_ms', float('nan')):.1f} ms: {pr.get('verdict', '')} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
