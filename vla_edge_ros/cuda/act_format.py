# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The prefill GEMMs' 16-bit format: fp16 where a model's weights prove it cannot overflow (issue 41).

The CUDA prefill rounds the GEMMs' inputs (the RMSNorm outputs, the attention output, silu(gate) * up) to 16 bits.
bf16 keeps float32's range with 8 significant bits; fp16 has 11 (8x less rounding error) but overflows past 65504.
The tensor cores multiply both operands in one format:
- a 4-bit model's GEMM multiplies the exact integers q - z, which both formats hold, so fp16 costs nothing;
- a bf16 model's GEMM multiplies its weights, so its layers are stored in fp16 on the device (fp16_weights_fit: a
  bf16 value of magnitude 2^-14 .. 65504 is exact in fp16, one below 2^-14 moves by at most 2^-25), and its decode
  GEMVs read them in fp16 as well (one copy of the weights, the same bytes).
fp16_prefill decides: fp16 wherever fp16_activation_bound shows no input can leave the range. No CuPy here (checked on
the CPU).
"""
from __future__ import annotations

import numpy as np

from ..model.quant import QuantTensor, as_f32

# fp16's largest finite value is 65504: an activation bound at most this leaves a margin over the roundings on the way.
FP16_ACT_LIMIT = 2.0 ** 15
LINEAR_WEIGHTS = ("wq", "wk", "wv", "wo", "wg", "wu", "wd")  # a layer's weights the GEMMs and GEMVs multiply
_BF16_FP16_MAX = 0x477F  # bf16 bits of 65280, the largest bf16 value at most fp16's 65504 (the next one is 65536)


_NIB = np.arange(256)
_LUT1 = ((_NIB & 15) + (_NIB >> 4)).astype(np.uint16)  # a byte's two nibbles: their sum and sum of squares
_LUT2 = ((_NIB & 15) ** 2 + (_NIB >> 4) ** 2).astype(np.uint16)


def _row_norms(w) -> np.ndarray:
    """Each output row's 2-norm (float64) of a linear weight [out, in]: bf16 bits, float32, or a 4-bit QuantTensor
    (without dequantizing: a group's sum of (q - z)^2 = sum q^2 - 2 z sum q + n z^2, from per-byte tables)."""
    if not isinstance(w, QuantTensor):
        f = as_f32(w)  # float32 products are exact squares of bf16 values; the sums in float64
        return np.sqrt(np.einsum("ij,ij->i", f, f, dtype=np.float64))
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


def fp16_weights_fit(weights) -> bool:
    """Whether every linear weight of every layer (LINEAR_WEIGHTS; bf16 bits or float) is finite with magnitude at most
    65504, fp16's largest value, so that storing it in fp16 cannot overflow. Read on the raw bf16 bits (two integer
    reductions, no copy): a positive value's bits, as int16, at most _BF16_FP16_MAX; a negative one's, as uint16, at
    most 0x8000 | _BF16_FP16_MAX (NaN and inf are past both)."""
    for lw in weights.layers:
        for name in LINEAR_WEIGHTS:
            a = lw[name]
            if isinstance(a, QuantTensor):
                return False  # a 4-bit model's layers stay 4-bit
            a = np.asarray(a)
            if a.dtype == np.uint16:
                if a.view(np.int16).max() > _BF16_FP16_MAX or a.max() > (0x8000 | _BF16_FP16_MAX):
                    return False
            elif not np.all(np.abs(a) <= 65504.0):  # float arrays (NaN fails the comparison)
                return False
    return True


def fp16_prefill(weights) -> bool:
    """Whether the CUDA prefill multiplies in fp16 (else bf16): a 4-bit model where fp16_activation_bound is at most
    FP16_ACT_LIMIT; a bf16 model where, besides, fp16_weights_fit (its layers are then stored in fp16)."""
    if weights.cfg.weight_format != "w4" and not fp16_weights_fit(weights):
        return False
    return fp16_activation_bound(weights) <= FP16_ACT_LIMIT
