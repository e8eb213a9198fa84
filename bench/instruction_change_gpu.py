# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""What an instruction change costs on the CUDA engine, and that it is right there (device-side, H200).

1. Golden semantics on the GPU (tiny preset): an engine whose prompt is changed after some frames gives the same
   action logits on the next frames as a fresh engine started on the new prompt.
2. The prompt prefill of a change (Engine.apply_instruction) for 16 + {16, 64, 256} prompt tokens on the 0.5B and
   1.5B shapes (random weights, 4096-slot cache), and the cycles of a 33 ms period it costs.

    python3 bench/instruction_change_gpu.py     # on the device; prints a table
"""
from __future__ import annotations

import math
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from vla_edge_ros.engine import Engine  # noqa: E402
from vla_edge_ros.instruction import Instruction  # noqa: E402
from vla_edge_ros.model.generate import make_model  # noqa: E402

PERIOD_MS = 33.0


def frames(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (64, 128, 3), dtype=np.uint8) for _ in range(n)]


def instruction(engine, n_extra: int, seed: int = 1) -> Instruction:
    """The default prompt + n_extra ids below the action range (no tokenizer needed: the cost depends on length)."""
    limit = engine.cfg.vocab_size - 257
    ids = np.concatenate([engine.prompt_ids, np.random.default_rng(seed).integers(0, limit, n_extra)]).astype(np.int32)
    return Instruction(f"<{n_extra} ids>", ids, n_extra, "raw", "bench")


def main() -> int:
    tmp = tempfile.mkdtemp()
    tiny = make_model(os.path.join(tmp, "tiny"), "tiny", seed=2)
    f = frames(5)
    a = Engine(tiny, backend="cuda", kv_capacity_tokens=512)
    b = Engine(tiny, backend="cuda", kv_capacity_tokens=512)
    new = instruction(a, 48)
    for x in f[:3]:
        a.run_chunk(x)
    a.apply_instruction(new)
    b.apply_instruction(new)  # b: a fresh engine (no frames yet) on the same prompt
    worst = max(float(np.abs(a.run_chunk(x, collect_logits=True).logits - b.run_chunk(x, collect_logits=True).logits)
                      .max()) for x in f[3:])
    print(f"golden semantics on the GPU (tiny): after a change vs fresh on the new prompt: max |d| action logits "
          f"{worst:.3g} (bound 1e-3)")
    ok = worst <= 1e-3
    a.close()
    b.close()
    print("| shape | prompt tokens | prefill ms p50 (5 runs) | cycles of 33 ms it costs | next chunk ms |")
    print("|---|---|---|---|---|")
    for preset in ("qwen2.5-0.5b", "qwen2.5-1.5b"):
        d = make_model(os.path.join(tmp, preset), preset, seed=0)
        e = Engine(d, backend="cuda", kv_capacity_tokens=4096)
        e.warmup(3)
        for n in (16, 64, 256):
            ins = instruction(e, n)
            ms = sorted(e.apply_instruction(ins) for _ in range(5))[2]
            t0 = time.perf_counter()
            e.run_chunk(f[0])
            chunk_ms = (time.perf_counter() - t0) * 1e3
            # the change starts at a tick, publishes instruction_change there, and the cycle after it finishes
            # runs normally: ceil(prefill / period) cycles, at least one
            cycles = max(1, math.ceil(ms / PERIOD_MS))
            print(f"| {preset} | {len(ins.ids)} | {ms:.2f} | {cycles} | {chunk_ms:.2f} |")
        e.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
