# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""One Checkpoint a start (issue 42 item 1): the runtime's start-up checks, the engine and the VRAM plan share the
model they opened, so its config, weights and tokenizer are each read once, for a model directory and a GGUF file."""
from __future__ import annotations

import os

import pytest

from vla_edge_ros.frame_buffer import FrameBuffer
from vla_edge_ros.model import checkpoint as checkpoint_module
from vla_edge_ros.model.checkpoint import Checkpoint
from vla_edge_ros.model.config import PRESETS
from vla_edge_ros.model.generate import make_model
from vla_edge_ros.model.gguf import save_gguf
from vla_edge_ros.model.weights import load_weights
from vla_edge_ros.runtime import Runtime
from vla_edge_ros.settings import ReasoningSettings
from vla_edge_ros.vram_plan import plan_for_model, vram_plan

READERS = ("load_config", "load_model", "load_tokenizer", "load_weights", "load_gguf")


@pytest.fixture
def reads(monkeypatch):
    """How often each of model/checkpoint.py's readers ran (the functions themselves run: this only counts)."""
    counts = dict.fromkeys(READERS, 0)
    for name in READERS:
        real = getattr(checkpoint_module, name)

        def counted(*a, _real=real, _name=name, **kw):
            counts[_name] += 1
            return _real(*a, **kw)

        monkeypatch.setattr(checkpoint_module, name, counted)
    return counts


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("ckpt") / "tiny")
    make_model(d, "tiny", seed=1)
    return d


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory, tiny_dir):
    return str(save_gguf(tmp_path_factory.mktemp("ckpt-gguf") / "tiny.gguf", load_weights(tiny_dir), "F16", "F16"))


@pytest.mark.parametrize("layout", ["directory", "gguf"])
def test_a_start_reads_the_config_the_weights_and_the_tokenizer_once(reads, tiny_dir, tiny_gguf, layout):
    path = tiny_dir if layout == "directory" else tiny_gguf
    s = ReasoningSettings.from_values({"backend": "numpy", "kv_capacity_tokens": 512, "warmup_chunks": 1})
    rt = Runtime.build(path, s, FrameBuffer(pinned=False))
    try:
        # a GGUF's weights come from its converted entry (written at this first load), a directory's from itself
        assert reads == {"load_config": 1, "load_model": 1, "load_tokenizer": 1, "load_weights": 1, "load_gguf": 0}, \
            reads
        ckpt = rt.engine.checkpoint
        assert isinstance(ckpt, Checkpoint) and ckpt.path == path and os.fspath(ckpt) == path
        assert rt.engine.weights is ckpt.weights and rt.engine.cfg == ckpt.config
    finally:
        rt.close()


def test_the_vram_plan_of_a_gguf_comes_from_its_checkpoint(reads, tiny_gguf):
    ckpt = Checkpoint(tiny_gguf)
    assert plan_for_model(ckpt, 512) == vram_plan(ckpt.config, 512)
    assert plan_for_model(ckpt, 1024)["total"] > plan_for_model(ckpt, 512)["total"]
    assert reads["load_config"] == 1 and reads["load_model"] == 0  # the plan reads no weight
    assert plan_for_model(Checkpoint(tiny_gguf + ".missing"), 512) is None


def test_a_checkpoint_that_fails_to_read_tries_again(tmp_path):
    ckpt = Checkpoint(tmp_path / "later")
    with pytest.raises(Exception):
        ckpt.config
    make_model(str(tmp_path / "later"), "tiny", seed=1)
    assert ckpt.config.hidden_size == PRESETS["tiny"].hidden_size  # a failed read is not kept
    assert Checkpoint.of(ckpt) is ckpt and Checkpoint.of(str(tmp_path)).path == str(tmp_path)
