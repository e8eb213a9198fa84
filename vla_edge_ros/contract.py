# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The chunk contract between the engine and its backends (a leaf module: it imports only constants).

- ``ChunkPlan``: which slots a chunk writes and the retention order attention reads (kv_cache.py makes it);
- ``PhaseTimings``: what one chunk cost, per phase (the admission EMAs learn from it);
- ``BackendResult``: what a backend hands back for one chunk (``NON_FINITE_TOKEN`` marks an action row whose
  logits were not finite; the engine turns it into ``NonFiniteOutput``);
- ``Backend``: the protocol both backends implement (model/reference.py: NumPy; cuda/backend.py: CUDA);
- ``EngineProtocol``: what the control loop (cycle.py, runtime.py) uses of an engine (engine.Engine; a test may
  hand the node a stand-in that implements it).

A model decodes its 8 action tokens either autoregressively (8 passes, one token each) or in parallel (the 8
action queries enter with the frame's 32 vision tokens in one pass); ``PhaseTimings`` describes both: a parallel
chunk has ``decode_tokens == 0`` and ``prefill_tokens == 40``. A parallel model may plan K actions (config.json
``vla_action_chunk``, 1..MAX_ACTION_CHUNK; DESIGN.md §17): K x 8 action queries in the same pass, K x 8 transient
slots, ``prefill_tokens == 32 + 8 K``; token 8 k + d is dimension d of the action for tick t0 + k (t0: the tick of
the chunk's frame). Autoregressive models plan one action (K = 1).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from .constants import ACTION_TOKENS, VISION_TOKENS


@dataclass
class ChunkPlan:
    order: np.ndarray  # int32 [n_prefix + 32 + S + A] (A = 8 K action tokens, S state); position of order[i] is i
    n_prefix: int  # prompt + retained older frames, in tokens
    frame_slots: np.ndarray  # int32 [32] == order[n_prefix:n_prefix+32]
    action_slots: np.ndarray  # int32 [A] == order[-A:]
    frame_id: int
    evicted: list[int] = field(default_factory=list)  # frame ids evicted to make room (or by the window)
    # int32 [S] == order[n_prefix+32:n_prefix+32+S]: the robot state's transient slot, between the frame and the
    # action slots (S = 1 for a model with a state input, else 0)
    state_slots: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))


@dataclass
class PhaseTimings:
    """Measured cost of one chunk, in milliseconds."""

    vision_ms: float
    prefill_ms: float
    decode_ms: float
    total_ms: float
    prefill_tokens: int = VISION_TOKENS
    decode_tokens: int = ACTION_TOKENS


NON_FINITE_TOKEN = -1  # a backend's token for an action row whose logits held NaN/inf (the argmax is meaningless)


class NonFiniteOutput(RuntimeError):
    """A chunk's forward pass produced NaN/inf (weights that overflow in the arithmetic, not in the file): no action
    comes of it. ``phase`` names where it was seen: "vision" (the projector's output) or "action logits" (the
    transformer layers, the final norm or the head); ``timings`` are the chunk's measured phases (still a real cost)."""

    def __init__(self, phase: str, message: str, timings: "PhaseTimings | None" = None):
        super().__init__(message)
        self.phase, self.timings = phase, timings


@dataclass
class BackendResult:
    tokens: np.ndarray  # int32 [8 K], ids in the last-256 range; NON_FINITE_TOKEN where a row's logits were not finite
    pooled: np.ndarray  # float32 [H]: mean of the frame's 32 vision embeddings
    timings: PhaseTimings
    logits: np.ndarray | None = None  # [8 K, 256] action logits when a test asks for them


class Backend(Protocol):
    name: str
    capacity: int

    def load_prompt(self, token_ids: np.ndarray, slots: np.ndarray) -> None:
        """Run the system prompt through the model into its pinned slots."""

    def run_chunk(self, frame: np.ndarray, plan: ChunkPlan, start_token: int,
                  collect_logits: bool = False, state: np.ndarray | None = None) -> BackendResult:
        """Vision -> cache insert -> prefill (-> decode) -> 8 K action tokens, for one frame; `state`: the normalized
        robot state (float32 [S], ops.normalize_state) of a model with a state input, its token in plan.state_slots."""


class EngineProtocol(Protocol):
    backend_name: str  # "numpy" | "cuda"
    weight_format: str  # "bf16" | "w4"
    action_decoding: str  # "autoregressive" | "parallel"
    action_chunk: int  # K: actions one chunk plans (1: one action; a parallel model's vla_action_chunk)
    phase_tokens: tuple[int, int]  # (prefill tokens, decode tokens) of one chunk, what admission counts
    busy: bool  # a chunk runs on the worker thread
    fault_hook: object  # test-only: called with the ChunkPlan before the backend runs

    def run_chunk(self, frame: np.ndarray):
        """One chunk on the calling thread (warm-up)."""

    def submit(self, frame: np.ndarray):
        """One chunk on the worker thread: a concurrent.futures.Future of its ChunkResult."""

    def warmup(self, chunks: int) -> list[PhaseTimings]:
        """Dry chunks, then forget their frames (chunks=0: only the reset)."""

    def set_worker_priority(self, priority: int) -> str | None:
        """SCHED_FIFO priority of the worker thread; None, or why it was refused."""

    def stats(self) -> dict:
        """Cache and device statistics for the roll-up."""

    def close(self) -> None:
        """Stop the worker, release the backend."""
