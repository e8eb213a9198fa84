"""The chunk contract between the engine and its backends (a leaf module: it imports only constants).

- ``ChunkPlan``: which slots a chunk writes and the retention order attention reads (kv_cache.py makes it);
- ``PhaseTimings``: what one chunk cost, per phase (the admission EMAs learn from it);
- ``BackendResult``: what a backend hands back for one chunk;
- ``Backend``: the protocol both backends implement (model/reference.py: NumPy; cuda/backend.py: CUDA).

A model decodes its 8 action tokens either autoregressively (8 passes, one token each) or in parallel (the 8
action queries enter with the frame's 32 vision tokens in one pass); ``PhaseTimings`` describes both: a parallel
chunk has ``decode_tokens == 0`` and ``prefill_tokens == 40``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .constants import ACTION_TOKENS, VISION_TOKENS


@dataclass
class ChunkPlan:
    order: np.ndarray  # int32 [n_prefix + 32 + 8]; position of order[i] is i
    n_prefix: int  # prompt + retained older frames, in tokens
    frame_slots: np.ndarray  # int32 [32] == order[n_prefix:n_prefix+32]
    action_slots: np.ndarray  # int32 [8] == order[-8:]
    frame_id: int
    evicted: list[int] = field(default_factory=list)  # frame ids evicted to make room (or by the window)


@dataclass
class PhaseTimings:
    """Measured cost of one chunk, in milliseconds."""

    vision_ms: float
    prefill_ms: float
    decode_ms: float
    total_ms: float
    prefill_tokens: int = VISION_TOKENS
    decode_tokens: int = ACTION_TOKENS


@dataclass
class BackendResult:
    tokens: np.ndarray  # int32 [8], ids in the last-256 range
    pooled: np.ndarray  # float32 [H]: mean of the frame's 32 vision embeddings
    timings: PhaseTimings
    logits: np.ndarray | None = None  # [8, 256] action logits when a test asks for them


class Backend(Protocol):
    name: str
    capacity: int

    def load_prompt(self, token_ids: np.ndarray, slots: np.ndarray) -> None:
        """Run the system prompt through the model into its pinned slots."""

    def run_chunk(self, frame: np.ndarray, plan: ChunkPlan, start_token: int,
                  collect_logits: bool = False) -> BackendResult:
        """Vision -> cache insert -> prefill (-> decode) -> 8 action tokens, for one frame."""
