# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The NumPy twins of every CUDA kernel: the golden math, float32 throughout.

Each function here is the reference its kernel in `kernels/*.cu` is tested against, and what
`model/reference.py` composes into the forward pass.
"""
from __future__ import annotations

import numpy as np

from ..constants import FRAME_C, FRAME_H, FRAME_W, GRID_H, GRID_W, PATCH


def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """Qwen2RMSNorm: x / sqrt(mean(x^2) + eps) * w, over the last axis.

    A row whose mean square overflows float32 (|x| beyond ~1e19: the forward pass has blown up) becomes NaN, as in
    the kernels, instead of the 0 that 1/sqrt(inf) would make of it: zeros would flow on as a finite, meaningless
    action (the argmax of an all-zero row is bin 0), while NaN is caught before the argmax."""
    x = x.astype(np.float32, copy=False)
    with np.errstate(over="ignore"):
        ms = np.mean(x * x, axis=-1, keepdims=True)
    ok = np.isfinite(ms)
    inv = np.where(ok, 1.0 / np.sqrt(np.where(ok, ms, 0.0) + eps), np.nan).astype(np.float32)
    return x * inv * w


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """y = x @ w.T (+ b); w is [out, in] as in the checkpoint."""
    y = x @ w.T
    return y + b if b is not None else y


def rope_cos_sin(positions: np.ndarray, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables [len(positions), head_dim/2] for the half-split rotation HF Qwen2 uses."""
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate x [..., T, heads, D] (or [T, heads, D]) by per-token cos/sin [T, D/2] (rotate_half form)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """GQA attention. q [Tq, NH, D] (rotated), k/v [NKV, S, D] (k rotated), allowed [Tq, S] bool.

    Query head h reads KV head h // (NH/NKV). Returns [Tq, NH, D].
    """
    tq, nh, d = q.shape
    nkv = k.shape[0]
    group = nh // nkv
    out = np.empty_like(q)
    scale = np.float32(1.0 / np.sqrt(d))
    neg = np.where(allowed, np.float32(0), np.float32(-np.inf))
    for g in range(nkv):
        qg = q[:, g * group:(g + 1) * group, :].reshape(tq * group, d)  # rows: (t, head in group)
        scores = (qg @ k[g].T).reshape(tq, group, -1) * scale + neg[:, None, :]
        scores -= scores.max(axis=-1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=-1, keepdims=True)
        out[:, g * group:(g + 1) * group, :] = (p.reshape(tq * group, -1) @ v[g]).reshape(tq, group, d)
    return out


def cache_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, order: np.ndarray, cos: np.ndarray,
                    sin: np.ndarray, q_start: int, bidir_from: int) -> np.ndarray:
    """The twin of kernels/attention.cu (attn_partial + attn_combine): q [T, NH*D] un-rotated, k/v [NKV, cap, D]
    float32 with keys un-rotated per slot, cos/sin tables over positions. The key at index j of ``order`` has
    position j, query t position q_start + t; query t sees keys j <= q_start + t, rows t >= bidir_from every key of
    the call. Returns [T, NH*D]."""
    T = q.shape[0]
    n = q_start + T
    d = k.shape[-1]
    pos = np.arange(n)
    krot = apply_rope(k[:, order[:n], :].transpose(1, 0, 2), cos[pos], sin[pos]).transpose(1, 0, 2)
    qp = np.arange(q_start, n)
    qrot = apply_rope(q.reshape(T, -1, d), cos[qp], sin[qp])
    limit = qp.copy()
    limit[bidir_from:] = n - 1
    return attention(qrot, krot, v[:, order[:n], :], pos[None, :] <= limit[:, None]).reshape(T, -1)


def silu_mul(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    return g / (1.0 + np.exp(-g)) * u


def patchify(frame: np.ndarray) -> np.ndarray:
    """uint8 [64, 128, 3] -> float32 [32, 768]: 4x8 grid row-major, (row, col, channel) inside a patch,
    pixels normalised to x/127.5 - 1."""
    if frame.shape != (FRAME_H, FRAME_W, FRAME_C) or frame.dtype != np.uint8:
        raise ValueError(f"frame must be uint8 {(FRAME_H, FRAME_W, FRAME_C)}, got {frame.dtype} {frame.shape}")
    p = frame.reshape(GRID_H, PATCH, GRID_W, PATCH, FRAME_C).transpose(0, 2, 1, 3, 4)
    return p.reshape(GRID_H * GRID_W, PATCH * PATCH * FRAME_C).astype(np.float32) / np.float32(127.5) - np.float32(1.0)


def vision_encode(frame: np.ndarray, patch_w: np.ndarray, patch_b: np.ndarray, pos_embed: np.ndarray) -> np.ndarray:
    """Patch projector: patches [32, 768] @ W.T + b + pos -> [32, H] float32."""
    return patchify(frame) @ patch_w.T + patch_b + pos_embed


def argmax_rows(logits: np.ndarray) -> np.ndarray:
    """First index of the maximum per row, as the on-device argmax breaks ties; -1 for a row holding any NaN or
    inf (a forward pass that overflowed: its argmax would otherwise be a real bin, e.g. 0 for an all-NaN row)."""
    idx = np.argmax(logits, axis=-1).astype(np.int32)
    return np.where(np.isfinite(logits).all(axis=-1), idx, np.int32(-1)).astype(np.int32)


def normalize_state(x: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """A raw robot state [S] into the projector's input, as OpenVLA-OFT normalizes proprioception (BOUNDS_Q99):
    2 (x - low) / (high - low) - 1 clipped to [-1, 1]; a dimension whose bounds coincide (never moved in the
    training data) becomes 0. Runs on the host for both backends (S values)."""
    x, low, high = (np.asarray(a, np.float32) for a in (x, low, high))
    span = high - low
    ok = span > 0
    out = np.where(ok, 2.0 * (x - low) / np.where(ok, span, 1.0) - 1.0, 0.0)
    return np.clip(out, -1.0, 1.0).astype(np.float32)


def erf(x: np.ndarray) -> np.ndarray:
    """erf in float32 for NumPy (which has none): Abramowitz & Stegun 7.1.26, |error| <= 1.5e-7, below float32's
    resolution of the GELU it feeds; the kernel uses CUDA's erff."""
    x = np.asarray(x, np.float32)
    a = np.abs(x).astype(np.float64)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return (np.sign(x) * (1.0 - poly * np.exp(-a * a))).astype(np.float32)


def gelu(x: np.ndarray) -> np.ndarray:
    """PyTorch's nn.GELU() (exact, erf form): 0.5 x (1 + erf(x / sqrt 2))."""
    x = np.asarray(x, np.float32)
    return (0.5 * x * (1.0 + erf(x * np.float32(1.0 / np.sqrt(2.0))))).astype(np.float32)


def state_project(s: np.ndarray, fc1_w: np.ndarray, fc1_b: np.ndarray, fc2_w: np.ndarray,
                  fc2_b: np.ndarray) -> np.ndarray:
    """The twin of kernels/state.cu: a normalized state [S] -> its token [H], fc2(GELU(fc1(s))) (OpenVLA-OFT's
    ProprioProjector), float32 on the float32 weights."""
    h = gelu(linear(np.asarray(s, np.float32)[None, :], fc1_w, fc1_b))
    return linear(h, fc2_w, fc2_b)[0].astype(np.float32)
