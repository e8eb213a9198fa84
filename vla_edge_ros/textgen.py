# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Greedy text from the hand-written engine: the first check of a new checkpoint ("does it load right?").

The same backends as the control loop (the NumPy golden model, the CUDA engine), driven through their
`text_logits` (full vocabulary, slot = position); the tokenizer and chat template are the checkpoint's own.
`vla-edge-generate` is the command-line face of `generate`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .engine import make_backend
from .model.weights import Weights


class NonFiniteLogits(RuntimeError):
    pass


@dataclass
class Generation:
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    stopped: bool = False  # ended on an end-of-text id
    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        n = max(len(self.ids) - 1, 0)
        return n / self.decode_s if self.decode_s > 0 and n else 0.0


def text_model(weights: Weights, backend: str, capacity: int, vram_ceiling_gb: float = 8.0):
    """A backend with `text_logits` for `capacity` positions (prompt + generated tokens)."""
    return make_backend(backend, weights, int(capacity), vram_ceiling_gb)


def greedy_next(logits: np.ndarray) -> int:
    row = np.asarray(logits, np.float32).reshape(-1)
    if not np.isfinite(row).all():
        raise NonFiniteLogits("non-finite logits: the forward pass overflowed")
    return int(row.argmax())


def generate(model, prompt_ids, n_tokens: int, stop_ids=()) -> Generation:
    """Up to `n_tokens` greedy tokens after `prompt_ids` (stopping after an id in `stop_ids`)."""
    g = Generation([int(i) for i in prompt_ids])
    t0 = time.perf_counter()
    logits = model.text_logits(g.prompt_ids, 0, last_only=True)
    g.prefill_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    pos = len(g.prompt_ids)
    for i in range(int(n_tokens)):
        tok = greedy_next(logits[-1])
        g.ids.append(tok)
        if tok in stop_ids:
            g.stopped = True
            break
        if i + 1 < n_tokens:
            logits = model.text_logits([tok], pos, last_only=True)
            pos += 1
    g.decode_s = time.perf_counter() - t1
    return g
