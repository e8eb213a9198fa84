# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""What fits the control cycle on this host: time a model's chunk here, before anything depends on it.

CPUs of the same kind differ ~2.5x in speed from machine to machine and from run to run (DESIGN.md §15), so
a CPU demo or a test cannot assume that a given model fits a 33 ms cycle: it measures. `measure_chunk`
fills the cache first (attention then reads every slot, as on a robot that has run for a while) and times
the chunks after that; `fits` compares the measured p90 with a share of the cycle's budget, because the
node shares the CPU with the camera process, DDS and whatever else runs (on the 2-core CI box a chunk in
the running node took ~1.5-2x the chunk measured alone).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .constants import FRAME_C, FRAME_H, FRAME_W
from .engine import Engine
from .robot_state import synthetic_state

FIT_SHARE = 0.75  # a model fits when its measured chunk p90 is at most this share of period - margin


@dataclass(frozen=True)
class ChunkCost:
    """Chunk times measured on this host (ms, wall clock around `Engine.run_chunk`)."""

    p50_ms: float
    p90_ms: float
    max_ms: float
    chunks: int

    def line(self) -> str:
        return f"chunk p50 {self.p50_ms:.1f} ms, p90 {self.p90_ms:.1f} ms over {self.chunks} chunks"


def measure_chunk(model_path: str, kv_capacity_tokens: int, backend: str = "numpy", chunks: int = 10,
                  seed: int = 0) -> ChunkCost:
    """Time `chunks` chunks of the model on a full cache of `kv_capacity_tokens` slots."""
    engine = Engine(model_path, backend=backend, kv_capacity_tokens=kv_capacity_tokens)
    try:
        rng = np.random.default_rng(seed)
        frames = rng.integers(0, 256, (4, FRAME_H, FRAME_W, FRAME_C), dtype=np.uint8)
        fill = engine.cache.frame_capacity + 1  # one more than fits: the timed chunks also evict
        dim = engine.state_dim  # a model with a state input gets a made-up one, as in the warm-up
        times = []
        for i in range(fill + chunks):
            state = {"state": synthetic_state(dim, 0.03 * i, seed)} if dim else {}
            t = time.perf_counter()
            engine.run_chunk(frames[i % len(frames)], **state)
            if i >= fill:
                times.append((time.perf_counter() - t) * 1000.0)
    finally:
        engine.close()
    xs = np.asarray(times)
    return ChunkCost(float(np.percentile(xs, 50)), float(np.percentile(xs, 90)), float(xs.max()), len(xs))


def fits(cost: ChunkCost, period_ms: float, safety_margin_ms: float, share: float = FIT_SHARE) -> bool:
    """True when the measured p90 is at most `share` of the cycle's budget (period - margin)."""
    return cost.p90_ms <= share * (period_ms - safety_margin_ms)


def period_for(cost: ChunkCost, safety_margin_ms: float, least_ms: float, share: float = FIT_SHARE) -> float:
    """The shortest period (ms, at least `least_ms`, rounded up to 10 ms above it) for which `cost` fits."""
    need = cost.p90_ms / share + safety_margin_ms
    if need <= least_ms:
        return float(least_ms)
    return float(np.ceil(need / 10.0) * 10.0)
