# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The whole CUDA chunk (one graph) against the NumPy golden model, and on the 1.5B shape against HF.

GPU only. Criterion per chunk: at every decode step the action logits agree (cosine >= 0.999) while the
tokens agree; a differing token is accepted only at a near-tie of the reference logits (then the rest
of an autoregressive chunk is conditioned on different tokens and is not compared; a parallel chunk's rows
condition on no token, so every row is compared). Parallel models planning 8 actions (K = 8: 64 action rows,
a 96-row prefill) are compared row by row the same way. Models with a robot-state input (the `-state` kinds: 7 joints'
positions and velocities, 14 values, one state token after the frame) run each chunk with its own random state.
"""
import os

import numpy as np
import pytest

from vla_edge_ros.constants import ACTION_TOKENS
from vla_edge_ros.model.config import PRESETS
from vla_edge_ros.model.reference import ReferenceModel
from vla_edge_ros.model.weights import load_weights
from vla_edge_ros.model.generate import make_model

pytestmark = pytest.mark.gpu
try:  # collected without CuPy too: conftest skips each gpu case with its reason, so CI counts them
    import cupy as cp
except ImportError:
    cp = None

# model kinds the engine runs: weights x action decoding (the kernels are chosen by the model dir)
KINDS = {"bf16": {}, "awq": {"quant": "awq"}, "ct-sym": {"quant": "compressed-tensors", "symmetric": True},
         "bf16-parallel": {"action_decoding": "parallel"},
         "awq-parallel": {"quant": "awq", "action_decoding": "parallel"},
         # 8 actions a chunk (vla_action_chunk 8): 64 action queries, 64 transient slots, the 96-row GEMMs
         "bf16-parallel-k8": {"action_decoding": "parallel", "action_chunk": 8},
         "awq-parallel-k8": {"quant": "awq", "action_decoding": "parallel", "action_chunk": 8}}
K8_KINDS = ["bf16-parallel-k8", "awq-parallel-k8"]
# a robot-state input (DESIGN.md §17): 7 joints x (position, velocity) = 14 values (ALOHA's size), one state token
STATE = {"state_joints": [f"joint_{i}" for i in range(7)], "state_fields": ["position", "velocity"]}
STATE_KINDS = {"bf16-state": dict(STATE), "awq-state": {"quant": "awq", **STATE},
               "bf16-parallel-state": {"action_decoding": "parallel", **STATE},
               "awq-parallel-state": {"quant": "awq", "action_decoding": "parallel", **STATE},
               "awq-parallel-k7-state": {"quant": "awq", "action_decoding": "parallel", "action_chunk": 7, **STATE}}
KINDS.update(STATE_KINDS)


def chunk_state(w, rng):
    """A normalized state for one chunk of `w` (its projector's input, as Engine.normalized_state makes it), None for a
    model without a state input; values across [-1, 1] with some clipped at the bounds."""
    if not w.cfg.state_dim:
        return None
    from vla_edge_ros.model import ops

    st = w.vision.state
    raw = rng.uniform(st.low - 0.2 * (st.high - st.low), st.high + 0.2 * (st.high - st.low)).astype(np.float32)
    return ops.normalize_state(raw, st.low, st.high)


def run_both(gpu, ref, frame, plan, start, st):
    """One chunk on each backend (collect_logits), the state passed when the model has one."""
    kw = {} if st is None else {"state": st}
    return (gpu.run_chunk(frame, plan, start, collect_logits=True, **kw),
            ref.run_chunk(frame, plan, start, collect_logits=True, **kw))


def cos(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# DESIGN 13: cosine AND the largest error. max |logit - reference| over max |reference logit| of a chunk's action
# logits, on the bf16 and 4-bit paths (bf16 activations into the GEMMs, bf16 K/V, fp32 accumulation); a rotation for
# the wrong positions or a wrong attention scale moves single logits far more than that
MAX_REL_DELTA = 2e-2
# the full-depth chunks (24 / 28 layers at 4096 slots) add up more rounding: measured 1.56e-2 at 0.5B (bf16-parallel,
# H200, 2026-12-01); the 1.5B was not re-measured against this bound
FULL_DEPTH_MAX_REL_DELTA = 3e-2
# Not widened for 4-bit weights (issue 41): the 4-bit GEMM that multiplied bf16-rounded scaled weights measured 1.5B
# awq-parallel 4.03e-2, with 8 actions 4.52e-2 (H200, 2026-12-03); with the exact weights 2.75e-2 / 2.87e-2, and the
# golden model itself with the old rounding 2.84e-2 from its exact self (dev/fidelity/w4_weight_rounding.py).
# What sits at the bound is the bf16 rounding of the prefill's activations, in both parallel kinds alike (a CPU twin of
# the engine's rounding points, dev/fidelity/act_rounding.py, 8 runs each: 1.5B awq-parallel 2.42-2.79e-2,
# bf16-parallel 2.62-3.01e-2); with a 4-bit model's GEMM inputs in fp16 (cuda/act_format.py) the twin gives
# 1.57-1.66e-2 for awq-parallel (2026-12-04; the H200 full-depth run of that tree is BENCHMARKS.md's to record).


def compare_chunk(gpu, ref, min_cos=0.999, max_rel_delta=MAX_REL_DELTA, conditioned=None):
    """Row by row (every action token of the chunk: 8, or 8 K); ``conditioned``: later rows depend on earlier
    tokens (autoregressive; default: a chunk of 8 rows), so a near-tie token difference ends the comparison."""
    worst = 1.0
    rows = len(ref.tokens)
    assert len(gpu.tokens) == rows and gpu.logits.shape == ref.logits.shape
    conditioned = rows == ACTION_TOKENS if conditioned is None else conditioned
    for s in range(rows):
        c = cos(gpu.logits[s], ref.logits[s])
        worst = min(worst, c)
        assert c >= min_cos, f"step {s}: logits cosine {c:.6f}"
        d = float(np.abs(np.asarray(gpu.logits[s], np.float64) - ref.logits[s]).max() / np.abs(ref.logits[s]).max())
        compare_chunk.max_delta = max(getattr(compare_chunk, "max_delta", 0.0), d)
        assert d <= max_rel_delta, f"step {s}: max |delta| {d:.3e} of the largest logit (cosine {c:.6f})"
        if gpu.tokens[s] != ref.tokens[s]:
            top = np.sort(ref.logits[s])[-2:]
            assert top[1] - top[0] <= 2e-2 * (np.abs(ref.logits[s]).max() + 1e-6), \
                f"step {s}: token {gpu.tokens[s]} != {ref.tokens[s]} without a near-tie"
            if conditioned:
                break
    np.testing.assert_allclose(gpu.pooled, ref.pooled, rtol=1e-4, atol=1e-5)
    return worst


def _plan(order, n_prefix, action_tokens=ACTION_TOKENS):
    from types import SimpleNamespace

    order = np.asarray(order, np.int32)
    return SimpleNamespace(order=order, n_prefix=n_prefix, frame_slots=order[n_prefix:n_prefix + 32],
                           action_slots=order[-action_tokens:], frame_id=0, evicted=[])


_TINY = {}


def tiny_weights(tmp_path_factory, kind):
    if kind not in _TINY:
        d = str(tmp_path_factory.mktemp("tiny-" + kind))
        make_model(d, "tiny", seed=3, **KINDS[kind])
        _TINY[kind] = load_weights(d)
    return _TINY[kind]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_weights(tmp_path_factory, "bf16")


@pytest.mark.parametrize("kind", list(KINDS))
def test_tiny_chunks_match_reference_through_evictions(tmp_path_factory, kind):
    from vla_edge_ros.cuda.backend import CudaBackend
    from vla_edge_ros.eviction import make_policy
    from vla_edge_ros.kv_cache import KvCache

    tiny = tiny_weights(tmp_path_factory, kind)
    cap, P = 512, 20
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, tiny.cfg.vocab_size, P)
    gpu = CudaBackend(tiny, cap)
    assert gpu.weight_format == ("w4" if "quant" in KINDS[kind] else "bf16")
    assert gpu.parallel == ("parallel" in kind)
    ref = ReferenceModel(tiny, cap)
    kv_g = KvCache(cap, P, make_policy("fifo"), action_tokens=tiny.cfg.action_tokens,
                   state_tokens=tiny.cfg.state_tokens)
    gpu.load_prompt(prompt, kv_g.prompt_slots)
    ref.load_prompt(prompt, kv_g.prompt_slots)
    evictions = 0
    for fid in range(18):  # frame capacity (512-20-8)//32 = 15 (K = 8: (512-20-64)//32 = 13): the last chunks evict
        plan = kv_g.plan_frame(fid)
        evictions += len(plan.evicted)
        frame = rng.integers(0, 256, (64, 128, 3), dtype=np.uint8)
        start = int(rng.integers(0, tiny.cfg.vocab_size))
        rg, rr = run_both(gpu, ref, frame, plan, start, chunk_state(tiny, rng))
        compare_chunk(rg, rr)
        assert rg.tokens.shape == (tiny.cfg.action_tokens,)
        kv_g.set_embedding(fid, rg.pooled)
        assert rg.timings.prefill_ms > 0 and rg.timings.vision_ms >= 0
        assert rg.timings.prefill_tokens == rr.timings.prefill_tokens
        assert (rg.timings.decode_ms == 0) if gpu.parallel else (rg.timings.decode_ms > 0)
    assert evictions >= 3
    assert gpu.peak_vram_bytes > 0 and gpu.peak_vram_bytes <= gpu.plan["total"]


@pytest.mark.parametrize("kind", ["bf16", "awq-parallel", "awq-parallel-k8"])
def test_tiny_semantic_policy_and_reordered_positions(tmp_path_factory, kind):
    """Semantic eviction removes frames from the middle: positions of later frames move."""
    from vla_edge_ros.cuda.backend import CudaBackend
    from vla_edge_ros.eviction import make_policy
    from vla_edge_ros.kv_cache import KvCache

    tiny = tiny_weights(tmp_path_factory, kind)
    cap, P = 300, 7
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, tiny.cfg.vocab_size, P)
    gpu, ref = CudaBackend(tiny, cap), ReferenceModel(tiny, cap)
    kv = KvCache(cap, P, make_policy("semantic"), action_tokens=tiny.cfg.action_tokens)
    gpu.load_prompt(prompt, kv.prompt_slots)
    ref.load_prompt(prompt, kv.prompt_slots)
    for fid in range(12):
        plan = kv.plan_frame(fid)
        frame = rng.integers(0, 256, (64, 128, 3), dtype=np.uint8)
        rg = gpu.run_chunk(frame, plan, 5, collect_logits=True)
        rr = ref.run_chunk(frame, plan, 5, collect_logits=True)
        compare_chunk(rg, rr)
        kv.set_embedding(fid, rr.pooled)


@pytest.mark.parametrize("kind", ["bf16", "awq-parallel", "awq-parallel-k7-state"])
def test_prompts_of_several_blocks_and_text_between_them_match_reference(tmp_path_factory, kind):
    """The prompt's prefill runs as a CUDA graph a block of up to PROMPT_ROWS (96) rows, queued without a host sync
    between blocks (issue 41 item 4): prompts of 200 (96 + 96 + 8) and 40 tokens, each followed by chunks compared
    with the reference, with text calls between them (one token through the one-token graph, a 40-token block). A
    block that fits the chunk's GEMM takes it (8 rows; 40 rows with the 4-bit parallel kind's 40-row instance), a
    larger one the 96-row GEMM. The text path's slot == position order must not outlive the next prompt, nor the
    chunk's order the next text call."""
    from vla_edge_ros.cuda.backend import CudaBackend
    from vla_edge_ros.eviction import make_policy
    from vla_edge_ros.kv_cache import KvCache

    tiny = tiny_weights(tmp_path_factory, kind)
    cap, V = 512, tiny.cfg.vocab_size
    rng = np.random.default_rng(7)
    gpu, ref = CudaBackend(tiny, cap), ReferenceModel(tiny, cap)
    for P in (200, 40, 200):
        prompt = rng.integers(0, V, P)
        kv = KvCache(cap, P, make_policy("semantic"), action_tokens=tiny.cfg.action_tokens,
                     state_tokens=tiny.cfg.state_tokens)
        gpu.load_prompt(prompt, kv.prompt_slots)
        ref.load_prompt(prompt, kv.prompt_slots)
        for fid in range(4):
            plan = kv.plan_frame(fid)
            frame = rng.integers(0, 256, (64, 128, 3), dtype=np.uint8)
            rg, rr = run_both(gpu, ref, frame, plan, int(rng.integers(0, V)), chunk_state(tiny, rng))
            compare_chunk(rg, rr)
            kv.set_embedding(fid, rr.pooled)
        text = rng.integers(0, V, 41)
        got = [gpu.text_logits(text[:40], 0, last_only=True), gpu.text_logits(text[40:], 40)]
        want = [ref.text_logits(text[:40], 0, last_only=True), ref.text_logits(text[40:], 40)]
        text_compare(np.concatenate(got), np.concatenate(want))
    assert sorted(gpu._block_graphs) == [8, 40, 96]  # a graph per block size, captured once
    assert (gpu.gemm_prompt is gpu.gemm) == (gpu.lay.rows == 96)


# ------------------------------------------------------------------ the published Qwen2.5 shapes (issue 27)
# Every kernel shape of the 0.5B (hidden 896, head_dim 64, 14/2 heads, FFN 4864) and the 3B (2048, 128, 16/2, 11008)
# with the full 151936-row vocabulary, at 2 layers (the kernels do not see the depth; the full-depth 0.5B runs below)
SHAPES = {"0.5b": "qwen2.5-0.5b", "3b": "qwen2.5-3b"}
PRESET_OF = {**SHAPES, "1.5b": "qwen2.5-1.5b"}  # the K = 8 tests run the design's 1.5B shape too
_SHAPED = {}


def shaped_weights(tmp_path_factory, shape, kind, layers=2, tie=True):
    import dataclasses

    key = (shape, kind, layers, tie)
    if key not in _SHAPED:
        cfg = dataclasses.replace(PRESETS[PRESET_OF[shape]], num_hidden_layers=layers, tie_word_embeddings=tie)
        d = str(tmp_path_factory.mktemp(f"{shape}-{kind}-{layers}-{int(tie)}"))
        make_model(d, cfg=cfg, seed=5, **KINDS[kind])
        _SHAPED.clear()  # one model in memory at a time (the 3B vocabulary alone is 1.2 GB in float32)
        _SHAPED[key] = load_weights(d)
    return _SHAPED[key]


def run_through_evictions(w, cap=400, P=12, frames=14, seed=0, policy="fifo", fp16_act=None, sms=None):
    """CUDA vs the reference chunk by chunk through evictions (non-identity slot order); returns the worst
    (cosine, max |delta| / max |ref|) and the evictions seen. ``fp16_act``, ``sms``: CudaBackend's (None: its choice,
    the device's SMs); the chunk's gate/up GEMM's token slices are left in run_through_evictions.zsplit."""
    from vla_edge_ros.cuda.backend import CudaBackend
    from vla_edge_ros.eviction import make_policy
    from vla_edge_ros.kv_cache import KvCache

    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, w.cfg.vocab_size, P)
    gpu, ref = CudaBackend(w, cap, fp16_act=fp16_act, sms=sms), ReferenceModel(w, cap)
    run_through_evictions.zsplit = gpu.gemm_gu.zsplit
    kv = KvCache(cap, P, make_policy(policy), action_tokens=w.cfg.action_tokens, state_tokens=w.cfg.state_tokens)
    gpu.load_prompt(prompt, kv.prompt_slots)
    ref.load_prompt(prompt, kv.prompt_slots)
    evictions, worst = 0, 1.0
    compare_chunk.max_delta = 0.0
    for fid in range(frames):
        plan = kv.plan_frame(fid)
        evictions += len(plan.evicted)
        frame = rng.integers(0, 256, (64, 128, 3), dtype=np.uint8)
        start = int(rng.integers(0, w.cfg.vocab_size))
        rg, rr = run_both(gpu, ref, frame, plan, start, chunk_state(w, rng))
        worst = min(worst, compare_chunk(rg, rr))
        kv.set_embedding(fid, rr.pooled)
    assert gpu.peak_vram_bytes <= gpu.plan["total"]
    out = (worst, compare_chunk.max_delta, evictions)
    del gpu
    cp.get_default_memory_pool().free_all_blocks()
    return out


@pytest.mark.parametrize("kind,fp16_act", [("bf16", None), ("awq", None), ("ct-sym", None), ("bf16-parallel", None),
                                           ("awq-parallel", None), ("bf16", False), ("bf16-parallel", False)])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_published_shapes_match_reference_through_evictions(tmp_path_factory, shape, kind, fp16_act):
    """0.5B / 3B shapes, every kind, chunk by chunk through fifo evictions (frame capacity (400-12-8)//32 = 11, 14
    frames): cosine >= 0.999 and max |delta| <= MAX_REL_DELTA of the largest logit at every step. The bf16 kinds also
    with fp16_act False: their layers as bf16 on the device (the synthetic weights would take fp16; the real 0.5B GGUF
    runs bf16)."""
    w = shaped_weights(tmp_path_factory, shape, kind)
    worst, delta, evictions = run_through_evictions(w, fp16_act=fp16_act)
    print(f"{shape} {kind}: worst cosine {worst:.6f}, max |delta| / max |ref| {delta:.2e}, evictions {evictions}")
    assert evictions >= 3


@pytest.mark.parametrize("kind", ["bf16", "bf16-parallel", "awq", "awq-parallel", "awq-parallel-k8"])
@pytest.mark.parametrize("fp16_act", [False, True])
def test_prefill_in_bf16_and_fp16(tmp_path_factory, kind, fp16_act):
    """The prefill GEMMs in either 16-bit format (cuda/act_format.py; the default is fp16 where the weights bound the
    activations, as for these tiny models; a bf16 model's layers are then fp16 on the device, its decode GEMVs
    included): chunk by chunk through evictions against the golden model."""
    w = tiny_weights(tmp_path_factory, kind)
    worst, delta, evictions = run_through_evictions(w, fp16_act=fp16_act)
    print(f"tiny {kind} fp16_act={fp16_act}: worst cosine {worst:.6f}, max |delta| / max |ref| {delta:.2e}")
    assert evictions >= 3


def test_fp16_activation_choice(tmp_path_factory, monkeypatch):
    """fp16 prefill: chosen for a model whose weights bound the activations under FP16_ACT_LIMIT; a bf16 model's layers
    are then fp16 on the device (the f16 GEMM and GEMV instances), unless a weight is past fp16's range (then bf16, and
    asking for fp16 is an error); the bound's 4-bit row norms are the dequantized weights' and its RMSNorm term is
    reached by a one-hot row."""
    from vla_edge_ros.cuda.act_format import FP16_ACT_LIMIT, _row_norms, fp16_activation_bound
    from vla_edge_ros.cuda.backend import CudaBackend
    from vla_edge_ros.model import ops
    from vla_edge_ros.model.quant import as_f32
    from vla_edge_ros.model.safetensors_io import bf16_to_f32, f32_to_bf16

    w = tiny_weights(tmp_path_factory, "awq-parallel")
    assert fp16_activation_bound(w) <= FP16_ACT_LIMIT
    assert CudaBackend(w, 300).x16 and not CudaBackend(w, 300, fp16_act=False).x16
    b = tiny_weights(tmp_path_factory, "bf16-parallel")
    import vla_edge_ros.cuda.backend as backend_mod
    monkeypatch.setattr(backend_mod, "F16_SLAB", 3000)  # several slabs a weight, one ending mid-part
    gb = CudaBackend(b, 300)
    assert gb.x16 and gb.device_format == "f16" and gb.gemm.name.startswith("gemm_f16_")
    assert all(p["name"].startswith("gemv_f16_") for p in gb.gemv.values())

    def f16_bits(*names):  # NumPy's conversion of the layer's bf16 parts, row-concatenated as the backend uploads
        return np.concatenate([bf16_to_f32(b.layers[1][n]).astype(np.float16).view(np.uint16) for n in names])

    assert (gb.layers[1]["wo"].get() == f16_bits("wo")).all()
    assert (gb.layers[1]["wgu"].get() == f16_bits("wg", "wu")).all()
    assert (gb.layers[1]["wqkv"].get() == f16_bits("wq", "wk", "wv")).all()
    assert (gb.layers[1]["wd"].get() == f16_bits("wd")).all()
    wo = b.layers[0]["wo"]
    assert CudaBackend(b, 300, fp16_act=False).device_format == "bf16"
    big = np.array(wo, copy=True)
    big[0, 0] = f32_to_bf16(np.array([7.0e4], np.float32))[0]  # past fp16's 65504
    b.layers[0]["wo"] = big
    try:
        assert CudaBackend(b, 300).device_format == "bf16"
        with pytest.raises(ValueError, match="65504"):
            CudaBackend(b, 300, fp16_act=True)
    finally:
        b.layers[0]["wo"] = wo
    wg = w.layers[0]["wg"]
    ref = np.sqrt((wg.dequantize().astype(np.float64) ** 2).sum(axis=1))
    assert np.allclose(_row_norms(wg), ref, rtol=1e-12)
    ln = as_f32(w.layers[0]["ln1"])
    H = w.cfg.hidden_size
    i = int(np.abs(ln).argmax())
    h = ops.rms_norm(np.eye(H, dtype=np.float32)[i:i + 1], ln, 0.0)
    assert np.isclose(np.abs(h).max(), np.sqrt(H) * np.abs(ln).max(), rtol=1e-5)


@pytest.mark.parametrize("sms", [None, 8])
@pytest.mark.parametrize("kind", K8_KINDS)
@pytest.mark.parametrize("shape", ["0.5b", "1.5b"])
def test_k8_action_chunks_match_reference_through_evictions(tmp_path_factory, shape, kind, sms):
    """8 actions a chunk (64 action rows in a 96-row prefill) at the 0.5B and 1.5B shapes (2 layers, full vocabulary),
    chunk by chunk through fifo evictions (frame capacity (400-12-64)//32 = 10, 14 frames): every one of the 64 rows
    at cosine >= 0.999 and max |delta| <= MAX_REL_DELTA of the largest logit. ``sms``: the grids planned for the
    whole device (the 96-row gate/up in two 48-row token slices, launch.gemm_token_split, on a whole H100 / H200) or
    for 8 SMs (whole)."""
    w = shaped_weights(tmp_path_factory, shape, kind)
    assert w.cfg.action_chunk == 8 and w.vision.action_queries.shape == (64, w.cfg.hidden_size)
    worst, delta, evictions = run_through_evictions(w, sms=sms)
    z = run_through_evictions.zsplit
    print(f"{shape} {kind} sms {sms}: worst cosine {worst:.6f}, max |delta| / max |ref| {delta:.2e}, evictions "
          f"{evictions}, token slices {z}")
    assert evictions >= 3
    if sms == 8:
        assert z == 1
    elif cp.cuda.Device().attributes["MultiProcessorCount"] >= 128:
        assert z == 2  # the sliced path is the one this case covers


@pytest.mark.parametrize("kind", list(STATE_KINDS))
@pytest.mark.parametrize("shape", ["0.5b", "1.5b"])
def test_state_token_matches_reference_through_evictions(tmp_path_factory, shape, kind):
    """A model with a robot-state input at the 0.5B and 1.5B shapes (2 layers, full vocabulary), every kind: the state
    token (kernels/state.cu into the prefill row after the frame, causal like the frame, the action rows after it) and
    a new random state every chunk, through fifo evictions (frame capacity (400-12-1-8)//32 = 11; with 7 actions
    (400-12-1-56)//32 = 10, the 96-row prefill with zero rows): cosine >= 0.999 and max |delta| <= MAX_REL_DELTA at
    every row."""
    w = shaped_weights(tmp_path_factory, shape, kind)
    assert w.cfg.state_dim == 14 and w.vision.state.trained
    worst, delta, evictions = run_through_evictions(w)
    print(f"{shape} {kind}: worst cosine {worst:.6f}, max |delta| / max |ref| {delta:.2e}, evictions {evictions}")
    assert evictions >= 3


@pytest.mark.parametrize("H,S", [(256, 1), (896, 14), (1536, 8), (2048, 64)])
def test_state_kernel_matches_its_twin(H, S):
    """kernels/state.cu (fc1 + exact GELU, fc2 by warps) against ops.state_project on bf16 weights: relative error
    <= 1e-5 of the largest output (fp32 accumulation in another order; erff vs the twin's erf, 1.5e-7 apart)."""
    from vla_edge_ros.cuda.kernels import Kernels
    from vla_edge_ros.cuda.launch import state_project
    from vla_edge_ros.model import ops
    from vla_edge_ros.model.safetensors_io import bf16_to_f32, f32_to_bf16

    rng = np.random.default_rng(H + S)
    parts = (rng.standard_normal((H, S)) / np.sqrt(S), rng.standard_normal(H) * 0.1,
             rng.standard_normal((H, H)) / np.sqrt(H), rng.standard_normal(H) * 0.1)
    w = [f32_to_bf16(a.astype(np.float32)) for a in parts]
    s = rng.uniform(-1, 1, S).astype(np.float32)
    want = ops.state_project(s, *(bf16_to_f32(a) for a in w))
    hidden, x = cp.zeros(H, cp.float32), cp.full(H, np.nan, cp.float32)
    state_project(Kernels(), cp.asarray(s), *(cp.asarray(a) for a in w), S, H, hidden, x)
    got = cp.asnumpy(x)
    err = float(np.abs(got - want).max() / np.abs(want).max())
    print(f"state kernel H {H} S {S}: max |delta| / max |want| {err:.2e}")
    assert np.isfinite(got).all() and err <= 1e-5


@pytest.mark.parametrize("shape,kind", [("0.5b", "bf16"), ("0.5b", "awq-parallel"), ("3b", "awq"),
                                        ("1.5b", "awq-parallel-k8")])
def test_untied_embeddings_and_semantic_reordering(tmp_path_factory, shape, kind):
    """Untied head / embedding (the GGUF's layout), semantic eviction (frames leave from the middle: positions move)."""
    w = shaped_weights(tmp_path_factory, shape, kind, tie=False)
    assert w.lm_head is not None
    worst, delta, evictions = run_through_evictions(w, cap=300, P=7, frames=11, seed=3, policy="semantic")
    print(f"{shape} {kind} untied, semantic: worst cosine {worst:.6f}, max |delta| / max |ref| {delta:.2e}")
    assert evictions >= 2


# ------------------------------------------------------------------------- text_logits (vla-edge-generate)
def text_compare(got, ref, max_rel_delta=MAX_REL_DELTA, min_cos=0.999):
    """Per position: cosine over the full vocabulary and max |delta| / max |ref| (DESIGN 13), top-1 equal unless a
    near-tie; returns the worst of each."""
    wc, wd = 1.0, 0.0
    for t in range(ref.shape[0]):
        c = cos(got[t], ref[t])
        d = float(np.abs(got[t].astype(np.float64) - ref[t]).max() / np.abs(ref[t]).max())
        wc, wd = min(wc, c), max(wd, d)
        assert c >= min_cos and d <= max_rel_delta, f"position {t}: cosine {c:.6f}, max |delta| {d:.2e}"
        if int(np.argmax(got[t])) != int(np.argmax(ref[t])):
            top = np.sort(ref[t])[-2:]
            assert top[1] - top[0] <= 2e-2 * np.abs(ref[t]).max(), f"position {t}: top-1 differs without a near-tie"
    return wc, wd


@pytest.mark.parametrize("shape,kind,tie,fp16_act", [
    ("tiny", "bf16", True, None), ("tiny", "awq", True, None), ("0.5b", "bf16", False, None),
    ("0.5b", "awq-parallel", True, None), ("3b", "bf16", True, None), ("0.5b", "bf16", True, False)])
def test_text_logits_match_reference(tmp_path_factory, shape, kind, tie, fp16_act):
    """CudaBackend.text_logits vs ReferenceModel.text_logits, full vocabulary: a 110-token text from position 0 (two
    prefill blocks, 96 rows and a partial 14), then 3 single tokens (the decode GEMV pass + head GEMV), then a 5-token
    block after them, and last_only; the robot chunk's VRAM plan is unchanged by the lazily uploaded head.
    ``fp16_act`` False: a bf16 model's layers as bf16 on the device (the real 0.5B GGUF's path; the synthetic weights
    would take fp16)."""
    from vla_edge_ros.cuda.backend import CudaBackend
    from vla_edge_ros.vram_plan import text_head_bytes

    if shape == "tiny":
        w = tiny_weights(tmp_path_factory, kind)
    else:
        w = shaped_weights(tmp_path_factory, shape, kind, tie=tie)
    V, cap = w.cfg.vocab_size, 256
    rng = np.random.default_rng()
    ids = rng.integers(0, V, 121)
    gpu, ref = CudaBackend(w, cap, fp16_act=fp16_act), ReferenceModel(w, cap)
    if fp16_act is False:
        assert gpu.device_format == "bf16"
    plan_before = dict(gpu.plan)
    got = [gpu.text_logits(ids[:110], 0)]
    want = [ref.text_logits(ids[:110], 0)]
    assert got[0].shape == (110, V) and got[0].dtype == np.float32
    for t in range(110, 113):
        got.append(gpu.text_logits(ids[t:t + 1], t))
        want.append(ref.text_logits(ids[t:t + 1], t))
    got.append(gpu.text_logits(ids[113:118], 113))
    want.append(ref.text_logits(ids[113:118], 113))
    last = gpu.text_logits(ids[118:121], 118, last_only=True)
    want_last = ref.text_logits(ids[118:121], 118, last_only=True)
    assert last.shape == (1, V)
    wc, wd = text_compare(np.concatenate(got + [last]), np.concatenate(want + [want_last]))
    print(f"text_logits {shape} {kind} tie={tie}: worst cosine {wc:.6f}, max |delta| / max |ref| {wd:.2e}")
    assert gpu.plan == plan_before
    assert gpu.peak_vram_bytes <= gpu.plan["total"] + text_head_bytes(w.cfg)
    with pytest.raises(ValueError):
        gpu.text_logits(ids[:10], cap - 5)
    del gpu
    cp.get_default_memory_pool().free_all_blocks()


@pytest.mark.parametrize("kind", ["awq", "bf16"])
def test_an_engine_that_loaded_its_model_keeps_no_host_copy_of_the_layers(tmp_path, kind):
    """Issue 42: on CUDA the device holds the layers, so an Engine that opened the model itself drops the host copy
    (a 4-bit model's repacked arrays are heap, not file pages) and its Checkpoint forgets the weights; weights a
    caller hands in stay whole (the bench builds an engine per policy from them). The engine still runs chunks."""
    from vla_edge_ros.engine import Engine
    from vla_edge_ros.model.checkpoint import _UNREAD, Checkpoint

    d = str(tmp_path / kind)
    make_model(d, "tiny", seed=3, **KINDS[kind])
    ckpt = Checkpoint(d)
    eng = Engine(ckpt, backend="cuda", kv_capacity_tokens=512)
    assert eng.weights.layers == [] and ckpt._weights is _UNREAD
    rng = np.random.default_rng(0)
    for _ in range(3):
        r = eng.run_chunk(rng.integers(0, 256, (64, 128, 3), dtype=np.uint8))
        assert len(r.tokens) == eng.cfg.action_tokens and np.isfinite(r.action).all()
    w = load_weights(d)
    kept = Engine(d, backend="cuda", kv_capacity_tokens=512, weights=w)
    assert kept.weights is w and len(w.layers) == w.cfg.num_hidden_layers
    del eng, kept
    cp.get_default_memory_pool().free_all_blocks()


def test_vram_plan_refuses_over_ceiling(tiny):
    from vla_edge_ros.cuda.backend import CudaBackend, VramPlanError

    with pytest.raises(VramPlanError, match="vram_ceiling_gb"):
        CudaBackend(tiny, 4096, vram_ceiling_gb=0.001)


_BIG = {}


def big_dir(tmp_path_factory, kind):
    """The 1.5B shape of each kind; VLA_EDGE_15B_DIR_<KIND> (e.g. VLA_EDGE_15B_DIR_BF16) reuses a generated dir."""
    if kind not in _BIG:
        d = os.environ.get("VLA_EDGE_15B_DIR_" + kind.upper().replace("-", "_"))
        if not d:
            d = str(tmp_path_factory.mktemp("q15-" + kind))
            make_model(d, "qwen2.5-1.5b", seed=0, **KINDS[kind])
        _BIG[kind] = d
    return _BIG[kind]


def test_unsupported_shape_refused_at_start(tmp_path):
    """A model outside the kernels' shapes (hidden > 2048) is refused before any allocation, naming the limit."""
    import dataclasses

    from vla_edge_ros.cuda.backend import CudaBackend
    from vla_edge_ros.vram_plan import UnsupportedShapeError

    cfg = dataclasses.replace(PRESETS["tiny"], hidden_size=2304, num_attention_heads=18, num_key_value_heads=2)
    w = type("W", (), {"cfg": cfg})()
    with pytest.raises(UnsupportedShapeError, match="hidden_size 2304 > 2048"):
        CudaBackend(w, 300)
    cfg = dataclasses.replace(PRESETS["tiny"], hidden_size=768, num_attention_heads=8, num_key_value_heads=2)
    with pytest.raises(UnsupportedShapeError, match="head_dim 96"):
        CudaBackend(type("W", (), {"cfg": cfg})(), 300)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["bf16", "awq", "bf16-parallel", "awq-parallel", "awq-parallel-k8", "bf16-state",
                                  "awq-parallel-state"])
def test_qwen05b_full_depth_matches_reference_and_hf(tmp_path_factory, kind):
    """The 0.5B at full depth (24 layers), one chunk at 4096 slots: as the 1.5B test below."""
    d = os.environ.get("VLA_EDGE_05B_DIR_" + kind.upper().replace("-", "_"))
    if not d:
        d = str(tmp_path_factory.mktemp("q05-" + kind))
        make_model(d, "qwen2.5-0.5b", seed=0, **KINDS[kind])
    full_chunk_vs_reference_and_hf(d, kind, "0.5B")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["bf16", "awq", "bf16-parallel", "awq-parallel", "awq-parallel-k8", "bf16-state",
                                  "awq-parallel-state"])
def test_qwen15b_plan_fits_8gib_and_matches_reference_and_hf(tmp_path_factory, kind):
    """1.5B shape, one chunk: CUDA vs the NumPy reference of the same model at every step (logits cosine >= 0.999);
    autoregressive bf16 also vs HF transformers fp32 (teacher-forced with the GPU's tokens)."""
    full_chunk_vs_reference_and_hf(big_dir(tmp_path_factory, kind), kind, "1.5B")


def full_chunk_vs_reference_and_hf(big, kind, label):
    from vla_edge_ros.cuda.backend import GIB, CudaBackend

    w = load_weights(big)
    cap, P = 4096, 24
    gpu = CudaBackend(w, cap, vram_ceiling_gb=8.0)
    assert gpu.plan["total"] <= 8 * GIB, gpu.plan
    rng = np.random.default_rng(2)
    prompt = rng.integers(0, w.cfg.vocab_size, P)
    slots = np.arange(P, dtype=np.int32)
    gpu.load_prompt(prompt, slots)
    n_prefix, A = P, w.cfg.action_tokens
    order = np.arange(P + 32 + w.cfg.state_tokens + A, dtype=np.int32)  # no eviction: positions == HF positions
    frame = rng.integers(0, 256, (64, 128, 3), dtype=np.uint8)
    start = int(w.cfg.vocab_size - 300)
    st = chunk_state(w, rng)
    ref = ReferenceModel(w, cap)
    ref.load_prompt(prompt, slots)
    rg, rr = run_both(gpu, ref, frame, _plan(order, n_prefix, A), start, st)
    compare_chunk.max_delta = 0.0
    worst_ref = compare_chunk(rg, rr, max_rel_delta=FULL_DEPTH_MAX_REL_DELTA)
    print(f"{label} {kind}: worst logits cosine vs reference {worst_ref:.6f}, max |delta| / max |ref| "
          f"{compare_chunk.max_delta:.2e}, VRAM plan {gpu.plan['total'] / GIB:.3f} GiB")
    if kind not in ("bf16", "bf16-state"):
        return
    # HF transformers (fp32 on the GPU) on the same weights, teacher-forced with the GPU's tokens; with a state input
    # the golden model's state token sits after the frame (HF runs the transformer; the projector is the golden one)
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(big, dtype=torch.float32).cuda().eval()
    emb = ref.embed
    seq = np.concatenate([emb[prompt], ref.frame_rows(frame, st), emb[[start, *rg.tokens[:-1]]]]).astype(np.float32)
    with torch.no_grad():
        out = model(inputs_embeds=torch.from_numpy(seq)[None].cuda()).logits[0, -ACTION_TOKENS:, -256:]
    hf = out.float().cpu().numpy()
    worst_hf = min(cos(rg.logits[s], hf[s]) for s in range(ACTION_TOKENS))
    print(f"{label} {kind}: worst logits cosine vs HF {worst_hf:.6f}")
    del gpu, model
    cp.get_default_memory_pool().free_all_blocks()
    assert worst_hf >= 0.999
