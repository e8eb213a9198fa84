# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""GGUF files (model/gguf.py): written with `gguf.GGUFWriter` (llama.cpp's own writer) in the layout llama.cpp's
converter produces, read back as the engine's weights, checked against HF transformers reading the same file, and
every kind of broken file refused with one line (no traceback, no giant allocation)."""
from __future__ import annotations

import dataclasses
import os
import struct
import subprocess
import sys

import numpy as np
import pytest

from vla_edge_ros.model.checkpoint import check_model_path, load_config, load_model
from vla_edge_ros.model.config import PRESETS
from vla_edge_ros.model.generate import make_model
from vla_edge_ros.model.gguf import GGUF_LAYER, is_gguf, save_gguf
from vla_edge_ros.model.quant import as_f32
from vla_edge_ros.model.safetensors_io import ModelLoadError

gguf = pytest.importorskip("gguf")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# head_dim 64, GQA 7:1 and untied embeddings, as the real 0.5B; small enough for a CPU test
HD64 = dataclasses.replace(PRESETS["micro"], hidden_size=448, num_attention_heads=7, num_key_value_heads=1,
                           intermediate_size=512, num_hidden_layers=2, tie_word_embeddings=False, vocab_size=1024)


def _weights(tmp_path, cfg, name="m"):
    make_model(str(tmp_path / name), cfg=cfg, seed=3)
    return load_model(str(tmp_path / name))


@pytest.fixture
def tiny_gguf(tmp_path):
    w = _weights(tmp_path, PRESETS["tiny"])
    return save_gguf(tmp_path / "tiny.gguf", w, "Q8_0", "F16"), w


def test_a_gguf_loads_as_the_weights_it_was_written_from(tmp_path):
    w = _weights(tmp_path, HD64)
    path = save_gguf(tmp_path / "m.gguf", w, "F32", "F32")  # F32 holds the bf16 values exactly
    assert is_gguf(path) and check_model_path(path) is None
    g = load_model(path)
    assert dataclasses.replace(g.cfg, rms_norm_eps=w.cfg.rms_norm_eps) == w.cfg
    assert g.cfg.rms_norm_eps == pytest.approx(w.cfg.rms_norm_eps, rel=1e-6)  # stored as float32
    assert g.cfg.head_dim == 64 and not g.cfg.tie_word_embeddings
    np.testing.assert_array_equal(g.embed, w.embed)
    np.testing.assert_array_equal(g.lm_head, w.lm_head)
    np.testing.assert_array_equal(g.norm, w.norm)
    for lg, lw in zip(g.layers, w.layers):
        for k in GGUF_LAYER:
            np.testing.assert_array_equal(lg[k], lw[k], err_msg=k)
    assert load_config(path) == g.cfg


def test_quantized_blocks_dequantize_as_llama_cpp_s_reader(tmp_path):
    w = _weights(tmp_path, HD64)
    for kind in ("Q8_0", "Q5_0", "Q4_0", "F16", "BF16"):
        g = load_model(save_gguf(tmp_path / f"{kind}.gguf", w, kind, kind), keep_f32=True)
        # error per 32-value block relative to the block's largest |value|: Q8_0 rounds to amax/127 (<= 1/254, plus
        # its fp16 scale); Q5_0 and Q4_0 scale by the signed extreme / -16 (-8), so the other end can clip one step
        ref = as_f32(w.layers[1]["wd"])
        blocks = lambda a: a.reshape(-1, 32)  # noqa: E731
        err = (np.abs(blocks(g.layers[1]["wd"] - ref)).max(1) / np.abs(blocks(ref)).max(1)).max()
        bound = {"Q8_0": 1 / 200, "Q5_0": 1 / 16 + 1e-6, "Q4_0": 1 / 8 + 1e-6, "F16": 1e-3, "BF16": 1e-6}[kind]
        assert 0 <= err < bound, (kind, err)
        r = gguf.GGUFReader(str(tmp_path / f"{kind}.gguf"))
        t = next(t for t in r.tensors if t.name == "blk.1.ffn_down.weight")
        np.testing.assert_array_equal(g.layers[1]["wd"], gguf.quants.dequantize(t.data, t.tensor_type)
                                      .reshape(g.layers[1]["wd"].shape).astype(np.float32))


def _same_as_llama_cpp_s_reader(path):
    """GgufFile reads what gguf.GGUFReader reads: every metadata value, every tensor's type, shape, place and bytes."""
    from vla_edge_ros.model.gguf import GgufFile, field

    ours, theirs = GgufFile(str(path), os.path.getsize(path)), gguf.GGUFReader(str(path))
    keys = [k for k in theirs.fields if not k.startswith("GGUF.")]
    assert list(ours.fields) == keys
    for k in keys:
        assert field(ours, k) == theirs.fields[k].contents(), k
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for a, b in zip(ours.tensors, theirs.tensors):
        assert (a.tensor_type, a.shape, a.n_elements, a.n_bytes, a.data_offset) == \
            (b.tensor_type, tuple(int(d) for d in b.shape), int(b.n_elements), int(b.n_bytes),
             int(b.data_offset)), a.name
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        assert np.array_equal(a.data, np.asarray(b.data)), a.name
    return ours


@pytest.mark.parametrize("kind", ["Q8_0", "Q5_0", "BF16", "F32"])
def test_the_container_reads_as_llama_cpp_s_reader(tmp_path, kind):
    w = _weights(tmp_path, HD64)
    path = save_gguf(tmp_path / f"{kind}.gguf", w, kind, "F32" if kind == "F32" else "F16",
                     chat_template="{{ messages }}", control_tokens=("<|im_start|>",))
    _same_as_llama_cpp_s_reader(path)


def test_the_real_gguf_s_container_reads_as_llama_cpp_s_reader(real_gguf):
    ours = _same_as_llama_cpp_s_reader(real_gguf)
    assert len(ours.fields["tokenizer.ggml.tokens"]) == 151936 and "tokenizer.chat_template" in ours.fields


def test_golden_model_on_a_gguf_is_hf_transformers(tmp_path):
    """HF transformers reads the same Q8_0 GGUF (head_dim 64, GQA 7:1, untied): the golden model in float32 must be
    it to float32 rounding, over the full vocabulary."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from vla_edge_ros.model.reference import ReferenceModel

    path = save_gguf(tmp_path / "m.gguf", _weights(tmp_path, HD64), "Q8_0", "Q8_0")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="m.gguf", dtype=torch.float32)
    ids = np.random.default_rng(0).integers(0, HD64.vocab_size, 48)
    with torch.no_grad():
        ref = hf(torch.from_numpy(ids[None])).logits[0].numpy()
    m = ReferenceModel(load_model(path, keep_f32=True), 64)
    ours = np.concatenate([m.text_logits(ids[:20], 0), m.text_logits(ids[20:], 20)])
    assert np.abs(ours - ref).max() < 1e-4 * max(1.0, np.abs(ref).max())
    assert (ours.argmax(-1) == ref.argmax(-1)).all()


def _header(path, version=None, n_tensors=None, n_kv=None):
    with open(path, "r+b") as f:
        head = bytearray(f.read(24))
        v, t, k = struct.unpack("<IQQ", head[4:])
        head[4:] = struct.pack("<IQQ", v if version is None else version, t if n_tensors is None else n_tensors,
                               k if n_kv is None else n_kv)
        f.seek(0)
        f.write(head)


def _truncate(path, fraction):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(int(size * fraction))


def _nan(w):
    w.layers[0]["wo"] = np.full(w.layers[0]["wo"].shape, np.nan, np.float32)


def _wrong_shape(w):
    w.layers[1]["wk"] = np.zeros((w.cfg.kv_dim + 32, w.cfg.hidden_size), np.float32)


def _missing(w):
    del w.layers[1]["wv"]


BROKEN = {
    "truncated_data": (lambda p: _truncate(p, 0.6), "past the end of the file"),
    "truncated_header": (lambda p: _truncate(p, 0.0005), "not a readable GGUF file|more than the"),
    "tensor_count_beyond_file": (lambda p: _header(p, n_tensors=1 << 40), "declares 1099511627776 tensors"),
    "kv_count_beyond_file": (lambda p: _header(p, n_kv=1 << 33), "metadata keys, more than the"),
    "unknown_version": (lambda p: _header(p, version=7), "GGUF version 7"),
    "not_gguf": (lambda p: open(p, "wb").write(b"PK\x03\x04" + bytes(100)), "not a GGUF file"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_gguf_is_one_line(tiny_gguf, case):
    path, _ = tiny_gguf
    damage, message = BROKEN[case]
    damage(path)
    with pytest.raises(ModelLoadError, match=message) as e:
        load_model(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


@pytest.mark.parametrize("case, change, message", [
    ("llama", lambda w: None, "architecture 'llama' is not qwen2"),
    ("gemma3", lambda w: None, "architecture 'gemma3' is not qwen2"),
    ("ternary", lambda w: None, "block type TQ1_0 is not supported"),
    ("nan", _nan, "contains NaN or Inf"),
    ("wrong_shape", _wrong_shape,
     r"attn_k.weight'\]: shape \[288, 512\] does not match the metadata, expected \[256, 512\]"),
    ("missing", _missing, r"tensor 'blk.1.attn_v.weight'\]: tensor missing"),
])
def test_a_foreign_or_inconsistent_gguf_is_one_line(tmp_path, case, change, message):
    w = _weights(tmp_path, PRESETS["tiny"])
    change(w)
    kind = "TQ1_0" if case == "ternary" else "F16"
    path = save_gguf(tmp_path / f"{case}.gguf", w, kind, "F16", arch=case if case in ("llama", "gemma3") else "qwen2")
    with pytest.raises(ModelLoadError, match=message) as e:
        load_model(path)
    assert "\n" not in str(e.value)


def test_a_vocabulary_smaller_than_the_action_range_is_refused(tmp_path):
    cfg = dataclasses.replace(PRESETS["micro"], vocab_size=4096)
    w = _weights(tmp_path, cfg)
    w = dataclasses.replace(w, embed=w.embed[:200], cfg=dataclasses.replace(cfg, vocab_size=200))
    path = save_gguf(tmp_path / "small_vocab.gguf", w, "F16", "F16")
    with pytest.raises(ModelLoadError, match="vocab_size must exceed 256 action tokens"):
        load_config(path)


def test_tools_report_a_bad_gguf_in_one_line_exit_3(tiny_gguf, tmp_path):
    path, _ = tiny_gguf
    _truncate(path, 0.6)
    r = subprocess.run([sys.executable, "-m", "vla_edge_ros.tools.generate", "--model", path, "--prompt-ids", "1,2"],
                       capture_output=True, text=True, cwd=ROOT, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 3 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "truncated" in r.stderr
    not_a_model = tmp_path / "notes.txt"
    not_a_model.write_text("hello")
    assert "not a GGUF file" in check_model_path(not_a_model)


def test_generate_on_a_gguf_without_a_real_tokenizer_matches_the_reference(tiny_gguf):
    """vla-edge-generate's ids are the golden model's greedy ids (the tool drives the same backend)."""
    from vla_edge_ros.model.reference import ReferenceModel
    from vla_edge_ros.textgen import generate

    path, w = tiny_gguf
    r = subprocess.run([sys.executable, "-m", "vla_edge_ros.tools.generate", "--model", path, "--prompt-ids",
                        "5,6,7", "--tokens", "6", "--backend", "numpy", "--no-stop", "--json"], capture_output=True,
                       text=True, cwd=ROOT, timeout=120, env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stderr
    import json

    got = json.loads(r.stdout)["ids"]
    m = ReferenceModel(load_model(path), 16)
    assert got == generate(m, [5, 6, 7], 6).ids
    logits = m.text_logits([5, 6, 7], 0)  # step by step == all at once
    assert int(logits[-1].argmax()) == got[0]


@pytest.mark.ros
@pytest.mark.parametrize("case", ["truncated", "llama"])
def test_the_node_refuses_a_broken_gguf_in_one_line_exit_3(domain, tmp_path, case):
    from ros_helpers import ros_env

    w = _weights(tmp_path, PRESETS["micro"])
    path = save_gguf(tmp_path / "m.gguf", w, "F16", "F16", arch="llama" if case == "llama" else "qwen2")
    if case == "truncated":
        _truncate(path, 0.6)
    r = subprocess.run([sys.executable, "-m", "vla_edge_ros.nodes.bringup", "--ros-args", "-p",
                        f"model_path:={path}", "-p", "kv_capacity_tokens:=512"], env=ros_env(domain),
                       capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert r.returncode == 3, (r.returncode, r.stderr[-2000:])
    msgs = [ln for ln in r.stderr.splitlines() if ln.startswith("vla_edge:")]
    assert len(msgs) == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "m.gguf" in msgs[0] and ("truncated" if case == "truncated" else "'llama' is not qwen2") in msgs[0]


# --- metadata bounded before it is read (issue 43, item 4) ---------------------------------------------------------

def _insert_kv(path, key: str, vtype: int, payload: bytes) -> None:
    """One more metadata entry right after the header, its key padded so that the entry is a multiple of 32 bytes
    long: the tensor data stays aligned, so the file is valid apart from what the entry itself claims."""
    head = 8 + 4
    while (head + len(key) + len(payload)) % 32:
        key += "_"
    with open(path, "rb") as f:
        data = f.read()
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
    entry = struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", vtype) + payload
    with open(path, "wb") as f:
        f.write(data[:4] + struct.pack("<IQQ", version, n_tensors, n_kv + 1) + entry + data[24:])


def _array(item: int, n: int, data: bytes = b"") -> bytes:
    return struct.pack("<IQ", item, n) + data


UINT8, INT32, STRING, ARRAY = 0, 5, 8, 9
BIG = bytes(1 << 24)
NESTED = _array(ARRAY, 1, _array(UINT8, 0))
HOSTILE_METADATA = {
    "int32 array of 2^61 entries": (lambda p: _insert_kv(p, "x.claim", ARRAY, _array(INT32, 1 << 61)),
                                    "claims 2305843009213693952 entries, more than the cap of 1048576"),
    "valid uint8 array of 2^24 entries": (lambda p: _insert_kv(p, "x.big", ARRAY, _array(UINT8, 1 << 24, BIG)),
                                          "claims 16777216 entries, more than the cap"),
    "string of 2^40 bytes": (lambda p: _insert_kv(p, "x.s", STRING, struct.pack("<Q", 1 << 40)),
                             "claims 1099511627776 bytes, more than the 1048576-byte cap"),
    "string array of lying lengths": (lambda p: _insert_kv(p, "x.sa", ARRAY, _array(STRING, 1 << 19)),
                                      r"x.sa_*' claims \d+ bytes, more than the 1048576-byte cap"),
    "arrays of 3 x 2^20 entries": (lambda p: [_insert_kv(p, f"x.a{i}", ARRAY, _array(UINT8, 1 << 20, bytes(1 << 20)))
                                              for i in range(3)], "more than 2097152 entries in all"),
    "arrays nested 3 deep": (lambda p: _insert_kv(p, "x.n", ARRAY, _array(ARRAY, 1, NESTED)),
                             "nests arrays more than 2 deep"),
    "unknown value type": (lambda p: _insert_kv(p, "x.t", 99, b""), "unknown value type 99"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_METADATA))
def test_hostile_metadata_is_one_line_at_once_and_allocates_nothing(tiny_gguf, case):
    import time
    import tracemalloc

    path, _ = tiny_gguf
    damage, message = HOSTILE_METADATA[case]
    damage(path)
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(ModelLoadError, match=message) as e:
            load_config(path)
        took = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "\n" not in str(e.value) and str(path) in str(e.value)
    assert took < 1.0 and peak < 8 << 20, (took, peak)


def test_a_tensor_with_too_many_dimensions_is_one_line(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "dims.gguf"), "qwen2")
    w.add_tensor("t", np.zeros([1] * 5, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match="tensor 0 has 5 dimensions"):
        load_config(str(tmp_path / "dims.gguf"))


def test_an_entry_that_fits_the_bounds_still_loads(tiny_gguf):
    path, _ = tiny_gguf
    before = load_config(path)
    _insert_kv(path, "x.ok", ARRAY, _array(UINT8, 1000, bytes(1000)))
    assert load_config(path) == before and load_model(path).cfg == before


# --- the tokenizer checked against the model (issue 43, item 5) ---------------------------------------------------

def _byte_tokens():
    from vla_edge_ros.model.gguf import _bytes_to_unicode

    return [c for _, c in sorted(_bytes_to_unicode().items())]


def _vocab(n):
    return (_byte_tokens() + [f"<|vla_{i}|>" for i in range(n)])[:n]


ROWS = PRESETS["tiny"].vocab_size
BAD_TOKENIZERS = {
    "151,936 tokens on a smaller embedding": (
        {"tokens": _vocab(151936), "token_type": [1] * 151936},
        f"the tokenizer has 151936 tokens but the model's embedding only {ROWS} rows"),
    "10 tokens": ({"tokens": _vocab(10), "token_type": [1] * 10}, r"\(10 tokens\) lacks 246 of the 256 byte tokens"),
    "a merge of an unknown token": ({"merges": ["Ġ zebra"]}, r"merges\[0\] 'Ġ zebra' names 'zebra', which the"),
    "a merge making an unknown token": ({"merges": ["a b"]}, r"merges\[0\] 'a b' names 'ab', which the vocabulary"),
    "a merge without a space": ({"merges": ["ab"]}, r"merges\[0\] 'ab' is not two tokens joined by a space"),
    "non-string merges": ({"merges": [7, 8]}, r"merges\[0\] is 7, not a merge string"),
    "non-string tokens": ({"tokens": list(range(ROWS))}, r"tokens\[0\] is 0, not a token string"),
    "no token types": ({"token_type": None}, f"holds no types for {ROWS} tokens"),
    "short token types": ({"token_type": [1] * 10}, f"holds 10 types for {ROWS} tokens"),
    "unknown token types": ({"token_type": [1] * (ROWS - 1) + [99]}, rf"token_type\[{ROWS - 1}\] is 99"),
}


@pytest.mark.parametrize("case", sorted(BAD_TOKENIZERS))
def test_a_tokenizer_that_does_not_fit_the_model_is_one_line(tmp_path, case):
    from vla_edge_ros.model.tokenizer import load_tokenizer

    meta, message = BAD_TOKENIZERS[case]
    path = save_gguf(tmp_path / "tok.gguf", _weights(tmp_path, PRESETS["tiny"]), "F16", "F16", tokenizer_meta=meta)
    with pytest.raises(ModelLoadError, match=message) as e:
        load_tokenizer(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_the_runtime_refuses_a_tokenizer_that_does_not_fit_at_start_up(tmp_path):
    from vla_edge_ros.frame_buffer import FrameBuffer
    from vla_edge_ros.runtime import Runtime, StartupError
    from vla_edge_ros.settings import ReasoningSettings

    meta, message = BAD_TOKENIZERS["151,936 tokens on a smaller embedding"]
    path = save_gguf(tmp_path / "tok.gguf", _weights(tmp_path, PRESETS["tiny"]), "F16", "F16", tokenizer_meta=meta)
    s = ReasoningSettings.from_values({"backend": "numpy", "kv_capacity_tokens": 512, "warmup_chunks": 1})
    with pytest.raises(StartupError, match=message) as e:
        Runtime.build(path, s, FrameBuffer())
    assert "\n" not in str(e.value)


def test_a_model_directory_whose_tokenizer_has_more_tokens_than_rows_is_one_line(tmp_path):
    import json

    from tokenizers import Tokenizer, models

    from vla_edge_ros.model.tokenizer import load_tokenizer

    make_model(str(tmp_path / "m"), "tiny", seed=1)
    vocab = {f"t{i}": i for i in range(ROWS + 10)}
    Tokenizer(models.WordLevel(vocab, unk_token="t0")).save(str(tmp_path / "m" / "tokenizer.json"))
    assert json.load(open(tmp_path / "m" / "config.json"))["vocab_size"] == ROWS
    with pytest.raises(ModelLoadError, match=f"has {ROWS + 10} tokens but the model's embedding only {ROWS} rows"):
        load_tokenizer(str(tmp_path / "m"))


def test_the_real_vocabulary_passes_the_checks(real_gguf):
    from vla_edge_ros.model.tokenizer import build_gguf_tokenizer

    tok = build_gguf_tokenizer(real_gguf)  # from the file's metadata, whatever the converted-weights cache holds
    assert tok.tok.get_vocab_size() == 151936 and tok.encode("<|im_end|>") == [151645]
