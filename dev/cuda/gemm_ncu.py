# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""One launch of each prefill-GEMM case given (qwen2.5-1.5b shapes), plainly (no graph), for Nsight Compute:

  ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \
      -k regex:gemm python dev/cuda/gemm_ncu.py [--cases w4:48:gateup,w4:96z2:gateup,...]

A case is format:rows[z<slices>]:shape (shape gateup | down); the 4-bit cases take fp16 X, as the engine does.
Default: w4 48-row buffer (the t40 kernel) gate/up (swiglu), w4 t40 down, w4 t32 gate/up, bf16 t48 gate/up, bf16 t48
down.
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import cupy as cp  # noqa: E402

from vla_edge_ros.cuda.kernels import Kernels  # noqa: E402
from vla_edge_ros.cuda.launch import Gemm  # noqa: E402

H, INTER = 1536, 8960


def main():
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--cases", default="w4:48:gateup,w4:48:down,w4:32:gateup,bf16:48:gateup,bf16:48:down")
    a = p.parse_args()
    k = Kernels()
    rng = cp.random.default_rng(0)
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    for case in a.cases.split(","):
        fmt, rz, key = case.split(":")
        rows, _, z = rz.partition("z")
        rows, z = int(rows), int(z or 1)
        N, K, mode = (2 * INTER, H, "swiglu") if key == "gateup" else (H, INTER, "add")
        if fmt == "bf16":
            W = ((rng.standard_normal((N, K), dtype=cp.float32) * 0.02).view(cp.uint32) >> 16).astype(cp.uint16)
        else:
            W = (rng.integers(0, 2 ** 31, (N, K // 8), dtype=cp.int64).astype(cp.uint32),
                 cp.full((N, K // 128), 0x2000, cp.uint32) | (8 << 16), np.int32(0))
        if fmt == "w4":
            X = rng.standard_normal((rows, K), dtype=cp.float32).astype(cp.float16).view(cp.uint16)
        else:
            X = (rng.standard_normal((rows, K), dtype=cp.float32).view(cp.uint32) >> 16).astype(cp.uint16)
        g = Gemm(k, fmt, rows, xfmt="fp16" if fmt == "w4" else None, zsplit=z)
        from vla_edge_ros.cuda.launch import Launcher

        slots = sms * Launcher(k, cp.cuda.Stream()).blocks_per_sm(g.name, g.threads, 1, g.smem)
        Y = cp.zeros((rows, N), cp.float32)
        act = cp.zeros((rows, INTER), cp.uint16)
        if mode == "swiglu":
            g(X, W, N, K, mode, act=act)
        else:
            g(X, W, N, K, mode, Y=Y, ks=g.split(N, K, mode, slots))
        cp.cuda.Device().synchronize()
        print(case, g.name, "done", flush=True)


if __name__ == "__main__":
    main()
