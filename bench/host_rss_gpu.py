# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Host memory and start time of the node's core on the CUDA backend (issue 42): `Runtime.build` (the start-up
checks, the engine, the warm-up, as the reasoning node runs them, without rclpy) of one model, then the process's
RSS from /proc/self/status: VmRSS (now), VmHWM (peak), RssAnon (heap: what cannot be given back to a file) and
RssFile (mapped file pages), and the seconds from the start to ready.

  python3 bench/host_rss_gpu.py --model DIR_OR_GGUF [--backend cuda] [--capacity 4096] [--json OUT]

One model a process (a second would count the first's leftovers). Prints one RESULT line.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def status_mb() -> dict:
    """VmRSS, VmHWM, RssAnon, RssFile of this process in MB (from /proc/self/status, kB there)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) / 1024
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--backend", default="cuda")
    p.add_argument("--capacity", type=int, default=4096)
    p.add_argument("--json")
    a = p.parse_args()
    t0 = time.perf_counter()
    from vla_edge_ros.frame_buffer import FrameBuffer
    from vla_edge_ros.runtime import Runtime
    from vla_edge_ros.settings import ReasoningSettings

    before = status_mb()
    s = ReasoningSettings.from_values({"backend": a.backend, "kv_capacity_tokens": a.capacity})
    rt = Runtime.build(a.model, s, FrameBuffer())
    ready_s = time.perf_counter() - t0
    after = status_mb()
    gpu_mb = None
    if a.backend == "cuda":
        import cupy

        gpu_mb = cupy.get_default_memory_pool().used_bytes() / 2**20
    cfg = rt.engine.cfg
    r = {"model": a.model, "backend": rt.engine.backend_name, "weight_format": cfg.weight_format,
         "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size, "capacity": a.capacity,
         "ready_s": ready_s, "after_imports_mb": before, "after_warmup_mb": after, "gpu_pool_used_mb": gpu_mb}
    print(f"RESULT {os.path.basename(a.model.rstrip('/'))} {r['backend']} {cfg.weight_format}: ready {ready_s:.1f} s, "
          f"host RSS {after['VmRSS']:.0f} MB (peak {after['VmHWM']:.0f}, anon {after['RssAnon']:.0f}, file "
          f"{after['RssFile']:.0f}; after imports {before['VmRSS']:.0f}), GPU pool {gpu_mb or 0:.0f} MB")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)
    rt.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
