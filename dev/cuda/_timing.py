# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Timing and variant set-up shared by the dev/cuda micro-benchmarks (not installed).

graph_ms: capture what ``enqueue`` launches on ``stream`` into a CUDA graph, replay it 3 times to warm up, then
``reps`` times between events: the median replay in ms. Every graph and module is kept alive to the end of the
process (KEEP): unloading them between variants crashed runs on 2026-12-01 (BENCHMARKS.md, "Measurement lesson").
variant_kernels: kernels/*.cu compiled with extra -D defines, or with files replaced (a dev/cuda/ copy of a
previous kernel), from a temporary copy of the kernel directory.
"""
from __future__ import annotations

import os
import shutil
import tempfile

import cupy as cp
import numpy as np

from vla_edge_ros.cuda.kernels import Kernels, kernel_dir

KEEP = []


def graph_ms(stream, enqueue, reps=20):
    stream.begin_capture()
    enqueue()
    g = stream.end_capture()
    KEEP.append(g)
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


def variant_kernels(defines: dict | None = None, replace: dict | None = None, only=None) -> Kernels:
    """Kernels compiled with ``#define NAME VALUE`` prepended to every file (``defines``) and with files swapped
    (``replace``: {"attention.cu": path}); ``only``: the .cu files to compile (default all); no arguments: the
    shipped kernels."""
    if not defines and not replace and not only:
        k = Kernels()
    else:
        d = tempfile.mkdtemp()
        src = kernel_dir()
        for f in os.listdir(src):
            if f.endswith(".cuh") or only is None or f in only:
                shutil.copy(os.path.join(src, f), d)
        for name, path in (replace or {}).items():
            shutil.copy(path, os.path.join(d, name))
        if defines:
            head = "".join(f"#define {n} {v}\n" for n, v in defines.items())
            for f in os.listdir(d):
                if f.endswith(".cu"):
                    p = os.path.join(d, f)
                    with open(p) as fh:
                        body = fh.read()
                    with open(p, "w") as fh:
                        fh.write(head + body)
        k = Kernels(d)
    KEEP.append(k)
    return k
