# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Load an HF-layout Qwen2 directory (+ optional vision.safetensors) into bf16 arrays, validated.

Float tensors are kept as bf16 bits (uint16): that is what the GPU uploads unchanged, and the NumPy
reference widens it to float32 once. In a 4-bit checkpoint (AWQ gemm or compressed-tensors
pack-quantized, see `quant.py`) the seven decoder linears of every layer load as `QuantTensor`s;
norms, biases, embeddings, an untied LM head and the vision projector stay bf16. A missing tensor, a
wrong shape, an unsupported dtype or format, NaN/Inf, a truncated file or a broken shard index raises
one `ModelLoadError` naming the file and tensor. Pickle checkpoints (`*.bin`, `*.pt`) are refused:
loading a model never executes code from it.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
import re
from dataclasses import dataclass, field

import numpy as np

from ..constants import ACTION_VOCAB, GROUP_SIZE, PATCH_DIM, VISION_TOKENS
from .config import ACTION_KEYS, QUANT_SUPPORTED, STATE_KEYS, ModelConfig, parse_action_keys, parse_state_keys
from .quant import PACK, QuantTensor, from_awq, from_compressed
from .safetensors_io import ModelLoadError, bf16_to_f32, f32_to_bf16, load_file, read_header, release_pages

log = logging.getLogger(__name__)

LAYER_TENSORS = {  # short name -> HF suffix under model.layers.{i}.
    "ln1": "input_layernorm.weight",
    "wq": "self_attn.q_proj.weight", "bq": "self_attn.q_proj.bias",
    "wk": "self_attn.k_proj.weight", "bk": "self_attn.k_proj.bias",
    "wv": "self_attn.v_proj.weight", "bv": "self_attn.v_proj.bias",
    "wo": "self_attn.o_proj.weight",
    "ln2": "post_attention_layernorm.weight",
    "wg": "mlp.gate_proj.weight", "wu": "mlp.up_proj.weight", "wd": "mlp.down_proj.weight",
}
LINEARS = ("wq", "wk", "wv", "wo", "wg", "wu", "wd")  # stored in 4 bits in a quantized checkpoint
VISION_FILE = "vision.safetensors"
VISION_SEED = 1234
ACTION_QUERIES = "action_queries"  # [K x 8, H] in vision.safetensors: the action-slot inputs of a parallel model
# The robot-state projector in vision.safetensors (OpenVLA-OFT's ProprioProjector: fc1 -> GELU -> fc2 to the LLM
# width) and the bounds its input is normalized by (OFT's q01 / q99: 2 (x - low) / (high - low) - 1, clipped to
# [-1, 1]); S = vla_state_dim. The bounds stay float32: bf16 would move a normalized value by up to ~1 %.
STATE_PREFIX = "state_projector."
STATE_SEED = VISION_SEED + 1
CHECK_BLOCK = 1 << 22  # values checked for NaN / Inf at once
QUANT_PARTS = {"awq": ("qweight", "qzeros", "scales"),
               "compressed-tensors": ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point")}


def layer_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    H, F = cfg.hidden_size, cfg.intermediate_size
    return {"ln1": (H,), "wq": (cfg.q_dim, H), "bq": (cfg.q_dim,), "wk": (cfg.kv_dim, H), "bk": (cfg.kv_dim,),
            "wv": (cfg.kv_dim, H), "bv": (cfg.kv_dim,), "wo": (H, cfg.q_dim), "ln2": (H,),
            "wg": (F, H), "wu": (F, H), "wd": (H, F)}


def hf_tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor an HF Qwen2 checkpoint of this config holds, by HF name."""
    shapes = {"model.embed_tokens.weight": (cfg.vocab_size, cfg.hidden_size), "model.norm.weight": (cfg.hidden_size,)}
    for i in range(cfg.num_hidden_layers):
        for short, suffix in LAYER_TENSORS.items():
            shapes[f"model.layers.{i}.{suffix}"] = layer_shapes(cfg)[short]
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, cfg.hidden_size)
    return shapes


def float_tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The tensors stored as floats: all of them, less the decoder linears of a quantized model."""
    shapes = hf_tensor_shapes(cfg)
    if cfg.quant is not None:
        for i in range(cfg.num_hidden_layers):
            for short in LINEARS:
                del shapes[f"model.layers.{i}.{LAYER_TENSORS[short]}"]
    return shapes


def quant_tensor_shapes(cfg: ModelConfig, prefix: str, shape: tuple[int, int]) -> dict[str, tuple[int, ...]]:
    """The stored tensors of one quantized linear `prefix` (no `.weight`) of logical shape [out, in]."""
    out, n_in = shape
    if cfg.quant.method == "awq":
        return {f"{prefix}.qweight": (n_in, out // PACK), f"{prefix}.qzeros": (n_in // GROUP_SIZE, out // PACK),
                f"{prefix}.scales": (n_in // GROUP_SIZE, out)}
    shapes = {f"{prefix}.weight_packed": (out, n_in // PACK), f"{prefix}.weight_scale": (out, n_in // GROUP_SIZE),
              f"{prefix}.weight_shape": (2,)}
    if not cfg.quant.symmetric:
        shapes[f"{prefix}.weight_zero_point"] = (-(-out // PACK), n_in // GROUP_SIZE)
    return shapes


def action_query_fallback_ids(cfg: ModelConfig) -> np.ndarray:
    """Token ids whose embeddings stand in for missing `action_queries`: the K x 8 ids just below the start token
    (vocab - 256 - 1), i.e. vocab-257-8K .. vocab-258 (K = 1: vocab-265 .. vocab-258). Well defined for any
    vocabulary the config accepts (more than 257 + 64 ids is checked at load), but untrained."""
    start = cfg.vocab_size - ACTION_VOCAB - 1
    return np.arange(start - cfg.action_tokens, start)


def vision_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    return {"patch_proj.weight": (cfg.hidden_size, PATCH_DIM), "patch_proj.bias": (cfg.hidden_size,),
            "pos_embed": (VISION_TOKENS, cfg.hidden_size)}


def state_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The state projector's tensors (bf16 in the engine) and bounds (float32), keyed as in vision.safetensors."""
    H, S = cfg.hidden_size, cfg.state_dim
    return {STATE_PREFIX + "fc1.weight": (H, S), STATE_PREFIX + "fc1.bias": (H,),
            STATE_PREFIX + "fc2.weight": (H, H), STATE_PREFIX + "fc2.bias": (H,),
            STATE_PREFIX + "low": (S,), STATE_PREFIX + "high": (S,)}


@dataclass
class StateWeights:
    """The robot-state projector: fc1 [H, S] and fc2 [H, H] with biases (bf16 bits), the bounds low / high (float32
    [S]) its input is normalized by, and whether it came from the checkpoint (False: seeded stand-in)."""

    fc1_w: np.ndarray
    fc1_b: np.ndarray
    fc2_w: np.ndarray
    fc2_b: np.ndarray
    low: np.ndarray
    high: np.ndarray
    trained: bool


@dataclass
class VisionWeights:
    patch_w: np.ndarray  # bf16 bits [H, 768]
    patch_b: np.ndarray  # bf16 bits [H]
    pos_embed: np.ndarray  # bf16 bits [32, H]
    trained: bool  # False: seeded PRNG stand-in, there was no vision.safetensors
    # Parallel-decoding models only (None for autoregressive ones): the input embeddings of the K x 8 action
    # slots, bf16 bits [K x 8, H]. From vision.safetensors `action_queries`, else the embedding rows of
    # `action_query_fallback_ids` (queries_trained False).
    action_queries: np.ndarray | None = None
    queries_trained: bool = False
    state: StateWeights | None = None  # models with a state input only (cfg.state_dim > 0)


@dataclass
class Weights:
    cfg: ModelConfig
    embed: np.ndarray  # bf16 bits [V, H]; tied: also the LM head
    norm: np.ndarray
    layers: list[dict[str, np.ndarray | QuantTensor]]  # LINEARS are QuantTensor when cfg.quant is set
    vision: VisionWeights
    lm_head: np.ndarray | None = None  # only when embeddings are not tied
    path: str = ""
    files: list[str] = field(default_factory=list)

    @property
    def head(self) -> np.ndarray:
        return self.embed if self.lm_head is None else self.lm_head

    def nbytes(self) -> int:
        """Bytes of the transformer weights as the device holds them (QuantTensor: packed, see its nbytes)."""
        arrays = [self.embed, self.norm, *(t for layer in self.layers for t in layer.values())]
        if self.lm_head is not None:
            arrays.append(self.lm_head)
        return sum(a.nbytes for a in arrays)


def _to_bf16(path, name, dtype, arr, check_finite) -> np.ndarray:
    if dtype == "BF16":
        bits = np.asarray(arr)
        if check_finite:
            flat = bits.reshape(-1)
            for i in range(0, flat.size, CHECK_BLOCK):  # a block at a time: no tensor-sized temporaries
                if ((flat[i:i + CHECK_BLOCK] & 0x7F80) == 0x7F80).any():  # exponent all ones: Inf or NaN
                    raise ModelLoadError(path, "contains NaN or Inf", name)
            release_pages(bits)  # read once to check: a memory-mapped file's pages need not stay in this process
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
        except (OSError, json.JSONDecodeError, UnicodeDecodeError, RecursionError, KeyError, TypeError) as e:
            raise ModelLoadError(index, f"unreadable shard index ({type(e).__name__}: {e})") from None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ModelLoadError(index, f"'weight_map' must map tensor names to file names, got a "
                                        f"{type(weight_map).__name__}")
        return {name: os.path.join(path, os.path.basename(fn)) for name, fn in weight_map.items()}
    if os.path.isfile(single):
        infos, _, _ = read_header(single)
        return {name: single for name in infos}
    hint = (f"; pickle checkpoints are refused for safety: {', '.join(map(os.path.basename, pickles))}"
            if pickles else "")
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
                raise ModelLoadError(fn, f"shape {list(infos[name].shape)} does not match the config, expected "
                                         f"{list(expected[name])}", name)
        for name, (dtype, arr) in load_file(fn, names).items():
            out[name] = _to_bf16(fn, name, dtype, arr, check_finite)
    return out


def random_vision_weights(cfg: ModelConfig, seed: int = VISION_SEED) -> dict[str, np.ndarray]:
    """Untrained patch projector from a seeded PRNG, as float32, keyed like vision.safetensors."""
    rng = np.random.default_rng(seed)
    shapes = vision_shapes(cfg)
    return {"patch_proj.weight": (rng.standard_normal(shapes["patch_proj.weight"], dtype=np.float32)
                                  * (1.0 / np.sqrt(PATCH_DIM))),
            "patch_proj.bias": rng.standard_normal(shapes["patch_proj.bias"], dtype=np.float32) * 0.02,
            "pos_embed": rng.standard_normal(shapes["pos_embed"], dtype=np.float32) * 0.02}


def random_state_weights(cfg: ModelConfig, seed: int = STATE_SEED) -> dict[str, np.ndarray]:
    """Untrained state projector from a seeded PRNG (float32, keyed like vision.safetensors): unit-variance inputs give
    a token of about the vision tokens' scale (each layer scaled by 1 / sqrt(fan-in)); bounds -1..1, so a state
    already in [-1, 1] passes the normalization unchanged."""
    rng = np.random.default_rng(seed)
    H, S = cfg.hidden_size, cfg.state_dim
    p = STATE_PREFIX
    return {p + "fc1.weight": rng.standard_normal((H, S), dtype=np.float32) / np.float32(np.sqrt(S)),
            p + "fc1.bias": rng.standard_normal(H, dtype=np.float32) * np.float32(0.02),
            p + "fc2.weight": rng.standard_normal((H, H), dtype=np.float32) / np.float32(np.sqrt(H)),
            p + "fc2.bias": rng.standard_normal(H, dtype=np.float32) * np.float32(0.02),
            p + "low": np.full(S, -1.0, np.float32), p + "high": np.ones(S, np.float32)}


def _load_state(cfg: ModelConfig, vpath: str, header: dict | None, check_finite: bool) -> StateWeights | None:
    """The state projector of `vpath`'s tensors (`header`: its header, None without the file), else the seeded
    stand-in with one WARN; None for a model without a state input. Tensors of a state projector in a model whose
    config has no vla_state_dim are refused: the engine would not know the state it needs."""
    names = [n for n in (header or {}) if n.startswith(STATE_PREFIX)]
    if not cfg.state_dim:
        if names:
            raise ModelLoadError(vpath, "has a state projector but the config has no vla_state_dim (the state input's "
                                        "size: joints x fields)", names[0])
        return None
    expected = state_shapes(cfg)
    p = STATE_PREFIX
    if names:
        raw = _load_set({n: vpath for n in header}, {k: s for k, s in expected.items() if "fc" in k}, check_finite)
        bounds = {}
        for name, (dtype, arr) in load_file(vpath, [p + "low", p + "high"] if p + "low" in header and
                                            p + "high" in header else []).items():
            if header[name].shape != expected[name]:
                raise ModelLoadError(vpath, f"shape {list(header[name].shape)} does not match the config, expected "
                                            f"{list(expected[name])}", name)
            if dtype not in ("F32", "F64", "F16", "BF16"):
                raise ModelLoadError(vpath, f"dtype {dtype} is not a float type", name)
            bounds[name] = bf16_to_f32(arr) if dtype == "BF16" else np.asarray(arr, np.float32)
        if len(bounds) != 2:
            raise ModelLoadError(vpath, "tensor missing: a state projector needs its normalization bounds "
                                        f"{p}low and {p}high (OpenVLA-OFT's q01 / q99)", p + "low")
        low, high = bounds[p + "low"], bounds[p + "high"]
        if not (np.isfinite(low).all() and np.isfinite(high).all()) or (high < low).any():
            raise ModelLoadError(vpath, "state bounds must be finite with high >= low in every dimension", p + "high")
        trained = True
    else:
        r = random_state_weights(cfg)
        raw = {k: f32_to_bf16(a) for k, a in r.items() if "fc" in k}
        low, high = r[p + "low"], r[p + "high"]
        trained = False
        log.warning("%s: vla_state_dim %d without a state projector (%s*) in %s: a seeded, untrained one stands in "
                    "and the bounds are -1..1", os.path.dirname(vpath) or ".", cfg.state_dim, p,
                    os.path.basename(vpath))
    return StateWeights(raw[p + "fc1.weight"], raw[p + "fc1.bias"], raw[p + "fc2.weight"], raw[p + "fc2.bias"],
                        np.ascontiguousarray(low, np.float32), np.ascontiguousarray(high, np.float32), trained)


def _check_layer_count(cfg: ModelConfig, files_by_name: dict[str, str], cfg_path: str) -> None:
    """The config's layer count against the layers the weight files name, before anything is sized by it
    (a config with 16 million layers would otherwise be expanded into hundreds of millions of tensor names)."""
    layers = {int(m.group(1)) for name in files_by_name if (m := re.match(r"model\.layers\.(\d+)\.", name))}
    held = max(layers) + 1 if layers else 0
    if cfg.num_hidden_layers != held:
        files = ", ".join(sorted({os.path.basename(f) for f in files_by_name.values()})) or "no weight file"
        raise ModelLoadError(cfg_path, f"num_hidden_layers={cfg.num_hidden_layers} but the weight files ({files}) "
                                       f"hold {held} layers")


def _missing_part(cfg, files_by_name, prefix, name) -> str:
    if f"{prefix}.weight" in files_by_name:
        return (f"tensor missing: this linear is stored unquantized ({prefix}.weight), but every decoder linear of a "
                f"{cfg.quant.method} model must be 4-bit")
    if name.endswith(".qzeros"):
        return "tensor missing: AWQ gemm needs zero points (qzeros)"
    if name.endswith(".weight_zero_point"):
        return "tensor missing: the config says asymmetric (symmetric: false), which needs zero points"
    return "tensor missing"


def _quant_expected(cfg, files_by_name, prefix, shape) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    """The stored parts of one 4-bit linear: {name: (shape, allowed dtypes)}, after checking they are all there."""
    out, n_in = shape
    any_file = next(iter(set(files_by_name.values())), "?")
    if n_in % GROUP_SIZE or out % PACK:
        raise ModelLoadError(files_by_name.get(f"{prefix}.weight", any_file),
                             f"shape [{out}, {n_in}] cannot be 4-bit here: input size must be a multiple of "
                             f"{GROUP_SIZE} and output size of {PACK}", f"{prefix}.weight")
    expected = {}
    for name, want in quant_tensor_shapes(cfg, prefix, shape).items():
        if name not in files_by_name:
            raise ModelLoadError(files_by_name.get(f"{prefix}.weight", any_file),
                                 _missing_part(cfg, files_by_name, prefix, name), name)
        part = name.rsplit(".", 1)[1]
        dtypes = ("I32", "I64") if part == "weight_shape" else ("F16", "BF16") if "scale" in part else ("I32",)
        expected[name] = (want, dtypes)
    extra = f"{prefix}.weight_zero_point"
    if cfg.quant.method == "compressed-tensors" and cfg.quant.symmetric and extra in files_by_name:
        raise ModelLoadError(files_by_name[extra], "zero points present but the config says symmetric: true", extra)
    return expected


def _load_raw(cfg, files_by_name, expected) -> dict[str, tuple[str, str, np.ndarray]]:
    """{name: (file, dtype, array)} for integer/16-bit parts, loaded one file at a time, shapes and dtypes checked."""
    by_file: dict[str, list[str]] = {}
    for name in expected:
        by_file.setdefault(files_by_name[name], []).append(name)
    out = {}
    for fn, names in by_file.items():
        infos = read_header(fn)[0]
        for name in names:
            want, dtypes = expected[name]
            if name not in infos:
                raise ModelLoadError(fn, f"{_missing_part(cfg, files_by_name, name.rsplit('.', 1)[0], name)} "
                                         f"(the index names this file)", name)
            if infos[name].dtype not in dtypes:
                raise ModelLoadError(fn, f"dtype {infos[name].dtype} is not supported here (expected "
                                         f"{' or '.join(dtypes)}); {QUANT_SUPPORTED}", name)
            if infos[name].shape != tuple(want):
                raise ModelLoadError(fn, f"shape {list(infos[name].shape)} does not match the config, expected "
                                         f"{list(want)} (4-bit, group {GROUP_SIZE})", name)
        for name, (dtype, arr) in load_file(fn, names).items():
            out[name] = (fn, dtype, arr)
    return out


def _build_quant(cfg, raw, prefix, shape, check_finite) -> QuantTensor:
    def scales(part):
        fn, dtype, arr = raw[f"{prefix}.{part}"]
        if check_finite:
            bad = ((arr & 0x7F80) == 0x7F80).any() if dtype == "BF16" else not np.isfinite(arr).all()
            if bad:
                raise ModelLoadError(fn, "scales contain NaN or Inf", f"{prefix}.{part}")
        return arr, ("float16" if dtype == "F16" else "bfloat16")

    if cfg.quant.method == "awq":
        s, sdt = scales("scales")
        return from_awq(raw[f"{prefix}.qweight"][2], raw[f"{prefix}.qzeros"][2], s, sdt)
    fn, _, ws = raw[f"{prefix}.weight_shape"]
    if [int(v) for v in ws] != list(shape):
        raise ModelLoadError(fn, f"weight_shape {[int(v) for v in ws]} does not match the config, expected "
                                 f"{list(shape)}", f"{prefix}.weight_shape")
    s, sdt = scales("weight_scale")
    zp = raw.get(f"{prefix}.weight_zero_point")
    return from_compressed(raw[f"{prefix}.weight_packed"][2], s, None if zp is None else zp[2], shape, sdt)


def load_weights(path, check_finite: bool = True, vision_file: str | None = None,
                 hashed_entry: bool = False) -> Weights:
    """An HF-layout model directory's weights, every tensor checked; `vision_file`: the vision projector's file
    (default the directory's vision.safetensors; a converted GGUF's cache entry names the sidecar of the GGUF).
    `hashed_entry`: a converted-weights entry, whose transformer tensors were checked when it was written and whose
    bytes were just hashed against that write, so they are not scanned for NaN again (0.45 s of a 0.5B start); the
    vision file is."""
    path = str(path)
    if not os.path.isdir(path):
        raise ModelLoadError(path, "model directory not found")
    cfg = ModelConfig.from_dir(path)
    files_by_name = _weight_files(path)
    _check_layer_count(cfg, files_by_name, os.path.join(path, "config.json"))
    if cfg.quant is not None:
        for name in ("lm_head", "model.embed_tokens"):
            if any(f"{name}.{part}" in files_by_name for part in QUANT_PARTS[cfg.quant.method]):
                raise ModelLoadError(files_by_name.get(f"{name}.{QUANT_PARTS[cfg.quant.method][0]}", path),
                                     "stored 4-bit; only the decoder linears may be (keep it in the config's "
                                     "ignore / modules_to_not_convert)", name)
    t = _load_set(files_by_name, float_tensor_shapes(cfg), check_finite and not hashed_entry)
    shapes = layer_shapes(cfg)
    quant_parts = {}
    if cfg.quant is not None:
        for i in range(cfg.num_hidden_layers):
            for short in LINEARS:
                prefix = f"model.layers.{i}.{LAYER_TENSORS[short]}"[:-len(".weight")]
                quant_parts.update(_quant_expected(cfg, files_by_name, prefix, shapes[short]))
        raw = _load_raw(cfg, files_by_name, quant_parts)
    for i in range(cfg.num_hidden_layers):
        for short in LINEARS if cfg.quant is not None else ():
            name = f"model.layers.{i}.{LAYER_TENSORS[short]}"
            t[name] = _build_quant(cfg, raw, name[:-len(".weight")], shapes[short], check_finite)
    return weights_from_hf(cfg, t, path, sorted(set(files_by_name.values())),
                           vision_file or os.path.join(path, VISION_FILE), check_finite)


def weights_from_hf(cfg: ModelConfig, t: dict, path: str, files: list[str], vpath: str,
                    check_finite: bool = True) -> Weights:
    """`Weights` from the transformer's tensors under their HF names (`t`) and the vision projector at `vpath`."""
    layers = [{short: t[f"model.layers.{i}.{suffix}"] for short, suffix in LAYER_TENSORS.items()}
              for i in range(cfg.num_hidden_layers)]
    embed = t["model.embed_tokens.weight"]
    vision = load_vision(cfg, vpath, embed, check_finite)
    return Weights(cfg=cfg, embed=embed, norm=t["model.norm.weight"], layers=layers, vision=vision,
                   lm_head=t.get("lm_head.weight"), path=path, files=files)


def load_vision(cfg: ModelConfig, vpath: str, embed: np.ndarray, check_finite: bool = True) -> VisionWeights:
    """The vision projector from `vpath` (a vision.safetensors), else the seeded untrained stand-in; for a
    parallel-decoding model also its action queries (`action_queries`, else the embedding rows of
    `action_query_fallback_ids`, logged as untrained). `embed`: the token embeddings (bf16 bits or float32)."""
    queries, header = None, None
    if os.path.exists(vpath):
        header = read_header(vpath)[0]
        expected = vision_shapes(cfg)
        if cfg.parallel and ACTION_QUERIES in header:
            expected[ACTION_QUERIES] = (cfg.action_tokens, cfg.hidden_size)
            rows = header[ACTION_QUERIES].shape[0] if header[ACTION_QUERIES].shape else 0
            if rows != cfg.action_tokens:  # the config and the queries disagree on K: name both
                raise ModelLoadError(vpath, f"shape {list(header[ACTION_QUERIES].shape)} does not match the config, "
                                            f"expected {list(expected[ACTION_QUERIES])} (vla_action_chunk="
                                            f"{cfg.action_chunk}: 8 query rows an action)", ACTION_QUERIES)
        v = _load_set({n: vpath for n in header if not n.startswith(STATE_PREFIX)}, expected, check_finite)
        queries = v.get(ACTION_QUERIES)
        trained = True
    else:
        v = {k: f32_to_bf16(a) for k, a in random_vision_weights(cfg).items()}
        trained = False
    queries_trained = queries is not None
    if cfg.parallel and queries is None:
        ids = action_query_fallback_ids(cfg)
        queries = np.ascontiguousarray(embed[ids])
        log.warning("%s: parallel action decoding without '%s' in %s: the action slots use the embeddings of "
                    "token ids %d..%d (untrained for this role)", os.path.dirname(vpath), ACTION_QUERIES,
                    os.path.basename(vpath), ids[0], ids[-1])
    return VisionWeights(v["patch_proj.weight"], v["patch_proj.bias"], v["pos_embed"], trained,
                         action_queries=queries, queries_trained=queries_trained,
                         state=_load_state(cfg, vpath, header, check_finite))


def action_queries(weights: Weights) -> np.ndarray:
    """float32 [K x 8, H]: the input embeddings of the parallel action slots: `action_queries` from
    vision.safetensors, else (an untrained stand-in) the embedding rows of `action_query_fallback_ids`."""
    q = getattr(weights.vision, "action_queries", None)
    if q is not None:
        return bf16_to_f32(np.asarray(q)).reshape(weights.cfg.action_tokens, -1)
    return bf16_to_f32(weights.embed[action_query_fallback_ids(weights.cfg)])


def sidecar_action_keys(cfg: ModelConfig, vpath: str) -> ModelConfig:
    """`cfg` (a GGUF file's, whose metadata has no VLA keys) with the action decoding and chunk and the state input of
    its vision sidecar `vpath`: the safetensors `__metadata__` keys vla_action_decoding / vla_action_chunk and
    vla_state_dim / vla_state_joints / vla_state_fields (strings, as safetensors stores them); `cfg` unchanged
    without the file or the keys. A bad value: one ModelLoadError line."""
    if not os.path.exists(vpath):
        return cfg
    meta = read_header(vpath)[1]
    if not isinstance(meta, dict) or not any(k in meta for k in ACTION_KEYS + STATE_KEYS):
        return cfg
    out = dataclasses.replace(cfg, **parse_action_keys(meta, vpath, strings=True),
                              **parse_state_keys(meta, vpath, strings=True))
    out.validate(vpath)
    return out
