# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""cuda/act_format.py on the CPU (no CuPy): which models the CUDA prefill runs in fp16, and whether a bf16 model's
layers may be stored in fp16 (issue 41). The GPU side (the f16 kernels, the backend's choice) is in
test_cuda_kernels.py and test_cuda_engine.py."""
from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest

from vla_edge_ros.cuda.act_format import (FP16_ACT_LIMIT, LINEAR_WEIGHTS, fp16_activation_bound, fp16_prefill,
                                          fp16_weights_fit)
from vla_edge_ros.model.generate import make_model
from vla_edge_ros.model.safetensors_io import bf16_to_f32, f32_to_bf16
from vla_edge_ros.model.weights import load_weights


@pytest.fixture(scope="module")
def tiny_bf16(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("tiny-bf16"))
    make_model(d, "tiny", seed=5)
    return load_weights(d)


def _with_weight(w, layer, name, arr):
    layers = [dict(lw) for lw in w.layers]
    layers[layer][name] = arr
    return dataclasses.replace(w, layers=layers)


def test_every_bf16_pattern_is_judged_as_its_value(tiny_bf16):
    """fp16_weights_fit reads the raw bf16 bits: each of the 65536 patterns, placed in one weight, is judged fit
    exactly when its value is finite with |value| <= 65504 (fp16's largest)."""
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    vals = bf16_to_f32(bits)
    want = np.isfinite(vals) & (np.abs(vals) <= 65504.0)
    assert want.sum() == 2 * 0x4780  # +-0 .. +-65280 (bits 0x477F): 0x4780 patterns a sign
    assert fp16_weights_fit(tiny_bf16)
    # a one-layer stand-in of 8 weights a matrix: the function reads only .layers (65536 calls on the tiny model's
    # full matrices take a minute)
    one = {n: np.array(tiny_bf16.layers[0][n][:1, :8], copy=True) for n in LINEAR_WEIGHTS}
    a = one["wd"]
    w = types.SimpleNamespace(layers=[one])
    got = np.empty(65536, bool)
    for p in range(65536):
        a.flat[7] = p
        got[p] = fp16_weights_fit(w)
    assert (got == want).all(), [hex(p) for p in np.flatnonzero(got != want)[:8]]


def test_float_weights_and_every_linear_name(tiny_bf16):
    """A weight past 65504 in any of the seven linear weights of any layer rules fp16 out; float32 arrays are
    judged by value (NaN too)."""
    last = len(tiny_bf16.layers) - 1
    for name in LINEAR_WEIGHTS:
        a = np.array(tiny_bf16.layers[last][name], copy=True)
        a.flat[0] = f32_to_bf16(np.array([-7.0e4], np.float32))[0]
        assert not fp16_weights_fit(_with_weight(tiny_bf16, last, name, a)), name
    f = bf16_to_f32(tiny_bf16.layers[0]["wq"])
    assert fp16_weights_fit(_with_weight(tiny_bf16, 0, "wq", f))
    f = f.copy()
    f[0, 0] = np.nan
    assert not fp16_weights_fit(_with_weight(tiny_bf16, 0, "wq", f))


def test_a_bf16_model_runs_fp16_where_bound_and_range_allow(tiny_bf16):
    """fp16_prefill: the tiny bf16 model (bound under FP16_ACT_LIMIT, weights in range) runs fp16; one weight past
    fp16's range, or an RMSNorm weight that lifts the bound past the limit, turns it back to bf16."""
    assert fp16_activation_bound(tiny_bf16) <= FP16_ACT_LIMIT
    assert fp16_prefill(tiny_bf16)
    a = np.array(tiny_bf16.layers[0]["wu"], copy=True)
    a.flat[3] = f32_to_bf16(np.array([1.0e5], np.float32))[0]
    assert not fp16_prefill(_with_weight(tiny_bf16, 0, "wu", a))
    ln = f32_to_bf16(np.full(tiny_bf16.cfg.hidden_size, 4096.0, np.float32))
    loud = _with_weight(tiny_bf16, 0, "ln1", ln)
    assert fp16_weights_fit(loud) and fp16_activation_bound(loud) > FP16_ACT_LIMIT
    assert not fp16_prefill(loud)
