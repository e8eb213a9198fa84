# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Where generated assets (demo models, demo clips) live, made once and shared by the demo, the soak and the node.

$VLA_EDGE_CACHE, else out/cache of a writable source tree (in-tree runs, or the current directory when it is the
repo), else $XDG_CACHE_HOME (~/.cache)/vla_edge_ros. The converted GGUF models live in its converted/ folder
(model/converted_cache.py).
"""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The folder generated assets go to (see the module docstring)."""
    if os.environ.get("VLA_EDGE_CACHE"):
        return Path(os.environ["VLA_EDGE_CACHE"])
    for tree in (Path(__file__).resolve().parents[1], Path.cwd()):  # in-tree, or installed but run from the repo
        if (tree / "setup.py").is_file() and (tree / "vla_edge_ros").is_dir() and os.access(tree, os.W_OK):
            return tree / "out" / "cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")) / "vla_edge_ros"


def generated_model(preset: str = "tiny", seed: int = 0, cache: Path | None = None) -> str:
    """The random `preset` model (seed `seed`) in the cache, generated the first time it is asked for."""
    from .model.generate import ensure_model  # here: model/converted_cache asks cache_root, without a circle

    return ensure_model(str(Path(cache or cache_root()) / f"{preset}-seed{seed}"), preset, seed)
