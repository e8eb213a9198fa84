# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Model directories: good ones load (single file and sharded), bad ones raise one clear error
naming the file and the tensor."""
import json
import os
import shutil
import struct

import numpy as np
import pytest

from vla_edge_ros.model.config import PRESETS, ModelConfig
from vla_edge_ros.model.safetensors_io import ModelLoadError, bf16_to_f32, f32_to_bf16, load_file, save_file
from vla_edge_ros.model.weights import load_weights
from vla_edge_ros.tools.make_model import main as make_model_main
from vla_edge_ros.model.generate import make_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_model(str(tmp_path_factory.mktemp("m") / "tiny"), "tiny", seed=3)


def copy_model(src, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(src, dst)
    return str(dst)


def test_bf16_round_trip_and_rounding():
    x = np.random.default_rng(0).standard_normal(10000).astype(np.float32) * 10
    y = bf16_to_f32(f32_to_bf16(x))
    assert np.all(np.abs(y - x) <= np.abs(x) * 2.0**-8 + 1e-30)  # within half a bf16 ulp
    assert f32_to_bf16(np.array([1.0], np.float32))[0] == 0x3F80
    assert np.isnan(bf16_to_f32(f32_to_bf16(np.array([np.nan], np.float32))))[0]


def test_loads_tiny_with_expected_shapes(tiny):
    w = load_weights(tiny)
    cfg = w.cfg
    assert w.embed.shape == (cfg.vocab_size, cfg.hidden_size) and w.embed.dtype == np.uint16
    assert len(w.layers) == cfg.num_hidden_layers
    assert w.layers[0]["wk"].shape == (cfg.kv_dim, cfg.hidden_size)
    assert w.vision.trained and w.vision.patch_w.shape == (cfg.hidden_size, 768)


def test_sharded_equals_single(tmp_path):
    a = load_weights(make_model(str(tmp_path / "one"), "tiny", seed=5))
    b = load_weights(make_model(str(tmp_path / "three"), "tiny", seed=5, shards=3))
    assert os.path.exists(tmp_path / "three" / "model.safetensors.index.json")
    assert len(b.files) == 3
    np.testing.assert_array_equal(a.embed, b.embed)
    for la, lb in zip(a.layers, b.layers):
        for k in la:
            np.testing.assert_array_equal(la[k], lb[k])


def test_cli_writes_loadable_model(tmp_path):
    assert make_model_main(["--preset", "tiny", "--seed", "1", "--out", str(tmp_path / "m")]) == 0
    assert load_weights(str(tmp_path / "m")).cfg == PRESETS["tiny"]


def test_missing_vision_file_uses_seeded_untrained_projector(tiny, tmp_path):
    d = copy_model(tiny, tmp_path)
    os.remove(os.path.join(d, "vision.safetensors"))
    w1, w2 = load_weights(d), load_weights(d)
    assert not w1.vision.trained
    np.testing.assert_array_equal(w1.vision.patch_w, w2.vision.patch_w)  # seeded: reproducible


def expect_error(d, *fragments):
    with pytest.raises(ModelLoadError) as e:
        load_weights(d)
    msg = str(e.value)
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"
    return msg


def test_missing_directory(tmp_path):
    expect_error(str(tmp_path / "nope"), "model directory not found")


def test_missing_config(tiny, tmp_path):
    d = copy_model(tiny, tmp_path)
    os.remove(os.path.join(d, "config.json"))
    expect_error(d, "config.json", "not found")


def test_missing_weights_file(tiny, tmp_path):
    d = copy_model(tiny, tmp_path)
    os.remove(os.path.join(d, "model.safetensors"))
    expect_error(d, "model.safetensors", "not found")


def test_pickle_checkpoint_refused(tiny, tmp_path):
    d = copy_model(tiny, tmp_path)
    os.remove(os.path.join(d, "model.safetensors"))
    open(os.path.join(d, "pytorch_model.bin"), "wb").write(b"\x80\x04not really")
    expect_error(d, "pickle", "pytorch_model.bin")


def test_truncated_weights(tiny, tmp_path):
    d = copy_model(tiny, tmp_path)
    fn = os.path.join(d, "model.safetensors")
    size = os.path.getsize(fn)
    with open(fn, "r+b") as f:
        f.truncate(size - 1000)
    expect_error(d, "model.safetensors", "truncated", "tensor '")


def test_truncated_header(tiny, tmp_path):
    d = copy_model(tiny, tmp_path)
    with open(os.path.join(d, "model.safetensors"), "r+b") as f:
        f.truncate(100)
    expect_error(d, "model.safetensors", "truncated")


def rewrite(d, fn, edit):
    path = os.path.join(d, fn)
    tensors = load_file(path, mmap=False)
    edit(tensors)
    save_file(tensors, path)


def test_missing_tensor(tiny, tmp_path):
    d = copy_model(tiny, tmp_path)
    rewrite(d, "model.safetensors", lambda t: t.pop("model.layers.1.self_attn.k_proj.bias"))
    expect_error(d, "model.safetensors", "model.layers.1.self_attn.k_proj.bias", "missing")


def test_wrong_shape(tiny, tmp_path):
    d = copy_model(tiny, tmp_path)

    def edit(t):
        dtype, a = t["model.layers.0.mlp.up_proj.weight"]
        t["model.layers.0.mlp.up_proj.weight"] = (dtype, np.ascontiguousarray(a[:-1]))

    rewrite(d, "model.safetensors", edit)
    expect_error(d, "model.layers.0.mlp.up_proj.weight", "shape")


def test_config_that_does_not_match_tensors(tiny, tmp_path):
    d = copy_model(tiny, tmp_path)
    cfg = json.load(open(os.path.join(d, "config.json")))
    cfg["intermediate_size"] = 999
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    expect_error(d, "model.safetensors", "mlp.gate_proj.weight", "shape")


def test_nan_weights(tiny, tmp_path):
    d = copy_model(tiny, tmp_path)

    def edit(t):
        dtype, a = t["model.norm.weight"]
        a = a.copy()
        a[3] = 0x7FC0  # bf16 NaN
        t["model.norm.weight"] = (dtype, a)

    rewrite(d, "model.safetensors", edit)
    expect_error(d, "model.norm.weight", "NaN")


def test_integer_dtype_refused(tiny, tmp_path):
    d = copy_model(tiny, tmp_path)
    rewrite(d, "model.safetensors",
            lambda t: t.update({"model.norm.weight": ("I16", t["model.norm.weight"][1].view(np.int16))}))
    expect_error(d, "model.norm.weight", "I16")


def test_float32_weights_accepted(tiny, tmp_path):
    d = copy_model(tiny, tmp_path)
    rewrite(d, "model.safetensors",
            lambda t: t.update({"model.norm.weight": ("F32", bf16_to_f32(t["model.norm.weight"][1]))}))
    np.testing.assert_array_equal(load_weights(d).norm, load_weights(tiny).norm)


def test_garbage_header(tiny, tmp_path):
    d = copy_model(tiny, tmp_path)
    with open(os.path.join(d, "model.safetensors"), "r+b") as f:
        f.seek(8)
        f.write(b"{not json")
    expect_error(d, "model.safetensors", "JSON")


def test_corrupt_shard_index(tmp_path):
    d = make_model(str(tmp_path / "s"), "tiny", seed=1, shards=2)
    open(os.path.join(d, "model.safetensors.index.json"), "w").write("{")
    expect_error(d, "index")


def test_bad_config_values(tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    raw = PRESETS["tiny"].to_hf_dict()
    raw["num_key_value_heads"] = 3
    json.dump(raw, open(d / "config.json", "w"))
    with pytest.raises(ModelLoadError, match="multiple of num_key_value_heads"):
        ModelConfig.from_dir(str(d))
    raw = PRESETS["tiny"].to_hf_dict()
    del raw["hidden_size"]
    json.dump(raw, open(d / "config.json", "w"))
    with pytest.raises(ModelLoadError, match="hidden_size"):
        ModelConfig.from_dir(str(d))


def test_header_declaring_more_than_the_file(tmp_path):
    fn = tmp_path / "x.safetensors"
    header = json.dumps({"w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}}).encode()
    fn.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    with pytest.raises(ModelLoadError, match="truncated"):
        load_file(str(fn))


def test_unreadable_weights_file_is_one_line(tiny, monkeypatch):
    """PermissionError (EACCES) on a weights file: one ModelLoadError naming it. Tests run as root, which no
    file mode refuses, so the refusal is injected at the module's `open`."""
    import builtins

    from vla_edge_ros.model import safetensors_io

    def refusing_open(path, *args, **kwargs):
        if str(path).endswith(".safetensors"):
            raise PermissionError(13, "Permission denied", str(path))
        return builtins.open(path, *args, **kwargs)

    monkeypatch.setattr(safetensors_io, "open", refusing_open, raising=False)
    msg = expect_error(tiny, "model.safetensors", "cannot read", "PermissionError", "Permission denied")
    assert "\n" not in msg
