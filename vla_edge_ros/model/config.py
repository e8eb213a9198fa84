"""Model configuration: the subset of an HF Qwen2 `config.json` the engine needs, plus presets."""
from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import asdict, dataclass

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

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    def validate(self, where="config.json") -> None:
        problems = []
        for k, v in asdict(self).items():
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
        if problems:
            raise ModelLoadError(where, "; ".join(problems))

    def to_hf_dict(self) -> dict:
        d = asdict(self)
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
            if name not in raw:
                if field.default is dataclasses.MISSING:
                    raise ModelLoadError(cfg_path, f"missing key {name!r}")
                continue
            value = _typed(raw[name], field.type)
            if value is None:
                shown = repr(raw[name])
                shown = shown if len(shown) <= 80 else shown[:77] + "..."
                raise ModelLoadError(cfg_path, f"key {name!r} has a bad value {shown} (expected a {field.type}"
                                               f"{' <= ' + str(MAX_INT) if field.type == 'int' else ''})")
            kw[name] = value
        cfg = cls(**kw)
        if "head_dim" in raw and raw["head_dim"] != cfg.head_dim:
            raise ModelLoadError(cfg_path, f"head_dim {raw['head_dim']} != hidden_size/num_attention_heads {cfg.head_dim}")
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
    "qwen2.5-1.5b": ModelConfig(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
                                num_key_value_heads=2, intermediate_size=8960, vocab_size=151936),
}
