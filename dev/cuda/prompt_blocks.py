# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Where a prompt's and a text prefill's time goes (issue 41 item 4), on model dirs: CudaBackend.load_prompt and
text_logits(last_only) for several prompt lengths (so the cost of one prefill block of each size shows), then the
text head alone (the bf16 GEMM over all V rows of one PROMPT_ROWS block) and the copy of 64 rows of its fp32 logits
back to (pageable) host memory. Host wall time, stream synchronized, p50 of --reps after one warm-up call.

  python dev/cuda/prompt_blocks.py --model DIR [--model DIR ...] [--sizes 32,64,96,160,352] [--reps 10]

BENCHMARKS.md "Prompt blocks of 96 rows" has its numbers (the 0.5B shape's bf16 and 4-bit dirs of bench/lib.sh).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def p50_ms(fn, reps: int) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(ts))


def measure(model: str, sizes: list[int], reps: int, capacity: int) -> None:
    from vla_edge_ros.cuda.backend import CudaBackend
    from vla_edge_ros.model.weights import load_weights

    w = load_weights(model)
    be = CudaBackend(w, capacity)
    rng = np.random.default_rng(0)
    V = w.cfg.vocab_size
    print(f"PROMPT_BLOCKS {model}: fp16 activations {be.x16}, chunk GEMM {be.gemm.name}, prompt GEMM "
          f"{be.gemm_prompt.name}")
    for P in sizes:
        ids = rng.integers(0, V, P)
        lp = p50_ms(lambda: be.load_prompt(ids, np.arange(P, dtype=np.int32)), reps)
        tl = p50_ms(lambda: be.text_logits(ids, 0, last_only=True), reps)
        print(f"PROMPT_BLOCKS   {P} tokens: load_prompt {lp:.2f} ms, text_logits last_only {tl:.2f} ms")
    tx, s = be._text, be.stream

    def head():
        with s:
            tx["gemm"](be.xb, tx["head"], tx["vp"], be.H, "store", Y=tx["logits"], run=be.launch)
        s.synchronize()

    def copy_back():
        tx["logits"][:64, :V].get(stream=s)
        s.synchronize()

    print(f"PROMPT_BLOCKS   head GEMM ({tx['gemm'].name}) {p50_ms(head, reps):.2f} ms; 64 rows of logits "
          f"({64 * V * 4 / 1e6:.0f} MB) to pageable host memory {p50_ms(copy_back, reps):.2f} ms")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--sizes", default="32,64,96,160,352")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--capacity", type=int, default=4096)
    a = ap.parse_args(argv)

    import cupy as cp

    for model in a.model:
        measure(model, [int(x) for x in a.sizes.split(",")], a.reps, a.capacity)
        cp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
