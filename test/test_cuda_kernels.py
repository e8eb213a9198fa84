# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
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

try:  # collected without CuPy too: conftest skips each gpu case with its reason, so CI counts them
    import cupy as cp
except ImportError:
    cp = None


class _TypedLaunchers:
    """cuda.launch's typed launchers, imported on first use (the module needs CuPy; CI collects without it)."""

    def __getattr__(self, name):
        from vla_edge_ros.cuda import launch

        return getattr(launch, name)


L = _TypedLaunchers()


@pytest.fixture(scope="module")
def k():
    from vla_edge_ros.cuda.kernels import Kernels

    return Kernels()


def rel(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    assert np.isfinite(out).all(), "unwritten (NaN-poisoned) or non-finite output"
    return np.linalg.norm(out - ref) / np.linalg.norm(ref)


def bf(rng, shape, scale=1.0):
    return f32_to_bf16((scale * rng.standard_normal(shape)).astype(np.float32))


def act16(rng, shape, xfmt):
    """Random 16-bit activations as the GEMMs take them: bf16 bits, or fp16 bits (xfmt "fp16")."""
    if xfmt == "bf16":
        return bf(rng, shape)
    return rng.standard_normal(shape).astype(np.float16).view(np.uint16)


def w16(rng, shape, scale, fmt):
    """A random 16-bit weight as the device holds it: (bits, float32 values). fmt "bf16": bf16 bits; "f16": the same
    bf16 values converted to fp16 (a bf16 model stored in fp16: CudaBackend._linear), the values read back from fp16."""
    b = bf(rng, shape, scale)
    if fmt == "bf16":
        return b, bf16_to_f32(b)
    h = bf16_to_f32(b).astype(np.float16)
    return h.view(np.uint16), h.astype(np.float32)


def from16(bits, xfmt):
    """float32 values of 16-bit activation bits in format xfmt."""
    bits = np.asarray(bits, np.uint16)
    return bf16_to_f32(bits) if xfmt == "bf16" else bits.view(np.float16).astype(np.float32)


def poison(shape, dtype=np.float32):
    a = cp.empty(shape, dtype)
    if dtype == np.float32:
        a.fill(np.nan)
    else:
        a.fill(0xFFFF)  # bf16 NaN bits
    return a


i32 = np.int32


def gemm(k, fmt, rows, xfmt=None, z=1):
    from vla_edge_ros.cuda.launch import Gemm

    return Gemm(k, fmt, rows, xfmt=xfmt, zsplit=z)


def gemv(k, fmt):
    from vla_edge_ros.cuda.launch import Gemv

    return Gemv(k, fmt)


def attention(*args, **kw):
    from vla_edge_ros.cuda.launch import attention as launch_attention

    return launch_attention(*args, **kw)


# (buffer rows, token slices over grid.z): 96 rows whole, and as two 48-row slices (launch.gemm_token_split)
GEMM_ROWS_Z = [(32, 1), (48, 1), (96, 1), (96, 2)]


@pytest.mark.parametrize("rows,z", GEMM_ROWS_Z)
@pytest.mark.parametrize("N,K,mode,ks", [(128, 512, "store", 1), (1024, 1536, "add", 5), (128, 8960, "add", 7),
                                         (512, 8960, "store", 1), (2048, 1536, "add", 24), (256, 128, "add", 3),
                                         # 0.5B q/k/v, down; 3B q/k/v, down; the text head's store over many rows
                                         (1152, 896, "add", 5), (896, 4864, "add", 19), (2560, 2048, "add", 4),
                                         (2048, 11008, "add", 43), (8064, 896, "store", 1)])
@pytest.mark.parametrize("fmt", ["bf16", "f16"])
def test_gemm_16bit(k, fmt, rows, z, N, K, mode, ks):
    """kernels/gemm.cu, 16-bit weights (bf16 with bf16 X; fp16 with fp16 X, gemm_f16_*): store, and split-K
    accumulation (ks slices, some empty) onto Y; z token slices over grid.z."""
    rng = np.random.default_rng()
    xfmt = "bf16" if fmt == "bf16" else "fp16"
    X, (W, wf) = act16(rng, (rows, K), xfmt), w16(rng, (N, K), 0.05, fmt)
    y0 = rng.standard_normal((rows, N)).astype(np.float32)
    Y = cp.asarray(y0) if mode == "add" else poison((rows, N))
    g = gemm(k, fmt, rows, z=z)
    assert g.xfmt == xfmt and g.name == f"gemm_{fmt}_t{rows // z}" and g.kernel_rows == rows
    g(cp.asarray(X), cp.asarray(W), N, K, mode, Y=Y, ks=ks)
    ref = from16(X, xfmt) @ wf.T + (y0 if mode == "add" else 0)
    # fp32 sums of 8960 products in another order than NumPy's: measured 1.0e-5 at K = 8960
    assert rel(Y.get(), ref) < 3e-5


def test_gemm_refuses_activations_of_another_format(k):
    """The tensor cores multiply both operands in one format: 16-bit weights take X of their own format only (a bf16
    X read as fp16 bits, or the reverse, would be wrong values, not an error)."""
    from vla_edge_ros.cuda.launch import Gemm

    for fmt, xfmt in (("f16", "bf16"), ("bf16", "fp16")):
        with pytest.raises(ValueError, match=f"no prefill GEMM for {fmt} weights with {xfmt} activations"):
            Gemm(k, fmt, 32, xfmt=xfmt)
    assert Gemm(k, "f16", 32).xfmt == "fp16" and Gemm(k, "bf16", 32).xfmt == "bf16"
    assert Gemm(k, "w4", 32, xfmt="fp16").name == "gemm_w4h_t32"


def swiglu_twin(X, w, inter):
    """The fused gate/up + SwiGLU (mode "swiglu") from the twins: ops.linear on [gate; up], then ops.silu_mul."""
    gu = ops.linear(X, w)
    return ops.silu_mul(gu[:, :inter], gu[:, inter:])


@pytest.mark.parametrize("fmt,xfmt", [("bf16", "bf16"), ("f16", "fp16"), ("w4", "bf16"), ("w4", "fp16")])
@pytest.mark.parametrize("rows,z,inter,K", [(32, 1, 8960, 1536), (48, 1, 8960, 1536), (48, 1, 256, 512),
                                            (32, 1, 4864, 896), (48, 1, 4864, 896), (32, 1, 11008, 2048),
                                            # 96 rows: 32 vision + 64 action queries (8 actions); whole, and as two
                                            # 48-row token slices
                                            (96, 1, 8960, 1536), (96, 1, 4864, 896), (96, 1, 256, 512),
                                            (96, 2, 8960, 1536), (96, 2, 4864, 896), (96, 2, 256, 512)])
def test_gemm_swiglu(k, fmt, xfmt, rows, z, inter, K):
    """Mode "swiglu": act = silu(X Wg^T) * (X Wu^T) in bf16, W = [gate rows; up rows] (the backend's wgu); the fp16
    instances (gemm_f16_*, gemm_w4h_*) take X and write act in fp16. z: token slices over grid.z (every row of each
    slice multiplied)."""
    rng = np.random.default_rng()
    X = act16(rng, (rows, K), xfmt)
    if fmt == "w4":
        Q, SZ, sbf, w = w4_random(rng, 2 * inter, K, "float16")
        wdev = (Q, SZ, sbf)
    else:
        wb, w = w16(rng, (2 * inter, K), 0.05, fmt)
        wdev = cp.asarray(wb)
    act = poison((rows, inter), np.uint16)  # NaN in bf16 and in fp16
    gemm(k, fmt, rows, xfmt, z)(cp.asarray(X), wdev, 2 * inter, K, "swiglu", act=act)
    real = 40 if fmt == "w4" and rows == 48 else rows  # the 4-bit body multiplies a 48-row buffer's 40 real rows
    out = from16(act.get(), xfmt)
    ref = swiglu_twin(from16(X[:real], xfmt), w, inter)
    b16 = xfmt == "bf16"  # the output's rounding: 8 significant bits, or fp16's 11
    assert rel(out[:real], ref) < (5e-3 if b16 else 7e-4)
    assert np.abs(out[:real] - ref).max() <= (2 ** -7 if b16 else 2 ** -10) * np.abs(ref).max() + 1e-6
    assert np.isnan(out[real:]).all()  # rows past the real ones are not written


@pytest.mark.parametrize("T,n_prefix,nsplit,group,bidir_from,D", [
    (1, 4000, 128, 6, 1, 128), (1, 4036, 128, 6, 1, 128), (1, 4000, 16, 6, 1, 128), (1, 0, 128, 2, 1, 128),
    (1, 100, 128, 6, 1, 128), (32, 3000, 22, 6, 32, 128), (32, 17, 8, 2, 32, 128), (40, 3000, 22, 6, 32, 128),
    (40, 17, 8, 6, 32, 128), (40, 0, 4, 2, 32, 128),
    # the 0.5B shape (head_dim 64, 7 query heads a KV head) and the 3B one (128, 8)
    (1, 4000, 64, 7, 1, 64), (1, 4055, 64, 7, 1, 64), (1, 0, 64, 7, 1, 64), (1, 100, 16, 7, 1, 64),
    (32, 3000, 22, 7, 32, 64), (32, 17, 8, 7, 32, 64), (40, 3000, 22, 7, 32, 64), (40, 0, 4, 7, 32, 64),
    (7, 29, 3, 7, 7, 64), (1, 4000, 64, 8, 1, 128), (32, 3000, 16, 8, 32, 128), (40, 100, 8, 8, 32, 128),
    # 8 planned actions: 32 vision + 64 action queries (9 / 11 / 12 row groups a KV head; one split on 8 SMs)
    (96, 3000, 15, 6, 32, 128), (96, 17, 1, 6, 32, 128), (96, 3000, 12, 7, 32, 64), (96, 0, 3, 7, 32, 64),
    (96, 100, 11, 8, 32, 128), (96, 300, 4, 2, 32, 128)])
def test_attention_partial_combine(k, T, n_prefix, nsplit, group, bidir_from, D):
    """attn_partial/attn_combine: causal by index, and rows t >= bidir_from (parallel action queries) see every
    key of the call."""
    rng = np.random.default_rng()
    NKV, cap, theta = 2, 4096 + 64, 1e6
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
    part_o.fill(np.nan)
    part_ml.fill(np.nan)
    out, outb = poison((T, NH * D)), poison((T, NH * D), np.uint16)
    attention(k, qd, NH * D, cp.asarray(kc), cp.asarray(vc), order_d, params, 0, T, NKV, group, cap, cp.asarray(cos),
              cp.asarray(sin), bidir_from, nsplit, part_o, part_ml, out, outb)
    ref = ops.cache_attention(q, bf16_to_f32(kc), bf16_to_f32(vc), order, cos, sin, n_prefix, bidir_from)
    assert rel(out.get(), ref) < 1e-2
    assert rel(bf16_to_f32(outb.get()), ref) < 1.5e-2
    # and the largest error: bf16 Q, K and P on the tensor cores (a wrong rotation or mask moves single rows far)
    assert np.abs(out.get() - ref).max() < 0.05 * np.abs(ref).max()
    # attn_combine_h_<D> (the 4-bit GEMMs' fp16 input): the same fp32 output, its 16-bit copy as fp16 of it
    out2, outh = poison((T, NH * D)), poison((T, NH * D), np.uint16)
    part_o.fill(np.nan)
    part_ml.fill(np.nan)
    attention(k, qd, NH * D, cp.asarray(kc), cp.asarray(vc), order_d, params, 0, T, NKV, group, cap, cp.asarray(cos),
              cp.asarray(sin), bidir_from, nsplit, part_o, part_ml, out2, outh, out_f16=True)
    assert (out2.get() == out.get()).all()
    assert (outh.get() == out.get().astype(np.float16).view(np.uint16)).all()


@pytest.mark.parametrize("D", [64, 128])
def test_attention_residency_is_what_the_plan_assumes(k, D):
    """vram_plan.ATT_RESIDENT (the prefill's split rule counts waves with it) is the occupancy API's answer for the
    prefill's partial kernel, attn_partial_w8_<D> (256 threads, its dynamic shared memory)."""
    from vla_edge_ros.vram_plan import ATT_RESIDENT

    la = L.Launcher(k, cp.cuda.Stream(non_blocking=True))
    name, warps = L.att_partial_name(D, 32)
    assert warps == 8
    smem = L.att_smem_bytes(D, warps)
    L._set_max_dynamic_smem(getattr(k, name), smem)
    assert la.blocks_per_sm(name, 32 * warps, fallback=0, smem=smem) == ATT_RESIDENT[D]


@pytest.mark.parametrize("H,rows", [(1536, 256), (896, 256), (2048, 256), (896, 4224)])
def test_lm_head_argmax(k, H, rows):
    """The action head (256 rows), and the full-vocabulary head GEMV of text_logits (any multiple of 8 rows)."""
    rng = np.random.default_rng()
    V0 = 151936 - 256
    x = rng.standard_normal(H).astype(np.float32)
    ln = f32_to_bf16((1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
    head = bf(rng, (rows, H), 0.05)
    logits = poison((8, rows))
    ticket = cp.zeros(1, cp.int32)
    tokidx = cp.full(1, -1, cp.int32)
    tokens = cp.full(8, -7, cp.int32)
    for step in range(2):
        L.lm_head_argmax(k, cp.asarray(x), cp.asarray(ln), 1e-6, H, cp.asarray(head), logits[step], ticket, tokidx,
                         tokens, step, V0)
    ref = ops.rms_norm(x, bf16_to_f32(ln), 1e-6) @ bf16_to_f32(head).T
    got = logits.get()[1]
    assert rel(got, ref) < 1e-5
    assert int(tokidx.get()[0]) == int(np.argmax(got))  # first index of the device's own maximum
    assert int(tokens.get()[1]) == V0 + int(np.argmax(got))
    assert int(ticket.get()[0]) == 0  # ticket reset for the next launch
    # ties: all-equal logits pick the first index
    L.lm_head_argmax(k, cp.zeros(H, cp.float32) + 1, cp.asarray(ln), 1e-6, H, cp.zeros((rows, H), cp.uint16),
                     logits[2], ticket, tokidx, tokens, 2, V0)
    assert int(tokidx.get()[0]) == 0


def test_lm_head_argmax_over_many_rows_in_one_launch(k):
    """n_x rows of x in one launch (a parallel chunk's K x 8 action rows): row r's logits, its own ticket and token
    tokens[step + r] as n_x launches of one row would give; a non-finite row gives -1 at its own place only."""
    rng = np.random.default_rng()
    H, V0, n = 1536, 151936 - 256, 64
    x = rng.standard_normal((n, H)).astype(np.float32)
    x[37, 5] = np.nan
    ln = f32_to_bf16((1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
    head = bf(rng, (256, H), 0.05)
    logits = poison((n, 256))
    ticket = cp.zeros(n, cp.int32)
    tokidx = cp.full(1, -1, cp.int32)
    tokens = cp.full(n + 2, -7, cp.int32)
    L.lm_head_argmax(k, cp.asarray(x), cp.asarray(ln), 1e-6, H, cp.asarray(head), logits, ticket, tokidx, tokens, 1,
                     V0, n_x=n)
    with np.errstate(all="ignore"):
        ref = ops.rms_norm(x, bf16_to_f32(ln), 1e-6) @ bf16_to_f32(head).T
    got, toks = logits.get(), tokens.get()
    finite = np.arange(n) != 37
    assert rel(got[finite], ref[finite]) < 1e-5
    want = np.where(finite, V0 + np.argmax(np.where(np.isfinite(got), got, -np.inf), axis=1), -1)
    np.testing.assert_array_equal(toks[1:n + 1], want)
    assert toks[0] == -7 and toks[n + 1] == -7  # nothing outside tokens[step .. step + n)
    assert (ticket.get() == 0).all()  # every row's ticket reset
    assert int(tokidx.get()[0]) == int(np.argmax(got[0]))  # row 0's index


def test_lm_head_argmax_non_finite_gives_minus_one(k):
    """A NaN or an inf anywhere in the hidden vector or the head rows: token -1 and row index 0 (a following decode
    pass gathers a valid row); the same launch on a finite row afterwards still matches the twin."""
    rng = np.random.default_rng()
    H, V0 = 1536, 151936 - 256
    ln = cp.asarray(f32_to_bf16((1 + 0.1 * rng.standard_normal(H)).astype(np.float32)))
    logits = poison((8, 256))
    ticket = cp.zeros(1, cp.int32)
    tokidx = cp.full(1, -1, cp.int32)
    tokens = cp.full(8, -7, cp.int32)

    def run(x, head, step):
        tokidx.fill(-1)
        L.lm_head_argmax(k, cp.asarray(x), ln, 1e-6, H, cp.asarray(head), logits[step], ticket, tokidx, tokens, step,
                         V0)
        return int(tokens.get()[step]), int(tokidx.get()[0])

    nan_bf16, pinf_bf16, ninf_bf16 = np.uint16(0x7FC0), np.uint16(0x7F80), np.uint16(0xFF80)
    cases = []
    for bad in (np.nan, np.inf, -np.inf):  # in the hidden vector
        x = rng.standard_normal(H).astype(np.float32)
        x[rng.integers(H)] = bad
        cases.append((x, bf(rng, (256, H), 0.05)))
    for bad in (nan_bf16, pinf_bf16, ninf_bf16):  # in one head row
        head = bf(rng, (256, H), 0.05)
        head[rng.integers(256), rng.integers(H)] = bad
        cases.append((rng.standard_normal(H).astype(np.float32), head))
    for step, (x, head) in enumerate(cases):
        tok, idx = run(x, head, step % 8)
        with np.errstate(all="ignore"):
            ref = ops.argmax_rows((ops.rms_norm(x, bf16_to_f32(cp.asnumpy(ln)), 1e-6)
                                   @ bf16_to_f32(head).T)[None].astype(np.float32))[0]
        assert ref == -1  # the twin agrees that this row is non-finite
        assert (tok, idx) == (-1, 0), f"case {step}: token {tok}, row index {idx}"
        assert int(ticket.get()[0]) == 0
    x = rng.standard_normal(H).astype(np.float32)  # a finite row after them
    head = bf(rng, (256, H), 0.05)
    tok, idx = run(x, head, 7)
    got = logits.get()[7]
    ref = ops.rms_norm(x, bf16_to_f32(cp.asnumpy(ln)), 1e-6) @ bf16_to_f32(head).T
    assert rel(got, ref) < 1e-5
    assert idx == int(np.argmax(got)) and tok == V0 + idx


@pytest.mark.parametrize("H", [1536, 896, 2048])
def test_vision_encode(k, H):
    rng = np.random.default_rng()
    frame = rng.integers(0, 256, (64, 128, 3), dtype=np.uint8)
    W, b, pe = bf(rng, (H, 768), 0.02), bf(rng, (H,), 0.02), bf(rng, (32, H), 0.02)
    x, pooled = poison((32, H)), poison(H)
    L.vision_encode(k, cp.asarray(frame), cp.asarray(W), cp.asarray(b), cp.asarray(pe), H, x, pooled)
    ref = ops.vision_encode(frame, bf16_to_f32(W), bf16_to_f32(b), bf16_to_f32(pe))
    assert rel(x.get(), ref) < 1e-5
    assert rel(pooled.get(), ref.mean(axis=0)) < 1e-5


@pytest.mark.parametrize("xfmt", ["bf16", "fp16"])
@pytest.mark.parametrize("H,N,T", [(256, 0, 3), (1280, 1792, 40), (2048, 2560, 48), (896, 1152, 32), (896, 0, 40)])
def test_rmsnorm_bf16_sizes(k, xfmt, H, N, T):
    """The prefill norm at the edges of its register plan (H = 256 .. 2048), with and without the bias rows; its
    output as bf16 (rmsnorm_bf16) or fp16 (rmsnorm_f16, the 4-bit GEMMs' fp16 input)."""
    rng = np.random.default_rng()
    x = (3 * rng.standard_normal((T, H))).astype(np.float32)
    ln = f32_to_bf16((1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
    out = poison((T, H), np.uint16)
    bias = y = None
    if N:
        bias = rng.standard_normal(N).astype(np.float32)
        y = poison((T, N))
    L.rmsnorm_bf16(k, cp.asarray(x), cp.asarray(ln), 1e-6, H, T, out, None if bias is None else cp.asarray(bias), N, y,
                   f16=xfmt == "fp16")
    ref = ops.rms_norm(x, bf16_to_f32(ln), 1e-6)
    got = from16(out.get(), xfmt)
    assert rel(got, ref) < (5e-3 if xfmt == "bf16" else 6e-4)
    if xfmt == "fp16":  # fp16's rounding of the fp32 row: within one unit of its last place of the twin's rounding
        assert np.abs(got - ref.astype(np.float16).astype(np.float32)).max() <= 2 ** -10 * np.abs(ref).max()
    if N:
        assert (y.get() == bias[None, :]).all()


def test_rmsnorm_of_an_overflowing_row_is_nan_like_its_twin(k):
    """A row whose mean square overflows float32 is NaN (not the zeros rsqrtf(inf) gives), in the prefill norm, as
    ops.rms_norm: the head's non-finite check then sees it (issue 19)."""
    rng = np.random.default_rng()
    H = 1536
    x = rng.standard_normal((4, H)).astype(np.float32)
    x[2] *= np.float32(1e20)  # finite, but sum(x^2) is not
    ln = f32_to_bf16((1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
    ref = ops.rms_norm(x, bf16_to_f32(ln), 1e-6)
    assert np.isnan(ref[2]).all() and np.isfinite(np.delete(ref, 2, axis=0)).all()
    out = poison((4, H), np.uint16)
    L.rmsnorm_bf16(k, cp.asarray(x), cp.asarray(ln), 1e-6, H, 4, out)
    got = bf16_to_f32(out.get())
    assert np.isnan(got[2]).all()
    assert rel(np.delete(got, 2, axis=0), np.delete(ref, 2, axis=0)) < 5e-3


@pytest.mark.parametrize("H,NKV,D", [(896, 2, 64), (2048, 2, 128)])
def test_gather_and_kv_write_other_shapes(k, H, NKV, D):
    """embed_gather at a hidden size that is not a multiple of 256, kv_write at head_dim 64 / the 3B's widths."""
    rng = np.random.default_rng()
    table, start, xo = bf(rng, (256, H)), bf(rng, (H,)), poison(H)
    for idx, ref in [(-1, start), (255, table[255])]:
        L.embed_gather(k, cp.asarray(table), cp.asarray(start), cp.asarray(np.array([idx], np.int32)), H, xo)
        assert (xo.get() == bf16_to_f32(ref)).all()
    NQ, NKVD, cap, T = H, NKV * D, 96, 32
    qkv = rng.standard_normal((T, NQ + 2 * NKVD)).astype(np.float32)
    order = rng.permutation(cap).astype(np.int32)
    kc, vc = cp.zeros((NKV, cap, D), cp.uint16), cp.zeros((NKV, cap, D), cp.uint16)
    params = cp.asarray(np.array([40, 0, 0, 0], np.int32))
    L.kv_write(k, cp.asarray(qkv), T, NQ, NKVD, D, kc, vc, cp.asarray(order), params, 0, cap)
    kh, vh = kc.get(), vc.get()
    for t in range(T):
        s = order[40 + t]
        assert (kh[:, s, :].reshape(-1) == f32_to_bf16(qkv[t, NQ:NQ + NKVD])).all()
        assert (vh[:, s, :].reshape(-1) == f32_to_bf16(qkv[t, NQ + NKVD:])).all()
    untouched = np.setdiff1d(np.arange(cap), order[40:40 + T])
    assert (kh[:, untouched] == 0).all() and (vh[:, untouched] == 0).all()


def test_rmsnorm_swiglu_gather_kvwrite_stamp(k):
    rng = np.random.default_rng()
    H, N = 1536, 2048
    x = rng.standard_normal((32, H)).astype(np.float32)
    ln = f32_to_bf16((1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
    bias = rng.standard_normal(N).astype(np.float32)
    out, y = poison((32, H), np.uint16), poison((32, N))
    L.rmsnorm_bf16(k, cp.asarray(x), cp.asarray(ln), 1e-6, H, 32, out, cp.asarray(bias), N, y)
    assert rel(bf16_to_f32(out.get()), ops.rms_norm(x, bf16_to_f32(ln), 1e-6)) < 5e-3
    assert (y.get() == bias[None, :]).all()
    table = bf(rng, (256, H))
    start = bf(rng, (H,))
    xo = poison(H)
    for idx, ref in [(-1, start), (7, table[7])]:
        L.embed_gather(k, cp.asarray(table), cp.asarray(start), cp.asarray(np.array([idx], np.int32)), H, xo)
        assert (xo.get() == bf16_to_f32(ref)).all()
    NQ, NKVD, D, cap, T = 512, 256, 128, 128, 5
    qkv = rng.standard_normal((T, NQ + 2 * NKVD)).astype(np.float32)
    order = rng.permutation(cap).astype(np.int32)
    kc, vc = cp.zeros((2, cap, D), cp.uint16), cp.zeros((2, cap, D), cp.uint16)
    params = cp.asarray(np.array([10, 0, 0, 0], np.int32))
    L.kv_write(k, cp.asarray(qkv), T, NQ, NKVD, D, kc, vc, cp.asarray(order), params, 2, cap)
    for t in range(T):
        s = order[12 + t]
        assert (kc.get()[:, s, :].reshape(-1) == f32_to_bf16(qkv[t, NQ:NQ + NKVD])).all()
        assert (vc.get()[:, s, :].reshape(-1) == f32_to_bf16(qkv[t, NQ + NKVD:])).all()
    ts = cp.zeros(2, cp.uint64)
    L.stamp(k, ts, 0)
    gemm(k, "bf16", 32)(cp.asarray(bf(rng, (32, 8960))), cp.asarray(bf(rng, (4096, 8960))), 4096, 8960, "store",
                        Y=cp.zeros((32, 4096), cp.float32))
    L.stamp(k, ts, 1)
    t = ts.get()
    assert t[1] > t[0] > 0


# ---------------------------------------------------------------------------------- decode GEMVs (gemv.cu)
@pytest.mark.parametrize("H,NQ,NKV,blocks,D", [(1536, 1536, 2, 264, 128), (1536, 1536, 2, 5, 128),
                                               (512, 512, 2, 3, 128), (512, 256, 1, 264, 128),
                                               (2048, 2048, 2, 264, 128), (896, 896, 2, 264, 64),
                                               (896, 896, 2, 5, 64), (640, 640, 1, 264, 64)])
@pytest.mark.parametrize("fmt", ["bf16", "f16"])
def test_g4_qkv_writes_q_and_kv_slot(k, fmt, H, NQ, NKV, blocks, D):
    rng = np.random.default_rng()
    cap = 64
    NKVD = NKV * D
    N = NQ + 2 * NKVD
    x = rng.standard_normal(H).astype(np.float32)
    ln = f32_to_bf16((1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
    (W, wf), b = w16(rng, (N, H), 0.05, fmt), rng.standard_normal(N).astype(np.float32)
    order = cp.asarray(rng.permutation(cap).astype(np.int32))
    params = cp.asarray(np.array([5, -1, 0, 0], np.int32))
    q = poison(NQ)
    kc, vc = cp.zeros((NKV, cap, D), cp.uint16), cp.zeros((NKV, cap, D), cp.uint16)
    gemv(k, fmt).qkv(cp.asarray(x), cp.asarray(ln), 1e-6, cp.asarray(W), cp.asarray(b), H, NQ, NKVD, q, kc, vc,
                     order, params, 3, cap, D, blocks)
    ref = ops.linear(ops.rms_norm(x, bf16_to_f32(ln), 1e-6), wf, b)
    assert rel(q.get(), ref[:NQ]) < 1e-5
    slot = int(order[8].get())
    kv_k = bf16_to_f32(kc.get()[:, slot, :].reshape(-1))
    kv_v = bf16_to_f32(vc.get()[:, slot, :].reshape(-1))
    assert rel(kv_k, ref[NQ:NQ + NKVD]) < 5e-3 and rel(kv_v, ref[NQ + NKVD:]) < 5e-3
    assert (np.delete(kc.get(), slot, axis=1) == 0).all() and (np.delete(vc.get(), slot, axis=1) == 0).all()


@pytest.mark.parametrize("H,inter,blocks", [(1536, 8960, 132), (1536, 8960, 7), (512, 1024, 3), (512, 1024, 264),
                                            (896, 4864, 132), (896, 4864, 5), (2048, 11008, 132), (384, 640, 264)])
@pytest.mark.parametrize("fmt", ["bf16", "f16"])
def test_g4_gateup(k, fmt, H, inter, blocks):
    I = inter  # noqa: E741 - the intermediate size is I everywhere else
    rng = np.random.default_rng()
    x = rng.standard_normal(H).astype(np.float32)
    ln = f32_to_bf16((1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
    W, Wf = w16(rng, (2 * I, H), 0.05, fmt)
    act = poison(I)
    gemv(k, fmt).gateup(cp.asarray(x), cp.asarray(ln), 1e-6, cp.asarray(W), H, I, act, blocks)
    h = ops.rms_norm(x, bf16_to_f32(ln), 1e-6)
    assert rel(act.get(), ops.silu_mul(h @ Wf[:I].T, h @ Wf[I:].T)) < 1e-5


@pytest.mark.parametrize("K,N,kv,blocks", [(1536, 1536, 3, 264), (1536, 1536, 6, 4), (8960, 1536, 7, 264),
                                           (8960, 1536, 5, 9), (8960, 1536, 1, 264), (512, 256, 2, 3),
                                           (1024, 512, 4, 264),
                                           # K not a multiple of 256 kv: the last segment partial (0.5B o, down; 3B)
                                           (896, 896, 2, 264), (896, 896, 3, 264), (896, 896, 4, 7),
                                           (4864, 896, 7, 264), (4864, 896, 5, 9), (4864, 896, 1, 264),
                                           (11008, 2048, 7, 264), (11008, 2048, 5, 264), (2048, 2048, 3, 264),
                                           (384, 128, 8, 3)])
@pytest.mark.parametrize("fmt", ["bf16", "f16"])
def test_g4_proj_residual(k, fmt, K, N, kv, blocks):
    rng = np.random.default_rng()
    a = rng.standard_normal(K).astype(np.float32)
    W, wf = w16(rng, (N, K), 0.05, fmt)
    y0 = rng.standard_normal(N).astype(np.float32)
    y = cp.asarray(y0)
    gemv(k, fmt).proj(cp.asarray(a), cp.asarray(W), K, N, y, kv, blocks)
    assert rel(y.get() - y0, ops.linear(a, wf)) < 1e-5


def test_pdl_chain_launch_matches_plain(k):
    """The Launcher's PDL path (cuLaunchKernelEx, programmatic serialization) inside a captured graph gives the
    same result as plain launches on a dependent chain (gate/up -> down residual, 6 layers)."""
    from vla_edge_ros.cuda.launch import Launcher

    if int(cp.cuda.Device().compute_capability) < 90:
        pytest.skip("PDL needs sm_90")
    rng = np.random.default_rng()
    H, I, L = 1536, 8960, 6
    Ws = [(cp.asarray(bf(rng, (2 * I, H), 0.02)), cp.asarray(bf(rng, (H, I), 0.02))) for _ in range(L)]
    ln = cp.asarray(f32_to_bf16((1 + 0.1 * rng.standard_normal(H)).astype(np.float32)))
    x0 = rng.standard_normal(H).astype(np.float32)
    outs = []
    for pdl in (False, True):
        s = cp.cuda.Stream(non_blocking=True)
        go = Launcher(k, s, pdl=pdl)
        assert go.pdl == pdl
        x, act = cp.asarray(x0), poison(I)
        s.begin_capture()
        for wgu, wd in Ws:
            gemv(k, "bf16").gateup(x, ln, 1e-6, wgu, H, I, act, 132, run=go)
            gemv(k, "bf16").proj(act, wd, I, H, x, 7, 264, run=go)
        g = s.end_capture()
        g.launch(s)
        s.synchronize()
        outs.append(x.get())
    xr = x0.astype(np.float64)
    for wgu, wd in Ws:
        h = ops.rms_norm(xr.astype(np.float32), bf16_to_f32(ln.get()), 1e-6)
        gu = bf16_to_f32(wgu.get())
        xr = xr + ops.linear(ops.silu_mul(h @ gu[:I].T, h @ gu[I:].T), bf16_to_f32(wd.get()))
    assert rel(outs[0], xr) < 1e-4
    assert rel(outs[1], xr) < 1e-4


# ------------------------------------------------------------------------------ 4-bit weights (gemv.cu, gemm.cu) --
def w4_random(rng, N, K, scale_dtype):
    """Random 4-bit weight: (Q uint32 [N, K/8], SZ uint32 [N, K/128], sbf, dequantized float32 [N, K]), packed here
    independently of the backend (nibble k of word j = element 8j+k)."""
    q = rng.integers(0, 16, (N, K)).astype(np.uint32)
    z = rng.integers(0, 16, (N, K // 128)).astype(np.uint32)
    s = (rng.uniform(0.5, 1.5, (N, K // 128)) * 0.01).astype(np.float32)
    if scale_dtype == "bfloat16":
        bits = f32_to_bf16(s).astype(np.uint32)
        s = bf16_to_f32(bits.astype(np.uint16))
        sbf = 1
    else:
        s = s.astype(np.float16).astype(np.float32)
        bits = s.astype(np.float16).view(np.uint16).astype(np.uint32)
        sbf = 0
    Q = np.zeros((N, K // 8), np.uint32)
    for kk in range(8):
        Q |= q[:, kk::8] << (4 * kk)
    SZ = bits | (z << 16)
    w = (q.astype(np.float32) - np.repeat(z, 128, axis=1).astype(np.float32)) * np.repeat(s, 128, axis=1)
    return cp.asarray(Q), cp.asarray(SZ), i32(sbf), w


def w4_quant_tensor(Q, SZ, scale_dtype):
    """The QuantTensor the packed arrays w4_random made stand for (scale bits and zeros read back from SZ)."""
    from vla_edge_ros.model.quant import QuantTensor

    sz = SZ.get()
    bits = (sz & 0xFFFF).astype(np.uint16)
    scales = bf16_to_f32(bits) if scale_dtype == "bfloat16" else bits.view(np.float16).astype(np.float32)
    return QuantTensor(qweight=Q.get(), scales=scales, zeros=(sz >> 16).astype(np.uint8), scale_dtype=scale_dtype,
                       fmt="awq")


def test_w4_device_arrays_match_the_test_packing():
    """The backend's QuantTensor -> (Q, SZ) conversion puts scale bits and zeros where the kernels read them."""
    from vla_edge_ros.cuda.backend import w4_device_arrays

    rng = np.random.default_rng()
    for dt in ("float16", "bfloat16"):
        Q, SZ, sbf, w = w4_random(rng, 64, 256, dt)
        qt = w4_quant_tensor(Q, SZ, dt)
        q2, sz2, sbf2 = w4_device_arrays(qt)
        assert (q2 == Q.get()).all() and (sz2 == SZ.get()).all() and sbf2 == int(sbf)
        assert np.array_equal(qt.dequantize(), w)


W4_GEMM_CASES = [(32, 128, 512, "store", 1), (32, 1024, 1536, "add", 5), (32, 128, 8960, "add", 7),
                 (48, 128, 1536, "store", 1), (48, 512, 8960, "add", 44), (48, 17920, 1536, "store", 1),
                 (48, 1536, 256, "add", 2), (32, 1152, 896, "add", 7), (48, 896, 4864, "add", 19),
                 (32, 2560, 2048, "add", 8), (48, 2048, 11008, "add", 43), (32, 896, 896, "store", 1),
                 (96, 128, 1536, "store", 1), (96, 512, 8960, "add", 44), (96, 1536, 256, "add", 2),
                 (96, 1152, 896, "add", 7), (96, 896, 4864, "add", 19), (96, 2048, 11008, "add", 43)]


@pytest.mark.parametrize("scale_dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("rows,z,N,K,mode,ks", [(c[0], 1) + c[1:] for c in W4_GEMM_CASES]
                         + [(96, 2) + c[1:] for c in W4_GEMM_CASES if c[0] == 96])
@pytest.mark.parametrize("xfmt", ["bf16", "fp16"])
def test_gemm_w4(k, xfmt, scale_dtype, rows, z, N, K, mode, ks):
    """kernels/gemm.cu, 4-bit weights (fp16 or bf16 scales, zero points), store and split-K accumulation: the
    twin multiplies the exact dequantized weights (QuantTensor.dequantize(), as the GEMV and the golden model), and a
    48-row buffer's 40 real rows are multiplied (rows 40..47 of Y are left as they were). Weights rounded to bf16
    (2^-9 each) are ~1e-3 off: the bound fails them. xfmt "fp16": X in fp16 (gemm_w4h_*, q - z in fp16)."""
    rng = np.random.default_rng()
    Q, SZ, sbf, w = w4_random(rng, N, K, scale_dtype)
    X = act16(rng, (rows, K), xfmt)
    y0 = rng.standard_normal((rows, N)).astype(np.float32)
    Y = cp.asarray(y0) if mode == "add" else poison((rows, N))
    g = gemm(k, "w4", rows, xfmt, z)
    assert g.name.endswith(f"_t{40 if rows == 48 else rows // z}")
    g(cp.asarray(X), (Q, SZ, sbf), N, K, mode, Y=Y, ks=ks)
    real = 40 if rows == 48 else rows
    ref = from16(X[:real], xfmt) @ w.T + (y0[:real] if mode == "add" else 0)
    out = Y.get()
    assert rel(out[:real], ref) < 3e-5
    if mode == "add":
        assert (out[real:] == y0[real:]).all()


@pytest.mark.parametrize("scale_dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("H,NQ,NKV,blocks,D", [(1536, 1536, 2, 264, 128), (512, 512, 2, 3, 128),
                                               (2048, 2048, 2, 264, 128), (896, 896, 2, 264, 64),
                                               (896, 896, 2, 5, 64), (640, 640, 1, 264, 64)])
def test_w4_qkv_writes_q_and_kv_slot(k, scale_dtype, H, NQ, NKV, blocks, D):
    rng = np.random.default_rng()
    cap = 64
    NKVD = NKV * D
    N = NQ + 2 * NKVD
    x = rng.standard_normal(H).astype(np.float32)
    ln = f32_to_bf16((1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
    Q, SZ, sbf, w = w4_random(rng, N, H, scale_dtype)
    b = rng.standard_normal(N).astype(np.float32)
    order = cp.asarray(rng.permutation(cap).astype(np.int32))
    params = cp.asarray(np.array([5, -1, 0, 0], np.int32))
    q = poison(NQ)
    kc, vc = cp.zeros((NKV, cap, D), cp.uint16), cp.zeros((NKV, cap, D), cp.uint16)
    gemv(k, "w4").qkv(cp.asarray(x), cp.asarray(ln), 1e-6, (Q, SZ, sbf), cp.asarray(b), H, NQ, NKVD, q, kc, vc, order,
                      params, 3, cap, D, blocks)
    ref = ops.linear(ops.rms_norm(x, bf16_to_f32(ln), 1e-6), w, b)
    assert rel(q.get(), ref[:NQ]) < 1e-5
    slot = int(order[8].get())
    kv_k = bf16_to_f32(kc.get()[:, slot, :].reshape(-1))
    kv_v = bf16_to_f32(vc.get()[:, slot, :].reshape(-1))
    assert rel(kv_k, ref[NQ:NQ + NKVD]) < 5e-3 and rel(kv_v, ref[NQ + NKVD:]) < 5e-3
    assert (np.delete(kc.get(), slot, axis=1) == 0).all() and (np.delete(vc.get(), slot, axis=1) == 0).all()


@pytest.mark.parametrize("scale_dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("H,inter,blocks", [(1536, 8960, 132), (1536, 8960, 7), (512, 1024, 3), (896, 4864, 132),
                                            (896, 4864, 5), (2048, 11008, 132), (384, 640, 264)])
def test_w4_gateup(k, scale_dtype, H, inter, blocks):
    I = inter  # noqa: E741 - the intermediate size is I everywhere else
    rng = np.random.default_rng()
    x = rng.standard_normal(H).astype(np.float32)
    ln = f32_to_bf16((1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
    Qg, SZg, sbf, wg = w4_random(rng, I, H, scale_dtype)
    Qu, SZu, _, wu = w4_random(rng, I, H, scale_dtype)
    act = poison(I)
    W = (cp.concatenate([Qg, Qu]), cp.concatenate([SZg, SZu]), sbf)  # the backend's [gate rows; up rows]
    gemv(k, "w4").gateup(cp.asarray(x), cp.asarray(ln), 1e-6, W, H, I, act, blocks)
    h = ops.rms_norm(x, bf16_to_f32(ln), 1e-6)
    assert rel(act.get(), ops.silu_mul(h @ wg.T, h @ wu.T)) < 1e-5


@pytest.mark.parametrize("scale_dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("K,N,kv,blocks", [(1536, 1536, 3, 264), (8960, 1536, 5, 264), (8960, 1536, 7, 9),
                                           (512, 256, 2, 3), (1024, 512, 1, 264), (896, 896, 2, 264),
                                           (896, 896, 3, 264), (4864, 896, 5, 264), (4864, 896, 7, 9),
                                           (11008, 2048, 5, 264), (11008, 2048, 7, 264), (384, 128, 8, 3)])
def test_w4_proj_residual(k, scale_dtype, K, N, kv, blocks):
    rng = np.random.default_rng()
    a = rng.standard_normal(K).astype(np.float32)
    Q, SZ, sbf, w = w4_random(rng, N, K, scale_dtype)
    y0 = rng.standard_normal(N).astype(np.float32)
    y = cp.asarray(y0)
    gemv(k, "w4").proj(cp.asarray(a), (Q, SZ, sbf), K, N, y, kv, blocks)
    assert rel(y.get() - y0, ops.linear(a, w)) < 1e-5
