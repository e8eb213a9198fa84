# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""What the robot-state input costs the CPU chunk (issue 38's target: <= 3 % of the tiny chunk).

    python3 bench/state_cost_cpu.py [--preset tiny] [--chunks 60] [--rounds 5]

Two generated models of one seed, the same but for a 14-value state input (7 joints x position, velocity: ALOHA's
size), on the NumPy backend at the CPU capacity (512 slots) with the cache full. The rounds alternate the two models so
a slow spell of the host hits both; each round prints the median chunk and its phases, the last line the median over
the rounds and the difference, with the state projector alone (normalize + project) timed beside it."""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vla_edge_ros.constants import CPU_KV_CAPACITY_TOKENS, FRAME_C, FRAME_H, FRAME_W  # noqa: E402
from vla_edge_ros.engine import Engine  # noqa: E402
from vla_edge_ros.model import ops  # noqa: E402
from vla_edge_ros.model.generate import make_model  # noqa: E402
from vla_edge_ros.robot_state import synthetic_state  # noqa: E402

JOINTS = tuple(f"joint_{i}" for i in range(7))


def one_round(path: str, chunks: int) -> tuple[float, list[float]]:
    e = Engine(path, backend="numpy", kv_capacity_tokens=CPU_KV_CAPACITY_TOKENS)
    try:
        rng = np.random.default_rng(0)
        frames = rng.integers(0, 256, (4, FRAME_H, FRAME_W, FRAME_C), dtype=np.uint8)
        dim, rows = e.state_dim, []
        for i in range(e.cache.frame_capacity + 1 + chunks):
            kw = {"state": synthetic_state(dim, 0.03 * i)} if dim else {}
            t = e.run_chunk(frames[i % 4], **kw).timings
            if i > e.cache.frame_capacity:
                rows.append((t.total_ms, t.vision_ms, t.prefill_ms, t.decode_ms))
        med = np.median(np.asarray(rows), axis=0)
        return float(med[0]), [float(x) for x in med[1:]]
    finally:
        e.close()


def projector_ms(path: str, reps: int = 500) -> float:
    e = Engine(path, backend="numpy", kv_capacity_tokens=CPU_KV_CAPACITY_TOKENS)
    try:
        s = synthetic_state(e.state_dim, 0.0)
        w = e.backend.state_w
        t = time.perf_counter()
        for _ in range(reps):
            ops.state_project(e.normalized_state(s), *w)
        return (time.perf_counter() - t) / reps * 1000.0
    finally:
        e.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--chunks", type=int, default=60)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        plain = make_model(f"{d}/plain", preset=a.preset, seed=0)
        state = make_model(f"{d}/state", preset=a.preset, seed=0, state_joints=JOINTS,
                           state_fields=("position", "velocity"))
        totals = {"plain": [], "state": []}
        for r in range(a.rounds):
            for name, path in (("plain", plain), ("state", state)):
                total, phases = one_round(path, a.chunks)
                totals[name].append(total)
                print(f"round {r} {name:5s}: chunk {total:.3f} ms (vision {phases[0]:.3f}, prefill {phases[1]:.3f}, "
                      f"decode {phases[2]:.3f})", flush=True)
        mp, ms = statistics.median(totals["plain"]), statistics.median(totals["state"])
        print(f"{a.preset}: chunk without a state {mp:.3f} ms, with a 14-value state {ms:.3f} ms: "
              f"+{ms - mp:.3f} ms (+{100 * (ms - mp) / mp:.1f} %); the projector alone (normalize + project) "
              f"{projector_ms(state):.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
