# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""One entry point for a model on disk: an HF-layout directory or a single GGUF file.

`model_path` everywhere (the node, the bench, the demo, vla-edge-plan, vla-edge-generate) goes through these:
what the path holds decides how it loads (HF safetensors bf16/fp16/fp32, sharded or not; AWQ or
compressed-tensors 4-bit; GGUF dequantized to bf16), never a switch.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from .config import ModelConfig
from .gguf import config_from_gguf, is_gguf, load_gguf, vision_path
from .weights import Weights, load_vision, load_weights, sidecar_action_keys


def load_config(path) -> ModelConfig:
    """The model's configuration, read from config.json or the GGUF metadata (no weight is loaded); a GGUF's action
    decoding and chunk come from its vision sidecar's metadata (weights.sidecar_action_keys)."""
    path = str(path)
    if _is_file_model(path):
        return sidecar_action_keys(config_from_gguf(path), vision_path(path))
    return ModelConfig.from_dir(path)


def load_model(path, keep_f32: bool = False) -> Weights:
    """Every weight, validated (ModelLoadError: one line naming the file and tensor). `keep_f32` (GGUF only): keep
    the dequantized float32 values instead of rounding to bf16 (the golden model's fidelity measurements)."""
    path = str(path)
    if not _is_file_model(path):
        return load_weights(path)
    cfg = sidecar_action_keys(config_from_gguf(path), vision_path(path))  # refuses bad keys before the dequantizing
    w = load_gguf(path, keep_f32=keep_f32)
    if cfg != w.cfg:  # a parallel GGUF model: its action queries are read for the sidecar's K
        w.cfg = cfg
        w.vision = load_vision(cfg, vision_path(path), w.embed)
    return w


def _is_file_model(path: str) -> bool:
    """A single-file model: GGUF is the only one, so any file goes to the GGUF reader (which names what is wrong)."""
    return is_gguf(path) or os.path.isfile(path)


def check_model_path(path) -> str | None:
    """Why `path` is not a model this package can load (quick checks on names and kinds, before any loading), or
    None: "<path>: <reason>". The one rule the node's parameters and every tool apply."""
    reason = model_path_problem(path)
    return f"{path}: {reason}" if reason else None


def _special_kind(p: Path) -> str:
    """What a path that is neither a regular file nor a directory is ("FIFO", "socket", ...), by its stat mode."""
    mode = p.stat().st_mode
    for test, name in ((stat.S_ISFIFO, "FIFO (named pipe)"), (stat.S_ISSOCK, "socket"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "special file"


def model_path_problem(path) -> str | None:
    """The reason of check_model_path, without the path."""
    p = Path(str(path)).expanduser()
    try:
        if not p.exists():
            return "no such model (no such directory or GGUF file)"
        if p.is_file():
            if not is_gguf(p):
                return "not a GGUF file (a model is a .gguf file or a folder with config.json and *.safetensors)"
            if not os.access(p, os.R_OK):
                return "GGUF file not readable"
            return None
        if not p.is_dir():  # a FIFO, socket or device: never opened (a FIFO would block the reader)
            return (f"a {_special_kind(p)}, not a GGUF file or a model directory (a model is a .gguf file or a folder "
                    "with config.json and *.safetensors)")
        if not os.access(p, os.R_OK | os.X_OK):
            return "model directory not readable"
        if not (p / "config.json").is_file():
            return "no config.json (not an HF-layout model directory; a GGUF model is given as its file)"
        if not (any(p.glob("*.safetensors")) or (p / "model.safetensors.index.json").is_file()):
            pickles = sorted(x.name for x in p.iterdir() if x.suffix in (".bin", ".pt", ".pth", ".pkl", ".ckpt"))
            hint = f"; pickle checkpoints are refused for safety: {', '.join(pickles[:3])}" if pickles else ""
            return f"no model.safetensors (or *.safetensors shards) weights{hint}"
    except OSError as e:  # a name too long, an I/O error: one line, no traceback
        return f"cannot be read: {type(e).__name__}: {e.strerror or e}"
    return None
