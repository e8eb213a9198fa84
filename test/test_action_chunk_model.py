# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Action chunks (DESIGN.md §17, issue 37 item 1): a parallel model plans K actions in one pass.

K is the checkpoint's (config.json `vla_action_chunk`; a GGUF's vision sidecar metadata): K x 8 action queries enter
with the frame's 32 vision tokens, K x 8 transient KV slots, K x 8 action tokens, actions [K, 8]. Refused at load with
one line: K outside 1..8, not an integer, K > 1 with autoregressive decoding, action queries of another K. The golden
model's K = 8 pass is checked against HF transformers given the same bidirectional mask as a 4-D attention mask.
"""
import json
import os
from types import SimpleNamespace

import numpy as np
import pytest

from vla_edge_ros import edge
from vla_edge_ros.constants import ACTION_VOCAB, VISION_TOKENS
from vla_edge_ros.contract import NON_FINITE_TOKEN, BackendResult, NonFiniteOutput, PhaseTimings
from vla_edge_ros.engine import Engine, check_finite, system_prompt_ids
from vla_edge_ros.eviction import make_policy
from vla_edge_ros.kv_cache import KvCache, capacity_problem, min_capacity
from vla_edge_ros.model.checkpoint import load_config, load_model
from vla_edge_ros.model.config import PRESETS, ModelConfig
from vla_edge_ros.model.generate import make_model
from vla_edge_ros.model.reference import ReferenceModel
from vla_edge_ros.model.safetensors_io import ModelLoadError, load_file, save_file
from vla_edge_ros.model.weights import load_weights
from vla_edge_ros.tools import make_model as mm
from vla_edge_ros.vram_plan import layout, out_layout, prefill_attention_splits, prefill_rows, wave_splits


def _k8(tmp_path, name="k8", preset="micro", **kw):
    return make_model(str(tmp_path / name), preset, seed=1, action_decoding="parallel", action_chunk=8, **kw)


def _edit_config(d, edit):
    p = os.path.join(d, "config.json")
    raw = json.load(open(p))
    edit(raw)
    json.dump(raw, open(p, "w"))


def _rewrite_vision(d, edit, metadata=None):
    p = os.path.join(d, "vision.safetensors")
    t = {k: (dt, np.array(a)) for k, (dt, a) in load_file(p).items()}
    edit(t)
    save_file(t, p, metadata)


def _one_line_error(d, *parts):
    with pytest.raises(ModelLoadError) as e:
        load_weights(d)
    msg = str(e.value)
    assert "\n" not in msg
    for part in parts:
        assert part in msg, msg
    return msg


# -- the checkpoint property -----------------------------------------------------------------------------


def test_k_is_read_from_config_json_and_written_back(tmp_path):
    d = _k8(tmp_path)
    raw = json.load(open(os.path.join(d, "config.json")))
    assert raw["vla_action_chunk"] == 8 and raw["vla_action_decoding"] == "parallel"
    cfg = ModelConfig.from_dir(d)
    assert cfg.action_chunk == 8 and cfg.action_tokens == 64 and cfg.parallel
    one = make_model(str(tmp_path / "k1"), "micro", seed=1, action_decoding="parallel")
    assert "vla_action_chunk" not in json.load(open(os.path.join(one, "config.json")))  # K = 1: today's file
    assert ModelConfig.from_dir(one).action_chunk == 1 and ModelConfig.from_dir(one).action_tokens == 8


@pytest.mark.parametrize("bad", [0, 9, -1, "eight", "8", 1.5, 8.0, True, None, [8]])
def test_a_bad_k_is_refused_in_one_line_naming_the_key_and_range(tmp_path, bad):
    d = _k8(tmp_path)
    _edit_config(d, lambda r: r.update(vla_action_chunk=bad))
    _one_line_error(d, "config.json", "'vla_action_chunk'", "1..8")


def test_k_above_one_with_autoregressive_decoding_is_refused(tmp_path):
    d = _k8(tmp_path)
    _edit_config(d, lambda r: r.pop("vla_action_decoding"))
    _one_line_error(d, "config.json", "vla_action_chunk 8", "needs vla_action_decoding 'parallel'")
    _edit_config(d, lambda r: r.update(vla_action_decoding="autoregressive", vla_action_chunk=1))
    assert load_weights(d).cfg.action_chunk == 1  # K = 1 autoregressive: today's model


def test_action_queries_of_another_k_are_refused(tmp_path):
    d = _k8(tmp_path)
    _rewrite_vision(d, lambda t: t.update(action_queries=("BF16", np.zeros((8, 256), np.uint16))))
    _one_line_error(d, "vision.safetensors", "'action_queries'", "shape [8, 256]", "[64, 256]", "vla_action_chunk=8")
    one = make_model(str(tmp_path / "k1"), "micro", seed=1, action_decoding="parallel")
    _rewrite_vision(one, lambda t: t.update(action_queries=("BF16", np.zeros((64, 256), np.uint16))))
    _one_line_error(one, "shape [64, 256]", "[8, 256]", "vla_action_chunk=1")


def test_stand_in_queries_extend_below_the_start_token_deterministically(tmp_path, caplog):
    d = _k8(tmp_path)
    stored = load_file(os.path.join(d, "vision.safetensors"))["action_queries"][1]
    assert stored.shape == (64, 256)
    _rewrite_vision(d, lambda t: t.pop("action_queries"))
    caplog.clear()
    w = load_weights(d)
    start = w.cfg.vocab_size - ACTION_VOCAB - 1
    np.testing.assert_array_equal(w.vision.action_queries, w.embed[start - 64:start])
    assert not w.vision.queries_trained
    warns = [r for r in caplog.records if "untrained" in r.getMessage()]
    assert len(warns) == 1 and f"{start - 64}..{start - 1}" in warns[0].getMessage()
    # K = 1's stand-in is the last 8 of those rows (vocab-265 .. vocab-258, as before)
    one = make_model(str(tmp_path / "k1"), "micro", seed=1, action_decoding="parallel")
    _rewrite_vision(one, lambda t: t.pop("action_queries"))
    np.testing.assert_array_equal(load_weights(one).vision.action_queries, w.vision.action_queries[-8:])


def test_make_model_queries_extend_the_one_action_models(tmp_path):
    """Same seed: a K-action model's first 8 query rows are the one-action model's (row-major draws)."""
    k8 = load_file(os.path.join(_k8(tmp_path), "vision.safetensors"))["action_queries"][1]
    one = make_model(str(tmp_path / "k1"), "micro", seed=1, action_decoding="parallel")
    np.testing.assert_array_equal(k8[:8], load_file(os.path.join(one, "vision.safetensors"))["action_queries"][1])


# -- GGUF: the keys come from the vision sidecar's metadata ---------------------------------------------


def _gguf_with_sidecar(tmp_path, metadata, rows=64):
    pytest.importorskip("gguf")
    from vla_edge_ros.model.gguf import save_gguf, vision_path

    d = make_model(str(tmp_path / "hf"), "micro", seed=2)
    path = save_gguf(tmp_path / "m.gguf", load_weights(d), "F16", "F16")
    t = dict(load_file(os.path.join(d, "vision.safetensors")))
    q = 0.02 * np.random.default_rng(0).standard_normal((rows, 256)).astype(np.float32)
    t["action_queries"] = ("F32", q)
    save_file(t, vision_path(path), metadata)
    return path, q


def test_a_gguf_takes_k_and_the_decoding_from_its_sidecar_metadata(tmp_path):
    path, q = _gguf_with_sidecar(tmp_path, {"vla_action_decoding": "parallel", "vla_action_chunk": "8"})
    cfg = load_config(path)
    assert cfg.parallel and cfg.action_chunk == 8
    w = load_model(path)
    assert w.cfg == cfg and w.vision.queries_trained and w.vision.action_queries.shape == (64, 256)
    from vla_edge_ros.model.safetensors_io import bf16_to_f32, f32_to_bf16
    np.testing.assert_array_equal(bf16_to_f32(w.vision.action_queries), bf16_to_f32(f32_to_bf16(q)))


def test_a_gguf_sidecar_without_the_keys_stays_autoregressive(tmp_path):
    path, _ = _gguf_with_sidecar(tmp_path, {"note": "no VLA keys"})
    assert load_config(path).action_decoding == "autoregressive" and load_model(path).vision.action_queries is None


@pytest.mark.parametrize("meta,parts", [
    ({"vla_action_decoding": "parallel", "vla_action_chunk": "eight"}, ("'vla_action_chunk'", "1..8")),
    ({"vla_action_decoding": "parallel", "vla_action_chunk": "9"}, ("'vla_action_chunk'", "1..8")),
    ({"vla_action_decoding": "parallel", "vla_action_chunk": "1.5"}, ("'vla_action_chunk'", "1..8")),
    ({"vla_action_chunk": "8"}, ("vla_action_chunk 8", "needs vla_action_decoding 'parallel'")),
    ({"vla_action_decoding": "bidirectional"}, ("'vla_action_decoding'", "autoregressive, parallel")),
])
def test_a_bad_gguf_sidecar_key_is_one_line(tmp_path, meta, parts):
    path, _ = _gguf_with_sidecar(tmp_path, meta)
    for load in (load_config, load_model):
        with pytest.raises(ModelLoadError) as e:
            load(path)
        msg = str(e.value)
        assert "\n" not in msg and "vision.safetensors" in msg and all(p in msg for p in parts), msg


def test_a_gguf_sidecar_with_queries_of_another_k_is_refused(tmp_path):
    path, _ = _gguf_with_sidecar(tmp_path, {"vla_action_decoding": "parallel", "vla_action_chunk": "8"}, rows=8)
    with pytest.raises(ModelLoadError, match=r"shape \[8, 256\].*\[64, 256\]"):
        load_model(path)


# -- the KV cache's 64 transient slots -----------------------------------------------------------------


def test_kv_cache_with_64_transient_slots():
    kv = KvCache(4096, 64, make_policy("fifo"), action_tokens=64)
    assert kv.frame_capacity == (4096 - 64 - 64) // 32 == 124 == edge.frame_capacity(4096, 64, 64)
    np.testing.assert_array_equal(kv.action_slots, np.arange(64, 128))
    for fid in range(kv.frame_capacity + 5):  # full, then evicting
        plan = kv.plan_frame(fid)
        kv.set_embedding(fid, np.ones(4, np.float32))
        kv.check_invariants()
    assert len(plan.order) == plan.n_prefix + 32 + 64 <= 4096 and len(plan.action_slots) == 64
    np.testing.assert_array_equal(plan.action_slots, plan.order[-64:])
    assert kv.stats()["used_tokens"] == 64 + 64 + 124 * 32
    assert min_capacity(64, action_tokens=64) == 160
    with pytest.raises(ValueError, match="action 64"):
        KvCache(159, 64, make_policy("fifo"), action_tokens=64)
    msg = capacity_problem(159, 64, action_tokens=64)
    assert "64 action tokens need 160" in msg and capacity_problem(160, 64, action_tokens=64) is None


# -- vla-edge-make-model --action-chunk -------------------------------------------------------------------


def test_make_model_cli_writes_k_and_refuses_k_without_parallel(tmp_path, capsys):
    out = tmp_path / "m"
    args = ["--preset", "micro", "--action-decoding", "parallel", "--action-chunk", "8", "--out", str(out)]
    assert mm.main(args) == 0
    assert "8 actions a chunk" in capsys.readouterr().out
    assert json.load(open(out / "config.json"))["vla_action_chunk"] == 8
    assert load_file(str(out / "vision.safetensors"))["action_queries"][1].shape == (64, 256)
    for args, part in ((["--action-chunk", "8"], "needs --action-decoding parallel"),
                       (["--action-decoding", "parallel", "--action-chunk", "9"], "between 1 and 8"),
                       (["--action-decoding", "parallel", "--action-chunk", "0"], "between 1 and 8")):
        with pytest.raises(SystemExit) as e:
            mm.main(["--preset", "micro", "--out", str(tmp_path / "x"), *args])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert part in err[-1] and err[-1].startswith("vla-edge-make-model: error:")
        assert not (tmp_path / "x").exists()


# -- the engine and the golden model ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_k8(tmp_path_factory):
    return make_model(str(tmp_path_factory.mktemp("k8") / "tiny"), "tiny", seed=4, action_decoding="parallel",
                      action_chunk=8)


def test_engine_returns_k_actions_in_range(tiny_k8):
    eng = Engine(tiny_k8, backend="numpy", kv_capacity_tokens=512, action_low=-2.0, action_high=3.0)
    try:
        assert eng.action_chunk == 8 and eng.phase_tokens == (VISION_TOKENS + 64, 0)
        assert eng.stats()["action_chunk"] == 8 and eng.cache.frame_capacity == (512 - len(eng.prompt_ids) - 64) // 32
        rng = np.random.default_rng(0)
        for _ in range(3):
            r = eng.run_chunk(rng.integers(0, 256, (64, 128, 3), dtype=np.uint8))
            V = eng.cfg.vocab_size
            assert r.tokens.shape == (64,) and ((r.tokens >= V - ACTION_VOCAB) & (r.tokens < V)).all()
            assert r.actions.shape == (8, 8) and r.actions.dtype == np.float32 and np.isfinite(r.actions).all()
            assert ((r.actions >= -2.0) & (r.actions <= 3.0)).all()
            np.testing.assert_array_equal(r.action, r.actions[0])
            for k in range(8):  # row k: tokens 8k..8k+7 through the one-action decoder
                np.testing.assert_array_equal(r.actions[k], eng.decoder.decode(r.tokens[8 * k:8 * k + 8]))
            assert r.timings.prefill_tokens == 96 and r.timings.decode_tokens == 0
            assert r.cache_tokens == len(eng.prompt_ids) + 32 * len(r.retained) + 64
        assert len(set(map(tuple, r.actions))) > 1  # the 8 rows are not one action repeated
    finally:
        eng.close()


def test_a_one_action_engine_keeps_its_shapes(tmp_path):
    d = make_model(str(tmp_path / "p"), "micro", seed=1, action_decoding="parallel")
    eng = Engine(d, backend="numpy", kv_capacity_tokens=512)
    try:
        r = eng.run_chunk(np.zeros((64, 128, 3), np.uint8))
        assert eng.action_chunk == 1 and eng.phase_tokens == (40, 0) and eng.stats()["action_chunk"] == 1
        assert r.tokens.shape == (8,) and r.actions.shape == (1, 8)
        np.testing.assert_array_equal(r.action, r.actions[0])
    finally:
        eng.close()


def test_a_non_finite_row_anywhere_in_the_k_actions_is_caught():
    timings = PhaseTimings(1.0, 1.0, 0.0, 2.0, 96, 0)
    for bad in (0, 37, 63):
        tokens = np.full(64, 2000, np.int32)
        tokens[bad] = NON_FINITE_TOKEN
        with pytest.raises(NonFiniteOutput, match=f"action token {bad}:"):
            check_finite(BackendResult(tokens=tokens, pooled=np.zeros(4, np.float32), timings=timings))
    check_finite(BackendResult(tokens=np.full(64, 2000, np.int32), pooled=np.zeros(4, np.float32), timings=timings))


def test_the_engine_refuses_a_chunk_with_a_non_finite_last_row(tiny_k8):
    eng = Engine(tiny_k8, backend="numpy", kv_capacity_tokens=512)
    real = eng.backend.run_chunk

    def last_row_overflows(*a, **kw):
        r = real(*a, **kw)
        r.tokens[-1] = NON_FINITE_TOKEN
        return r

    try:
        eng.backend.run_chunk = last_row_overflows
        with pytest.raises(NonFiniteOutput, match="action token 63"):
            eng.run_chunk(np.zeros((64, 128, 3), np.uint8))
        assert eng.cache.retained() == []  # the half-written frame is forgotten
    finally:
        eng.close()


def test_golden_k8_pass_is_hf_transformers_with_the_same_4d_mask(tiny_k8):
    """The reference's K = 8 chunk (prompt prefill, then 32 vision rows causal + 64 action queries that see every row
    of the pass) against HF Qwen2 in float32 on the whole sequence with that mask given as a 4-D attention mask: the
    64 rows' action logits agree (cosine >= 0.999 and max |delta| <= 2e-5, as test_reference_vs_hf). The action slots
    sit in shuffled cache slots, so a slot used for a position shows up."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    w = load_weights(tiny_k8)
    cfg = w.cfg
    prompt = system_prompt_ids(tiny_k8, cfg.vocab_size)
    P = len(prompt)
    n = P + VISION_TOKENS + 64
    cap = n + 24
    order = np.random.default_rng(5).permutation(cap)[:n].astype(np.int32)
    plan = SimpleNamespace(order=order, n_prefix=P, frame_slots=order[P:P + 32], action_slots=order[-64:])
    frame = np.random.default_rng(1).integers(0, 256, (64, 128, 3), dtype=np.uint8)
    ref = ReferenceModel(w, cap)
    ref.load_prompt(prompt, order[:P])
    r = ref.run_chunk(frame, plan, cfg.vocab_size - 257, collect_logits=True)
    assert r.logits.shape == (64, ACTION_VOCAB) and r.tokens.shape == (64,)

    seq = np.concatenate([ref.embed[prompt], ref.vision(frame), ref.queries]).astype(np.float32)
    allowed = np.tril(np.ones((n, n), bool))
    allowed[P + VISION_TOKENS:, :] = True  # the action queries: every row of the pass, each other included
    mask = np.where(allowed, 0.0, np.finfo(np.float32).min).astype(np.float32)[None, None]
    hf = transformers.AutoModelForCausalLM.from_pretrained(tiny_k8, dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    with torch.no_grad():
        out = hf(inputs_embeds=torch.from_numpy(seq)[None], attention_mask=torch.from_numpy(mask),
                 position_ids=torch.arange(n)[None], use_cache=False)
    theirs = out.logits[0, -64:, -ACTION_VOCAB:].float().numpy()
    a, b = r.logits.astype(np.float64).ravel(), theirs.astype(np.float64).ravel()
    cosine = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    delta = float(np.abs(r.logits - theirs).max())
    print(f"\nK = 8 golden vs HF 4-D mask: cosine {cosine:.7f}, max |delta| {delta:.3g}")
    assert cosine >= 0.999 and delta <= 2e-5, (cosine, delta)
    # and the mask matters: HF with a plain causal mask disagrees (the queries would not see the later ones)
    with torch.no_grad():
        causal = hf(inputs_embeds=torch.from_numpy(seq)[None], position_ids=torch.arange(n)[None], use_cache=False)
    assert float(np.abs(r.logits - causal.logits[0, -64:, -ACTION_VOCAB:].float().numpy()).max()) > 1e-3


# -- the VRAM plan, the bytes, the plan tool ----------------------------------------------------------------


def test_vram_layout_for_k8_and_k1_unchanged():
    big = PRESETS["qwen2.5-1.5b"]
    import dataclasses

    one = dataclasses.replace(big, action_decoding="parallel")
    k8 = dataclasses.replace(one, action_chunk=8)
    l1, l8 = layout(one, 4096), layout(k8, 4096)
    assert (l1.rows, l1.tokens) == (48, 40) and (l8.rows, l8.tokens) == (96, 96)
    fields = ("hidden_size", "intermediate_size", "head_dim", "num_attention_heads", "num_key_value_heads",
              "num_hidden_layers", "tie_word_embeddings")
    legacy = SimpleNamespace(**{f: getattr(one, f) for f in fields}, parallel=True, weight_format="bf16")
    assert layout(legacy, 4096) == l1  # a config without action_chunk: the one-action plan of before
    assert l1.buffers["logits"] == ((8, 256), "float32") and l1.buffers["ticket"] == ((1,), "int32")
    assert l8.buffers["logits"] == ((64, 256), "float32") and l8.buffers["ticket"] == ((64,), "int32")
    assert l8.buffers["x_pre"] == ((96, 1536), "float32")
    assert l8.parts["weights"] - l1.parts["weights"] == 4 * 56 * 1536  # 56 more fp32 query rows
    assert l8.parts["total"] > l1.parts["total"]
    assert out_layout(1536)[0]["ts"] == out_layout(1536, 8)[0]["ts"] == 64 and out_layout(1536, 64)[0]["ts"] == 256
    assert [prefill_rows(t) for t in (32, 40, 48, 56, 96)] == [32, 48, 96, 96, 96]
    with pytest.raises(ValueError, match="96"):
        prefill_rows(104)


def test_prefill_attention_splits_fill_whole_waves():
    import dataclasses

    for preset in ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "tiny"):
        for K in (1, 8):
            cfg = dataclasses.replace(PRESETS[preset], action_decoding="parallel", action_chunk=K)
            group = cfg.num_attention_heads // cfg.num_key_value_heads
            for sms in (8, 16, 132):
                assert layout(cfg, 4096, sms).prefill_splits == prefill_attention_splits(
                    sms, cfg.num_key_value_heads, 32 + 8 * K, group, cfg.head_dim)
    # 1.5B (2 KV heads, group 6, head dim 128: one 8-warp block an SM) on 8 SMs: one action, 240 rows = 2 blocks of
    # 128 a KV head: 2 splits fill the 8 SMs once. 8 actions, 576 rows = 5 blocks a KV head, 10 a split: 1 split is
    # 2 waves of every key (2 units), 3 splits 4 waves of a third (1.33), the best (4, 8, ...) 1.25
    assert prefill_attention_splits(8, 2, 40, 6, 128) == wave_splits(8, 4) == 2
    assert prefill_attention_splits(8, 2, 96, 6, 128) == wave_splits(8, 10) == 3
    # the 0.5B (group 7, head dim 64: two blocks an SM) on 8 SMs: 280 rows = 3 blocks a KV head
    assert prefill_attention_splits(8, 2, 40, 7, 64) == wave_splits(16, 6) == 5
    assert wave_splits(264, 18) == 14  # 252 blocks, one wave (15 splits: 270 blocks)
    assert wave_splits(16, 16) == 1 and wave_splits(10, 1) == 10


def test_layout_holds_every_prompt_block():
    """A prompt / text block of T <= PROMPT_ROWS rows (CudaBackend._prefill_layers) writes T rows of the prefill
    buffers and, with its own attention splits, nkv x ceil(T x group / 64) x splits partials of 64 rows (the combine
    grid of cuda.launch.attention): the layout allocates both for every T, every chunk kind and SM count, so a block
    never writes past a buffer."""
    import dataclasses

    from vla_edge_ros.vram_plan import PROMPT_ROWS

    assert PROMPT_ROWS == 96  # the largest prefill GEMM instance (GEMM_ROWS)
    for preset in ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "tiny"):
        base = PRESETS[preset]
        for cfg in (base, dataclasses.replace(base, action_decoding="parallel", action_chunk=8)):
            nkv, D = cfg.num_key_value_heads, cfg.head_dim
            group = cfg.num_attention_heads // nkv
            for sms in (8, 16, 132):
                lay = layout(cfg, 4096, sms)
                assert lay.buffer_rows >= max(lay.rows, PROMPT_ROWS)
                for name in ("x_pre", "xb", "qkv", "gu", "att", "att_bf"):
                    assert lay.buffers[name][0][0] == lay.buffer_rows, name
                for T in (lay.tokens, *range(1, PROMPT_ROWS + 1)):
                    nrg = -(-T * group // 64)
                    need = nkv * nrg * prefill_attention_splits(sms, nkv, T, group, D) * 64
                    assert lay.buffers["part_o"][0][0] >= need * D, (preset, sms, T)
                    assert lay.buffers["part_ml"][0][0] >= need * 2, (preset, sms, T)


def test_chunk_bytes_count_k_actions():
    import dataclasses

    one = dataclasses.replace(PRESETS["qwen2.5-1.5b"], action_decoding="parallel")
    k8 = dataclasses.replace(one, action_chunk=8)
    b1, b8 = edge.chunk_bytes(one, 4096, prompt_tokens=64), edge.chunk_bytes(k8, 4096, prompt_tokens=64)
    assert (b1["prefill_rows"], b1["action_chunk"]) == (40, 1) and (b8["prefill_rows"], b8["action_chunk"]) == (96, 8)
    per_key, H = b8["kv_bytes_per_key"], 1536
    # one frame block fewer retained (64 transient slots), 56 more query rows read and written, 56 more inputs
    assert b8["prefill"] - b1["prefill"] == per_key * (-32 + 2 * 56) + 2 * 56 * H
    assert edge.chunk_kind(b8) == "bf16-parallel-k8" and edge.chunk_kind(b1) == "bf16-parallel"
    ar = edge.chunk_bytes(k8, 4096, decoding="autoregressive", prompt_tokens=64)
    assert ar["action_chunk"] == 1 and ar["decode_passes"] == 8  # the what-if counts one action


def test_plan_tool_on_a_k8_model(tiny_k8, capsys):
    from vla_edge_ros.tools import plan

    assert plan.main(["--model", tiny_k8, "--capacity", "512", "--board", "orin-nano"]) == 0
    out = capsys.readouterr().out
    assert "8 actions a chunk" in out and "96 rows" in out and "64 action queries" in out
    prompt = len(system_prompt_ids(tiny_k8, 2048))
    assert f"{(512 - prompt - 64) // 32} frames when full" in out
