# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""4-bit weights (W4A16): packing against the formats' own libraries, quantized models through the loader and
the NumPy reference, and every refusal as one line naming the file and the tensor. Fresh random tensors each run."""
import importlib.util
import json
import os
import shutil
from types import SimpleNamespace

import numpy as np
import pytest

from vla_edge_ros.constants import ACTION_VOCAB
from vla_edge_ros.model import quant as Q
from vla_edge_ros.model.reference import ReferenceModel
from vla_edge_ros.model.safetensors_io import ModelLoadError, bf16_to_f32, f32_to_bf16, load_file, save_file
from vla_edge_ros.model.weights import LAYER_TENSORS, LINEARS, Weights, load_weights
from vla_edge_ros.model.generate import make_model

SEED = int(np.random.SeedSequence().entropy % 2**32)  # fresh each run, printed on failure


@pytest.fixture
def rng():
    print(f"seed {SEED}")
    return np.random.default_rng(SEED)


def _words_by_hand(q, order):
    """Pack uint8 [R, C] into uint32 words one Python int at a time: nibble k of word j <- column 8j + order[k]."""
    r, c = q.shape
    out = np.zeros((r, c // 8), np.uint32)
    for i in range(r):
        for j in range(c // 8):
            word = 0
            for k in range(8):
                word |= int(q[i, 8 * j + order[k]]) << (4 * k)
            out[i, j] = word
    return out


# -- 1. packing ---------------------------------------------------------------------------------------
def test_nibble_packing_round_trips_and_matches_hand_packing(rng):
    q = rng.integers(0, 16, (5, 64), dtype=np.uint8)
    words = Q.pack_nibbles(q)
    assert words.dtype == np.uint32 and words.shape == (5, 8)
    np.testing.assert_array_equal(words, _words_by_hand(q, range(8)))
    np.testing.assert_array_equal(Q.unpack_nibbles(words), q)
    np.testing.assert_array_equal(Q.unpack_nibbles(words.view(np.int32)), q)  # files store int32


def test_awq_order_matches_hand_packed_vectors(rng):
    """AutoAWQ's WQLinear_GEMM.from_linear: nibble i of word col holds column col*8 + [0,2,4,6,1,3,5,7][i]."""
    q = rng.integers(0, 16, (3, 32), dtype=np.uint8)
    hand = _words_by_hand(q, [0, 2, 4, 6, 1, 3, 5, 7]).view(np.int32)
    np.testing.assert_array_equal(Q.awq_pack(q), hand)
    np.testing.assert_array_equal(Q.awq_unpack(hand), q)
    # A known word: columns 0..7 holding 0..7 pack to nibbles 0,2,4,6,1,3,5,7 (low to high).
    assert Q.awq_pack(np.arange(8, dtype=np.uint8)[None])[0, 0] == 0x75316420


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("scale_dtype", ["float16", "bfloat16"])
def test_quantizer_and_dequantize_are_exact(rng, symmetric, scale_dtype):
    w = rng.standard_normal((16, 384)).astype(np.float32) * rng.uniform(0.001, 0.2)
    w[3, 128:256] = 0.0  # an all-zero group
    t = Q.quantize_rtn(w, symmetric, scale_dtype)
    assert t.qweight.dtype == np.uint32 and t.qweight.shape == (16, 48)
    assert t.scales.shape == t.zeros.shape == (16, 3) and t.shape == (16, 384)
    # scales are exactly representable in the file's type
    back = bf16_to_f32(f32_to_bf16(t.scales)) if scale_dtype == "bfloat16" else \
        t.scales.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(back, t.scales)
    q = t.q().astype(np.int64).reshape(16, 3, 128)
    expect = ((q - t.zeros[:, :, None]) * t.scales[:, :, None].astype(np.float64)).reshape(16, 384)
    np.testing.assert_array_equal(t.dequantize(), expect.astype(np.float32))  # float32 result is exact
    assert np.array_equal(t.dequantize()[3, 128:256], np.zeros(128))
    # round to nearest: every element within half a step of its weight, plus what rounding the scale to 16 bits
    # moves the ends of the 15-step range. Rounding to nearest changes a value by at most u = 2^-p relative (p the
    # significand bits: 8 for bf16, 11 for fp16), i.e. 15 * u / (1 - u) steps of the rounded scale at the ends;
    # a wrong rounding is off by >= 1 step
    u = 2.0**-8 if scale_dtype == "bfloat16" else 2.0**-11
    step = np.repeat(t.scales, 128, axis=1)
    assert (np.abs(t.dequantize() - w) <= step * (0.5 + 15 * u / (1 - u)) + 1e-12).all()
    if symmetric:
        assert (t.zeros == 8).all()
    assert t.nbytes == 16 * 48 * 4 + 16 * 3 * 2 + 24


def _ct():
    pytest.importorskip("compressed_tensors")
    import torch
    from compressed_tensors.compressors import PackedQuantizationCompressor
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    return torch, PackedQuantizationCompressor, unpack_from_int32, QuantizationArgs, QuantizationScheme


@pytest.mark.parametrize("symmetric", [False, True])
def test_compressed_tensors_library_agrees(rng, symmetric):
    """compressed-tensors' own compress() writes our bytes, and its decompress() reads ours to our values."""
    torch, PQC, unpack, QArgs, QScheme = _ct()
    out = 44 if not symmetric else 40  # 44: the zero points' dim-0 packing needs padding
    w = rng.standard_normal((out, 256)).astype(np.float32) * 0.03
    t = Q.quantize_rtn(w, symmetric, "bfloat16")
    mine = Q.to_compressed(t, symmetric)
    scheme = QScheme(targets=["Linear"], weights=QArgs(num_bits=4, type="int", symmetric=symmetric,
                                                       strategy="group", group_size=128))
    bf = torch.from_numpy(f32_to_bf16(t.scales).view(np.int16)).view(torch.bfloat16)
    sd = {"weight": torch.from_numpy(t.dequantize()), "weight_scale": bf}
    if not symmetric:
        sd["weight_zero_point"] = torch.from_numpy(t.zeros.astype(np.int8) - 8)
    theirs = PQC.compress(sd, scheme)
    np.testing.assert_array_equal(theirs["weight_packed"].numpy(), mine["weight_packed"])
    assert list(theirs["weight_shape"]) == list(mine["weight_shape"])
    if symmetric:
        assert "weight_zero_point" not in theirs and "weight_zero_point" not in mine
    else:
        np.testing.assert_array_equal(theirs["weight_zero_point"].numpy(), mine["weight_zero_point"])
    # and back: their decompression of our tensors, in float32 (exact) and in the file's bf16
    for scale, cmp in ((torch.from_numpy(t.scales), t.dequantize()), (bf, f32_to_bf16(t.dequantize()))):
        sd = {"weight_packed": torch.from_numpy(mine["weight_packed"]), "weight_scale": scale,
              "weight_shape": torch.from_numpy(mine["weight_shape"])}
        if not symmetric:
            sd["weight_zero_point"] = torch.from_numpy(mine["weight_zero_point"])
        got = PQC.decompress(sd, scheme)["weight"]
        got = got.float().numpy() if got.dtype == torch.float32 else got.view(torch.int16).numpy().view(np.uint16)
        np.testing.assert_array_equal(got, cmp)
    back = Q.from_compressed(mine["weight_packed"], f32_to_bf16(t.scales), mine.get("weight_zero_point"),
                             (out, 256), "bfloat16")
    np.testing.assert_array_equal(back.dequantize(), t.dequantize())


def _awq_packing_utils():
    """AutoAWQ's awq/utils/packing_utils.py (torch only), loaded by path: the package __init__ needs CUDA-era deps."""
    spec = importlib.util.find_spec("awq")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("autoawq not installed (the hand-packed AWQ test above still runs)")
    path = os.path.join(list(spec.submodule_search_locations)[0], "utils", "packing_utils.py")
    mod_spec = importlib.util.spec_from_file_location("awq_packing_utils", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


def test_awq_round_trip_and_library_dequantize(rng):
    w = rng.standard_normal((64, 256)).astype(np.float32) * 0.02
    t = Q.quantize_rtn(w, False, "float16", "awq")
    d = Q.to_awq(t)
    assert d["qweight"].shape == (256, 8) and d["qzeros"].shape == (2, 8) and d["scales"].shape == (2, 64)
    assert d["qweight"].dtype == np.int32 and d["scales"].dtype == np.float16
    back = Q.from_awq(d["qweight"], d["qzeros"], d["scales"])
    np.testing.assert_array_equal(back.dequantize(), t.dequantize())
    # independent decode straight from the documented layout: [in, out/8] words, nibble k -> column AWQ_ORDER[k]
    words = d["qweight"].view(np.uint32)
    q_in_out = np.zeros((256, 64), np.int64)
    for k, col in enumerate([0, 2, 4, 6, 1, 3, 5, 7]):
        q_in_out[:, col::8] = (words >> (4 * k)) & 0xF
    np.testing.assert_array_equal(q_in_out.T, t.q())
    pu = _awq_packing_utils()
    import torch
    got = pu.dequantize_gemm(torch.from_numpy(d["qweight"]), torch.from_numpy(d["qzeros"]),
                             torch.from_numpy(d["scales"]), 4, 128)  # [in, out] in fp16
    np.testing.assert_array_equal(got.numpy().T, t.dequantize().astype(np.float16))


# -- 2. quantized models through the loader and the reference ----------------------------------------
@pytest.fixture(scope="module")
def models(tmp_path_factory):
    seed = SEED % 1000
    base = tmp_path_factory.mktemp("q")
    return {"seed": seed,
            "bf16": make_model(str(base / "bf16"), "tiny", seed=seed),
            "awq": make_model(str(base / "awq"), "tiny", seed=seed, quant="awq", shards=2),
            "ct": make_model(str(base / "ct"), "tiny", seed=seed, quant="compressed-tensors"),
            "ct-sym": make_model(str(base / "cts"), "tiny", seed=seed, quant="compressed-tensors", symmetric=True)}


def _decode_file_linear(d, fmt, prefix):
    """float32 [out, in] of one stored 4-bit linear, decoded here from the file bytes (not through quant.py)."""
    files = [os.path.join(d, f) for f in os.listdir(d) if f.startswith("model") and f.endswith(".safetensors")]
    t = {}
    for fn in files:
        for name, (dtype, arr) in load_file(fn).items():
            if name.startswith(prefix + "."):
                t[name[len(prefix) + 1:]] = (dtype, np.array(arr))

    def scales(key):
        dtype, a = t[key]
        return bf16_to_f32(a) if dtype == "BF16" else a.astype(np.float32)

    shifts = np.arange(8, dtype=np.uint32) * 4
    if fmt == "awq":
        nib = (t["qweight"][1].view(np.uint32)[:, :, None] >> shifts) & 0xF  # [in, out/8, 8]
        znib = (t["qzeros"][1].view(np.uint32)[:, :, None] >> shifts) & 0xF
        inv = np.argsort([0, 2, 4, 6, 1, 3, 5, 7])
        q = nib[:, :, inv].reshape(nib.shape[0], -1).T.astype(np.float64)  # [out, in]
        z = znib[:, :, inv].reshape(znib.shape[0], -1).T.astype(np.float64)  # [out, in/128]
        s = scales("scales").T
    else:
        q = ((t["weight_packed"][1].view(np.uint32)[:, :, None] >> shifts) & 0xF).reshape(
            t["weight_packed"][1].shape[0], -1).astype(np.float64)
        s = scales("weight_scale")
        if "weight_zero_point" in t:
            zw = t["weight_zero_point"][1].view(np.uint32)  # [ceil(out/8), in/128], packed along dim 0
            z = ((zw[:, :, None] >> shifts) & 0xF).transpose(0, 2, 1).reshape(-1, zw.shape[1])[:q.shape[0]]
        else:
            z = np.full(s.shape, 8.0)
    return ((q - np.repeat(z, 128, axis=1)) * np.repeat(s, 128, axis=1)).astype(np.float32)


@pytest.mark.parametrize("kind", ["awq", "ct", "ct-sym"])
def test_quantized_model_loads_as_written(models, kind):
    fmt = "awq" if kind == "awq" else "compressed-tensors"
    w = load_weights(models[kind])
    bf = load_weights(models["bf16"])
    assert w.cfg.quant.method == fmt and w.cfg.quant.symmetric == (kind == "ct-sym")
    for i, layer in enumerate(w.layers):
        for short, suffix in LAYER_TENSORS.items():
            if short in LINEARS:
                qt = layer[short]
                assert isinstance(qt, Q.QuantTensor) and qt.fmt == fmt
                assert qt.scale_dtype == ("float16" if kind == "awq" else "bfloat16")
                # the writer's intent: round-to-nearest of the same-seed bf16 model
                want = Q.quantize_rtn(bf16_to_f32(bf.layers[i][short]), kind == "ct-sym", qt.scale_dtype)
                np.testing.assert_array_equal(qt.dequantize(), want.dequantize())
                file_values = _decode_file_linear(models[kind], fmt, f"model.layers.{i}.{suffix[:-7]}")
                np.testing.assert_array_equal(qt.dequantize(), file_values)
            else:
                np.testing.assert_array_equal(layer[short], bf.layers[i][short])  # stays bf16, unchanged
    np.testing.assert_array_equal(w.embed, bf.embed)
    linear_bytes = sum(layer[s].nbytes for layer in w.layers for s in LINEARS)
    dense_bytes = sum(bf.layers[0][s].nbytes for s in LINEARS) * len(bf.layers)
    assert linear_bytes == pytest.approx(dense_bytes * (0.5 + 2.5 / 128) / 2, rel=1e-9)  # 4.16 bits a weight
    assert w.nbytes() == bf.nbytes() - dense_bytes + linear_bytes


@pytest.mark.parametrize("kind", ["awq", "ct"])
def test_reference_on_quantized_equals_reference_on_dequantized(models, kind, rng):
    """The NumPy reference's chunk on a 4-bit model equals the same forward on dense float32 weights decoded
    from the files independently; after evictions-like non-identity slot order."""
    fmt = "awq" if kind == "awq" else "compressed-tensors"
    wq = load_weights(models[kind])
    dense_layers = []
    for i, layer in enumerate(wq.layers):
        dense_layers.append({s: (_decode_file_linear(models[kind], fmt, f"model.layers.{i}.{LAYER_TENSORS[s][:-7]}")
                                 if s in LINEARS else v) for s, v in layer.items()})
    wd = Weights(cfg=wq.cfg, embed=wq.embed, norm=wq.norm, layers=dense_layers, vision=wq.vision,
                 lm_head=wq.lm_head, path=wq.path, files=wq.files)
    cap = 160
    order = rng.permutation(cap)[:120]  # non-identity slot order: positions are not slots
    frame = rng.integers(0, 256, (64, 128, 3), dtype=np.uint8)
    plan = SimpleNamespace(order=order, n_prefix=80)
    prompt = rng.integers(0, 100, 80)
    results = []
    for w in (wq, wd):
        m = ReferenceModel(w, cap)
        m.load_prompt(prompt, order[:80])
        results.append(m.run_chunk(frame, plan, wq.cfg.vocab_size - ACTION_VOCAB - 1, collect_logits=True))
    a, b = results
    assert np.max(np.abs(a.logits - b.logits)) <= 1e-6  # same float32 weights, same code: equal
    np.testing.assert_array_equal(a.tokens, b.tokens)


# -- 3. refusals: one line naming the file and the tensor ----------------------------------------------
def _copy(src, tmp_path):
    dst = str(tmp_path / "m")
    shutil.copytree(src, dst)
    return dst


def _expect(d, *fragments):
    with pytest.raises(ModelLoadError) as e:
        load_weights(d)
    msg = str(e.value)
    assert "\n" not in msg, msg
    for f in fragments:
        assert f in msg, f"{f!r} not in {msg!r}"
    return msg


def _edit_config(d, edit):
    p = os.path.join(d, "config.json")
    raw = json.load(open(p))
    edit(raw)
    json.dump(raw, open(p, "w"))


def _groups_weights(raw):
    return raw["quantization_config"]["config_groups"]["group_0"]["weights"]


@pytest.mark.parametrize("kind,edit,fragments", [
    ("awq", lambda r: r["quantization_config"].update(bits=8), ["bits=8"]),
    ("awq", lambda r: r["quantization_config"].update(group_size=64), ["group_size=64"]),
    ("awq", lambda r: r["quantization_config"].update(version="gemv"), ["version='gemv'"]),
    ("awq", lambda r: r["quantization_config"].update(zero_point=False), ["zero_point=False"]),
    ("awq", lambda r: r["quantization_config"].update(quant_method="gptq"), ["quant_method='gptq'"]),
    ("ct", lambda r: r["quantization_config"].update(format="float-quantized"), ["format='float-quantized'"]),
    ("ct", lambda r: r["quantization_config"].update(format="mixed-precision") or
     r["quantization_config"]["config_groups"]["group_0"].update(format="naive-quantized"),
     ["group_0.format='naive-quantized'"]),
    ("ct", lambda r: _groups_weights(r).update(num_bits=8), ["weights.num_bits=8"]),
    ("ct", lambda r: _groups_weights(r).update(group_size=32), ["weights.group_size=32"]),
    ("ct", lambda r: _groups_weights(r).update(strategy="channel"), ["weights.strategy='channel'"]),
    ("ct", lambda r: _groups_weights(r).update(actorder="group"), ["actorder='group'"]),
    ("ct", lambda r: r["quantization_config"]["config_groups"]["group_0"].update(
        input_activations={"num_bits": 8, "type": "int"}), ["input_activations", "activation quantization"]),
])
def test_unsupported_quant_configs_refused(models, tmp_path, kind, edit, fragments):
    d = _copy(models[kind], tmp_path)
    _edit_config(d, edit)
    msg = _expect(d, "config.json", "quantization_config", *fragments)
    assert "supported: 4-bit weights in groups of 128" in msg


def _rewrite(d, edit):
    for fn in os.listdir(d):
        if fn.startswith("model") and fn.endswith(".safetensors"):
            path = os.path.join(d, fn)
            t = {k: (dt, np.array(a)) for k, (dt, a) in load_file(path).items()}
            if edit(t) is not False:
                save_file(t, path)


def _on(name, change):
    """An edit that applies `change(tensors)` to the file holding `name` only."""
    def edit(t):
        if name not in t:
            return False
        change(t)
    return edit


P = "model.layers.1.mlp.down_proj"


def _nan_scale(t, key, dtype):
    a = t[key][1].copy()
    a.reshape(-1)[5] = np.float16("nan") if dtype == "F16" else 0x7FC0
    t[key] = (t[key][0], a)


@pytest.mark.parametrize("kind,tensor,change,fragments", [
    ("awq", f"{P}.qzeros", lambda t: t.pop(f"{P}.qzeros"), ["missing", "zero points"]),
    ("awq", f"{P}.qweight", lambda t: t.update({f"{P}.qweight": ("I32", t[f"{P}.qweight"][1][:, :-1].copy())}),
     ["shape", "expected"]),
    ("awq", f"{P}.qweight", lambda t: t.update({f"{P}.qweight": ("U8", t[f"{P}.qweight"][1].view(np.uint8))}),
     ["dtype U8"]),
    ("awq", f"{P}.scales", lambda t: _nan_scale(t, f"{P}.scales", "F16"), ["NaN"]),
    ("awq", f"{P}.scales", lambda t: t.update({f"{P}.scales": ("F32", t[f"{P}.scales"][1].astype(np.float32))}),
     ["dtype F32", "F16 or BF16"]),
    ("ct", f"{P}.weight_scale", lambda t: _nan_scale(t, f"{P}.weight_scale", "BF16"), ["NaN"]),
    ("ct", f"{P}.weight_zero_point", lambda t: t.pop(f"{P}.weight_zero_point"), ["missing", "asymmetric"]),
    ("ct", f"{P}.weight_zero_point", lambda t: t.update({f"{P}.weight_zero_point": (
        "I8", (t[f"{P}.weight_zero_point"][1].view(np.uint32) & 0xF).astype(np.int8))}), ["dtype I8"]),
    ("ct", f"{P}.weight_shape", lambda t: t.update({f"{P}.weight_shape": ("I64", np.array([512, 1000]))}),
     ["weight_shape [512, 1000]"]),
    ("ct", f"{P}.weight_packed", lambda t: t.update({f"{P}.weight_packed": ("I32", t[f"{P}.weight_packed"][1][:-8])}),
     ["shape [504, 128]"]),
    ("ct-sym", f"{P}.weight_zero_point", lambda t: t.update({f"{P}.weight_zero_point": (
        "I32", np.zeros((64, 8), np.int32))}), ["symmetric: true"]),
    ("ct", f"{P}.weight_packed", lambda t: [t.pop(k) for k in list(t) if k.startswith(P + ".weight_")] and
     t.update({f"{P}.weight": ("BF16", np.zeros((512, 1024), np.uint16))}), ["stored unquantized", "4-bit"]),
    ("ct", "lm_head", lambda t: t.update({"lm_head.weight_packed": ("I32", np.zeros((2048, 64), np.int32))}),
     ["stored 4-bit", "ignore"]),
])
def test_bad_quantized_tensors_refused(models, tmp_path, kind, tensor, change, fragments):
    d = _copy(models[kind], tmp_path)
    _rewrite(d, _on(f"{P}.qweight" if kind == "awq" else f"{P}.weight_packed", change))
    msg = _expect(d, ".safetensors", f"'{tensor}'", *fragments)
    assert msg.startswith(d), msg  # the file is named first


# -- 4. parallel action decoding: the model option and its action queries --------------------------------
def test_mixed_precision_with_only_pack_quantized_groups_loads(models, tmp_path):
    d = _copy(models["ct"], tmp_path)
    _edit_config(d, lambda r: r["quantization_config"].update(format="mixed-precision"))
    assert load_weights(d).cfg.quant.method == "compressed-tensors"


def test_written_quantization_configs_parse_in_compressed_tensors(models):
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.quantization import QuantizationConfig
    for kind, sym in (("ct", False), ("ct-sym", True)):
        raw = json.load(open(os.path.join(models[kind], "config.json")))["quantization_config"]
        qc = QuantizationConfig.model_validate(raw)
        w = qc.config_groups["group_0"].weights
        assert (w.num_bits, w.group_size, w.symmetric, w.strategy) == (4, 128, sym, "group")
        assert qc.format == "pack-quantized" and qc.ignore == ["lm_head"]


def test_parallel_model_loads_its_action_queries(tmp_path):
    d = make_model(str(tmp_path / "p"), "micro", seed=SEED % 1000, action_decoding="parallel",
                   quant="compressed-tensors")
    w = load_weights(d)
    assert w.cfg.action_decoding == "parallel" and w.cfg.parallel and w.cfg.quant is not None
    stored = load_file(os.path.join(d, "vision.safetensors"))["action_queries"]
    assert stored[0] == "BF16" and stored[1].shape == (8, w.cfg.hidden_size)
    np.testing.assert_array_equal(w.vision.action_queries, stored[1])
    assert w.vision.queries_trained
    assert json.load(open(os.path.join(d, "config.json")))["vla_action_decoding"] == "parallel"


def test_parallel_fallback_queries_are_the_ids_below_the_start_token(tmp_path, caplog):
    d = make_model(str(tmp_path / "p"), "micro", seed=1, action_decoding="parallel")
    _rewrite_vision(d, lambda t: t.pop("action_queries"))
    w = load_weights(d)
    V = w.cfg.vocab_size
    start = V - ACTION_VOCAB - 1
    np.testing.assert_array_equal(w.vision.action_queries, w.embed[start - 8:start])
    assert not w.vision.queries_trained
    assert "untrained" in caplog.text and f"{start - 8}..{start - 1}" in caplog.text
    os.remove(os.path.join(d, "vision.safetensors"))  # no vision file at all: same fallback
    np.testing.assert_array_equal(load_weights(d).vision.action_queries, w.embed[start - 8:start])


def _rewrite_vision(d, edit):
    p = os.path.join(d, "vision.safetensors")
    t = {k: (dt, np.array(a)) for k, (dt, a) in load_file(p).items()}
    edit(t)
    save_file(t, p)


def test_autoregressive_model_ignores_action_queries(tmp_path):
    d = make_model(str(tmp_path / "p"), "micro", seed=1, action_decoding="parallel")
    _edit_config(d, lambda r: r.pop("vla_action_decoding"))
    w = load_weights(d)
    assert w.cfg.action_decoding == "autoregressive" and w.vision.action_queries is None


def test_parallel_config_errors(tmp_path):
    d = make_model(str(tmp_path / "p"), "micro", seed=1, action_decoding="parallel")
    _rewrite_vision(d, lambda t: t.update(action_queries=("BF16", np.zeros((7, 256), np.uint16))))
    _expect(d, "vision.safetensors", "'action_queries'", "shape [7, 256]", "[8, 256]")
    for bad in ("bidirectional", 1, None):
        _edit_config(d, lambda r: r.update(vla_action_decoding=bad))
        _expect(d, "config.json", "vla_action_decoding", "autoregressive, parallel")


def test_hf_transformers_loads_symmetric_compressed_tensors_output(models):
    """HF transformers (with compressed-tensors) decompresses our symmetric pack-quantized dir itself; its float32
    logits equal the NumPy reference on our 4-bit weights. (HF 5.24 + compressed-tensors 0.20.1 size the asymmetric
    zero points unpacked when they build the model, so an asymmetric dir is checked against compressed-tensors'
    own decompression above instead: llm-compressor issue #1618.)"""
    pytest.importorskip("compressed_tensors")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    m = transformers.AutoModelForCausalLM.from_pretrained(models["ct-sym"], dtype=torch.float32).eval()
    ids = np.random.default_rng(SEED).integers(0, 1500, 40)
    with torch.no_grad():
        theirs = m(torch.from_numpy(ids)[None]).logits[0].numpy()
    ref = ReferenceModel(load_weights(models["ct-sym"]), 64)
    h, _ = ref.forward(ref.embed[ids], np.arange(40), 0)
    mine = ref.logits(h)
    err = np.max(np.abs(mine - theirs))
    assert err <= 2e-5, err  # correct code: ~2e-6 (float32 summation order); these logits vs the bf16 model: ~0.5


def test_every_preset_can_be_4_bit():
    """make_model --quant works for every preset: each decoder linear's input is a multiple of 128 and its output
    of 8 (the 1.5B shape: 1536, 256, 8960)."""
    from vla_edge_ros.model.config import PRESETS
    from vla_edge_ros.model.weights import layer_shapes
    for name, cfg in PRESETS.items():
        for short in LINEARS:
            out, n_in = layer_shapes(cfg)[short]
            assert n_in % 128 == 0 and out % 8 == 0, (name, short, out, n_in)
