# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""4-bit weights (W4A16): the in-memory form, the two published file layouts, and a round-to-nearest quantizer.

In memory a quantized linear weight is a `QuantTensor` with the logical shape of an HF ``nn.Linear``
weight, [out, in]. Element (o, i) is ``(q[o, i] - zeros[o, i // 128]) * scales[o, i // 128]`` with
``q`` and ``zeros`` unsigned 4-bit values. The CUDA kernels and the NumPy reference read this one form;
the two file layouts are converted to it when a model loads:

- AWQ "gemm" (AutoAWQ's ``WQLinear_GEMM``, Qwen's ``*-AWQ`` releases): ``qweight`` int32 [in, out/8] and
  ``qzeros`` int32 [in/128, out/8] packed along the output dimension in AutoAWQ's interleaved nibble
  order (nibble k of a word holds column ``AWQ_ORDER[k]`` of its group of 8), ``scales`` fp16 [in/128, out].
- compressed-tensors ``pack-quantized`` (llm-compressor W4A16): ``weight_packed`` int32 [out, in/8] with
  nibble k holding column 8j+k, values stored as signed + 8; ``weight_scale`` [out, in/128];
  ``weight_zero_point`` (asymmetric only) signed + 8, packed the same way but along dim 0:
  int32 [ceil(out/8), in/128]; ``weight_shape`` [out, in].

Dequantization is exact in float32: |q - z| <= 15 needs 4 bits and a 16-bit float scale at most 11
significant bits, so their product fits float32's 24. NumPy only; no torch.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..constants import GROUP_SIZE

from .safetensors_io import bf16_to_f32, f32_to_bf16

BITS = 4
PACK = 32 // BITS  # nibbles per 32-bit word
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble k of an AWQ word holds column AWQ_ORDER[k] of its group of 8
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # column j of a group of 8 sits in nibble AWQ_REVERSE_ORDER[j]
FORMATS = ("awq", "compressed-tensors")


@dataclass
class QuantTensor:
    """One W4A16 linear weight, logical shape [out, in] like an HF nn.Linear weight."""

    qweight: np.ndarray  # uint32 [out, in // 8]; nibble k (bits 4k..4k+3) of word j holds element 8j+k, 0..15
    scales: np.ndarray  # float32 [out, in // GROUP_SIZE], exact values of the file's fp16/bf16 scales
    zeros: np.ndarray  # uint8 [out, in // GROUP_SIZE], 0..15 (symmetric formats: 8, i.e. signed q = unsigned q - 8)
    scale_dtype: str  # "float16" or "bfloat16": what the file stored
    fmt: str  # "awq" or "compressed-tensors": where it came from

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.qweight.shape[0]), int(self.qweight.shape[1]) * PACK

    @property
    def nbytes(self) -> int:
        """Bytes the device holds: packed nibbles, 16-bit scales and 4-bit zero points."""
        return int(self.qweight.nbytes + self.scales.size * 2 + (self.zeros.size + 1) // 2)

    def q(self) -> np.ndarray:
        """The unsigned 4-bit values, uint8 [out, in]."""
        return unpack_nibbles(self.qweight)

    def dequantize(self, scales: np.ndarray | None = None) -> np.ndarray:
        """float32 [out, in] = (q - z) * s, exact (``scales``: other group scales in place of the tensor's)."""
        out, n_in = self.shape
        s = self.scales if scales is None else scales
        q = self.q().astype(np.float32).reshape(out, n_in // GROUP_SIZE, GROUP_SIZE)
        w = (q - self.zeros.astype(np.float32)[:, :, None]) * s[:, :, None]
        return w.reshape(out, n_in)


def as_f32(x) -> np.ndarray:
    """A weight as float32: QuantTensor dequantized, bf16 bits (uint16) widened, float32 passed through."""
    if isinstance(x, QuantTensor):
        return x.dequantize()
    if isinstance(x, np.ndarray) and x.dtype == np.float32:
        return x
    return bf16_to_f32(x)


# -- nibble packing --------------------------------------------------------------------------------
def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """uint8 [R, C] (values 0..15, C % 8 == 0) -> uint32 [R, C/8], element 8j+k in bits 4k..4k+3 of word j."""
    q = np.asarray(q, dtype=np.uint32)
    r, c = q.shape
    q = q.reshape(r, c // PACK, PACK)
    shifts = (np.arange(PACK, dtype=np.uint32) * BITS)
    return np.bitwise_or.reduce(q << shifts, axis=-1).astype(np.uint32)


def unpack_nibbles(words: np.ndarray) -> np.ndarray:
    """uint32 [R, W] -> uint8 [R, W*8]; the inverse of `pack_nibbles`."""
    w = np.ascontiguousarray(words)
    w = w.view(np.uint32) if w.dtype.itemsize == 4 else w.astype(np.uint32)
    shifts = (np.arange(PACK, dtype=np.uint32) * BITS)
    return ((w[..., None] >> shifts) & 0xF).astype(np.uint8).reshape(w.shape[0], -1)


def awq_pack(q: np.ndarray) -> np.ndarray:
    """uint8 [R, C] -> int32 [R, C/8] in AutoAWQ's order: nibble k of word j holds column 8j + AWQ_ORDER[k]."""
    r, c = q.shape
    inter = np.asarray(q).reshape(r, c // PACK, PACK)[:, :, list(AWQ_ORDER)].reshape(r, c)
    return pack_nibbles(inter).view(np.int32)


def awq_unpack(words: np.ndarray) -> np.ndarray:
    """int32 [R, W] in AutoAWQ's order -> uint8 [R, W*8] in column order."""
    nib = unpack_nibbles(words)
    r, c = nib.shape
    return nib.reshape(r, c // PACK, PACK)[:, :, list(AWQ_REVERSE_ORDER)].reshape(r, c)


# -- the two file layouts ----------------------------------------------------------------------------
def _scale_bits_to_f32(scales: np.ndarray, scale_dtype: str) -> np.ndarray:
    if scale_dtype == "bfloat16":
        return bf16_to_f32(scales)
    return np.asarray(scales, dtype=np.float16).astype(np.float32)


def _scale_f32_to_bits(scales: np.ndarray, scale_dtype: str) -> np.ndarray:
    if scale_dtype == "bfloat16":
        return f32_to_bf16(scales)
    return np.asarray(scales, dtype=np.float32).astype(np.float16)


def from_awq(qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, scale_dtype: str = "float16") -> QuantTensor:
    """AWQ gemm tensors (qweight int32 [in, out/8], qzeros int32 [in/128, out/8], scales [in/128, out]).

    ``scales`` is float16 values, or uint16 bf16 bits when scale_dtype is bfloat16."""
    q = awq_unpack(qweight).T  # [out, in]
    z = awq_unpack(qzeros).T  # [out, in/128]
    return QuantTensor(qweight=pack_nibbles(q), scales=np.ascontiguousarray(_scale_bits_to_f32(scales, scale_dtype).T),
                       zeros=np.ascontiguousarray(z), scale_dtype=scale_dtype, fmt="awq")


def to_awq(t: QuantTensor) -> dict[str, np.ndarray]:
    """{"qweight": int32 [in, out/8], "qzeros": int32 [in/128, out/8], "scales": fp16/bf16-bits [in/128, out]}."""
    return {"qweight": awq_pack(np.ascontiguousarray(t.q().T)),
            "qzeros": awq_pack(np.ascontiguousarray(t.zeros.T)),
            "scales": np.ascontiguousarray(_scale_f32_to_bits(t.scales, t.scale_dtype).T)}


def from_compressed(weight_packed: np.ndarray, weight_scale: np.ndarray, weight_zero_point: np.ndarray | None,
                    shape: tuple[int, int], scale_dtype: str) -> QuantTensor:
    """compressed-tensors pack-quantized tensors -> QuantTensor. ``weight_scale`` as for `from_awq`."""
    out, n_in = shape
    packed = np.ascontiguousarray(weight_packed).view(np.uint32)
    if weight_zero_point is None:
        zeros = np.full((out, n_in // GROUP_SIZE), 8, np.uint8)
    else:  # packed along dim 0: unpack the transpose, drop the padding rows
        zeros = np.ascontiguousarray(unpack_nibbles(np.ascontiguousarray(weight_zero_point.T))[:, :out].T)
    return QuantTensor(qweight=packed.copy(), scales=_scale_bits_to_f32(weight_scale, scale_dtype),
                       zeros=zeros, scale_dtype=scale_dtype, fmt="compressed-tensors")


def to_compressed(t: QuantTensor, symmetric: bool) -> dict[str, np.ndarray]:
    """{"weight_packed", "weight_scale", "weight_shape"[, "weight_zero_point"]} as llm-compressor writes them."""
    out, n_in = t.shape
    d = {"weight_packed": np.ascontiguousarray(t.qweight).view(np.int32),
         "weight_scale": _scale_f32_to_bits(t.scales, t.scale_dtype),
         "weight_shape": np.array([out, n_in], np.int64)}
    if symmetric:
        if (t.zeros != 8).any():
            raise ValueError("a symmetric compressed-tensors weight needs every zero point at 8 (signed 0)")
    else:
        pad = -out % PACK
        zt = np.concatenate([t.zeros.T, np.zeros((n_in // GROUP_SIZE, pad), np.uint8)], axis=1)  # padded as the library
        d["weight_zero_point"] = np.ascontiguousarray(pack_nibbles(zt).T).view(np.int32)
    return d


# -- round-to-nearest quantizer ------------------------------------------------------------------------
def quantize_rtn(w: np.ndarray, symmetric: bool = False, scale_dtype: str = "float16",
                 fmt: str = "compressed-tensors", clip: np.ndarray | float | None = None) -> QuantTensor:
    """Round-to-nearest per group of 128 input channels.

    Asymmetric: the range [min(w, 0), max(w, 0)] maps onto 0..15 with an integer zero point (taking 0 into
    the range keeps the zero point inside 0..15). Symmetric (compressed-tensors convention): scale =
    max|w| / 7.5, signed -8..7, zero point 8. The scale is rounded to the file's 16-bit type first and q is
    computed from the rounded scale, so (q - z) * s is what the file will say. `clip` (scalar or [out, in/128],
    in (0, 1]) shrinks each group's range before rounding (the values outside it saturate); see `search_clip`.
    """
    w = np.asarray(w, dtype=np.float32)
    out, n_in = w.shape
    if n_in % GROUP_SIZE:
        raise ValueError(f"input size {n_in} is not a multiple of the group size {GROUP_SIZE}")
    if not np.isfinite(w).all():
        raise ValueError("weights contain NaN or Inf")
    g = w.reshape(out, n_in // GROUP_SIZE, GROUP_SIZE)
    ratio = np.float32(1.0) if clip is None else np.asarray(clip, np.float32)
    if symmetric:
        scale = np.abs(g).max(axis=-1) * ratio / 7.5
    else:
        lo, hi = np.minimum(g.min(axis=-1), 0.0) * ratio, np.maximum(g.max(axis=-1), 0.0) * ratio
        scale = (hi - lo) / 15.0
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)  # an all-zero group: any scale gives 0
    scale = _scale_bits_to_f32(_scale_f32_to_bits(scale, scale_dtype), scale_dtype)
    if not np.isfinite(scale).all() or (scale <= 0).any():
        raise ValueError(f"weights too large or too small for {scale_dtype} scales")
    if symmetric:
        zeros = np.full(scale.shape, 8, np.uint8)
    else:
        zeros = np.clip(np.rint(-lo / scale), 0, 15).astype(np.uint8)
    q = np.clip(np.rint(g / scale[:, :, None]) + zeros[:, :, None], 0, 15).astype(np.uint8)
    return QuantTensor(qweight=pack_nibbles(q.reshape(out, n_in)), scales=scale, zeros=zeros,
                       scale_dtype=scale_dtype, fmt=fmt)


def stored_tensors(prefix: str, t: QuantTensor, method: str,
                   symmetric: bool = False) -> dict[str, tuple[str, np.ndarray]]:
    """The safetensors entries {name: (dtype, array)} of one quantized linear `prefix` (no `.weight`) in `method`'s
    layout, as its library names and types them."""
    sdt = "F16" if t.scale_dtype == "float16" else "BF16"
    if method == "awq":
        d = to_awq(t)
        return {f"{prefix}.qweight": ("I32", d["qweight"]), f"{prefix}.qzeros": ("I32", d["qzeros"]),
                f"{prefix}.scales": (sdt, d["scales"])}
    if method == "compressed-tensors":
        d = to_compressed(t, symmetric)
        out = {f"{prefix}.weight_packed": ("I32", d["weight_packed"]),
               f"{prefix}.weight_scale": (sdt, d["weight_scale"]),
               f"{prefix}.weight_shape": ("I64", d["weight_shape"])}
        if "weight_zero_point" in d:
            out[f"{prefix}.weight_zero_point"] = ("I32", d["weight_zero_point"])
        return out
    raise ValueError(f"unknown 4-bit format {method!r} (one of {', '.join(FORMATS)})")


def default_scale_dtype(method: str) -> str:
    """What each format's own tool writes: AutoAWQ fp16 scales, llm-compressor the bf16 of the model."""
    return "float16" if method == "awq" else "bfloat16"


CLIP_GRID = tuple(np.round(np.arange(1.0, 0.49, -0.05), 2))  # range ratios tried per group, AWQ's auto-clip grid


def group_output_error(w: np.ndarray, wq: np.ndarray, x: np.ndarray) -> np.ndarray:
    """float64 [out, in/128]: sum over the rows of x of (x_g . (w - wq)_g)^2, each group's share of the output
    error on the activations x [T, in]."""
    out, n_in = w.shape
    d = (w - wq).reshape(out, n_in // GROUP_SIZE, GROUP_SIZE)
    xg = np.asarray(x, np.float32).reshape(-1, n_in // GROUP_SIZE, GROUP_SIZE)
    err = np.empty((out, n_in // GROUP_SIZE))
    for g in range(n_in // GROUP_SIZE):
        y = xg[:, g, :] @ d[:, g, :].T  # [T, out]
        err[:, g] = np.einsum("to,to->o", y, y, dtype=np.float64)
    return err


def search_clip(w: np.ndarray, x: np.ndarray, symmetric: bool = False, scale_dtype: str = "float16",
                grid=CLIP_GRID, stats: dict | None = None) -> np.ndarray:
    """Per group of 128 input channels, the range ratio from `grid` whose round-to-nearest weights give the
    smallest output error on the calibration activations x [T, in] (AWQ's clip search, without its per-channel
    activation scaling). With 1.0 in the grid the result is never worse than plain round-to-nearest on x.
    `stats` (optional) accumulates the summed error of plain round-to-nearest ("rtn") and of the result."""
    w = np.asarray(w, np.float32)
    best = np.full((w.shape[0], w.shape[1] // GROUP_SIZE), np.inf)
    ratio = np.ones_like(best, dtype=np.float32)
    for r in grid:
        err = group_output_error(w, quantize_rtn(w, symmetric, scale_dtype, clip=r).dequantize(), x)
        if stats is not None and r == 1.0:
            stats["rtn"] = stats.get("rtn", 0.0) + float(err.sum())
        better = err < best
        best[better], ratio[better] = err[better], r
    if stats is not None:
        stats["searched"] = stats.get("searched", 0.0) + float(best.sum())
    return ratio
