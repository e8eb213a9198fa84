"""Each CUDA kernel against its NumPy twin (model/ops.py) on fresh random inputs, outputs poisoned first.

GPU only (marked gpu; conftest skips without CuPy + a device). Tolerances: relative L2 error
||out - ref|| / ||ref|| within bf16 bounds (bf16 operands: ~1e-3..1e-2; fp32 paths: 1e-5).
"""
import math

import numpy as np
import pytest

from vla_edge_ros.model import ops
from vla_edge_ros.model.safetensors_io import bf16_to_f32, f32_to_bf16

pytestmark = pytest.mark.gpu

cp = pytest.importorskip("cupy")


@pytest.fixture(scope="module")
def k():
    from vla_edge_ros.cuda.kernels import Kernels

    return Kernels()


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "pdl-build"])
def kk(request):
    """Both builds of the kernels: without and with -DVLA_PDL (launched plainly the PDL hooks are no-ops)."""
    from vla_edge_ros.cuda.kernels import Kernels

    return Kernels(pdl=request.param)


def rel(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert np.isfinite(out).all(), "unwritten (NaN-poisoned) or non-finite output"
    return np.linalg.norm(out - ref) / np.linalg.norm(ref)


def bf(rng, shape, scale=1.0):
    return f32_to_bf16((scale * rng.standard_normal(shape)).astype(np.float32))


def poison(shape, dtype=np.float32):
    a = cp.empty(shape, dtype)
    if dtype == np.float32:
        a.fill(np.nan)
    else:
        a.fill(0xFFFF)  # bf16 NaN bits
    return a


i32, f32 = np.int32, np.float32
NULL = np.uint64(0)


@pytest.mark.parametrize("N,K,mode", [(128, 512, 0), (1024, 1536, 1), (64, 8960, 1)])
def test_gemm_bf16_t32(k, N, K, mode):
    rng = np.random.default_rng()
    X, W = bf(rng, (32, K)), bf(rng, (N, K), 0.05)
    y0 = rng.standard_normal((32, N)).astype(np.float32)
    Y = cp.asarray(y0) if mode else poison((32, N))
    ks = 1 if mode == 0 else 5
    k.gemm_bf16_t32((N // 64, ks), (128,), (cp.asarray(X), cp.asarray(W), Y, i32(N), i32(K), i32(mode)))
    ref = bf16_to_f32(X) @ bf16_to_f32(W).T + (y0 if mode else 0)
    assert rel(Y.get(), ref) < 1e-5


def test_dec_proj_residual(k):
    rng = np.random.default_rng()
    for K, N in [(1536, 1536), (8960, 1536), (512, 256)]:
        a = rng.standard_normal(K).astype(np.float32)
        W = bf(rng, (N, K), 0.05)
        y0 = rng.standard_normal(N).astype(np.float32)
        y = cp.asarray(y0)
        k.dec_proj_residual((math.ceil(N / 8),), (256,), (cp.asarray(a), cp.asarray(W), i32(K), i32(N), y),
                            shared_mem=4 * K)
        assert rel(y.get(), y0 + ops.linear(a, bf16_to_f32(W))) < 1e-5


def test_dec_gateup(k):
    rng = np.random.default_rng()
    H, I = 1536, 8960
    x = rng.standard_normal(H).astype(np.float32)
    ln = f32_to_bf16((1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
    W = bf(rng, (2 * I, H), 0.05)
    act = poison(I)
    k.dec_gateup((math.ceil(I / 16),), (256,), (cp.asarray(x), cp.asarray(ln), f32(1e-6), cp.asarray(W), i32(H),
                                                i32(I), act), shared_mem=4 * H)
    h = ops.rms_norm(x, bf16_to_f32(ln), 1e-6)
    Wf = bf16_to_f32(W)
    ref = ops.silu_mul(h @ Wf[:I].T, h @ Wf[I:].T)
    assert rel(act.get(), ref) < 1e-5


def test_dec_qkv_writes_q_and_kv_slot(k):
    rng = np.random.default_rng()
    H, NQ, NKV, D, cap = 512, 512, 2, 128, 64
    NKVD = NKV * D
    N = NQ + 2 * NKVD
    x = rng.standard_normal(H).astype(np.float32)
    ln = f32_to_bf16((1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
    W, b = bf(rng, (N, H), 0.05), rng.standard_normal(N).astype(np.float32)
    order = cp.asarray(rng.permutation(cap).astype(np.int32))
    params = cp.asarray(np.array([5, -1, 0, 0], np.int32))
    q = poison(NQ)
    kc, vc = cp.zeros((NKV, cap, D), cp.uint16), cp.zeros((NKV, cap, D), cp.uint16)
    k.dec_qkv((math.ceil(N / 16),), (256,), (cp.asarray(x), cp.asarray(ln), f32(1e-6), cp.asarray(W), cp.asarray(b),
                                            i32(H), i32(NQ), i32(NKVD), q, kc, vc, order, params, i32(3), i32(cap),
                                            i32(D)), shared_mem=4 * H)
    ref = ops.linear(ops.rms_norm(x, bf16_to_f32(ln), 1e-6), bf16_to_f32(W), b)
    assert rel(q.get(), ref[:NQ]) < 1e-5
    slot = int(order[8].get())
    kk = bf16_to_f32(kc.get()[:, slot, :].reshape(-1))
    vv = bf16_to_f32(vc.get()[:, slot, :].reshape(-1))
    assert rel(kk, ref[NQ:NQ + NKVD]) < 5e-3 and rel(vv, ref[NQ + NKVD:]) < 5e-3
    others = np.delete(kc.get(), slot, axis=1)
    assert (others == 0).all()


@pytest.mark.parametrize("ver,T,n_prefix,nsplit,group", [
    ("", 1, 4000, 64, 6), ("", 32, 3000, 22, 6), ("", 32, 17, 8, 2), ("", 1, 0, 64, 2),
    ("_v5", 1, 4000, 128, 6), ("_v5", 1, 4036, 128, 6), ("_v5", 1, 4000, 16, 6), ("_v5", 1, 0, 128, 2),
    ("_v5", 1, 100, 128, 6), ("_v5", 32, 3000, 22, 6), ("_v5", 32, 17, 8, 2)])
def test_attention_partial_combine(kk, ver, T, n_prefix, nsplit, group):
    """attn_partial/attn_combine (v3) and attn_partial_v5/attn_combine_v5 (keys staged before the PDL wait)."""
    k = kk
    rng = np.random.default_rng()
    NKV, D, cap, theta = 2, 128, 4096 + 64, 1e6
    NH = NKV * group
    n = n_prefix + T
    order = rng.permutation(cap)[:n].astype(np.int32)
    kc = bf(rng, (NKV, cap, D)).astype(np.uint16)
    vc = bf(rng, (NKV, cap, D)).astype(np.uint16)
    q = rng.standard_normal((T, NH * D)).astype(np.float32)
    cos, sin = ops.rope_cos_sin(np.arange(cap), D, theta)
    nrg = math.ceil(T * group / 64)
    part_o = cp.zeros(NKV * nrg * nsplit * 64 * D, cp.float32)
    part_ml = cp.zeros(NKV * nrg * nsplit * 64 * 2, cp.float32)
    params = cp.asarray(np.array([n_prefix, -1, 0, 0], np.int32))
    order_d = cp.asarray(np.concatenate([order, np.zeros(cap - n, np.int32)]))
    qd = cp.asarray(q)
    args = (qd, i32(NH * D), cp.asarray(kc), cp.asarray(vc), order_d, params, i32(0), i32(T), i32(group), i32(cap),
            cp.asarray(cos), cp.asarray(sin), f32(math.log2(math.e) / math.sqrt(D)), part_o, part_ml)
    part_o.fill(np.nan)
    part_ml.fill(np.nan)
    getattr(k, "attn_partial" + ver)((NKV, nrg, nsplit), (128,), args)
    out, outb = poison((T, NH * D)), poison((T, NH * D), np.uint16)
    getattr(k, "attn_combine" + ver)((NKV * nrg * 64,), (128,), (part_o, part_ml, i32(nrg), i32(nsplit), i32(T),
                                                                  i32(group), i32(NH * D), out, outb))
    # twin: keys at index j have position j; query t at n_prefix + t; causal by index
    kf = bf16_to_f32(kc)[:, order, :]
    vf = bf16_to_f32(vc)[:, order, :]
    pos = np.arange(n)
    krot = ops.apply_rope(kf.transpose(1, 0, 2), cos[pos], sin[pos]).transpose(1, 0, 2)
    qp = np.arange(n_prefix, n)
    qrot = ops.apply_rope(q.reshape(T, NH, D), cos[qp], sin[qp])
    allowed = pos[None, :] <= qp[:, None]
    ref = ops.attention(qrot, krot, vf, allowed).reshape(T, NH * D)
    assert rel(out.get(), ref) < 1e-2
    assert rel(bf16_to_f32(outb.get()), ref) < 1.5e-2


def test_lm_head_argmax(k):
    rng = np.random.default_rng()
    H, V0 = 1536, 151936 - 256
    x = rng.standard_normal(H).astype(np.float32)
    ln = f32_to_bf16((1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
    head = bf(rng, (256, H), 0.05)
    logits = poison((8, 256))
    ticket = cp.zeros(1, cp.int32)
    tokidx = cp.full(1, -1, cp.int32)
    tokens = cp.full(8, -7, cp.int32)
    for step in range(2):
        k.lm_head_argmax((32,), (256,), (cp.asarray(x), cp.asarray(ln), f32(1e-6), i32(H), cp.asarray(head), i32(256),
                                         logits[step], ticket, tokidx, tokens, i32(step), i32(V0)), shared_mem=4 * H)
    ref = ops.rms_norm(x, bf16_to_f32(ln), 1e-6) @ bf16_to_f32(head).T
    got = logits.get()[1]
    assert rel(got, ref) < 1e-5
    assert int(tokidx.get()[0]) == int(np.argmax(got))  # first index of the device's own maximum
    assert int(tokens.get()[1]) == V0 + int(np.argmax(got))
    assert int(ticket.get()[0]) == 0  # ticket reset for the next launch
    # ties: all-equal logits pick the first index
    k.lm_head_argmax((32,), (256,), (cp.zeros(H, cp.float32) + 1, cp.asarray(ln), f32(1e-6), i32(H),
                                     cp.zeros((256, H), cp.uint16), i32(256), logits[2], ticket, tokidx, tokens,
                                     i32(2), i32(V0)), shared_mem=4 * H)
    assert int(tokidx.get()[0]) == 0


def test_vision_encode(k):
    rng = np.random.default_rng()
    H = 1536
    frame = rng.integers(0, 256, (64, 128, 3), dtype=np.uint8)
    W, b, pe = bf(rng, (H, 768), 0.02), bf(rng, (H,), 0.02), bf(rng, (32, H), 0.02)
    x, pooled = poison((32, H)), poison(H)
    k.vision_encode((H // 32,), (256,), (cp.asarray(frame), cp.asarray(W), cp.asarray(b), cp.asarray(pe), i32(H), x,
                                         pooled))
    ref = ops.vision_encode(frame, bf16_to_f32(W), bf16_to_f32(b), bf16_to_f32(pe))
    assert rel(x.get(), ref) < 1e-5
    assert rel(pooled.get(), ref.mean(axis=0)) < 1e-5


def test_rmsnorm_swiglu_gather_kvwrite_stamp(k):
    rng = np.random.default_rng()
    H, I, N = 1536, 8960, 2048
    x = rng.standard_normal((32, H)).astype(np.float32)
    ln = f32_to_bf16((1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
    bias = rng.standard_normal(N).astype(np.float32)
    out, y = poison((32, H), np.uint16), poison((32, N))
    k.rmsnorm_bf16((32,), (256,), (cp.asarray(x), cp.asarray(ln), f32(1e-6), i32(H), out, cp.asarray(bias), i32(N), y))
    assert rel(bf16_to_f32(out.get()), ops.rms_norm(x, bf16_to_f32(ln), 1e-6)) < 5e-3
    assert (y.get() == bias[None, :]).all()
    o32 = poison((32, H))
    k.rmsnorm_f32((32,), (256,), (cp.asarray(x), cp.asarray(ln), f32(1e-6), i32(H), o32))
    assert rel(o32.get(), ops.rms_norm(x, bf16_to_f32(ln), 1e-6)) < 1e-6
    gu = rng.standard_normal((32, 2 * I)).astype(np.float32)
    act = poison((32, I), np.uint16)
    k.silu_mul_bf16((1024,), (256,), (cp.asarray(gu), i32(32), i32(I), act))
    assert rel(bf16_to_f32(act.get()), ops.silu_mul(gu[:, :I], gu[:, I:])) < 5e-3
    table = bf(rng, (256, H))
    start = bf(rng, (H,))
    xo = poison(H)
    for idx, ref in [(-1, start), (7, table[7])]:
        k.embed_gather((6,), (256,), (cp.asarray(table), cp.asarray(start), cp.asarray(np.array([idx], np.int32)),
                                      i32(H), xo))
        assert (xo.get() == bf16_to_f32(ref)).all()
    NQ, NKVD, D, cap, T = 512, 256, 128, 128, 5
    qkv = rng.standard_normal((T, NQ + 2 * NKVD)).astype(np.float32)
    order = rng.permutation(cap).astype(np.int32)
    kc, vc = cp.zeros((2, cap, D), cp.uint16), cp.zeros((2, cap, D), cp.uint16)
    k.kv_write((4,), (256,), (cp.asarray(qkv), i32(T), i32(NQ), i32(NKVD), i32(D), kc, vc, cp.asarray(order),
                              cp.asarray(np.array([10, 0, 0, 0], np.int32)), i32(2), i32(cap)))
    for t in range(T):
        s = order[12 + t]
        assert (kc.get()[:, s, :].reshape(-1) == f32_to_bf16(qkv[t, NQ:NQ + NKVD])).all()
        assert (vc.get()[:, s, :].reshape(-1) == f32_to_bf16(qkv[t, NQ + NKVD:])).all()
    ts = cp.zeros(2, cp.uint64)
    k.stamp((1,), (1,), (ts, i32(0)))
    k.gemm_bf16_t32((64, 1), (128,), (cp.asarray(bf(rng, (32, 8960))), cp.asarray(bf(rng, (4096, 8960))),
                                      cp.zeros((32, 4096), cp.float32), i32(4096), i32(8960), i32(0)))
    k.stamp((1,), (1,), (ts, i32(1)))
    t = ts.get()
    assert t[1] > t[0] > 0


# ---------------------------------------------------------------------------------- v4 decode GEMVs (gemv_v4.cu)
@pytest.mark.parametrize("H,NQ,NKV,rb,blocks", [(1536, 1536, 2, 1, 264), (1536, 1536, 2, 2, 5), (512, 512, 2, 1, 3),
                                                 (512, 256, 1, 2, 264)])
def test_g4_qkv_writes_q_and_kv_slot(kk, H, NQ, NKV, rb, blocks):
    rng = np.random.default_rng()
    D, cap = 128, 64
    NKVD = NKV * D
    N = NQ + 2 * NKVD
    x = rng.standard_normal(H).astype(np.float32)
    ln = f32_to_bf16((1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
    W, b = bf(rng, (N, H), 0.05), rng.standard_normal(N).astype(np.float32)
    order = cp.asarray(rng.permutation(cap).astype(np.int32))
    params = cp.asarray(np.array([5, -1, 0, 0], np.int32))
    q = poison(NQ)
    kc, vc = cp.zeros((NKV, cap, D), cp.uint16), cp.zeros((NKV, cap, D), cp.uint16)
    fn = getattr(kk, f"g4_qkv_{H // 256}x{rb}")
    fn((blocks,), (256,), (cp.asarray(x), cp.asarray(ln), f32(1e-6), cp.asarray(W), cp.asarray(b), i32(H), i32(NQ),
                           i32(NKVD), q, kc, vc, order, params, i32(3), i32(cap), i32(D)))
    ref = ops.linear(ops.rms_norm(x, bf16_to_f32(ln), 1e-6), bf16_to_f32(W), b)
    assert rel(q.get(), ref[:NQ]) < 1e-5
    slot = int(order[8].get())
    kv_k = bf16_to_f32(kc.get()[:, slot, :].reshape(-1))
    kv_v = bf16_to_f32(vc.get()[:, slot, :].reshape(-1))
    assert rel(kv_k, ref[NQ:NQ + NKVD]) < 5e-3 and rel(kv_v, ref[NQ + NKVD:]) < 5e-3
    assert (np.delete(kc.get(), slot, axis=1) == 0).all() and (np.delete(vc.get(), slot, axis=1) == 0).all()


@pytest.mark.parametrize("H,I,rb,blocks", [(1536, 8960, 1, 132), (1536, 8960, 2, 132), (1536, 8960, 1, 7),
                                           (512, 1024, 2, 3), (512, 1024, 1, 264)])
def test_g4_gateup(kk, H, I, rb, blocks):
    rng = np.random.default_rng()
    x = rng.standard_normal(H).astype(np.float32)
    ln = f32_to_bf16((1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
    W = bf(rng, (2 * I, H), 0.05)
    act = poison(I)
    getattr(kk, f"g4_gateup_{H // 256}x{rb}")((blocks,), (256,), (cp.asarray(x), cp.asarray(ln), f32(1e-6),
                                                                   cp.asarray(W), i32(H), i32(I), act))
    h = ops.rms_norm(x, bf16_to_f32(ln), 1e-6)
    Wf = bf16_to_f32(W)
    assert rel(act.get(), ops.silu_mul(h @ Wf[:I].T, h @ Wf[I:].T)) < 1e-5


@pytest.mark.parametrize("K,N,kv,rb,blocks", [(1536, 1536, 3, 1, 264), (1536, 1536, 3, 2, 264), (1536, 1536, 6, 1, 4),
                                              (8960, 1536, 7, 1, 264), (8960, 1536, 7, 2, 264),
                                              (8960, 1536, 5, 2, 9), (8960, 1536, 1, 2, 264), (512, 256, 2, 1, 3),
                                              (1024, 512, 1, 2, 264), (1024, 512, 4, 1, 264)])
def test_g4_proj_residual(kk, K, N, kv, rb, blocks):
    rng = np.random.default_rng()
    a = rng.standard_normal(K).astype(np.float32)
    W = bf(rng, (N, K), 0.05)
    y0 = rng.standard_normal(N).astype(np.float32)
    y = cp.asarray(y0)
    S = K // 256 // kv
    getattr(kk, f"g4_proj_{kv}x{rb}")((blocks,), (256,), (cp.asarray(a), cp.asarray(W), i32(K), i32(N), y, i32(S)))
    assert rel(y.get() - y0, ops.linear(a, bf16_to_f32(W))) < 1e-5


def test_pdl_chain_launch_matches_plain():
    """The backend's PDL launch path (cuLaunchKernelEx, programmatic serialization) inside a captured graph gives the
    same result as plain launches on a dependent chain (g4 gateup -> down residual, 28 times)."""
    from vla_edge_ros.cuda.backend import CudaBackend
    from vla_edge_ros.cuda.kernels import Kernels

    if int(cp.cuda.Device().compute_capability) < 90:
        pytest.skip("PDL needs sm_90")
    from cuda.bindings import driver as drv

    rng = np.random.default_rng()
    H, I, L = 1536, 8960, 6
    Ws = [(cp.asarray(bf(rng, (2 * I, H), 0.02)), cp.asarray(bf(rng, (H, I), 0.02))) for _ in range(L)]
    ln = cp.asarray(f32_to_bf16((1 + 0.1 * rng.standard_normal(H)).astype(np.float32)))
    x0 = rng.standard_normal(H).astype(np.float32)
    outs = []
    for pdl in (False, True):
        be = CudaBackend.__new__(CudaBackend)
        be.k, be.pdl, be._pdl_prev, be.sms = Kernels(pdl=True), pdl, False, 132
        be._pdl_suspend = False
        drv.cuInit(0)
        be._drv = drv
        attr = drv.CUlaunchAttribute()
        attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        be._pdl_attr = attr
        x, act = cp.asarray(x0), poison(I)
        s = cp.cuda.Stream(non_blocking=True)
        s.begin_capture()
        for wgu, wd in Ws:
            be._launch("g4_gateup_6x1", (132,), (256,), (x, ln, f32(1e-6), wgu, i32(H), i32(I), act), stream=s)
            be._launch("g4_proj_7x1", (264,), (256,), (act, wd, i32(I), i32(H), x, i32(5)), stream=s)
        g = s.end_capture()
        g.launch(s)
        s.synchronize()
        outs.append(x.get())
    # reference on the CPU
    xr = x0.astype(np.float64)
    for wgu, wd in Ws:
        h = ops.rms_norm(xr.astype(np.float32), bf16_to_f32(ln.get()), 1e-6)
        gu = bf16_to_f32(wgu.get())
        xr = xr + ops.linear(ops.silu_mul(h @ gu[:I].T, h @ gu[I:].T), bf16_to_f32(wd.get()))
    assert rel(outs[0], xr) < 1e-4
    assert rel(outs[1], xr) < 1e-4
