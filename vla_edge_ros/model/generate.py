# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Random weights in HF Qwen2 layout (+ vision.safetensors): what `vla-edge-make-model` writes.

The output loads unchanged in `transformers.AutoModelForCausalLM.from_pretrained(DIR)` (a 4-bit one there
with the format's library installed). Speed does not depend on weight values, so these serve tests, demos
and benchmarks alike. `--quant` writes the same random model with its decoder linears rounded to 4 bits in
a published layout (AWQ gemm or compressed-tensors pack-quantized); `--action-decoding parallel` marks it
as a parallel-decoding model and adds random `action_queries` to vision.safetensors; `--action-chunk K` (parallel
only) makes it plan K actions a chunk (config.json `vla_action_chunk`, K x 8 query rows); `--state-dim N` gives it a
robot-state input of N values (config.json `vla_state_dim` / `vla_state_joints` / `vla_state_fields`, a random state
projector and normalization bounds in vision.safetensors).

The command line is tools/make_model.py; `ensure_model` is what the node's make_tiny_model and the demo use.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile

import numpy as np

from .config import PRESETS, ModelConfig, QuantConfig
from .quant import default_scale_dtype, quantize_rtn, stored_tensors
from ..output_dir import atomic_output_dir
from .safetensors_io import ModelLoadError, bf16_to_f32, f32_to_bf16, save_file
from .weights import (ACTION_QUERIES, LAYER_TENSORS, LINEARS, STATE_PREFIX, VISION_FILE, hf_tensor_shapes,
                      random_state_weights, random_vision_weights)

QUANT_SUFFIXES = tuple(LAYER_TENSORS[s] for s in LINEARS)


def _random_tensor(rng, name, shape) -> np.ndarray:
    if name.endswith("norm.weight"):
        # Not exactly ones, so a test notices a norm weight that was skipped or misapplied.
        return 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
    return 0.02 * rng.standard_normal(shape, dtype=np.float32)


def model_config(preset: str = "tiny", quant: str | None = None, symmetric: bool = False,
                 action_decoding: str = "autoregressive", cfg: ModelConfig | None = None,
                 action_chunk: int = 1, state_joints=None, state_fields=None) -> ModelConfig:
    """`preset` (or `cfg`) with the 4-bit format, the action decoding mode, the chunk K and the state input applied
    (K > 1 needs parallel decoding; `state_joints`: the state's joint names, None keeps the config's; one
    ModelLoadError line for a bad combination)."""
    cfg = cfg or PRESETS[preset]
    q = None if quant in (None, "none") else QuantConfig(quant, symmetric=symmetric and quant == "compressed-tensors")
    if quant is not None:
        cfg = dataclasses.replace(cfg, quant=q)
    cfg = dataclasses.replace(cfg, action_decoding=action_decoding, action_chunk=action_chunk)
    if state_joints is not None or state_fields is not None:
        joints = tuple(cfg.state_joints if state_joints is None else state_joints)
        fields = tuple(cfg.state_fields if state_fields is None else state_fields)
        cfg = dataclasses.replace(cfg, state_joints=joints, state_fields=fields, state_dim=len(joints) * len(fields))
    problems = cfg.action_problems() + cfg.state_problems()
    if problems:
        raise ModelLoadError("the model options", "; ".join(problems))
    return cfg


def write_model_files(out: str, cfg: ModelConfig, tensors: dict[str, tuple[str, np.ndarray]], shards: int = 1) -> None:
    """Write float tensors {HF name: (dtype, array)} into `out`, the decoder linears of a quantized `cfg` rounded
    to 4 bits in its layout; a tensor's parts stay in one shard. Also writes config.json."""
    names = sorted(tensors)
    weight_map = {}
    for i in range(shards):
        fn = "model.safetensors" if shards == 1 else f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        group = {}
        for name in names[i::shards]:
            dtype, arr = tensors.pop(name)
            if cfg.quant is not None and name.startswith("model.layers.") and name.endswith(QUANT_SUFFIXES):
                w = bf16_to_f32(arr) if dtype == "BF16" else np.asarray(arr, np.float32)
                qt = quantize_rtn(w, cfg.quant.symmetric, default_scale_dtype(cfg.quant.method), cfg.quant.method)
                group.update(stored_tensors(name[:-len(".weight")], qt, cfg.quant.method, cfg.quant.symmetric))
            else:
                group[name] = (dtype, arr)
        save_file(group, os.path.join(out, fn))
        weight_map.update({name: fn for name in group})
    if shards > 1:
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg.to_hf_dict(), f, indent=1)


def make_model(out: str, preset: str = "tiny", seed: int = 0, shards: int = 1, cfg: ModelConfig | None = None,
               quant: str | None = None, symmetric: bool = False, action_decoding: str | None = None,
               force: bool = False, action_chunk: int | None = None, state_joints=None, state_fields=None) -> str:
    """Write a random model into `out` (absent or empty; non-empty only with `force`), atomically.

    `quant` / `action_decoding` / `action_chunk` / `state_joints` / `state_fields` left None keep what `cfg` (or the
    preset) says."""
    cfg = cfg or PRESETS[preset]
    cfg = model_config(quant=quant, symmetric=symmetric, cfg=cfg,
                       action_decoding=action_decoding or cfg.action_decoding,
                       action_chunk=action_chunk or cfg.action_chunk, state_joints=state_joints,
                       state_fields=state_fields)
    rng = np.random.default_rng(seed)
    with atomic_output_dir(out, force) as tmp:
        # Draw in one fixed order so the values depend neither on the sharding nor on the 4-bit format:
        # a quantized model is the bf16 model of the same seed, rounded.
        values = {name: ("BF16", f32_to_bf16(_random_tensor(rng, name, shape)))
                  for name, shape in sorted(hf_tensor_shapes(cfg).items())}
        write_model_files(tmp, cfg, values, shards)
        vision = {k: ("BF16", f32_to_bf16(v)) for k, v in random_vision_weights(cfg, seed + 1).items()}
        note = "untrained patch projector (random)"
        if cfg.parallel:
            # row-major draws: the first 8 rows of a K-action model's queries are the one-action model's
            q = 0.02 * np.random.default_rng(seed + 2).standard_normal((cfg.action_tokens, cfg.hidden_size), np.float32)
            vision[ACTION_QUERIES] = ("BF16", f32_to_bf16(q))
            note += " and action queries (random)"
        if cfg.state_dim:
            # a random projector, and bounds unlike -1..1 (each dimension its own), so that a state that skipped
            # the normalization or took another dimension's bounds gives another token
            st = random_state_weights(cfg, seed + 3)
            u = np.random.default_rng(seed + 4).uniform(0.0, 2.0, cfg.state_dim).astype(np.float32)
            st[STATE_PREFIX + "low"], st[STATE_PREFIX + "high"] = -1.0 - u, 1.0 + 2.0 * u
            vision.update({k: ("F32", v) if k.endswith(("low", "high")) else ("BF16", f32_to_bf16(v))
                           for k, v in st.items()})
            note += " and a state projector (random)"
        save_file(vision, os.path.join(tmp, VISION_FILE), {"note": note})
    return out


def ensure_model(out: str, preset: str = "tiny", seed: int = 0) -> str:
    """Generate `preset` into `out` unless a model is already there. Atomic: concurrent callers (the demo
    and the node it starts, say) all end with one complete directory."""
    if os.path.isfile(os.path.join(out, "config.json")):
        return out
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(out) + ".", dir=parent)
    try:
        make_model(tmp, preset=preset, seed=seed)
        try:
            os.rename(tmp, out)
        except OSError:
            if not os.path.isfile(os.path.join(out, "config.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
