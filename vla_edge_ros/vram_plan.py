# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The CUDA engine's VRAM plan as pure arithmetic (no CuPy, no GPU): the shape of every device array the
engine allocates, computed from the model config before anything is allocated, the bytes per part, and the
start-up checks (a shape the kernels do not support; a plan over ``vram_ceiling_gb``) with one message each.

``layout()`` is the single source: ``CudaBackend`` allocates exactly ``layout().buffers`` (plus the weights and
the KV cache it sizes the same way), and ``vram_plan()`` is its byte count, so the plan the node checks at
start-up and what the engine allocates cannot disagree.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from .constants import (ACTION_TOKENS, ACTION_VOCAB, FRAME_C, FRAME_H, FRAME_W, GROUP_SIZE, MAX_STATE_DIM, PATCH_DIM,
                        VISION_TOKENS)

GIB = 1 << 30
MIB = 1 << 20
N_STAMPS = 3 + ACTION_TOKENS  # vision start, vision end, prefill end, after each decode pass
H100_SMS = 132  # the SM count used when none is given (H100/H200); it only sizes a small workspace
# decode attention splits: two 32-key tiles a block at a full 4096-slot cache (measured on the H200: 64 beat 128, 32,
# 16 and 8; BENCHMARKS.md, issue 18)
DECODE_SPLITS = 64
PREFILL_ROWS_MAX = 96  # the largest prefill GEMM instance (kernels/gemm.cu): 32 vision rows + 64 action queries
# Rows of a prompt / text prefill block (CudaBackend.load_prompt, text_logits): the largest GEMM instance, so a
# 352-token instruction is 4 blocks that each read the weights once, not 11 of 32 rows (BENCHMARKS.md, "Prompt blocks
# of 96 rows")
PROMPT_ROWS = PREFILL_ROWS_MAX
MAX_HIDDEN = 2048  # the decode GEMVs keep a whole row of x in a warp's registers: 256 * 8 values
TEXT_ROWS_ALIGN = 128  # the full LM head of text_logits is padded to this many rows (the bf16 prefill GEMM's block)
ALLOWANCE = 16 * MIB  # graph exec, module images, pool rounding
_DTYPE_BYTES = {"float32": 4, "uint16": 2, "int32": 4, "uint8": 1, "uint32": 4}


class VramPlanError(RuntimeError):
    """The plan does not fit the configured ceiling (start-up refuses it)."""


class UnsupportedShapeError(ValueError):
    """The model's shape is outside what the CUDA kernels implement (start-up refuses it, naming the limit)."""


def _align(n: int, a: int = 256) -> int:
    return (n + a - 1) // a * a


ATTN_HEAD_DIMS = (64, 128)  # the attention kernel's instances (kernels/attention.cu attn_partial_<D>)
SHAPE_QUANTUM = 128  # hidden, FFN, q/k/v and o sizes: the 4-bit group and the prefill GEMM's K step / 4-bit block


def cuda_shape_problems(cfg) -> list[str]:
    """Why the CUDA kernels cannot run this config (empty when they can). Every published Qwen2 / Qwen2.5 size up to
    3B runs (hidden 896 / 1536 / 2048, head_dim 64 or 128, GQA 7:1 / 6:1 / 8:1, FFN 4864 / 8960 / 11008): head_dim 64
    or 128, hidden and FFN multiples of 128 with hidden <= 2048, q/k/v and o widths multiples of 128, at most 16 query
    heads per KV head; a parallel chunk of at most 96 prefill rows (8 actions, or 7 with a state token)."""
    H, I, D = int(cfg.hidden_size), int(cfg.intermediate_size), int(cfg.head_dim)
    NH, NKV = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
    q = SHAPE_QUANTUM
    problems = []
    if D not in ATTN_HEAD_DIMS:
        problems.append(f"head_dim {D} (the attention kernel is built for {' and '.join(map(str, ATTN_HEAD_DIMS))})")
    if H % q or I % q:
        problems.append(f"hidden_size {H} / intermediate_size {I} must be multiples of {q}")
    if H > MAX_HIDDEN:
        problems.append(f"hidden_size {H} > {MAX_HIDDEN} (a decode GEMV warp holds a whole row of x)")
    if NKV <= 0 or NH % NKV:
        problems.append(f"{NH} query heads are not a multiple of {NKV} KV heads")
    else:
        if (NH + 2 * NKV) * D % q or NH * D % q:
            problems.append(f"q/k/v width {(NH + 2 * NKV) * D} / attention width {NH * D} must be multiples of {q}")
        if (NH // NKV) * VISION_TOKENS > 64 * 8:
            problems.append("more than 16 query heads per KV head")
    S, A = int(getattr(cfg, "state_tokens", 0)), int(getattr(cfg, "action_tokens", ACTION_TOKENS))
    if getattr(cfg, "parallel", False) and VISION_TOKENS + S + A > PREFILL_ROWS_MAX:
        problems.append(f"{A // ACTION_TOKENS} actions a chunk with a state token make {VISION_TOKENS + S + A} prefill "
                        f"rows, over the prefill GEMM's {PREFILL_ROWS_MAX} (with a state input at most "
                        f"{(PREFILL_ROWS_MAX - VISION_TOKENS - S) // ACTION_TOKENS} actions a chunk)")
    return problems


def check_cuda_shape(cfg) -> None:
    problems = cuda_shape_problems(cfg)
    if problems:
        raise UnsupportedShapeError("the CUDA engine does not support this model: " + "; ".join(problems)
                                    + " (use backend: numpy)")


def io_bytes(hidden: int, capacity: int, action_tokens: int = ACTION_TOKENS) -> tuple[int, int]:
    """Sizes of the input block (frame, order table, params, start row) and the output block (tokens,
    timestamps, pooled embedding), laid out as the CUDA backend does."""
    return in_layout(hidden, capacity)[1], out_layout(hidden, action_tokens)[1]


def in_layout(hidden: int, capacity: int) -> tuple[dict[str, int], int]:
    """Byte offsets of the input block: the frame, the order table, the params, the start token's row and the
    normalized robot state (float32, room for MAX_STATE_DIM values whether the model takes one or not)."""
    frame = FRAME_H * FRAME_W * FRAME_C
    o_order = _align(frame)
    o_params = _align(o_order + 4 * capacity)
    o_start = _align(o_params + 16)
    o_state = _align(o_start + 2 * hidden)
    return ({"frame": 0, "order": o_order, "params": o_params, "start": o_start, "state": o_state},
            _align(o_state + 4 * MAX_STATE_DIM))


def out_layout(hidden: int, action_tokens: int = ACTION_TOKENS) -> tuple[dict[str, int], int]:
    """Byte offsets of the output block: the chunk's int32 tokens (8 K of them), the timestamps, the pooled
    embedding; 8 tokens keep the layout of one action (timestamps at 64)."""
    o_ts = _align(4 * int(action_tokens), 64)
    o_pooled = _align(o_ts + 8 * N_STAMPS, 64)
    return {"tokens": 0, "ts": o_ts, "pooled": o_pooled}, _align(o_pooled + 4 * hidden)


def linear_bytes(n: int, k: int, quantized: bool) -> int:
    """Device bytes of one [n, k] linear weight: bf16, or 4-bit nibbles + one 32-bit scale|zero word a group."""
    return n * k // 2 + n * (k // GROUP_SIZE) * 4 if quantized else 2 * n * k


def prefill_rows(tokens: int) -> int:
    """Rows of the prefill buffers for ``tokens`` real rows: a row count kernels/gemm.cu has an instance for. 32 (the
    vision tokens alone); 48 for 33 (+ the state token) and for one parallel action (32 + 8, + 1 with a state: the
    4-bit body multiplies the 40 or 48 rows, the bf16 one zero rows too); 96 for 2..8 actions (32 + 8 K; K < 8 pads
    with zero rows: one more instance, not seven)."""
    for rows, most in ((32, 32), (48, 41), (PREFILL_ROWS_MAX, PREFILL_ROWS_MAX)):
        if tokens <= most:
            return rows
    raise ValueError(f"{tokens} prefill tokens: the prefill GEMM has instances for up to 96 rows")


@dataclass(frozen=True)
class Layout:
    rows: int  # the chunk's prefill GEMM rows (prefill_rows): 32, 48 (32 vision + 8 parallel action queries + 8 zero
    # rows) or 96 (32 vision + 8 K action queries of K = 2..8 actions, zero rows to 96)
    buffer_rows: int  # rows of the prefill's activation buffers: the chunk's and a prompt block's (PROMPT_ROWS)
    tokens: int  # prefill tokens: 32, or 32 + 8 K with parallel action decoding; + 1 (the state) with a state input
    decode_passes: int  # 8 (autoregressive) or 0 (parallel)
    decode_splits: int
    prefill_splits: int
    buffers: dict  # name -> (shape, dtype name): every activation / workspace array the backend allocates
    parts: dict  # weights, kv, activations, graph_workspace, total (bytes)


# attn_partial_w8_<D> (the prefill's partial kernel) blocks an SM holds (256 threads; sm_90 ptxas: 222 registers a
# thread at D 128, 128 at D 64; shared memory 61 / 32 KB): test_cuda_kernels checks these against the occupancy API
ATT_RESIDENT = {64: 2, 128: 1}
ATT_BLOCK_ROWS = 128  # query rows (token x head in group) an attn_partial_w8 block computes
WAVE_SLACK = 1.1  # wave_splits takes the fewest splits within this factor of the best waves per split


def wave_splits(slots: int, blocks_per_split: int) -> int:
    """Key splits (1..64) of a prefill attention whose blocks come in waves of ``slots`` (SMs x resident blocks): each
    split adds ``blocks_per_split`` blocks and divides every block's keys, so the time goes as waves / splits; the
    fewest splits within WAVE_SLACK of the least (every extra split costs a Q load and a partial to combine)."""
    cost = {s: -(-blocks_per_split * s // slots) / s for s in range(1, 65)}
    best = min(cost.values())
    return min(s for s, c in cost.items() if c <= WAVE_SLACK * best)


@functools.lru_cache(maxsize=4096)  # layout() asks for every prompt block size of a shape
def prefill_attention_splits(sms: int, nkv: int, tokens: int, group: int, head_dim: int) -> int:
    """Key splits of a prefill attention of ``tokens`` query tokens: whole waves of attn_partial_w8 blocks (nkv x
    ceil(tokens x group / 128) a split) over ``sms`` SMs."""
    row_blocks = -(-int(tokens) * int(group) // ATT_BLOCK_ROWS)
    return wave_splits(int(sms) * ATT_RESIDENT.get(int(head_dim), 1), int(nkv) * row_blocks)


def prefill_partial_rows(sms: int, nkv: int, tokens: int, group: int, head_dim: int) -> int:
    """Rows of attention partials (64-row groups x splits x KV heads, 64 rows each) a prefill of ``tokens`` query
    tokens writes with its prefill_attention_splits."""
    groups = -(-int(tokens) * int(group) // 64)
    return int(nkv) * groups * prefill_attention_splits(sms, nkv, tokens, group, head_dim) * 64


def layout(cfg, capacity: int, sms: int = H100_SMS) -> Layout:
    H, I, D = int(cfg.hidden_size), int(cfg.intermediate_size), int(cfg.head_dim)
    NH, NKV, L = int(cfg.num_attention_heads), int(cfg.num_key_value_heads), int(cfg.num_hidden_layers)
    cap = int(capacity)
    group = NH // NKV
    NQ, NKVD = NH * D, NKV * D
    NQKV = NQ + 2 * NKVD
    parallel, quant = cfg.parallel, cfg.weight_format == "w4"
    A = int(getattr(cfg, "action_tokens", ACTION_TOKENS))  # 8 K action tokens
    S = int(getattr(cfg, "state_tokens", 0))  # the state's token (1 with a state input)
    tokens = VISION_TOKENS + S + (A if parallel else 0)
    rows = prefill_rows(tokens)
    buffer_rows = max(rows, PROMPT_ROWS)
    # the head: one launch over the K x 8 action rows when K > 1, a ticket a row; one action (8 launches, or a
    # decode pass's one) shares one ticket
    tickets = A if A > ACTION_TOKENS else 1
    prefill_splits = prefill_attention_splits(sms, NKV, tokens, group, D)
    # the partials of the chunk's prefill, of every prompt block (1..PROMPT_ROWS rows: the splits are per block size)
    # and of a decode pass
    parts_rows = max(max(prefill_partial_rows(sms, NKV, t, group, D) for t in (tokens, *range(1, PROMPT_ROWS + 1))),
                     NKV * DECODE_SPLITS * 64)
    n_in, n_out = io_bytes(H, cap, A)
    activations = {
        "x_pre": ((buffer_rows, H), "float32"), "xb": ((buffer_rows, max(H, I)), "uint16"),
        "qkv": ((buffer_rows, NQKV), "float32"), "gu": ((buffer_rows, 2 * I), "float32"),
        "att": ((buffer_rows, NQ), "float32"), "att_bf": ((buffer_rows, NQ), "uint16"),
        "xdec": ((H,), "float32"), "qdec": ((NQ,), "float32"), "attdec": ((NQ,), "float32"),
        "act": ((I,), "float32"), "logits": ((A, ACTION_VOCAB), "float32"), "ticket": ((tickets,), "int32"),
    }
    if S:
        activations["state_hidden"] = ((H,), "float32")  # GELU(fc1 s), read by kernels/state.cu's fc2
    workspace = {
        "part_o": ((parts_rows * D,), "float32"), "part_ml": ((parts_rows * 2,), "float32"),
        "cos": ((cap, D // 2), "float32"), "sin": ((cap, D // 2), "float32"),
        "in_dev": ((n_in,), "uint8"), "out_dev": ((n_out,), "uint8"),
    }

    def nbytes(bufs):
        return sum(math.prod(shape) * _DTYPE_BYTES[dt] for shape, dt in bufs.values())

    per_layer = (linear_bytes(NQKV, H, quant) + linear_bytes(H, NQ, quant) + linear_bytes(2 * I, H, quant)
                 + linear_bytes(H, I, quant) + 2 * 2 * H + 4 * NQKV)
    head_rows = 2 * ACTION_VOCAB * H * (1 if cfg.tie_word_embeddings else 2)  # action rows of head (+ embedding)
    vision = 2 * (H * PATCH_DIM + H + VISION_TOKENS * H)
    queries = 4 * A * H if parallel else 0
    state = 2 * (H * int(getattr(cfg, "state_dim", 0)) + H + H * H + H) if S else 0  # the projector, bf16
    weights = L * per_layer + 2 * H + head_rows + vision + queries + state
    kv = L * 2 * NKV * cap * D * 2
    act = nbytes(activations)
    ws = nbytes(workspace) + ALLOWANCE
    parts = {"weights": weights, "kv": kv, "activations": act, "graph_workspace": ws,
             "total": weights + kv + act + ws}
    return Layout(rows=rows, buffer_rows=buffer_rows, tokens=tokens, decode_passes=0 if parallel else ACTION_TOKENS,
                  decode_splits=DECODE_SPLITS, prefill_splits=prefill_splits,
                  buffers={**activations, **workspace}, parts=parts)


def text_head_bytes(cfg, rows: int = PROMPT_ROWS) -> int:
    """Device bytes CudaBackend.text_logits adds on its first call (never part of the robot chunk's plan): the full LM
    head in bf16, padded to TEXT_ROWS_ALIGN rows, and its fp32 logits for one prefill block (PROMPT_ROWS rows)."""
    vp = _align(int(cfg.vocab_size), TEXT_ROWS_ALIGN)
    return 2 * vp * int(cfg.hidden_size) + 4 * rows * vp


def vram_plan(cfg, capacity: int, sms: int = H100_SMS) -> dict[str, int]:
    """Bytes per part: weights (bf16 or 4-bit), kv (bf16, every layer), activations, graph_workspace, total."""
    return dict(layout(cfg, capacity, sms).parts)


def format_plan(plan: dict[str, int]) -> str:
    return ", ".join(f"{k} {v / MIB:.1f} MiB" for k, v in plan.items())


def plan_message(plan: dict[str, int], ceiling_gb: float, capacity: int | None = None) -> str:
    cap = f" at kv_capacity_tokens={capacity}" if capacity is not None else ""
    return (f"VRAM plan{cap} ({format_plan(plan)}) exceeds the ceiling vram_ceiling_gb={ceiling_gb:g} "
            f"({ceiling_gb * GIB / MIB:.0f} MiB): lower kv_capacity_tokens, use a smaller or 4-bit model or raise "
            f"vram_ceiling_gb")


def check_vram_plan(plan: dict[str, int], ceiling_gb: float, capacity: int | None = None) -> dict[str, int]:
    """Return ``plan`` when its total fits ``ceiling_gb``; else raise VramPlanError naming both."""
    if not (plan["total"] <= float(ceiling_gb) * GIB):
        raise VramPlanError(plan_message(plan, ceiling_gb, capacity))
    return plan


def plan_for_model(model, capacity: int, sms: int = H100_SMS) -> dict[str, int] | None:
    """The plan of a model's config (`model`: a model/checkpoint.py Checkpoint, whose config is read once, or an HF
    directory or GGUF file path; None when it cannot be read)."""
    try:
        from .model.checkpoint import Checkpoint

        return vram_plan(Checkpoint.of(model).config, capacity, sms=sms)
    except Exception:  # noqa: BLE001 - the engine reports an unreadable model with details
        return None
