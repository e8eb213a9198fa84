# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Model configuration: the subset of an HF Qwen2 `config.json` the engine needs, plus presets."""
from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import asdict, dataclass

from ..constants import ACTION_TOKENS, GROUP_SIZE, MAX_ACTION_CHUNK, MAX_STATE_DIM, STATE_FIELDS
from .safetensors_io import ModelLoadError


MAX_CONFIG_BYTES = 1 << 20  # HF configs are a few KiB
MAX_INT = 1 << 24  # no size, layer or vocabulary count of a loadable model comes near this


def _typed(v, kind: str):
    """``v`` as the JSON type ``kind`` (int | float | bool), or None when it is not one."""
    if kind == "bool":
        return v if isinstance(v, bool) else None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if kind == "int":
        if isinstance(v, float):
            if not (math.isfinite(v) and v.is_integer()):
                return None
            v = int(v)
        return v if abs(v) <= MAX_INT else None
    try:
        v = float(v)
    except OverflowError:  # a JSON integer with hundreds of digits
        return None
    return v if math.isfinite(v) else None


QUANT_SUPPORTED = ("supported: 4-bit weights in groups of 128, as AWQ gemm (quant_method awq, zero_point true) or "
                   "compressed-tensors pack-quantized W4A16 (int, strategy group, no activation quantization)")
ACTION_DECODING = ("autoregressive", "parallel")
ACTION_KEYS = ("vla_action_decoding", "vla_action_chunk")  # config.json keys (a GGUF's: its sidecar's metadata)
STATE_KEYS = ("vla_state_dim", "vla_state_joints", "vla_state_fields")  # the robot-state input (DESIGN.md §17)
MAX_JOINT_NAME = 256  # characters of one joint name
CHUNK_RANGE = f"an integer 1..{MAX_ACTION_CHUNK}: the actions one parallel pass plans"


def _shown(v) -> str:
    shown = repr(v)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def parse_action_keys(raw: dict, where, strings: bool = False) -> dict:
    """`vla_action_decoding` and `vla_action_chunk` of `raw` (config.json, or with `strings` the text-only
    `__metadata__` of a GGUF's vision sidecar) as ModelConfig keywords; an absent key keeps the default
    (autoregressive, one action). A bad value raises one ModelLoadError line naming the key and what is allowed;
    the combination (K > 1 needs parallel decoding) is ModelConfig.validate's."""
    decoding = raw.get("vla_action_decoding", "autoregressive")
    if decoding not in ACTION_DECODING:
        raise ModelLoadError(where, f"key 'vla_action_decoding' has a bad value {_shown(decoding)} "
                                    f"(expected one of {', '.join(ACTION_DECODING)})")
    chunk = raw.get("vla_action_chunk", 1)
    if strings and isinstance(chunk, str) and chunk.isascii() and chunk.isdigit():
        chunk = int(chunk)  # safetensors metadata holds strings only
    # an int, never a bool, a float or a string: 1.5, true and "8" are not an action count in config.json
    if type(chunk) is not int or not 1 <= chunk <= MAX_ACTION_CHUNK:
        raise ModelLoadError(where, f"key 'vla_action_chunk' has a bad value {_shown(chunk)} (expected {CHUNK_RANGE})")
    return {"action_decoding": decoding, "action_chunk": chunk}


def parse_state_keys(raw: dict, where, strings: bool = False) -> dict:
    """`vla_state_dim`, `vla_state_joints` and `vla_state_fields` of `raw` as ModelConfig keywords (absent: no state
    input, no names, position). With `strings` (a safetensors `__metadata__`) the dim is a decimal string and the two
    lists JSON strings. A bad value raises one ModelLoadError line; how they fit together is ModelConfig.validate's."""
    dim = raw.get("vla_state_dim", 0)
    if strings and isinstance(dim, str) and dim.isascii() and dim.isdigit():
        dim = int(dim)
    if type(dim) is not int or not 0 <= dim <= MAX_STATE_DIM:
        raise ModelLoadError(where, f"key 'vla_state_dim' has a bad value {_shown(dim)} (expected an integer "
                                    f"0..{MAX_STATE_DIM}: the robot-state values the model takes)")
    out = {"state_dim": dim}
    lists = (("vla_state_joints", "state_joints", ()), ("vla_state_fields", "state_fields", ("position",)))
    for key, name, default in lists:
        v = raw.get(key, list(default))
        if strings and isinstance(v, str):
            try:
                v = json.loads(v) if len(v) <= MAX_STATE_DIM * (MAX_JOINT_NAME + 4) + 2 else None
            except (json.JSONDecodeError, RecursionError):
                v = None
        if not isinstance(v, list) or len(v) > MAX_STATE_DIM or \
                not all(isinstance(x, str) and 0 < len(x) <= MAX_JOINT_NAME and x.isprintable() for x in v):
            raise ModelLoadError(where, f"key {key!r} has a bad value {_shown(v)} (expected a list of at most "
                                        f"{MAX_STATE_DIM} printable names of 1..{MAX_JOINT_NAME} characters)")
        out[name] = tuple(v)
    return out


@dataclass(frozen=True)
class QuantConfig:
    """A checkpoint's 4-bit weight format, parsed from config.json's `quantization_config`."""

    method: str  # "awq" | "compressed-tensors"
    bits: int = 4
    group_size: int = GROUP_SIZE
    symmetric: bool = False  # AWQ gemm always has zero points

    def to_hf(self) -> dict:
        """The `quantization_config` the format's own library writes for this scheme."""
        if self.method == "awq":
            return {"quant_method": "awq", "bits": self.bits, "group_size": self.group_size, "zero_point": True,
                    "version": "gemm", "modules_to_not_convert": None}
        weights = {"num_bits": self.bits, "type": "int", "symmetric": self.symmetric, "strategy": "group",
                   "group_size": self.group_size, "dynamic": False, "actorder": None, "block_structure": None,
                   "observer": "minmax", "observer_kwargs": {}}
        return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                              "output_activations": None, "format": "pack-quantized"}},
                "ignore": ["lm_head"], "kv_cache_scheme": None, "global_compression_ratio": None,
                "sparsity_config": {}}


def parse_quant(raw, where) -> QuantConfig | None:
    """`quantization_config` -> QuantConfig; anything this runtime cannot run raises one ModelLoadError line."""
    if raw is None:
        return None

    def bad(what):
        return ModelLoadError(where, f"quantization_config: {what}; {QUANT_SUPPORTED}")

    if not isinstance(raw, dict):
        raise bad("not a JSON object")
    method = raw.get("quant_method")
    if method == "awq":
        for key, want in (("bits", 4), ("group_size", GROUP_SIZE)):
            if raw.get(key) != want or isinstance(raw.get(key), bool):
                raise bad(f"{key}={raw.get(key)!r}")
        if raw.get("zero_point", True) is not True:  # HF's AwqConfig defaults to zero points
            raise bad(f"zero_point={raw.get('zero_point')!r} (AWQ gemm with zero points only)")
        version = raw.get("version", "gemm")
        if not isinstance(version, str) or version.lower() != "gemm":
            raise bad(f"version={version!r} (only the gemm packing)")
        return QuantConfig("awq", symmetric=False)
    if method == "compressed-tensors":
        fmt = raw.get("format")
        if fmt not in ("pack-quantized", "mixed-precision"):  # mixed: each group names its own, checked below
            raise bad(f"format={fmt!r}")
        status = raw.get("quantization_status", "compressed")
        if status != "compressed":
            raise bad(f"quantization_status={status!r} (the weights must be stored packed: 'compressed')")
        if raw.get("kv_cache_scheme") is not None:
            raise bad("kv_cache_scheme is set (KV cache quantization)")
        if raw.get("sparsity_config") not in (None, {}):
            raise bad("sparsity_config is set")
        groups = raw.get("config_groups")
        if not isinstance(groups, dict) or not groups:
            raise bad("config_groups missing")
        symmetric = set()
        for gname, g in groups.items():
            if not isinstance(g, dict):
                raise bad(f"config_groups.{gname} is not an object")
            if g.get("format", fmt) != "pack-quantized":
                raise bad(f"config_groups.{gname}.format={g.get('format')!r}")
            for act in ("input_activations", "output_activations"):
                if g.get(act) is not None:
                    raise bad(f"config_groups.{gname}.{act} is set (activation quantization; only W4A16 runs)")
            w = g.get("weights")
            if not isinstance(w, dict):
                raise bad(f"config_groups.{gname}.weights missing")
            for key, want in (("num_bits", 4), ("type", "int"), ("strategy", "group"), ("group_size", GROUP_SIZE)):
                if w.get(key) != want or isinstance(w.get(key), bool):
                    raise bad(f"config_groups.{gname}.weights.{key}={w.get(key)!r}")
            if w.get("dynamic", False) is not False:
                raise bad(f"config_groups.{gname}.weights.dynamic={w.get('dynamic')!r}")
            if w.get("actorder") not in (None, "static"):
                raise bad(f"config_groups.{gname}.weights.actorder={w.get('actorder')!r} (no g_idx reordering)")
            if not isinstance(w.get("symmetric", True), bool):
                raise bad(f"config_groups.{gname}.weights.symmetric={w.get('symmetric')!r}")
            symmetric.add(w.get("symmetric", True))
        if len(symmetric) != 1:
            raise bad("config groups mix symmetric and asymmetric weights")
        return QuantConfig("compressed-tensors", symmetric=symmetric.pop())
    raise bad(f"quant_method={method!r}")


@dataclass(frozen=True)
class ModelConfig:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    rope_theta: float = 1e6
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 32768
    quant: QuantConfig | None = None  # None: bf16 weights
    action_decoding: str = "autoregressive"  # config.json "vla_action_decoding": autoregressive | parallel
    action_chunk: int = 1  # config.json "vla_action_chunk" K: actions one parallel pass plans (K x 8 tokens)
    # The robot-state input (DESIGN.md §17): config.json "vla_state_dim" values (0: none), the joints they are of in
    # the model's order ("vla_state_joints", empty: the node's state_joints parameter names them) and the
    # sensor_msgs/JointState fields read per joint ("vla_state_fields"); the vector is, field by field, each
    # field's values of the joints in order: dim = joints x fields.
    state_dim: int = 0
    state_joints: tuple[str, ...] = ()
    state_fields: tuple[str, ...] = ("position",)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def parallel(self) -> bool:
        return self.action_decoding == "parallel"

    @property
    def action_tokens(self) -> int:
        """Action tokens of one chunk (K x 8): its transient KV slots, and its action queries when parallel."""
        return ACTION_TOKENS * self.action_chunk

    @property
    def state_tokens(self) -> int:
        """Tokens the robot state takes in a chunk: one (a transient slot after the frame) when the model has a state
        input, else none."""
        return 1 if self.state_dim else 0

    @property
    def transient_tokens(self) -> int:
        """The chunk's transient KV slots after its frame: the state token (if any) and the action tokens."""
        return self.state_tokens + self.action_tokens

    @property
    def weight_format(self) -> str:
        """Layer weight format: "w4" for 4-bit weights (a quantization_config), else "bf16"."""
        return "bf16" if self.quant is None else "w4"

    def action_problems(self) -> list[str]:
        """What is wrong with the action decoding and the chunk K (each one line; empty when nothing)."""
        problems = []
        if self.action_decoding not in ACTION_DECODING:
            problems.append(f"vla_action_decoding {self.action_decoding!r} must be one of {', '.join(ACTION_DECODING)}")
        if type(self.action_chunk) is not int or not 1 <= self.action_chunk <= MAX_ACTION_CHUNK:
            problems.append(f"vla_action_chunk {self.action_chunk!r} must be {CHUNK_RANGE}")
        elif self.action_chunk > 1 and not self.parallel:
            problems.append(f"vla_action_chunk {self.action_chunk} needs vla_action_decoding 'parallel' (an "
                            "autoregressive model decodes one action a chunk)")
        return problems

    def state_problems(self) -> list[str]:
        """What is wrong with the state input's dim, joints and fields (each one line; empty when nothing)."""
        problems = []
        if type(self.state_dim) is not int or not 0 <= self.state_dim <= MAX_STATE_DIM:
            return [f"vla_state_dim {self.state_dim!r} must be an integer 0..{MAX_STATE_DIM}"]
        fields = self.state_fields
        if not fields or len(set(fields)) != len(fields) or not set(fields) <= set(STATE_FIELDS):
            problems.append(f"vla_state_fields {list(fields)!r} must name each of {', '.join(STATE_FIELDS)} at most "
                            "once (at least one)")
        joints = self.state_joints
        if len(set(joints)) != len(joints):
            problems.append("vla_state_joints names a joint twice")
        if joints and not self.state_dim:
            problems.append("vla_state_joints needs vla_state_dim")
        elif joints and not problems and len(joints) * len(fields) != self.state_dim:
            problems.append(f"vla_state_dim {self.state_dim} must be {len(joints)} joints x {len(fields)} fields = "
                            f"{len(joints) * len(fields)}")
        elif self.state_dim and not problems and self.state_dim % len(fields):
            problems.append(f"vla_state_dim {self.state_dim} is not a whole number of joints x {len(fields)} fields")
        return problems

    def validate(self, where="config.json") -> None:
        problems = self.action_problems() + self.state_problems()
        for k, v in asdict(self).items():
            if k == "state_dim":
                continue  # 0: no state input (state_problems checks it)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v <= 0:
                problems.append(f"{k}={v} must be > 0")
        if not problems:
            if self.hidden_size % self.num_attention_heads:
                problems.append("hidden_size must be a multiple of num_attention_heads")
            if self.num_attention_heads % self.num_key_value_heads:
                problems.append("num_attention_heads must be a multiple of num_key_value_heads")
            if self.head_dim % 2:
                problems.append("head_dim must be even (RoPE rotates pairs)")
            if self.vocab_size <= 257:
                problems.append("vocab_size must exceed 256 action tokens + 1 start token")
            elif self.parallel and self.vocab_size <= 257 + self.action_tokens:
                problems.append(f"vocab_size must exceed 257 + {self.action_tokens} (the ids below the start token "
                                "stand in for missing action queries)")
        if problems:
            raise ModelLoadError(where, "; ".join(problems))

    def to_hf_dict(self) -> dict:
        d = asdict(self)
        del d["quant"], d["action_decoding"], d["action_chunk"], d["state_dim"], d["state_joints"], d["state_fields"]
        if self.quant is not None:
            d["quantization_config"] = self.quant.to_hf()
        if self.action_decoding != "autoregressive":
            d["vla_action_decoding"] = self.action_decoding
        if self.action_chunk != 1:
            d["vla_action_chunk"] = self.action_chunk
        if self.state_dim:
            d["vla_state_dim"] = self.state_dim
            d["vla_state_fields"] = list(self.state_fields)
            if self.state_joints:
                d["vla_state_joints"] = list(self.state_joints)
        d.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_act="silu",
                 torch_dtype="bfloat16", use_sliding_window=False, sliding_window=None,
                 attention_dropout=0.0, initializer_range=0.02, use_cache=True,
                 bos_token_id=0, eos_token_id=1, max_window_layers=self.num_hidden_layers)
        return d

    @classmethod
    def from_dir(cls, path) -> "ModelConfig":
        cfg_path = os.path.join(path, "config.json")
        if not os.path.isfile(cfg_path):
            raise ModelLoadError(cfg_path, "file not found (is this a model directory?)")
        # config.json is data only: parsed as JSON, never executed; unknown keys (auto_map,
        # trust_remote_code, ...) are ignored, and each known key must have the right JSON type.
        try:
            if os.path.getsize(cfg_path) > MAX_CONFIG_BYTES:
                raise ModelLoadError(cfg_path, f"{os.path.getsize(cfg_path)} bytes: too large for a model config "
                                               f"(limit {MAX_CONFIG_BYTES})")
            with open(cfg_path, encoding="utf-8") as f:
                raw = json.load(f)
        except (OSError, json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
            raise ModelLoadError(cfg_path, f"not readable JSON ({type(e).__name__}: {e})") from None
        if not isinstance(raw, dict):
            raise ModelLoadError(cfg_path, "not a JSON object")
        if raw.get("model_type", "qwen2") != "qwen2":
            raise ModelLoadError(cfg_path, f"model_type {raw.get('model_type')!r} is not qwen2")
        kw = {}
        for name, field in cls.__dataclass_fields__.items():
            if name in ("quant", "action_decoding", "action_chunk", "state_dim", "state_joints", "state_fields"):
                continue
            if name not in raw:
                if field.default is dataclasses.MISSING:
                    raise ModelLoadError(cfg_path, f"missing key {name!r}")
                continue
            value = _typed(raw[name], field.type)
            if value is None:
                raise ModelLoadError(cfg_path, f"key {name!r} has a bad value {_shown(raw[name])} (expected a "
                                               f"{field.type}{' <= ' + str(MAX_INT) if field.type == 'int' else ''})")
            kw[name] = value
        kw["quant"] = parse_quant(raw.get("quantization_config"), cfg_path)
        kw.update(parse_action_keys(raw, cfg_path))
        kw.update(parse_state_keys(raw, cfg_path))
        cfg = cls(**kw)
        if "head_dim" in raw and raw["head_dim"] != cfg.head_dim:
            raise ModelLoadError(cfg_path, f"head_dim {raw['head_dim']} != hidden_size/num_attention_heads "
                                           f"{cfg.head_dim}")
        cfg.validate(cfg_path)
        return cfg


PRESETS = {
    # Small enough for CPU CI and the demo, but head_dim 128 and GQA like the real model, so the
    # CUDA kernels specialised for head_dim 128 run on it too.
    "tiny": ModelConfig(hidden_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        intermediate_size=1024, vocab_size=2048),
    # One layer, hidden 256 (~5 ms a chunk with NumPy): model actions fit 33 ms even on a busy 2-core CPU,
    # where 'tiny' (~25 ms) sits too close to the deadline. Integration tests, soak and CPU demos.
    "micro": ModelConfig(hidden_size=256, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=512, vocab_size=1024),
    # A CPU-hostile middle size: used to prove the deadline guard with a backend that is too slow.
    "small": ModelConfig(hidden_size=1024, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=2,
                         intermediate_size=2816, vocab_size=8192),
    # The published Qwen2.5 shapes (HF config.json of each), random weights: the 0.5B backbone of MiniVLA and
    # VLA-Adapter (head_dim 64, GQA 7:1), the design's 1.5B (head_dim 128, 6:1), the 3B of NORA / QwenOFT (8:1).
    "qwen2.5-0.5b": ModelConfig(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                                num_key_value_heads=2, intermediate_size=4864, vocab_size=151936),
    "qwen2.5-1.5b": ModelConfig(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                                num_key_value_heads=2, intermediate_size=8960, vocab_size=151936),
    "qwen2.5-3b": ModelConfig(hidden_size=2048, num_hidden_layers=36, num_attention_heads=16,
                              num_key_value_heads=2, intermediate_size=11008, vocab_size=151936),
}
