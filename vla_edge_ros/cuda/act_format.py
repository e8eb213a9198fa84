# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The prefill GEMMs' 16-bit activation format: fp16 where a model's weights prove it cannot overflow (issue 41).

The CUDA prefill rounds the GEMMs' inputs (the RMSNorm outputs, the attention output, silu(gate) * up) to 16 bits.
bf16 keeps float32's range with 8 significant bits; fp16 has 11 (8x less rounding error) but overflows past 65504.
The 4-bit GEMM multiplies the exact integers q - z, which both formats hold, so for a 4-bit model the format is free:
fp16 wherever fp16_activation_bound shows no input can leave its range. No CuPy here (checked on the CPU).
"""
from __future__ import annotations

import numpy as np

from ..model.quant import QuantTensor, as_f32

# fp16's largest finite value is 65504: an activation bound at most this leaves a margin over the roundings on the way.
FP16_ACT_LIMIT = 2.0 ** 15


_NIB = np.arange(256)
_LUT1 = ((_NIB & 15) + (_NIB >> 4)).astype(np.uint16)  # a byte's two nibbles: their sum and sum of squares
_LUT2 = ((_NIB & 15) ** 2 + (_NIB >> 4) ** 2).astype(np.uint16)


def _row_norms(w) -> np.ndarray:
    """Each output row's 2-norm (float64) of a linear weight [out, in]: bf16 bits, float32, or a 4-bit QuantTensor
    (without dequantizing: a group's sum of (q - z)^2 = sum q^2 - 2 z sum q + n z^2, from per-byte tables)."""
    if not isinstance(w, QuantTensor):
        return np.sqrt((np.asarray(as_f32(w), np.float64) ** 2).sum(axis=1))
    out, n_in = w.shape
    groups = w.scales.shape[1]
    by = np.ascontiguousarray(w.qweight, np.uint32).view(np.uint8).reshape(out, groups, -1)  # a group's bytes
    s1 = _LUT1[by].sum(axis=-1, dtype=np.float64)
    s2 = _LUT2[by].sum(axis=-1, dtype=np.float64)
    z = np.asarray(w.zeros, np.float64)
    sq = s2 - 2.0 * z * s1 + (n_in // groups) * z * z
    return np.sqrt((sq * np.asarray(w.scales, np.float64) ** 2).sum(axis=1))


def fp16_activation_bound(weights) -> float:
    """The largest magnitude any input can give the prefill GEMMs' 16-bit inputs, over every layer (Cauchy-Schwarz):
    an RMSNorm output h = x / rms(x) * w has |h_i| <= ||h||_2 <= sqrt(H) max |w| (|x_i| <= ||x||_2 = sqrt(H) rms);
    the attention output is a convex combination of V rows, |v_i| <= ||h1|| ||Wv_i|| + |bv_i|; silu(g) u has
    |silu(g_i) u_i| <= |g_i| |u_i| <= ||h2||^2 ||Wg_i|| ||Wu_i||. The rounding of V and of the softmax weights to bf16
    adds at most 2^-7 of it. Where this is <= FP16_ACT_LIMIT, fp16 holds every such activation without overflow (issue
    41: fp16's 3 more mantissa bits than bf16 take ~40 % off the 1.5B parallel chunk's error against the golden
    model, BENCHMARKS.md)."""
    H = weights.cfg.hidden_size
    worst = 0.0
    for lw in weights.layers:
        n1 = np.sqrt(H) * float(np.abs(as_f32(lw["ln1"])).max())
        n2 = np.sqrt(H) * float(np.abs(as_f32(lw["ln2"])).max())
        bv = np.abs(np.asarray(as_f32(lw["bv"]), np.float64))
        v = float((n1 * _row_norms(lw["wv"]) + bv).max()) * (1 + 2.0 ** -7) ** 2
        act = n2 * n2 * float((_row_norms(lw["wg"]) * _row_norms(lw["wu"])).max())
        worst = max(worst, n1, n2, v, act)
    return worst
