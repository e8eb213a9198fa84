# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The golden model: a NumPy Qwen2 forward over the slot-addressed KV cache, float32 on bf16 weights.

Cache layout (shared with the CUDA engine): keys are stored un-rotated per slot; the position of a
token is its index in the chunk's `order` (prompt, retained frames oldest->newest, new frame, the robot state's
token of a model with a state input, action tokens), and RoPE is applied from that position inside attention.
This keeps positions contiguous and < capacity however long the stream runs. For speed on the CPU this backend
also keeps a rotated copy of every key, re-rotated only when eviction moves its position (at most once per chunk).
"""
from __future__ import annotations

import time

import numpy as np

from ..contract import NON_FINITE_TOKEN, BackendResult, PhaseTimings
from ..constants import ACTION_TOKENS, ACTION_VOCAB, VISION_TOKENS
from . import ops
from .quant import as_f32
from .safetensors_io import release_pages
from .weights import Weights, action_queries


def _widened(x) -> np.ndarray:
    """as_f32(x), then the pages of a memory-mapped `x` released (read once; safetensors_io.release_pages)."""
    f = as_f32(x)
    if f is not x:
        release_pages(x)
    return f


class WidenedRows:
    """A [V, H] weight kept as loaded (bf16 bits or float32) and read as float32: `rows[ids]` widens the rows asked
    for; `times_transposed(h)` (h @ W.T, the text logits) widens the whole weight the first time and keeps it, so
    the control loop, which only looks rows up, never holds a float32 copy of the vocabulary (545 MB at 0.5B)."""

    def __init__(self, w):
        self.w = w
        self.shape = tuple(w.shape)
        self._whole = None

    def __getitem__(self, idx) -> np.ndarray:
        return as_f32(self.w[idx]) if self._whole is None else self._whole[idx]

    def __len__(self) -> int:
        return self.shape[0]

    def times_transposed(self, h: np.ndarray) -> np.ndarray:
        if self._whole is None:
            self._whole = _widened(self.w)
        return h @ self._whole.T


class ReferenceModel:
    name = "numpy"

    def __init__(self, weights: Weights, capacity: int):
        cfg = self.cfg = weights.cfg
        self.weights = weights
        self.capacity = int(capacity)
        f = _widened  # bf16 bits widened, 4-bit QuantTensors dequantized (both exact in float32)
        # The embedding and an untied head stay as loaded (bf16: 545 MB less at 0.5B than float32) until text logits
        # are asked for: the rows a forward looks up are widened then; the action head's 256 rows are widened once
        # (every chunk uses them).
        self.embed = WidenedRows(weights.embed)
        self.final_norm = f(weights.norm)
        self.layers = [{k: f(v) for k, v in layer.items()} for layer in weights.layers]
        self.head = self.embed if weights.lm_head is None else WidenedRows(weights.lm_head)
        self.action_head = np.ascontiguousarray(self.head[cfg.vocab_size - ACTION_VOCAB:])
        v = weights.vision
        self.patch_w, self.patch_b, self.pos_embed = f(v.patch_w), f(v.patch_b), f(v.pos_embed)
        L, nkv, d = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim
        self.k_raw = np.zeros((L, nkv, self.capacity, d), np.float32)
        self.k_rot = np.zeros_like(self.k_raw)
        self.v = np.zeros_like(self.k_raw)
        self.rotated_for = np.full(self.capacity, -1, np.int64)  # position k_rot[:, :, slot] is rotated for
        self.cos, self.sin = ops.rope_cos_sin(np.arange(self.capacity), d, cfg.rope_theta)
        self.parallel = cfg.parallel
        self.queries = action_queries(weights) if self.parallel else None
        st = weights.vision.state
        self.state_w = None if st is None else (f(st.fc1_w), f(st.fc1_b), f(st.fc2_w), f(st.fc2_b))
        self.S = cfg.state_tokens

    # -- building blocks -------------------------------------------------------------------------
    def vision(self, frame: np.ndarray) -> np.ndarray:
        return ops.vision_encode(frame, self.patch_w, self.patch_b, self.pos_embed)

    def frame_rows(self, frame: np.ndarray, state) -> np.ndarray:
        """The chunk's prefill inputs before any action query: the frame's 32 vision tokens, then (a model with a
        state input) the state's token [1, H] from the normalized state."""
        emb = self.vision(frame)
        if not self.S:
            return emb
        if state is None or np.shape(state) != (self.cfg.state_dim,):
            raise ValueError(f"this model takes a robot state of {self.cfg.state_dim} values, got "
                             f"{None if state is None else np.shape(state)}")
        return np.concatenate([emb, ops.state_project(state, *self.state_w)[None, :]])

    def logits(self, h: np.ndarray) -> np.ndarray:
        return self.head.times_transposed(h)

    def _rerotate(self, slots: np.ndarray, positions: np.ndarray) -> None:
        stale = self.rotated_for[slots] != positions
        if not stale.any():
            return
        s, p = slots[stale], positions[stale]
        c, sn = self.cos[p], self.sin[p]
        for layer in range(self.cfg.num_hidden_layers):
            raw = self.k_raw[layer][:, s, :].transpose(1, 0, 2)  # [n, NKV, D]
            self.k_rot[layer][:, s, :] = ops.apply_rope(raw, c, sn).transpose(1, 0, 2)
        self.rotated_for[s] = p

    def forward(self, x: np.ndarray, order: np.ndarray, q_start: int, collect: bool = False,
                bidir_from: int | None = None):
        """Run tokens x [T, H] whose slots are order[q_start:q_start+T] over the cache.

        Token t sees positions <= q_start + t (causal), except tokens t >= bidir_from, which see every token of
        this call (parallel action queries: the whole frame and each other).
        Returns (final-normed hidden [T, H], per-layer residual streams if collect else None).
        """
        cfg = self.cfg
        t = x.shape[0]
        n = q_start + t
        order = np.asarray(order[:n], dtype=np.int64)
        if n > self.capacity or (order >= self.capacity).any() or (order < 0).any():
            raise ValueError(f"order of {n} tokens does not fit a cache of {self.capacity} slots")
        self._rerotate(order[:q_start], np.arange(q_start))
        new_slots = order[q_start:]
        pos_of_slot = np.full(self.capacity, -1, np.int64)
        pos_of_slot[order] = np.arange(n)
        q_pos = np.arange(q_start, n)
        limit = q_pos.copy()
        if bidir_from is not None:
            limit[bidir_from:] = n - 1
        allowed = (pos_of_slot[None, :] >= 0) & (pos_of_slot[None, :] <= limit[:, None])
        cos, sin = self.cos[q_pos], self.sin[q_pos]
        nh, nkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        hidden = [] if collect else None
        x = x.astype(np.float32)
        for li, w in enumerate(self.layers):
            h = ops.rms_norm(x, w["ln1"], cfg.rms_norm_eps)
            q = ops.linear(h, w["wq"], w["bq"]).reshape(t, nh, d)
            k = ops.linear(h, w["wk"], w["bk"]).reshape(t, nkv, d)
            v = ops.linear(h, w["wv"], w["bv"]).reshape(t, nkv, d)
            self.k_raw[li][:, new_slots, :] = k.transpose(1, 0, 2)
            self.k_rot[li][:, new_slots, :] = ops.apply_rope(k, cos, sin).transpose(1, 0, 2)
            self.v[li][:, new_slots, :] = v.transpose(1, 0, 2)
            a = ops.attention(ops.apply_rope(q, cos, sin), self.k_rot[li], self.v[li], allowed)
            x = x + ops.linear(a.reshape(t, nh * d), w["wo"])
            h = ops.rms_norm(x, w["ln2"], cfg.rms_norm_eps)
            x = x + ops.linear(ops.silu_mul(ops.linear(h, w["wg"]), ops.linear(h, w["wu"])), w["wd"])
            if collect:
                hidden.append(x.copy())
        self.rotated_for[new_slots] = q_pos
        return ops.rms_norm(x, self.final_norm, cfg.rms_norm_eps), hidden

    # -- text (vla-edge-generate, the real-weight gates) -----------------------------------------
    def text_logits(self, token_ids, start: int = 0, last_only: bool = False) -> np.ndarray:
        """Full-vocabulary logits float32 [T, V] ([1, V] with last_only) of `token_ids` at positions
        start..start+T-1, appended to the text already in slots 0..start-1 (slot = position; start 0 begins a
        new text). Each token attends causally to positions 0..its own. The CUDA backend has the same method."""
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        if ids.size == 0 or start < 0 or start + ids.size > self.capacity:
            raise ValueError(f"{ids.size} tokens at position {start} do not fit a cache of {self.capacity} slots")
        if ((ids < 0) | (ids >= self.cfg.vocab_size)).any():
            raise ValueError(f"token ids must lie in 0..{self.cfg.vocab_size - 1}")
        h, _ = self.forward(self.embed[ids], np.arange(start + ids.size), start)
        return self.head.times_transposed(h[-1:] if last_only else h)

    # -- the Backend protocol of engine.py -------------------------------------------------------
    def load_prompt(self, token_ids: np.ndarray, slots: np.ndarray) -> None:
        self.forward(self.embed[np.asarray(token_ids)], np.asarray(slots), 0)

    def run_chunk(self, frame: np.ndarray, plan, start_token: int, collect_logits: bool = False, state=None):
        if self.parallel:
            return self._run_parallel(frame, plan, collect_logits, state)
        t0 = time.perf_counter()
        rows = self.frame_rows(frame, state)
        emb = rows[:VISION_TOKENS]
        t1 = time.perf_counter()
        self.forward(rows, plan.order, plan.n_prefix)
        t2 = time.perf_counter()
        tokens = np.empty(ACTION_TOKENS, np.int32)
        logits_log = []
        tok = int(start_token)
        base = plan.n_prefix + len(rows)
        vocab0 = self.cfg.vocab_size - ACTION_VOCAB
        for step in range(ACTION_TOKENS):
            h, _ = self.forward(self.embed[tok][None, :], plan.order, base + step)
            logits = h[0] @ self.action_head.T
            if collect_logits:
                logits_log.append(logits)
            idx = int(ops.argmax_rows(logits[None])[0])
            tokens[step] = vocab0 + idx if idx >= 0 else NON_FINITE_TOKEN
            tok = vocab0 + max(idx, 0)  # the next pass gathers a valid row, as the kernel does
        t3 = time.perf_counter()
        ms = 1e3
        timings = PhaseTimings(vision_ms=(t1 - t0) * ms, prefill_ms=(t2 - t1) * ms, decode_ms=(t3 - t2) * ms,
                               total_ms=(t3 - t0) * ms, prefill_tokens=len(rows))
        result = BackendResult(tokens=tokens, pooled=emb.mean(axis=0), timings=timings)
        if collect_logits:
            result.logits = np.stack(logits_log)
        return result

    def _run_parallel(self, frame: np.ndarray, plan, collect_logits: bool, state=None):
        """One pass: the frame's 32 vision tokens (+ the state token, causal like them) + the K x 8 action queries
        (bidirectional among themselves and over the whole frame); the action tokens are the argmaxes over the 256
        action rows at the K x 8 queries."""
        t0 = time.perf_counter()
        rows = self.frame_rows(frame, state)
        emb = rows[:VISION_TOKENS]
        t1 = time.perf_counter()
        x = np.concatenate([rows, self.queries])
        h, _ = self.forward(x, plan.order, plan.n_prefix, bidir_from=len(rows))
        logits = h[len(rows):] @ self.action_head.T
        idx = ops.argmax_rows(logits)
        tokens = np.where(idx >= 0, self.cfg.vocab_size - ACTION_VOCAB + idx, NON_FINITE_TOKEN).astype(np.int32)
        t2 = time.perf_counter()
        ms = 1e3
        timings = PhaseTimings(vision_ms=(t1 - t0) * ms, prefill_ms=(t2 - t1) * ms, decode_ms=0.0,
                               total_ms=(t2 - t0) * ms, prefill_tokens=len(x), decode_tokens=0)
        return BackendResult(tokens=tokens, pooled=emb.mean(axis=0), timings=timings,
                             logits=logits if collect_logits else None)
