# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The whole CUDA chunk (one graph) against the NumPy golden model, and on the 1.5B shape against HF.

GPU only. Criterion per chunk: at every decode step the action logits agree (cosine >= 0.999) while the
tokens agree; a differing token is accepted only at a near-tie of the reference logits (then the rest
of that chunk is conditioned on different tokens and is not compared).
"""
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
         "awq-parallel": {"quant": "awq", "action_decoding": "parallel"}}


def cos(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def compare_chunk(gpu, ref, min_cos=0.999):
    worst = 1.0
    for s in range(ACTION_TOKENS):
        c = cos(gpu.logits[s], ref.logits[s])
        worst = min(worst, c)
        assert c >= min_cos, f"step {s}: logits cosine {c:.6f}"
        if gpu.tokens[s] != ref.tokens[s]:
            top = np.sort(ref.logits[s])[-2:]
            assert top[1] - top[0] <= 2e-2 * (np.abs(ref.logits[s]).max() + 1e-6), \
                f"step {s}: token {gpu.tokens[s]} != {ref.tokens[s]} without a near-tie"
            break
    np.testing.assert_allclose(gpu.pooled, ref.pooled, rtol=1e-4, atol=1e-5)
    return worst


def _plan(order, n_prefix):
    from types import SimpleNamespace

    order = np.asarray(order, np.int32)
    return SimpleNamespace(order=order, n_prefix=n_prefix, frame_slots=order[n_prefix:n_prefix + 32],
                           action_slots=order[-8:], frame_id=0, evicted=[])


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
    kv_g = KvCache(cap, P, make_policy("fifo"))
    gpu.load_prompt(prompt, kv_g.prompt_slots)
    ref.load_prompt(prompt, kv_g.prompt_slots)
    evictions = 0
    for fid in range(18):  # frame capacity (512-20-8)//32 = 15: the last chunks evict
        plan = kv_g.plan_frame(fid)
        evictions += len(plan.evicted)
        frame = rng.integers(0, 256, (64, 128, 3), dtype=np.uint8)
        start = int(rng.integers(0, tiny.cfg.vocab_size))
        rg = gpu.run_chunk(frame, plan, start, collect_logits=True)
        rr = ref.run_chunk(frame, plan, start, collect_logits=True)
        compare_chunk(rg, rr)
        kv_g.set_embedding(fid, rg.pooled)
        assert rg.timings.prefill_ms > 0 and rg.timings.vision_ms >= 0
        assert (rg.timings.decode_ms == 0) if gpu.parallel else (rg.timings.decode_ms > 0)
    assert evictions >= 3
    assert gpu.peak_vram_bytes > 0 and gpu.peak_vram_bytes <= gpu.plan["total"]


@pytest.mark.parametrize("kind", ["bf16", "awq-parallel"])
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
    kv = KvCache(cap, P, make_policy("semantic"))
    gpu.load_prompt(prompt, kv.prompt_slots)
    ref.load_prompt(prompt, kv.prompt_slots)
    for fid in range(12):
        plan = kv.plan_frame(fid)
        frame = rng.integers(0, 256, (64, 128, 3), dtype=np.uint8)
        rg = gpu.run_chunk(frame, plan, 5, collect_logits=True)
        rr = ref.run_chunk(frame, plan, 5, collect_logits=True)
        compare_chunk(rg, rr)
        kv.set_embedding(fid, rr.pooled)


def test_vram_plan_refuses_over_ceiling(tiny):
    from vla_edge_ros.cuda.backend import CudaBackend, VramPlanError

    with pytest.raises(VramPlanError, match="vram_ceiling_gb"):
        CudaBackend(tiny, 4096, vram_ceiling_gb=0.001)


_BIG = {}


def big_dir(tmp_path_factory, kind):
    """The 1.5B shape of each kind; VLA_EDGE_15B_DIR_<KIND> (e.g. VLA_EDGE_15B_DIR_BF16) reuses a generated dir."""
    import os

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


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["bf16", "awq", "bf16-parallel", "awq-parallel"])
def test_qwen15b_plan_fits_8gib_and_matches_reference_and_hf(tmp_path_factory, kind):
    """1.5B shape, one chunk: CUDA vs the NumPy reference of the same model at every step (logits cosine >= 0.999);
    autoregressive bf16 also vs HF transformers fp32 (teacher-forced with the GPU's tokens)."""
    from vla_edge_ros.cuda.backend import GIB, CudaBackend

    big = big_dir(tmp_path_factory, kind)
    w = load_weights(big)
    cap, P = 4096, 24
    gpu = CudaBackend(w, cap, vram_ceiling_gb=8.0)
    assert gpu.plan["total"] <= 8 * GIB, gpu.plan
    rng = np.random.default_rng(2)
    prompt = rng.integers(0, w.cfg.vocab_size, P)
    slots = np.arange(P, dtype=np.int32)
    gpu.load_prompt(prompt, slots)
    n_prefix = P
    order = np.arange(P + 40, dtype=np.int32)  # no eviction: positions == HF positions
    frame = rng.integers(0, 256, (64, 128, 3), dtype=np.uint8)
    start = int(w.cfg.vocab_size - 300)
    rg = gpu.run_chunk(frame, _plan(order, n_prefix), start, collect_logits=True)
    ref = ReferenceModel(w, cap)
    ref.load_prompt(prompt, slots)
    rr = ref.run_chunk(frame, _plan(order, n_prefix), start, collect_logits=True)
    worst_ref = compare_chunk(rg, rr)
    print(f"1.5B {kind}: worst logits cosine vs reference {worst_ref:.6f}, VRAM plan {gpu.plan['total'] / GIB:.3f} GiB")
    if kind != "bf16":
        return
    # HF transformers (fp32 on the GPU) on the same weights, teacher-forced with the GPU's tokens
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(big, dtype=torch.float32).cuda().eval()
    emb = ref.embed
    seq = np.concatenate([emb[prompt], ref.vision(frame), emb[[start, *rg.tokens[:-1]]]]).astype(np.float32)
    with torch.no_grad():
        out = model(inputs_embeds=torch.from_numpy(seq)[None].cuda()).logits[0, -ACTION_TOKENS:, -256:]
    hf = out.float().cpu().numpy()
    worst_hf = min(cos(rg.logits[s], hf[s]) for s in range(ACTION_TOKENS))
    print(f"1.5B {kind}: worst logits cosine vs HF {worst_hf:.6f}")
    del gpu, model
    cp.get_default_memory_pool().free_all_blocks()
    assert worst_hf >= 0.999
