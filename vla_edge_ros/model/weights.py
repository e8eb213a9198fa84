"""Load an HF-layout Qwen2 directory (+ optional vision.safetensors) into bf16 arrays, validated.

Everything is kept as bf16 bits (uint16): that is what the GPU uploads unchanged, and the NumPy
reference widens it to float32 once. A missing tensor, a wrong shape, an unsupported dtype, NaN/Inf,
a truncated file or a broken shard index raises one `ModelLoadError` naming the file and tensor.
Pickle checkpoints (`*.bin`, `*.pt`) are refused: loading a model never executes code from it.
"""
from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass, field

import numpy as np

from ..constants import PATCH_DIM, VISION_TOKENS
from .config import ModelConfig
from .safetensors_io import ModelLoadError, f32_to_bf16, load_file, read_header

LAYER_TENSORS = {  # short name -> HF suffix under model.layers.{i}.
    "ln1": "input_layernorm.weight",
    "wq": "self_attn.q_proj.weight", "bq": "self_attn.q_proj.bias",
    "wk": "self_attn.k_proj.weight", "bk": "self_attn.k_proj.bias",
    "wv": "self_attn.v_proj.weight", "bv": "self_attn.v_proj.bias",
    "wo": "self_attn.o_proj.weight",
    "ln2": "post_attention_layernorm.weight",
    "wg": "mlp.gate_proj.weight", "wu": "mlp.up_proj.weight", "wd": "mlp.down_proj.weight",
}
VISION_FILE = "vision.safetensors"
VISION_SEED = 1234


def layer_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    H, I = cfg.hidden_size, cfg.intermediate_size
    return {"ln1": (H,), "wq": (cfg.q_dim, H), "bq": (cfg.q_dim,), "wk": (cfg.kv_dim, H), "bk": (cfg.kv_dim,),
            "wv": (cfg.kv_dim, H), "bv": (cfg.kv_dim,), "wo": (H, cfg.q_dim), "ln2": (H,),
            "wg": (I, H), "wu": (I, H), "wd": (H, I)}


def hf_tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor an HF Qwen2 checkpoint of this config holds, by HF name."""
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, cfg.hidden_size), "model.norm.weight": (cfg.hidden_size,)}
    for i in range(cfg.num_hidden_layers):
        for short, suffix in LAYER_TENSORS.items():
            shapes[f"model.layers.{i}.{suffix}"] = layer_shapes(cfg)[short]
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, cfg.hidden_size)
    return shapes


def vision_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    return {"patch_proj.weight": (cfg.hidden_size, PATCH_DIM), "patch_proj.bias": (cfg.hidden_size,),
            "pos_embed": (VISION_TOKENS, cfg.hidden_size)}


@dataclass
class VisionWeights:
    patch_w: np.ndarray  # bf16 bits [H, 768]
    patch_b: np.ndarray  # bf16 bits [H]
    pos_embed: np.ndarray  # bf16 bits [32, H]
    trained: bool  # False: seeded PRNG stand-in, there was no vision.safetensors


@dataclass
class Weights:
    cfg: ModelConfig
    embed: np.ndarray  # bf16 bits [V, H]; tied: also the LM head
    norm: np.ndarray
    layers: list[dict[str, np.ndarray]]
    vision: VisionWeights
    lm_head: np.ndarray | None = None  # only when embeddings are not tied
    path: str = ""
    files: list[str] = field(default_factory=list)

    @property
    def head(self) -> np.ndarray:
        return self.embed if self.lm_head is None else self.lm_head

    def nbytes(self) -> int:
        arrays = [self.embed, self.norm, *(t for layer in self.layers for t in layer.values())]
        if self.lm_head is not None:
            arrays.append(self.lm_head)
        return sum(a.nbytes for a in arrays)


def _to_bf16(path, name, dtype, arr, check_finite) -> np.ndarray:
    if dtype == "BF16":
        bits = np.asarray(arr)
        if check_finite and ((bits & 0x7F80) == 0x7F80).any():  # exponent all ones: Inf or NaN
            raise ModelLoadError(path, "contains NaN or Inf", name)
        return bits
    if dtype in ("F32", "F16"):
        f = np.asarray(arr, dtype=np.float32)
        if check_finite and not np.isfinite(f).all():
            raise ModelLoadError(path, "contains NaN or Inf", name)
        return f32_to_bf16(f)
    raise ModelLoadError(path, f"dtype {dtype} is not a float type (expected BF16, F16 or F32)", name)


def _weight_files(path) -> dict[str, str]:
    """Map every tensor name to the file that holds it (single file or sharded with an index)."""
    pickles = [p for p in glob.glob(os.path.join(path, "*")) if p.endswith((".bin", ".pt", ".pth", ".pkl", ".ckpt"))]
    single = os.path.join(path, "model.safetensors")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index) as f:
                weight_map = json.load(f)["weight_map"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise ModelLoadError(index, f"unreadable shard index ({e!r})") from None
        return {name: os.path.join(path, os.path.basename(fn)) for name, fn in weight_map.items()}
    if os.path.isfile(single):
        infos, _, _ = read_header(single)
        return {name: single for name in infos}
    hint = f"; pickle checkpoints are refused for safety: {', '.join(map(os.path.basename, pickles))}" if pickles else ""
    raise ModelLoadError(single, f"file not found (nor model.safetensors.index.json){hint}")


def _load_set(files_by_name, expected, check_finite) -> dict[str, np.ndarray]:
    by_file: dict[str, list[str]] = {}
    for name in expected:
        if name not in files_by_name:
            raise ModelLoadError(next(iter(set(files_by_name.values())), "?"), "tensor missing", name)
        by_file.setdefault(files_by_name[name], []).append(name)
    out = {}
    for fn, names in by_file.items():
        infos, _, _ = read_header(fn)
        for name in names:
            if name not in infos:
                raise ModelLoadError(fn, "tensor missing (the index names this file)", name)
            if infos[name].shape != tuple(expected[name]):
                raise ModelLoadError(fn, f"shape {list(infos[name].shape)} does not match the config, expected {list(expected[name])}", name)
        for name, (dtype, arr) in load_file(fn, names).items():
            out[name] = _to_bf16(fn, name, dtype, arr, check_finite)
    return out


def random_vision_weights(cfg: ModelConfig, seed: int = VISION_SEED) -> dict[str, np.ndarray]:
    """Untrained patch projector from a seeded PRNG, as float32, keyed like vision.safetensors."""
    rng = np.random.default_rng(seed)
    shapes = vision_shapes(cfg)
    return {"patch_proj.weight": rng.standard_normal(shapes["patch_proj.weight"], dtype=np.float32) * (1.0 / np.sqrt(PATCH_DIM)),
            "patch_proj.bias": rng.standard_normal(shapes["patch_proj.bias"], dtype=np.float32) * 0.02,
            "pos_embed": rng.standard_normal(shapes["pos_embed"], dtype=np.float32) * 0.02}


def load_weights(path, check_finite: bool = True) -> Weights:
    path = str(path)
    if not os.path.isdir(path):
        raise ModelLoadError(path, "model directory not found")
    cfg = ModelConfig.from_dir(path)
    files_by_name = _weight_files(path)
    t = _load_set(files_by_name, hf_tensor_shapes(cfg), check_finite)
    layers = [{short: t[f"model.layers.{i}.{suffix}"] for short, suffix in LAYER_TENSORS.items()}
              for i in range(cfg.num_hidden_layers)]
    vpath = os.path.join(path, VISION_FILE)
    if os.path.exists(vpath):
        v = _load_set({n: vpath for n in read_header(vpath)[0]}, vision_shapes(cfg), check_finite)
        trained = True
    else:
        v = {k: f32_to_bf16(a) for k, a in random_vision_weights(cfg).items()}
        trained = False
    vision = VisionWeights(v["patch_proj.weight"], v["patch_proj.bias"], v["pos_embed"], trained)
    return Weights(cfg=cfg, embed=t["model.embed_tokens.weight"], norm=t["model.norm.weight"], layers=layers,
                   vision=vision, lm_head=t.get("lm_head.weight"), path=path,
                   files=sorted(set(files_by_name.values())))
