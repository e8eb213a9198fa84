# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""One reasoning chunk, backend-agnostic: encode frame -> cache insert (eviction) -> prefill 32 vision
tokens -> 8 constrained greedy decode passes -> action; a parallel model instead runs its K x 8 action queries in
the prefill and gets K actions (vla_action_chunk K; action k is for tick t0 + k, DESIGN.md §17).

The engine owns the KvCache bookkeeping (host side, no device round trip) and hands each backend a
ChunkPlan. `submit` runs the chunk on one worker thread so the control loop can wait for it with a
deadline and walk away from a late result.
"""
from __future__ import annotations

import concurrent.futures
import threading
import time
from dataclasses import dataclass, field, replace

import numpy as np

from .actions import ActionDecoder
from .constants import (ACTION_TOKENS, ACTION_VOCAB, DEFAULT_PROMPT_TOKENS, FRAME_C, FRAME_H, FRAME_W,
                        KV_CAPACITY_TOKENS, VISION_TOKENS, VRAM_CEILING_GB)
from .contract import (NON_FINITE_TOKEN, BackendResult, ChunkPlan, NonFiniteOutput,  # noqa: F401 - re-exported
                       PhaseTimings)
from .kv_cache import KvCache
from .eviction import make_policy
from .gpu import cuda_available
from .instruction import InstructionError, PromptBuilder
from .model.checkpoint import Checkpoint
from .model import ops
from .model.safetensors_io import release_heap
from .model.weights import Weights
from .realtime import set_realtime_priority

DEFAULT_SYSTEM_PROMPT = "You are a robot controller. Look at the camera and output the next action."
BACKENDS = ("auto", "numpy", "cuda")


class EngineError(RuntimeError):
    pass


@dataclass
class ChunkResult:
    tokens: np.ndarray  # int32 [8 K]
    action: np.ndarray  # float32 [8]: actions[0], the action for the tick of the chunk's frame
    timings: PhaseTimings
    frame_id: int
    evicted: list[int]
    retained: list[int]
    cache_tokens: int
    backend: str = ""
    logits: np.ndarray | None = field(default=None, repr=False)
    actions: np.ndarray | None = None  # float32 [K, 8]: row k the action for tick t0 + k (K = Engine.action_chunk)

    def __post_init__(self):
        if self.actions is None:  # a one-action result (callers that build one by hand)
            self.actions = np.asarray(self.action, np.float32).reshape(1, -1)


def make_backend(name: str, weights: Weights, capacity: int, vram_ceiling_gb: float):
    if name not in BACKENDS:
        raise EngineError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if name == "auto":
        name = "cuda" if cuda_available() else "numpy"
    if name == "cuda":
        try:
            from .cuda.backend import CudaBackend
        except ImportError as e:
            raise EngineError(f"backend 'cuda' needs CuPy and a CUDA GPU: {e}") from None
        return CudaBackend(weights, capacity, vram_ceiling_gb)
    from .model.reference import ReferenceModel

    return ReferenceModel(weights, capacity)


def system_prompt_ids(model, vocab_size: int, n: int = DEFAULT_PROMPT_TOKENS) -> np.ndarray:
    """Token ids of the pinned system prompt when no instruction is given.

    With the tokenizer of `model` (a Checkpoint or a model path; tokenizer.json, or a GGUF file's vocabulary) the
    default prompt text is encoded; a generated model has none, so a fixed, deterministic id sequence stands in.
    Either way the ids avoid the action range and the start token.
    """
    limit = vocab_size - ACTION_VOCAB - 1
    try:
        tok = Checkpoint.of(model).tokenizer
        ids = [i for i in tok.encode(DEFAULT_SYSTEM_PROMPT) if i < limit] if tok is not None else []
        if ids:
            return np.asarray(ids, np.int32)
    except Exception:  # noqa: BLE001 - an unreadable tokenizer falls back to the fixed prompt
        pass
    return ((np.arange(n, dtype=np.int64) * 7919 + 11) % limit).astype(np.int32)


def prompt_length(model) -> int:
    """Tokens of the system prompt `model` (a Checkpoint or a model path) gets (0 when its config cannot be read:
    loading reports that)."""
    checkpoint = Checkpoint.of(model)
    try:
        return int(len(system_prompt_ids(checkpoint, checkpoint.config.vocab_size)))
    except Exception:  # noqa: BLE001 - unreadable model: the engine reports it with details
        return 0


def check_finite(r: BackendResult) -> None:
    """Raise NonFiniteOutput when a chunk's forward pass overflowed: the vision embedding (pooled, already on the
    host) or any action row's logits (the backends mark such a row NON_FINITE_TOKEN; the CUDA head checks on the
    device while it takes the argmax, at no extra pass). An overflowing model must never drive: the argmax of a
    NaN row is a real bin."""
    if not np.isfinite(r.pooled).all():
        raise NonFiniteOutput("vision", "non-finite vision embedding: the vision projector overflowed", r.timings)
    bad = np.flatnonzero(np.asarray(r.tokens) == NON_FINITE_TOKEN)
    if bad.size:
        shown = ", ".join(map(str, bad[:16])) + (f" (+{bad.size - 16} more)" if bad.size > 16 else "")
        raise NonFiniteOutput("action logits", f"non-finite action logits at action token {shown}: the "
                              "transformer layers, the final norm or the head overflowed", r.timings)


class Engine:
    def __init__(self, model_path, backend: str = "auto", kv_capacity_tokens: int = KV_CAPACITY_TOKENS,
                 policy: str = "fifo", window_frames: int = 8, action_low=-1.0, action_high=1.0,
                 vram_ceiling_gb: float = VRAM_CEILING_GB,
                 weights: Weights | None = None, instruction: str = "", instruction_template: str = "auto",
                 max_instruction_tokens: int = 256):
        self.checkpoint = Checkpoint.of(model_path)  # a path, or the Checkpoint the caller opened (read once)
        self.model_path = self.checkpoint.path
        self.weights = weights if weights is not None else self.checkpoint.weights
        cfg = self.cfg = self.weights.cfg
        self.policy_name, self.window_frames = policy, window_frames
        self.capacity = int(kv_capacity_tokens)
        self.tokenizer = self.checkpoint.tokenizer
        self.prompts = PromptBuilder(self.tokenizer, cfg.vocab_size, self.capacity, DEFAULT_SYSTEM_PROMPT,
                                     system_prompt_ids(self.checkpoint, cfg.vocab_size),
                                     instruction_template,
                                     max_instruction_tokens, action_tokens=cfg.action_tokens,
                                     state_tokens=cfg.state_tokens)
        self.instruction_error = None  # why the start-up instruction was refused (the default prompt runs instead)
        try:
            self.instruction = self.prompts.build(instruction, "start")
        except InstructionError as e:
            self.instruction_error, self.instruction = str(e), self.prompts.default()
        self.prompt_ids = self.instruction.ids
        self.cache = self._new_cache()  # validates capacity and policy before any device allocation
        self.backend = make_backend(backend, self.weights, self.capacity, vram_ceiling_gb)
        if weights is None and self.backend.name == "cuda":
            # The device holds the layers now. A bf16 model's host pages were released after the upload; a 4-bit
            # model's repacked arrays live on the heap (853 MB of host RSS at 1.5B), so the host copy of the layers
            # goes, here and in the checkpoint. Weights handed in by the caller are theirs (the bench reuses them).
            self.weights = replace(self.weights, layers=[])
            self.checkpoint.release_weights()
            release_heap()
        self.backend.load_prompt(self.prompt_ids, self.cache.prompt_slots)
        self.start_token = cfg.vocab_size - ACTION_VOCAB - 1  # the last id before the action range
        self.decoder = ActionDecoder(cfg.vocab_size, action_low, action_high)
        self._next_frame_id = 0
        self._chunk_lock = threading.Lock()
        self._busy = threading.Event()
        self._worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="vla-engine")
        # Start the worker thread now, from the constructing thread: threads inherit their creator's
        # scheduling, and a real-time control thread that submits first must not hand its priority on.
        self._worker.submit(lambda: None).result()
        self.fault_hook = None  # tests inject faults here: called with the plan before the backend runs

    def _new_cache(self) -> KvCache:
        return KvCache(self.capacity, len(self.prompt_ids), make_policy(self.policy_name, self.window_frames),
                       action_tokens=self.cfg.action_tokens, state_tokens=self.cfg.state_tokens)

    @property
    def backend_name(self) -> str:
        return self.backend.name

    @property
    def weight_format(self) -> str:
        """Weight format the model dir holds and the backend runs: "w4" (4-bit weights, W4A16) or "bf16"."""
        return self.cfg.weight_format

    @property
    def action_decoding(self) -> str:
        """Action decoding, a property of the model read from its dir: "autoregressive" (8 passes) or "parallel"."""
        return self.cfg.action_decoding

    @property
    def action_chunk(self) -> int:
        """K: the actions one chunk plans (config.json vla_action_chunk; 1 for autoregressive models)."""
        return self.cfg.action_chunk

    @property
    def phase_tokens(self) -> tuple[int, int]:
        """(prefill tokens, decode tokens) of one chunk: what the admission estimate counts (parallel: 32 + 8 K; the
        state token of a model with a state input is one more prefill token)."""
        if self.cfg.parallel:
            return VISION_TOKENS + self.cfg.transient_tokens, 0
        return VISION_TOKENS + self.cfg.state_tokens, ACTION_TOKENS

    @property
    def state_dim(self) -> int:
        """Values of the robot state this model takes a chunk (0: none; config.json vla_state_dim)."""
        return self.cfg.state_dim

    def normalized_state(self, state) -> np.ndarray | None:
        """The backend's state input: `state` (float32 [S], the raw values in the model's order) normalized by the
        checkpoint's bounds; None for a model without a state input. A missing, mis-sized or non-finite state raises
        ValueError: the model never runs on a state it did not get."""
        if not self.cfg.state_dim:
            if state is not None:
                raise ValueError("this model has no state input (vla_state_dim 0), but a state was given")
            return None
        x = None if state is None else np.asarray(state, np.float32)
        got = "none" if x is None else f"shape {x.shape}" if x.shape != (self.cfg.state_dim,) else \
            None if np.isfinite(x).all() else "non-finite values"
        if got is not None:
            raise ValueError(f"this model needs a finite robot state of {self.cfg.state_dim} values, got {got}")
        st = self.weights.vision.state
        return ops.normalize_state(x, st.low, st.high)

    def set_worker_priority(self, priority: int) -> str | None:
        """Run the worker thread at SCHED_FIFO `priority` (0: leave it). Returns None or why it was refused.

        With the control thread real-time too (at a higher priority), a worker preempted by other processes while
        it holds the interpreter lock is what delays the deadline guard (measured on a ~3x slower host: publish
        lag p90 13 ms with only the control thread real-time); a real-time worker is never preempted by them and
        hands the lock over within the switch interval."""
        return self._worker.submit(set_realtime_priority, priority).result()

    @property
    def busy(self) -> bool:
        return self._busy.is_set()

    def run_chunk(self, frame: np.ndarray, collect_logits: bool = False, state=None) -> ChunkResult:
        """One chunk on the calling thread. `state`: the robot state (float32 [state_dim], raw values in the model's
        order) for a model with a state input, None otherwise."""
        if not isinstance(frame, np.ndarray) or frame.shape != (FRAME_H, FRAME_W, FRAME_C) or frame.dtype != np.uint8:
            raise ValueError(f"frame must be a uint8 array {(FRAME_H, FRAME_W, FRAME_C)}, got "
                             f"{getattr(frame, 'dtype', type(frame))} {getattr(frame, 'shape', '')}")
        state_in = self.normalized_state(state)
        with self._chunk_lock:
            frame_id = self._next_frame_id
            self._next_frame_id += 1
            plan: ChunkPlan = self.cache.plan_frame(frame_id)
            try:
                if self.fault_hook is not None:
                    self.fault_hook(plan)
                kwargs = {"collect_logits": True} if collect_logits else {}
                if state_in is not None:
                    kwargs["state"] = state_in
                r = self.backend.run_chunk(frame, plan, self.start_token, **kwargs)
                check_finite(r)
            except BaseException:
                # The frame's KV is half written: forget the frame so no later chunk attends to it.
                self.cache.discard(frame_id)
                raise
            self.cache.set_embedding(frame_id, r.pooled)
            # row k: tokens 8k..8k+7, the action for tick t0 + k, decoded as one action is
            actions = np.stack([self.decoder.decode(row) for row in np.reshape(r.tokens, (-1, ACTION_TOKENS))])
            return ChunkResult(tokens=r.tokens, action=actions[0], timings=r.timings,
                               frame_id=frame_id, evicted=list(plan.evicted), retained=self.cache.retained(),
                               cache_tokens=len(plan.order), backend=self.backend.name, logits=r.logits,
                               actions=actions)

    def submit(self, frame: np.ndarray, state=None) -> concurrent.futures.Future:
        """Run a chunk on the worker thread. The engine is `busy` until that chunk finishes, even if the
        caller stopped waiting for it."""
        # copies: the caller's buffers may be reused before the worker reads them
        s = None if state is None else np.array(state, np.float32, copy=True)
        return self._on_worker(lambda f=np.array(frame, copy=True): self.run_chunk(f, state=s))

    def _on_worker(self, fn) -> concurrent.futures.Future:
        """`fn()` on the worker thread, the engine `busy` until it returns; refused while busy."""
        if self._busy.is_set():
            raise EngineError("engine is busy with an earlier chunk")
        self._busy.set()

        def run():
            # cleared on the worker before the future completes: a caller woken by the result never sees a stale
            # `busy` (a done-callback runs after the waiters wake, and the next tick could read `busy` in between)
            try:
                return fn()
            finally:
                self._busy.clear()

        try:
            return self._worker.submit(run)
        except BaseException:
            self._busy.clear()
            raise

    def apply_instruction(self, instruction) -> float:
        """Make `instruction` (instruction.Instruction) the pinned prompt: prefill it into slots 0..P-1 and drop every
        retained frame (their keys and values were computed after the old prompt, so no action mixes two
        instructions; the positions restart contiguous). Returns the prefill's milliseconds. On failure the previous
        prompt is prefilled again and the error raised: the previous instruction stays active."""
        with self._chunk_lock:
            old = (self.instruction, self.prompt_ids, self.cache)
            t0 = time.perf_counter()
            try:
                self.prompt_ids = np.asarray(instruction.ids, np.int32)
                self.cache = self._new_cache()
                self.backend.load_prompt(self.prompt_ids, self.cache.prompt_slots)
            except BaseException:
                self.instruction, self.prompt_ids, _ = old
                self.cache = self._new_cache()  # the old prompt's slots were overwritten: prefill it again
                self.backend.load_prompt(self.prompt_ids, self.cache.prompt_slots)
                raise
            self.instruction = instruction
            return (time.perf_counter() - t0) * 1000.0

    def submit_instruction(self, instruction) -> concurrent.futures.Future:
        """`apply_instruction` on the worker thread (the engine is `busy` meanwhile); the future gives its ms."""
        return self._on_worker(lambda: self.apply_instruction(instruction))

    def warmup(self, chunks: int = 3, seed: int = 0) -> list[PhaseTimings]:
        """Compile, capture and run a few dry chunks so timings start from steady state; then forget
        those frames so the live stream starts with an empty history."""
        rng = np.random.default_rng(seed)
        st = self.weights.vision.state
        timings = [self.run_chunk(rng.integers(0, 256, (FRAME_H, FRAME_W, FRAME_C), dtype=np.uint8),
                                  state=None if st is None else rng.uniform(st.low, st.high).astype(np.float32)).timings
                   for _ in range(chunks)]
        with self._chunk_lock:
            self.cache = self._new_cache()
        return timings

    def stats(self) -> dict:
        s = dict(self.cache.stats())
        s["backend"] = self.backend.name
        s["weights"] = self.weight_format
        s["action_decoding"] = self.action_decoding
        s["action_chunk"] = self.action_chunk
        s["state_dim"] = self.state_dim
        s["prompt_tokens"] = int(len(self.prompt_ids))
        s["instruction_tokens"] = int(self.instruction.instruction_tokens)
        peak = getattr(self.backend, "peak_vram_bytes", None)
        s["peak_vram_bytes"] = peak
        return s

    def close(self) -> None:
        self._worker.shutdown(wait=True, cancel_futures=True)
