"""The CUDA engine's VRAM plan as pure arithmetic (no CuPy, no GPU): bytes of every device
allocation, computed from the model config before anything is allocated, and the start-up check
against ``vram_ceiling_gb`` with one message that names the plan and the ceiling.

It mirrors ``CudaBackend.vram_plan()`` (cuda/backend.py), which needs a device only for the SM
count; ``CudaBackend`` can call :func:`vram_plan` with ``sms=device SM count`` instead of its own copy.
"""

from __future__ import annotations

import math

from .constants import ACTION_TOKENS, ACTION_VOCAB, FRAME_C, FRAME_H, FRAME_W, VISION_TOKENS

GIB = 1 << 30
MIB = 1 << 20
T_PRE = VISION_TOKENS  # prefill GEMM rows (fixed 32)
N_STAMPS = 3 + ACTION_TOKENS  # vision start, vision end, prefill end, after each decode pass
H100_SMS = 132  # the SM count used when none is given (H100/H200); it only sizes a small workspace


class VramPlanError(RuntimeError):
    """The plan does not fit the configured ceiling (start-up refuses it)."""


def _align(n: int, a: int = 256) -> int:
    return (n + a - 1) // a * a


def io_bytes(hidden: int, capacity: int) -> tuple[int, int]:
    """Sizes of the pinned/device input block (frame, order table, params, start row) and the output
    block (tokens, timestamps, pooled embedding), laid out as the CUDA backend does."""
    frame = FRAME_H * FRAME_W * FRAME_C
    o_order = _align(frame)
    o_params = _align(o_order + 4 * capacity)
    o_start = _align(o_params + 16)
    in_bytes = _align(o_start + 2 * hidden)
    o_pooled = _align(64 + 8 * N_STAMPS, 64)
    out_bytes = _align(o_pooled + 4 * hidden)
    return in_bytes, out_bytes


def vram_plan(cfg, capacity: int, sms: int = H100_SMS, decode_splits: int = 64) -> dict[str, int]:
    """Bytes per part: weights (bf16), kv (bf16, every layer), activations, graph_workspace, total."""
    H, I, D = int(cfg.hidden_size), int(cfg.intermediate_size), int(cfg.head_dim)
    NH, NKV, L = int(cfg.num_attention_heads), int(cfg.num_key_value_heads), int(cfg.num_hidden_layers)
    cap = int(capacity)
    group = NH // NKV
    NQ, NKVD = NH * D, NKV * D
    NQKV = NQ + 2 * NKVD
    decode_splits = max(1, min(64, int(decode_splits)))
    nrg_pre = math.ceil(T_PRE * group / 64)
    prefill_splits = max(1, min(64, round(2 * int(sms) / (NKV * nrg_pre))))

    per_layer = 2 * (NQKV * H + H * NQ + 2 * I * H + H * I + 2 * H) + 4 * NQKV
    tied = True  # action rows of the head (and, if untied, of the embedding too) only
    weights = L * per_layer + 2 * H + 2 * ACTION_VOCAB * H * (1 if tied else 2) + 2 * (H * 768 + H + 32 * H)
    kv = L * 2 * NKV * cap * D * 2
    act = (4 * T_PRE * H + 2 * T_PRE * max(H, I) + 4 * T_PRE * NQKV + 4 * T_PRE * 2 * I
           + (4 + 2) * T_PRE * NQ + 4 * (H + NQ * 2 + I) + 4 * ACTION_TOKENS * ACTION_VOCAB)
    parts = max(NKV * nrg_pre * prefill_splits, NKV * decode_splits) * 64
    in_bytes, out_bytes = io_bytes(H, cap)
    workspace = (parts * (D + 2) * 4 + 2 * cap * (D // 2) * 4 + in_bytes + out_bytes
                 + 16 * MIB)  # + 16 MiB allowance: graph exec, module images, pool rounding
    total = weights + kv + act + workspace
    return {"weights": weights, "kv": kv, "activations": act, "graph_workspace": workspace, "total": total}


def format_plan(plan: dict[str, int]) -> str:
    return ", ".join(f"{k} {v / MIB:.1f} MiB" for k, v in plan.items())


def plan_message(plan: dict[str, int], ceiling_gb: float, capacity: int | None = None) -> str:
    cap = f" at kv_capacity_tokens={capacity}" if capacity is not None else ""
    return (f"VRAM plan{cap} ({format_plan(plan)}) exceeds the ceiling vram_ceiling_gb={ceiling_gb:g} "
            f"({ceiling_gb * GIB / MIB:.0f} MiB): lower kv_capacity_tokens, use a smaller model or raise "
            f"vram_ceiling_gb")


def check_vram_plan(plan: dict[str, int], ceiling_gb: float, capacity: int | None = None) -> dict[str, int]:
    """Return ``plan`` when its total fits ``ceiling_gb``; else raise VramPlanError naming both."""
    if not (plan["total"] <= float(ceiling_gb) * GIB):
        raise VramPlanError(plan_message(plan, ceiling_gb, capacity))
    return plan


def plan_for_model_dir(model_dir: str, capacity: int, sms: int = H100_SMS) -> dict[str, int] | None:
    """The plan of a model directory's config (None when the config cannot be read)."""
    try:
        from .model.config import ModelConfig

        return vram_plan(ModelConfig.from_dir(model_dir), capacity, sms=sms)
    except Exception:  # noqa: BLE001 - the engine reports an unreadable model with details
        return None
