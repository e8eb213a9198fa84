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


# The prompt is prefilled in blocks of this many tokens: a block's queries against the whole cache are the prefill's
# working set (the golden model holds [block, capacity] scores a head), so a long prompt costs memory linear in its
# length, not quadratic.
PREFILL_BLOCK = 256


class NonFiniteLogits(RuntimeError):
    pass


def prefill_bytes(cfg, capacity: int) -> int:
    """Host bytes the golden model needs for `capacity` positions: its cache (raw k, rotated k and v, float32, every
    layer), the rotary tables, and one prefill block's attention scores, mask and activations."""
    cap, block = int(capacity), min(PREFILL_BLOCK, int(capacity))
    cache = 3 * cfg.num_hidden_layers * cap * cfg.kv_dim * 4 + 2 * cap * cfg.head_dim * 4
    scores = 3 * cfg.num_attention_heads * block * cap * 4 + block * cap
    acts = 8 * block * max(cfg.intermediate_size, cfg.hidden_size, cfg.vocab_size) * 4
    return cache + scores + acts


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
    if not g.prompt_ids:
        raise ValueError("the prompt has no tokens")
    t0 = time.perf_counter()
    for start in range(0, len(g.prompt_ids), PREFILL_BLOCK):  # in blocks: the working set stays one block's
        logits = model.text_logits(g.prompt_ids[start:start + PREFILL_BLOCK], start, last_only=True)
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
