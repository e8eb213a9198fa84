# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Models whose weights are finite in the file but overflow in the forward pass (issue 19): the three kinds a user
reported, written in the layouts people publish (bf16 safetensors; AutoAWQ gemm with fp16 scales).

- ``vision``: the vision projector's weights at 3e38 (bf16): the vision embedding is inf;
- ``final_norm``: the final RMSNorm's weight at 3e38 (bf16): the normalized hidden state, then the logits, overflow;
- ``awq_scales``: every AWQ scale at 65504 (fp16 max): the activations pass 1e19 after a layer, and the next
  RMSNorm's mean square overflows float32.
"""
from __future__ import annotations

import os

import numpy as np

from vla_edge_ros.model.generate import make_model
from vla_edge_ros.model.safetensors_io import f32_to_bf16, load_file, save_file

KINDS = ("vision", "final_norm", "awq_scales")
PHASE = {"vision": "vision", "final_norm": "action logits", "awq_scales": "action logits"}


def _rewrite(path: str, edit) -> None:
    t = {k: (dt, np.array(a)) for k, (dt, a) in load_file(path).items()}
    edit(t)
    save_file(t, path)


def _fill(t: dict, name: str, value: float) -> None:
    dt, a = t[name]
    assert dt == "BF16", (name, dt)
    t[name] = (dt, np.full_like(a, f32_to_bf16(np.float32(value))))


def make_overflow_model(out: str, kind: str, preset: str = "micro", action_decoding: str | None = None) -> str:
    assert kind in KINDS, kind
    make_model(out, preset=preset, seed=0, quant="awq" if kind == "awq_scales" else None,
               action_decoding=action_decoding)
    if kind == "vision":
        _rewrite(os.path.join(out, "vision.safetensors"), lambda t: _fill(t, "patch_proj.weight", 3e38))
    elif kind == "final_norm":
        _rewrite(os.path.join(out, "model.safetensors"), lambda t: _fill(t, "model.norm.weight", 3e38))
    else:
        def edit(t):
            for k in [k for k in t if k.endswith(".scales")]:
                dt, a = t[k]
                assert dt == "F16", (k, dt)
                t[k] = (dt, np.full_like(a, np.float16(65504.0)))
        _rewrite(os.path.join(out, "model.safetensors"), edit)
    return out
