# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Frame eviction policies for the KV cache (DESIGN.md §5).

A policy only decides *which* retained frame goes; the KvCache owns the slots and does the freeing.
Policies see the retained frame ids (oldest -> newest) and the pooled embeddings known so far. They
never see the frame being inserted: its embedding comes out of the chunk that is about to run, and
waiting for it would put a host<->device round trip on the control path.

- fifo: evict the oldest frame when the cache is full.
- sliding_window: keep only the newest `window_frames` frames (the new one included) even when
  space remains, which bounds attention cost; evict the oldest when full.
- semantic: among adjacent retained frames, evict the older frame of the most cosine-similar pair,
  so near-duplicate frames go first and the last frame of an old scene survives a scene cut.
"""

from __future__ import annotations

import numpy as np


class EvictionPolicy:
    """Base policy: never windows, evicts the oldest frame when full."""

    name = "base"
    # Upper bound on retained frames the policy enforces by itself (None: only capacity limits it).
    max_frames: int | None = None

    def choose_victim(self, retained: list[int], embeddings: dict[int, np.ndarray]) -> int | None:
        """Frame id to evict because the cache is full; None when nothing is retained."""
        return retained[0] if retained else None

    def window_victims(self, retained: list[int]) -> list[int]:
        """Frame ids to evict before inserting a new frame even though space remains."""
        return []


class FifoPolicy(EvictionPolicy):
    name = "fifo"


class SlidingWindowPolicy(EvictionPolicy):
    name = "sliding_window"

    def __init__(self, window_frames: int = 8):
        if window_frames < 1:
            raise ValueError(f"window_frames must be >= 1, got {window_frames}")
        self.window_frames = window_frames
        self.max_frames = window_frames

    def window_victims(self, retained: list[int]) -> list[int]:
        # The new frame takes one place in the window, so at most window-1 old frames may stay.
        excess = len(retained) - (self.window_frames - 1)
        return list(retained[:excess]) if excess > 0 else []


class SemanticPolicy(EvictionPolicy):
    name = "semantic"

    def __init__(self):
        # Adjacent pairs change only around an insertion or eviction, so cosines are memoised per
        # pair; the stored arrays are kept so a re-reported embedding (a new object) is rescored.
        self._pair_cosine: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, float]] = {}

    def choose_victim(self, retained: list[int], embeddings: dict[int, np.ndarray]) -> int | None:
        # Frames without an embedding yet (typically the newest, whose chunk is still running) drop
        # out of the scoring, so their neighbours on either side count as adjacent.
        known = [frame_id for frame_id in retained if frame_id in embeddings]
        if len(known) < 2:
            return super().choose_victim(retained, embeddings)
        pairs = list(zip(known, known[1:]))
        cosines = [self._cosine(older, newer, embeddings) for older, newer in pairs]
        self._pair_cosine = {pair: self._pair_cosine[pair] for pair in pairs}  # forget stale pairs
        # max() keeps the first maximum: on ties the oldest pair goes, which degrades to fifo.
        best = max(range(len(pairs)), key=cosines.__getitem__)
        return pairs[best][0]

    def _cosine(self, older: int, newer: int, embeddings: dict[int, np.ndarray]) -> float:
        a, b = embeddings[older], embeddings[newer]
        cached = self._pair_cosine.get((older, newer))
        if cached is not None and cached[0] is a and cached[1] is b:
            return cached[2]
        a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        norms = np.linalg.norm(a64) * np.linalg.norm(b64)
        cosine = float(a64 @ b64 / norms) if norms > 0 else 0.0  # a zero vector matches nothing
        self._pair_cosine[(older, newer)] = (a, b, cosine)
        return cosine


POLICY_NAMES = ("fifo", "sliding_window", "semantic")


def make_policy(name: str, window_frames: int = 8) -> EvictionPolicy:
    """Policy by its config name: fifo | sliding_window | semantic."""
    if name == "fifo":
        return FifoPolicy()
    if name == "sliding_window":
        return SlidingWindowPolicy(window_frames)
    if name == "semantic":
        return SemanticPolicy()
    raise ValueError(f"unknown eviction policy {name!r}; valid policies: {', '.join(POLICY_NAMES)}")
