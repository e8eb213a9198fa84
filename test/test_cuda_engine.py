"""The whole CUDA chunk (one graph) against the NumPy golden model, and on the 1.5B shape against HF.

GPU only. Criterion per chunk: at every decode step the action logits agree (cosine >= 0.999) while the
tokens agree; a differing token is accepted only at a near-tie of the reference logits (then the rest
of that chunk is conditioned on different tokens and is not compared).
"""
import numpy as np
import pytest

from vla_edge_ros.constants import ACTION_TOKENS, VISION_TOKENS
from vla_edge_ros.model.config import PRESETS
from vla_edge_ros.model.reference import ReferenceModel
from vla_edge_ros.model.weights import load_weights
from vla_edge_ros.tools.make_model import make_model

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

VARIANTS = ["v3", "v3p", "v4", "v5", "v5w", "v5p"]


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


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("tiny"))
    make_model(d, "tiny", seed=3)
    return load_weights(d)


@pytest.mark.parametrize("variant", VARIANTS)
def test_tiny_chunks_match_reference_through_evictions(tiny, variant):
    from vla_edge_ros.cuda.backend import CudaBackend
    from vla_edge_ros.eviction import make_policy
    from vla_edge_ros.kv_cache import KvCache

    cap, P = 512, 20
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, tiny.cfg.vocab_size, P)
    gpu = CudaBackend(tiny, cap, variant=variant)
    assert gpu.variant == variant
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
        assert rg.timings.decode_ms > 0 and rg.timings.prefill_ms > 0 and rg.timings.vision_ms >= 0
    assert evictions >= 3
    assert gpu.peak_vram_bytes > 0 and gpu.peak_vram_bytes <= gpu.plan["total"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_tiny_semantic_policy_and_reordered_positions(tiny, variant):
    """Semantic eviction removes frames from the middle: positions of later frames move."""
    from vla_edge_ros.cuda.backend import CudaBackend
    from vla_edge_ros.eviction import make_policy
    from vla_edge_ros.kv_cache import KvCache

    cap, P = 300, 7
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, tiny.cfg.vocab_size, P)
    gpu, ref = CudaBackend(tiny, cap, variant=variant), ReferenceModel(tiny, cap)
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


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    import os

    d = os.environ.get("VLA_EDGE_15B_DIR")
    if not d:
        d = str(tmp_path_factory.mktemp("q15"))
        make_model(d, "qwen2.5-1.5b", seed=0)
    return d


def test_unknown_variant_refused(tiny):
    from vla_edge_ros.cuda.backend import CudaBackend

    with pytest.raises(ValueError, match="unknown CUDA variant"):
        CudaBackend(tiny, 300, variant="v9")


@pytest.fixture(scope="module")
def big_weights(big):
    return load_weights(big)


_HF = {}


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_qwen15b_plan_fits_8gib_and_matches_reference_and_hf(big, big_weights, variant):
    from vla_edge_ros.cuda.backend import GIB, CudaBackend

    w = big_weights
    cap, P = 4096, 24
    gpu = CudaBackend(w, cap, vram_ceiling_gb=8.0, variant=variant)
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
    if "ref" not in _HF:  # the NumPy reference does not depend on the variant: computed once
        ref = ReferenceModel(w, cap)
        ref.load_prompt(prompt, slots)
        _HF["ref"] = (ref, ref.run_chunk(frame, _plan(order, n_prefix), start, collect_logits=True))
    ref, rr = _HF["ref"]
    worst_ref = compare_chunk(rg, rr)
    # HF transformers (fp32 on the GPU) on the same weights, teacher-forced with the GPU's tokens
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    if "model" not in _HF:
        _HF["model"] = transformers.AutoModelForCausalLM.from_pretrained(big, dtype=torch.float32).cuda().eval()
    model = _HF["model"]
    emb = ref.embed
    seq = np.concatenate([emb[prompt], ref.vision(frame), emb[[start, *rg.tokens[:-1]]]]).astype(np.float32)
    with torch.no_grad():
        out = model(inputs_embeds=torch.from_numpy(seq)[None].cuda()).logits[0, -ACTION_TOKENS:, -256:]
    hf = out.float().cpu().numpy()
    worst_hf = min(cos(rg.logits[s], hf[s]) for s in range(ACTION_TOKENS))
    print(f"1.5B {variant}: worst logits cosine vs reference {worst_ref:.6f}, vs HF {worst_hf:.6f}")
    del gpu
    cp.get_default_memory_pool().free_all_blocks()
    assert worst_hf >= 0.999
