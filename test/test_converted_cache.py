# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The converted-weights cache (model/converted_cache.py, issue 42): a GGUF's first load writes its engine-ready
entry, later loads read it without opening the GGUF reader and give the same weights, config and tokenizer; an entry
that is truncated, half-written, changed or foreign is rebuilt, never trusted; a changed source gets a new entry; a
folder that cannot be written converts in memory with one WARN."""
from __future__ import annotations

import gc
import logging
import os

import numpy as np
import pytest

from vla_edge_ros.model import converted_cache, gguf, tokenizer
from vla_edge_ros.model.checkpoint import load_config, load_model
from vla_edge_ros.model.generate import make_model
from vla_edge_ros.model.gguf import load_gguf, save_gguf
from vla_edge_ros.model.safetensors_io import load_file, release_pages, save_file

CHAT = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _forget():
    """What a new process starts with: no hashed file, no checked entry, no open reader, no built tokenizer."""
    converted_cache._keys.clear()
    converted_cache._checked.clear()
    converted_cache._warned.clear()
    gguf._open_checked.cache_clear()
    tokenizer._LAST.clear()


@pytest.fixture
def micro_gguf(tmp_path, monkeypatch):
    """The micro preset as a Q8_0 GGUF with a chat template and control tokens; the cache in its own folder."""
    make_model(str(tmp_path / "micro"), "micro", seed=0)
    path = save_gguf(tmp_path / "micro.gguf", load_model(str(tmp_path / "micro")), "Q8_0", "F16",
                     chat_template=CHAT, control_tokens=("<|im_start|>", "<|im_end|>"))
    monkeypatch.setenv("VLA_EDGE_CONVERTED_CACHE", str(tmp_path / "cache"))
    _forget()
    yield path
    _forget()


def _entry(tmp_path):
    entries = [d for d in (tmp_path / "cache").iterdir() if not d.name.startswith(".")]
    assert len(entries) == 1, entries
    return entries[0]


def _same_weights(a, b):
    assert a.cfg == b.cfg
    assert np.array_equal(a.embed, b.embed) and np.array_equal(a.norm, b.norm)
    for la, lb in zip(a.layers, b.layers):
        assert la.keys() == lb.keys() and all(np.array_equal(la[k], lb[k]) for k in la)


def _no_reader(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("the GGUF reader was opened")

    monkeypatch.setattr("vla_edge_ros.model.gguf.GgufFile", refuse)


def test_the_first_load_writes_an_entry_later_loads_read_without_the_gguf_reader(micro_gguf, tmp_path, monkeypatch):
    direct = load_gguf(micro_gguf)  # the in-memory conversion, for comparison
    tok_direct = tokenizer.build_gguf_tokenizer(micro_gguf)
    _forget()
    first = load_model(micro_gguf)
    entry = _entry(tmp_path)
    files = {"entry.json", "model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"}
    assert {p.name for p in entry.iterdir()} == files
    _same_weights(first, direct)
    assert first.path == micro_gguf
    _forget()
    _no_reader(monkeypatch)  # a new start: config, weights and tokenizer all from the entry
    assert load_config(micro_gguf) == direct.cfg
    _same_weights(load_model(micro_gguf), direct)
    tok = tokenizer.load_tokenizer(micro_gguf)
    assert tok.source == micro_gguf  # messages still name the model the user gave
    text = "<|im_start|>user\npick up the red cube<|im_end|>"
    assert tok.encode(text) == tok_direct.encode(text)
    assert tok.chat_template == tok_direct.chat_template == CHAT
    assert tok.eos_ids == tok_direct.eos_ids and tok.special_ids == tok_direct.special_ids
    assert tok.render_chat([{"role": "user", "content": "go"}]) == tok_direct.render_chat([{"role": "user",
                                                                                            "content": "go"}])


def test_keep_f32_loads_bypass_the_cache(micro_gguf, tmp_path):
    w = load_model(micro_gguf, keep_f32=True)
    assert w.embed.dtype == np.float32
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("damage", ["truncated", "byte_flipped", "foreign_file", "no_record", "other_format"])
def test_a_damaged_entry_is_rebuilt_never_trusted(micro_gguf, tmp_path, caplog, damage):
    load_model(micro_gguf)  # writes the entry; its memory map is gone before the file is damaged (a mapped file
    gc.collect()  # truncated under a reader is SIGBUS, whoever truncates it)
    good = load_gguf(micro_gguf)
    entry = _entry(tmp_path)
    weights = entry / "model.safetensors"
    size = weights.stat().st_size
    if damage == "truncated":
        os.truncate(weights, size // 2)
    elif damage == "byte_flipped":  # same size, other content: only the hash tells
        with open(weights, "r+b") as f:
            f.seek(size - 100)
            b = f.read(1)
            f.seek(size - 100)
            f.write(bytes([b[0] ^ 0x40]))
    elif damage == "foreign_file":  # another valid safetensors file under the right name
        save_file({"model.embed_tokens.weight": ("BF16", np.zeros(good.embed.shape, np.uint16))}, weights)
    elif damage == "no_record":  # a folder of the entry's name that was never completed
        (entry / "entry.json").unlink()
    else:
        (entry / "entry.json").write_text('{"format": 0}')
    _forget()
    with caplog.at_level(logging.WARNING, logger="vla_edge_ros.model.converted_cache"):
        again = load_model(micro_gguf)
    assert any("converting the model again" in r.getMessage() for r in caplog.records), caplog.text
    _same_weights(again, good)
    assert _entry(tmp_path) == entry and weights.stat().st_size == size  # rebuilt in place
    _forget()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vla_edge_ros.model.converted_cache"):
        load_model(micro_gguf)
    assert not caplog.records  # the rebuilt entry passes its checks


def test_a_changed_source_file_gets_a_new_entry_and_the_old_one_goes(micro_gguf, tmp_path):
    old = load_model(micro_gguf)
    first = _entry(tmp_path)
    make_model(str(tmp_path / "other"), "micro", seed=1)
    save_gguf(micro_gguf, load_model(str(tmp_path / "other")), "Q8_0", "F16", chat_template=CHAT,
              control_tokens=("<|im_start|>", "<|im_end|>"))
    _forget()
    new = load_model(micro_gguf)
    assert not np.array_equal(new.embed, old.embed)
    _same_weights(new, load_gguf(micro_gguf))
    assert _entry(tmp_path) != first and not first.exists()


def test_a_folder_that_cannot_be_written_converts_in_memory_with_one_warn(micro_gguf, tmp_path, monkeypatch, caplog):
    if os.geteuid() == 0:  # permissions do not stop root: a folder on /proc's read-only file system does
        monkeypatch.setenv("VLA_EDGE_CONVERTED_CACHE", "/proc/vla_edge_converted")
    else:
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        monkeypatch.setenv("VLA_EDGE_CONVERTED_CACHE", str(ro / "cache"))
    with caplog.at_level(logging.WARNING, logger="vla_edge_ros.model.converted_cache"):
        a = load_model(micro_gguf)
        b = load_model(micro_gguf)
    warns = [r.getMessage() for r in caplog.records]
    assert len(warns) == 1 and "cannot be written" in warns[0] and "converted in memory" in warns[0], warns
    _same_weights(a, b)
    _same_weights(a, load_gguf(micro_gguf))


def test_off_converts_in_memory_and_writes_nothing(micro_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("VLA_EDGE_CONVERTED_CACHE", "off")
    _same_weights(load_model(micro_gguf), load_gguf(micro_gguf))
    assert not (tmp_path / "cache").exists()


def test_released_pages_leave_the_process_and_fault_back_in(tmp_path):
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    n = 64 << 20  # 128 MB of bf16
    save_file({"w": ("BF16", np.arange(n, dtype=np.uint16))}, tmp_path / "w.safetensors")
    w = load_file(tmp_path / "w.safetensors")["w"][1]
    before = rss()
    total = int(w.sum(dtype=np.uint64))  # every page read
    touched = rss()
    release_pages(w[1:])  # a view: whole pages inside it only
    released = rss()
    assert touched - before > 100e6 and touched - released > 100e6, (before, touched, released)
    assert int(w.sum(dtype=np.uint64)) == total  # still the file's values
    release_pages(np.ones(10))  # not a map: nothing happens


GOLDEN_RSS = """
import json, os, sys
import numpy as np
from vla_edge_ros.model.checkpoint import load_model
from vla_edge_ros.model.reference import ReferenceModel

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

r0 = rss()
w = load_model(sys.argv[1])
r1 = rss()
m = ReferenceModel(w, 64)
r2 = rss()
f32 = sum(4 * v.size for layer in w.layers for v in layer.values())
print(json.dumps({"load": r1 - r0, "golden": r2 - r0, "f32_layers": f32, "bf16": w.nbytes()}))
"""


def test_the_golden_model_holds_float32_layers_without_a_second_bf16_copy(small_model, tmp_path):
    """A memory-mapped bf16 model (a converted GGUF's entry, a bf16 safetensors file): loading checks each tensor and
    lets its pages go, the golden model widens each layer to float32 and lets those pages go, and the embedding
    stays bf16 (rows widened when looked up): the process holds the float32 layers and little else."""
    import json
    import subprocess
    import sys

    (tmp_path / "rss.py").write_text(GOLDEN_RSS)
    out = subprocess.run([sys.executable, str(tmp_path / "rss.py"), small_model], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"[golden rss] {r}")
    assert r["load"] < 0.25 * r["bf16"], r  # checked, then released: the pages stay in the page cache only
    assert r["golden"] - r["f32_layers"] < 0.5 * r["bf16"], r
