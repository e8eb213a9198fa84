# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""One entry point for a model on disk: an HF-layout directory or a single GGUF file.

`model_path` everywhere (the node, the bench, the demo, vla-edge-plan, vla-edge-generate) goes through these:
what the path holds decides how it loads (HF safetensors bf16/fp16/fp32, sharded or not; AWQ or
compressed-tensors 4-bit; GGUF dequantized to bf16), never a switch.
"""
from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

from . import converted_cache
from .config import ModelConfig
from .gguf import config_from_gguf, hf_tensors, is_gguf, load_gguf, vision_path
from .safetensors_io import ModelLoadError
from .tokenizer import load_tokenizer, tokenizer_files
from .weights import Weights, load_vision, load_weights, sidecar_action_keys

log = logging.getLogger(__name__)
_UNREAD = object()  # a Checkpoint's field not read yet (None is a value: a model without a tokenizer)


class Checkpoint:
    """A model on disk, opened once per start and handed to everything that reads it (the runtime's start-up checks,
    the engine, the tools, the VRAM plan): its config, weights and tokenizer are each read on first use and kept, so
    a start reads each once. `os.fspath(checkpoint)` is its path, so code that takes a model path takes it too."""

    def __init__(self, path):
        self.path = str(path)
        self._config = self._weights = self._tokenizer = _UNREAD

    @classmethod
    def of(cls, model) -> "Checkpoint":
        """`model` itself when it is a Checkpoint, else a new one of that path."""
        return model if isinstance(model, cls) else cls(model)

    def __fspath__(self) -> str:
        return self.path

    def __str__(self) -> str:
        return self.path

    def __repr__(self) -> str:
        return f"Checkpoint({self.path!r})"

    @property
    def config(self) -> ModelConfig:
        """load_config's result (the weights' own once they are loaded: the same values)."""
        if self._config is _UNREAD:
            self._config = self._weights.cfg if self._weights is not _UNREAD else load_config(self.path)
        return self._config

    @property
    def weights(self) -> Weights:
        """load_model's result, read at the first use."""
        if self._weights is _UNREAD:
            self._weights = load_model(self.path, config=None if self._config is _UNREAD else self._config,
                                       tokenizer=self._tokenizer)
            self._config = self._weights.cfg
        return self._weights

    @property
    def tokenizer(self):
        """load_tokenizer's result (None: the model has none; ModelLoadError: it has a broken one)."""
        if self._tokenizer is _UNREAD:
            self._tokenizer = load_tokenizer(self.path)
        return self._tokenizer

    def release_weights(self) -> None:
        """Forget the weights (an engine that holds them keeps its own reference; the config stays)."""
        self._weights = _UNREAD


def load_config(path) -> ModelConfig:
    """The model's configuration, read from config.json or the GGUF metadata (no weight is loaded; a GGUF's
    converted entry's config.json when it has one, without opening the GGUF reader); a GGUF's action decoding and
    chunk come from its vision sidecar's metadata (weights.sidecar_action_keys)."""
    path = str(path)
    if _is_file_model(path):
        entry = converted_cache.lookup(path) if is_gguf(path) else None
        base = ModelConfig.from_dir(entry) if entry else config_from_gguf(path)
        return sidecar_action_keys(base, vision_path(path))
    return ModelConfig.from_dir(path)


def load_model(path, keep_f32: bool = False, config: ModelConfig | None = None, tokenizer=_UNREAD) -> Weights:
    """Every weight, validated (ModelLoadError: one line naming the file and tensor). A GGUF file loads from its
    converted-weights entry (converted_cache: written at the first load, memory-mapped after). `keep_f32` (GGUF
    only): the dequantized float32 values instead of bf16 (the golden model's fidelity measurements; not cached).
    `config` / `tokenizer`: load_config's / load_tokenizer's results when the caller has read them (a GGUF's are
    then not read again)."""
    path = str(path)
    if not _is_file_model(path):
        return load_weights(path)
    cfg = config if config is not None else load_config(path)  # refuses bad sidecar keys before the dequantizing
    entry = None if keep_f32 else converted_entry(path, tokenizer)
    if entry is not None:
        w = load_weights(entry, vision_file=vision_path(path), hashed_entry=True)
        w.path, w.files = path, [path]
    else:
        w = load_gguf(path, keep_f32=keep_f32)
    if cfg != w.cfg:  # a parallel GGUF model: its action queries are read for the sidecar's K
        w.cfg = cfg
        w.vision = load_vision(cfg, vision_path(path), w.embed)
    return w


def converted_entry(path: str, tokenizer=_UNREAD) -> str | None:
    """The converted-weights entry of the GGUF at `path`, written now when there is none; None when the cache is
    off or cannot be written, or when the file's tokenizer is broken (its loader reports that; the weights then
    load in memory)."""
    entry = converted_cache.lookup(path)
    if entry is not None or converted_cache.cache_root() is None:
        return entry
    try:
        tok = load_tokenizer(path) if tokenizer is _UNREAD else tokenizer
    except ModelLoadError:
        return None
    cfg, specs, arrays = hf_tensors(path)
    files = {"config.json": json.dumps(cfg.to_hf_dict(), indent=1).encode("utf-8")}
    if tok is not None:
        files.update(tokenizer_files(tok))
    entry = converted_cache.store(path, specs, arrays, files)
    if entry is not None:
        log.info("%s: converted once into %s (later starts memory-map it)", path, entry)
    return entry


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
