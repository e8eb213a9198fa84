# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Slot bookkeeping for the bounded KV cache (DESIGN.md §5).

The cache has `capacity` slots per layer, laid out once:

    [0, P)              system prompt, never evicted
    [P, P+S)            the transient state slot of a model with a robot-state input (S = `state_tokens`: 1, else 0)
    [P+S, P+S+A)        transient action slots, overwritten every chunk (A = `action_tokens`: 8, or K x 8 for
                        a model that plans K actions in one parallel pass)
    [P+S+A, ...)        `frame_capacity` = (capacity - P - S - A) // 32 blocks of 32 contiguous slots, one frame each
    (tail)              leftover slots too few for a block, never used

This module only moves integers: it decides which slots a chunk writes and in which order attention
reads them. Positions are the index into `ChunkPlan.order`, so they are contiguous and bounded by
the capacity however long the stream runs (keys are stored un-rotated; RoPE uses the position).
"""

from __future__ import annotations

import numpy as np

from .constants import ACTION_TOKENS, VISION_TOKENS
from .contract import ChunkPlan  # noqa: F401 - re-exported: kv_cache makes the plans
from .eviction import EvictionPolicy


def min_capacity(prompt_tokens: int, frame_tokens: int = VISION_TOKENS, action_tokens: int = ACTION_TOKENS,
                 state_tokens: int = 0) -> int:
    """The one capacity rule: the smallest cache that holds the prompt, the state and action slots and one frame
    block."""
    return int(prompt_tokens) + int(state_tokens) + int(action_tokens) + int(frame_tokens)


def capacity_problem(capacity: int, prompt_tokens: int, label: str | None = None,
                     action_tokens: int = ACTION_TOKENS, state_tokens: int = 0) -> str | None:
    """None when `capacity` slots hold a `prompt_tokens` prompt (min_capacity), else one line; `label` names the
    value (default ``kv_capacity_tokens=<capacity>``, a tool's option e.g. ``--capacity <capacity>``);
    `action_tokens` / `state_tokens`: the model's transient slots (ModelConfig.action_tokens: K x 8; state_tokens)."""
    need = min_capacity(prompt_tokens, action_tokens=action_tokens, state_tokens=state_tokens)
    if capacity >= need:
        return None
    state = f" + {state_tokens} state token" if state_tokens else ""
    return (f"{label or f'kv_capacity_tokens={capacity}'} is too small: the {prompt_tokens}-token prompt + one "
            f"{VISION_TOKENS}-token frame{state} + {action_tokens} action tokens need {need}")


_PROMPT = -2  # owner tags in check_invariants' slot map; frame ids are >= 0
_ACTION = -3
_STATE = -4
_FREE = -1


class KvCache:
    def __init__(
        self,
        capacity_tokens: int,
        prompt_tokens: int,
        policy: EvictionPolicy,
        frame_tokens: int = VISION_TOKENS,
        action_tokens: int = ACTION_TOKENS,
        state_tokens: int = 0,
    ):
        if prompt_tokens < 0 or frame_tokens < 1 or action_tokens < 0 or state_tokens not in (0, 1):
            raise ValueError(
                f"need prompt_tokens >= 0, frame_tokens >= 1, action_tokens >= 0, state_tokens 0 or 1; got "
                f"{prompt_tokens}, {frame_tokens}, {action_tokens}, {state_tokens}"
            )
        needed = min_capacity(prompt_tokens, frame_tokens, action_tokens, state_tokens)
        if capacity_tokens < needed:
            raise ValueError(
                f"kv capacity {capacity_tokens} tokens is too small: prompt {prompt_tokens} + state {state_tokens} + "
                f"action {action_tokens} + one frame {frame_tokens} needs at least {needed}"
            )
        self.capacity = capacity_tokens
        self.prompt_tokens = prompt_tokens
        self.frame_tokens = frame_tokens
        self.action_tokens = action_tokens
        self.state_tokens = state_tokens
        self.transient_tokens = state_tokens + action_tokens
        self.policy = policy

        self.prompt_slots = np.arange(prompt_tokens, dtype=np.int32)
        self.state_slots = np.arange(prompt_tokens, prompt_tokens + state_tokens, dtype=np.int32)
        self.action_slots = np.arange(prompt_tokens + state_tokens, prompt_tokens + self.transient_tokens,
                                      dtype=np.int32)
        first_block_slot = prompt_tokens + self.transient_tokens
        self.frame_capacity = (capacity_tokens - first_block_slot) // frame_tokens
        # Row b holds block b's slots, so a plan's order is one fancy-index + concatenate.
        self._block_slots = (
            first_block_slot
            + np.arange(self.frame_capacity * frame_tokens, dtype=np.int32).reshape(self.frame_capacity, frame_tokens)
        )
        # Reversed so pop() hands out block 0 first; freed blocks are reused before untouched ones.
        self._free_blocks: list[int] = list(range(self.frame_capacity - 1, -1, -1))
        self._block_of: dict[int, int] = {}  # frame id -> block; dict order is retention order
        self._embeddings: dict[int, np.ndarray] = {}
        self._last_frame_id: int | None = None
        self._last_plan: ChunkPlan | None = None
        self.evictions_total = 0
        self.discards_total = 0

    # -- control path -------------------------------------------------------------------------

    def plan_frame(self, frame_id: int) -> ChunkPlan:
        """Insert a new frame, evicting per policy, and return where this chunk reads and writes."""
        if self._last_frame_id is not None and frame_id <= self._last_frame_id:
            raise ValueError(f"frame ids must increase: got {frame_id} after {self._last_frame_id}")
        if frame_id < 0:
            raise ValueError(f"frame ids must be >= 0, got {frame_id}")

        evicted: list[int] = []
        for victim in self.policy.window_victims(self.retained()):
            self._evict(victim)
            evicted.append(victim)
        if not self._free_blocks:
            victim = self.policy.choose_victim(self.retained(), self._embeddings)
            if victim is None:
                raise RuntimeError(f"policy {self.policy.name!r} chose no victim with the cache full")
            self._evict(victim)
            evicted.append(victim)

        older_blocks = np.fromiter(self._block_of.values(), dtype=np.intp, count=len(self._block_of))
        block = self._free_blocks.pop()
        self._block_of[frame_id] = block
        self._last_frame_id = frame_id

        frame_slots = self._block_slots[block]
        order = np.concatenate(
            [self.prompt_slots, self._block_slots[older_blocks].ravel(), frame_slots, self.state_slots,
             self.action_slots]
        )
        n_prefix = self.prompt_tokens + len(older_blocks) * self.frame_tokens
        plan = ChunkPlan(
            order=order,
            n_prefix=n_prefix,
            frame_slots=order[n_prefix:n_prefix + self.frame_tokens],
            action_slots=order[len(order) - self.action_tokens:],
            state_slots=order[n_prefix + self.frame_tokens:n_prefix + self.frame_tokens + self.state_tokens],
            frame_id=frame_id,
            evicted=evicted,
        )
        self._last_plan = plan
        return plan

    def set_embedding(self, frame_id: int, pooled: np.ndarray) -> bool:
        """Remember a frame's pooled embedding; False (ignored) if the frame is no longer retained."""
        if self._last_frame_id is None or frame_id > self._last_frame_id:
            raise ValueError(f"set_embedding for frame {frame_id} that was never planned")
        if frame_id not in self._block_of:
            return False  # evicted while its chunk ran: nothing to score any more
        pooled = np.array(pooled, dtype=np.float32, copy=True)
        if pooled.ndim != 1:
            raise ValueError(f"pooled embedding must be 1-D, got shape {pooled.shape}")
        self._embeddings[frame_id] = pooled
        return True

    def discard(self, frame_id: int) -> bool:
        """Forget a retained frame outside the policy, e.g. one whose chunk failed with its KV half
        written, so no later chunk attends to it. False if it was not retained. Ids must still increase."""
        if frame_id not in self._block_of:
            return False
        self._release(frame_id)
        self.discards_total += 1
        self._last_plan = None  # that plan's order names the discarded block: it describes nothing now
        return True

    def _evict(self, frame_id: int) -> None:
        if frame_id not in self._block_of:
            raise RuntimeError(f"policy {self.policy.name!r} chose frame {frame_id}, which is not retained")
        self._release(frame_id)
        self.evictions_total += 1

    def _release(self, frame_id: int) -> None:
        self._free_blocks.append(self._block_of.pop(frame_id))
        self._embeddings.pop(frame_id, None)

    # -- inspection ---------------------------------------------------------------------------

    def retained(self) -> list[int]:
        """Retained frame ids, oldest -> newest."""
        return list(self._block_of)

    def embedding(self, frame_id: int) -> np.ndarray | None:
        return self._embeddings.get(frame_id)

    def frame_slots_of(self, frame_id: int) -> np.ndarray:
        """The 32 slots a retained frame occupies (KeyError if not retained)."""
        return self._block_slots[self._block_of[frame_id]]

    def stats(self) -> dict:
        frames = len(self._block_of)
        return {
            "capacity": self.capacity,
            "used_tokens": self.prompt_tokens + self.transient_tokens + frames * self.frame_tokens,
            "frames_retained": frames,
            "frame_capacity": self.frame_capacity,
            "evictions_total": self.evictions_total,
            "discards_total": self.discards_total,
            "policy": self.policy.name,
        }

    def check_invariants(self) -> None:
        """Raise AssertionError if the slot bookkeeping is inconsistent (for tests and debugging)."""
        cap, n_prompt = self.capacity, self.prompt_tokens
        assert np.array_equal(self.prompt_slots, np.arange(n_prompt)), "prompt slots moved"
        assert np.array_equal(self.state_slots, np.arange(n_prompt, n_prompt + self.state_tokens)), "state slot moved"
        assert np.array_equal(
            self.action_slots, np.arange(n_prompt + self.state_tokens, n_prompt + self.transient_tokens)
        ), "action slots moved"

        owner = np.full(cap, _FREE, dtype=np.int64)
        owner[self.prompt_slots] = _PROMPT
        owner[self.action_slots] = _ACTION
        owner[self.state_slots] = _STATE
        retained = self.retained()
        assert retained == sorted(set(retained)), f"retention order not oldest->newest: {retained}"
        for frame_id, block in self._block_of.items():
            slots = self._block_slots[block]
            assert np.all(owner[slots] == _FREE), f"frame {frame_id} block {block} overlaps another owner"
            owner[slots] = frame_id
        assert owner[self.prompt_slots].tolist() == [_PROMPT] * n_prompt, "prompt slots overwritten"

        used_blocks = list(self._block_of.values())
        free_blocks = self._free_blocks
        assert len(set(free_blocks)) == len(free_blocks), "a block is free twice"
        assert not set(used_blocks) & set(free_blocks), "a block is both free and owned"
        assert sorted(used_blocks + free_blocks) == list(range(self.frame_capacity)), "a block was lost"
        for block in free_blocks:
            assert np.all(owner[self._block_slots[block]] == _FREE), f"free block {block} has an owner"
        tail_start = n_prompt + self.transient_tokens + self.frame_capacity * self.frame_tokens
        assert tail_start <= cap and np.all(owner[tail_start:] == _FREE), "slots beyond the blocks in use"

        assert len(retained) <= self.frame_capacity, "more frames than blocks"
        if self.policy.max_frames is not None:
            assert len(retained) <= self.policy.max_frames, "more frames than the policy's window"
        assert set(self._embeddings) <= set(retained), "embedding kept for an evicted frame"

        plan = self._last_plan
        if plan is None:
            return
        order = plan.order
        assert len(order) <= cap, f"order has {len(order)} slots, capacity {cap}"
        assert len(np.unique(order)) == len(order), "a slot appears twice in order"
        assert order.min(initial=0) >= 0 and order.max(initial=0) < cap, "order slot out of range"
        assert len(order) - 1 < cap, "position beyond capacity"
        assert plan.n_prefix == len(order) - self.frame_tokens - self.transient_tokens
        assert np.array_equal(order[:n_prompt], self.prompt_slots), "order does not start with the prompt"
        assert np.array_equal(plan.frame_slots, order[plan.n_prefix:plan.n_prefix + self.frame_tokens])
        assert np.array_equal(plan.action_slots, order[len(order) - self.action_tokens:])
        assert np.array_equal(plan.action_slots, self.action_slots)
        assert np.array_equal(plan.state_slots, self.state_slots)
        assert np.array_equal(order[plan.n_prefix + self.frame_tokens:len(order) - self.action_tokens],
                              self.state_slots), "the state slot is not between the frame and the action slots"
        # Layout only changes in plan_frame, so the last plan must still describe the cache exactly.
        assert plan.frame_id == retained[-1], "last planned frame is not the newest retained"
        expected_frames = [self._block_slots[self._block_of[f]] for f in retained]
        assert np.array_equal(order[n_prompt:len(order) - self.transient_tokens], np.concatenate(expected_frames))
