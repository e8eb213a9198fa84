# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Kernel launches for the CUDA graph: plain, or with Programmatic Dependent Launch (PDL, sm_90+).

A PDL launch (cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION on the capturing
stream) lets the kernel's blocks start while the previous kernel drains; they run up to their PDL_WAIT
(kernels/common.cuh) and may read constant data (weights) before it. The launcher uses PDL only between two
kernels of a ``dependent`` stretch; ``barrier()`` makes the next launch a plain one (everything before it
completes first). Without a Hopper GPU or cuda-python every launch is plain and the hooks are no-ops.
"""
from __future__ import annotations

import ctypes
import math

import cupy
import numpy as np


def _carg(a):
    if isinstance(a, cupy.ndarray):
        return ctypes.c_void_p(a.data.ptr)
    if isinstance(a, np.int32):
        return ctypes.c_int32(int(a))
    if isinstance(a, np.float32):
        return ctypes.c_float(float(a))
    if isinstance(a, np.uint64):
        return ctypes.c_uint64(int(a))
    raise TypeError(f"kernel argument of type {type(a).__name__}: use numpy scalars or cupy arrays")


def _fn_ptr(fn) -> int | None:
    f = getattr(fn, "kernel", fn)
    ptr = getattr(f, "ptr", None)
    return int(ptr) if ptr else None


class Launcher:
    def __init__(self, kernels, stream, pdl: bool = True):
        self.k = kernels
        self.stream = stream
        self.pdl = False
        self._prev_kernel = False
        self._drv = None
        try:
            from cuda.bindings import driver as drv
        except ImportError:  # no cuda-python: plain launches, still correct (see cooperative below)
            drv = None
        if drv is not None and drv.cuInit(0)[0] == drv.CUresult.CUDA_SUCCESS:
            self._drv = drv
            coop = drv.CUlaunchAttribute()
            coop.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
            coop.value.cooperative = 1
            self._coop = coop
            if pdl and int(cupy.cuda.Device().compute_capability) >= 90:
                attr = drv.CUlaunchAttribute()
                attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
                attr.value.programmaticStreamSerializationAllowed = 1
                self._attr, self.pdl = attr, True

    def barrier(self) -> None:
        """The next launch waits for everything before it (a plain launch)."""
        self._prev_kernel = False

    def __call__(self, name, grid, block, args, shared_mem=0, dependent=True, cooperative=False):
        """Launch kernel ``name``: a programmatic dependent of the previous kernel when ``dependent`` and PDL are on;
        ``cooperative``: all its blocks resident at once or the launch fails (the persistent decode pass's grid
        barriers need that; a plain launch, never PDL). Without cuda-python (or a driver handle for the function) a
        cooperative kernel is launched plainly: its grid is what the occupancy API says fits, so it is resident unless
        another context holds SMs."""
        fn = getattr(self.k, name)
        s = self.stream
        attrs = None
        if cooperative and self._drv is not None:
            attrs = [self._coop]
        elif self.pdl and dependent and self._prev_kernel:
            attrs = [self._attr]
        ptr = _fn_ptr(fn) if attrs is not None else None
        if ptr is not None:
            drv = self._drv
            cargs = [_carg(a) for a in args]
            ptrs = (ctypes.c_void_p * len(cargs))(*[ctypes.addressof(c) for c in cargs])
            g = tuple(grid) + (1,) * (3 - len(grid))
            b = tuple(block) + (1,) * (3 - len(block))
            cfg = drv.CUlaunchConfig()
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = (int(v) for v in g)
            cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = (int(v) for v in b)
            cfg.sharedMemBytes = int(shared_mem)
            cfg.hStream = drv.CUstream(s.ptr)
            cfg.attrs = attrs
            cfg.numAttrs = len(attrs)
            (err,) = drv.cuLaunchKernelEx(cfg, drv.CUfunction(ptr), ctypes.addressof(ptrs), 0)
            if err != drv.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"cuLaunchKernelEx({name}): {err}")
        else:
            fn(tuple(grid), tuple(block), tuple(args), shared_mem=shared_mem, stream=s)
        self._prev_kernel = True

    def blocks_per_sm(self, name: str, threads: int = 256, fallback: int = 1, smem: int = 0) -> int:
        try:
            from cuda.bindings import driver as drv

            err, n = drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                drv.CUfunction(_fn_ptr(getattr(self.k, name))), threads, int(smem))
            if err == drv.CUresult.CUDA_SUCCESS and n > 0:
                return int(n)
        except Exception:  # noqa: BLE001 - no cuda-python: the __launch_bounds__ minimum
            pass
        return fallback


# --------------------------------------------------------------------------------------------- typed launchers
# The prefill GEMM's shape per weight format, as kernels/gemm.cu compiles it (its GEMM_*_BF16 / GEMM_*_W4 defaults):
# bf16 (and f16, the same body on fp16 weights): nt n-tiles of 8 W rows a warp (a block: 4 warps along N, 32 * nt
# rows), kw warp groups of 4 along K (each on its own 64-wide chunk of a stage); 4-bit: nw m16 tiles of W rows a warp
# (a block: 4 warps, 64 * nw rows), kw as for bf16; stages cp.async stages of one 64-wide chunk (times kw).
GEMM_CFG = {"bf16": {"nt": 2, "kw": 1, "stages": 4}, "f16": {"nt": 2, "kw": 1, "stages": 4},
            "w4": {"nw": 2, "kw": 1, "stages": 4}}
# The weight formats of the layers on the device: "f16" is a bf16 model stored in fp16 (cuda/act_format.py), whose
# GEMMs then take fp16 activations.
WEIGHT_FORMATS = ("bf16", "f16", "w4")
GEMM_MODES = {"store": 0, "add": 1, "swiglu": 2}
GEMM_ROWS = (32, 48, 96)  # the buffer rows kernels/gemm.cu has instances for (vram_plan.prefill_rows picks one)


def gemm_kernel_rows(fmt: str, rows: int, tokens: int | None = None) -> int:
    """Rows the kernel multiplies for a buffer of ``rows`` holding ``tokens`` real rows (None: at most 40): the 4-bit
    body takes the 48-row buffer of a parallel pass as its 40 real rows (32 vision tokens + 8 action queries; the 8
    zero rows are not multiplied), all 48 when a state token makes it 41 (or an autoregressive pass 33); 32 and 96
    rows are multiplied as they are (96: 32 + 64 queries of 8 actions, zero rows for fewer)."""
    if fmt == "w4" and rows == 48:
        return 40 if tokens is None or tokens <= 40 else 48
    return rows


def gemm_token_split(rows: int, wide_blocks: int, sms: int) -> int:
    """Token slices over grid.z for the gate/up + SwiGLU GEMM of a ``rows``-row buffer (``wide_blocks``: its blocks
    with the whole ``rows``-row instance; it cannot split K): a 96-row buffer runs as two 48-row slices where that grid
    has fewer than 4 blocks an SM. There one or two blocks of 4 warps an SM leave a warp or two a scheduler, and the
    GEMM waits on latency (ncu, 1.5B 4-bit, whole H100: warps active 6.7 %, "wait" stalls 1.2 an issued instruction);
    the slices double the warps at the cost of dequantizing each W tile once a slice: gate/up -7 % (4-bit, 140 blocks
    on 132 SMs) and -10 % (bf16, 280 blocks). On 8 SMs (17.5 blocks an SM) they cost +9 %, and the split-K GEMMs,
    already many blocks an SM, keep the 96-row instance (sliced, the 4-bit down measured +15 %). The threshold lies
    between the measured points (1.1-2.1 blocks an SM gained, 17.5 lost). BENCHMARKS.md, "Token slices of the 96-row
    gate/up GEMM"."""
    return 2 if rows == 96 and wide_blocks < 4 * sms else 1


def gemm_block_rows(fmt: str, cfg: dict | None = None) -> int:
    """W rows a block owns."""
    c = cfg or GEMM_CFG[fmt]
    return 64 * c["nw"] if fmt == "w4" else 32 * c["nt"]


def gemm_smem_bytes(fmt: str, rows: int, cfg: dict | None = None, tokens: int | None = None) -> int:
    """Dynamic shared memory of one prefill-GEMM block: stages x kw x (X tile + W tile (+ scale|zero tile)) of one
    64-wide chunk."""
    c = cfg or GEMM_CFG[fmt]
    nb = gemm_block_rows(fmt, c)
    x_units = gemm_kernel_rows(fmt, rows, tokens) * 8  # rows x 64 bf16
    w_units = nb * 2 + nb // 4 if fmt == "w4" else nb * 8
    return c["stages"] * c.get("kw", 1) * 16 * (x_units + w_units)


def _set_max_dynamic_smem(fn, nbytes: int) -> None:
    """Raise a kernel's dynamic shared-memory limit (cupy.RawKernel's settable attribute, else the driver call)."""
    try:
        fn.max_dynamic_shared_size_bytes = int(nbytes)
        return
    except AttributeError:
        pass
    from cuda.bindings import driver as drv

    attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    (err,) = drv.cuFuncSetAttribute(drv.CUfunction(_fn_ptr(fn)), attr, int(nbytes))
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuFuncSetAttribute(max dynamic shared memory {nbytes}): {err}")


def raise_dynamic_smem(kernels, name: str, nbytes: int) -> None:
    """Raise kernel ``name``'s dynamic shared-memory limit to ``nbytes`` once: what was raised is kept on the Kernels
    object, so every launcher of it (the decode GEMVs, the prefill attention) shares one record."""
    raised = kernels.__dict__.setdefault("smem_raised", {})
    if raised.get(name, 0) < nbytes:
        _set_max_dynamic_smem(getattr(kernels, name), nbytes)
        raised[name] = int(nbytes)


class Gemm:
    """Typed launcher of the prefill GEMM (kernels/gemm.cu) for one weight format (WEIGHT_FORMATS: "bf16" | "f16" |
    "w4") and row count (GEMM_ROWS: the buffer's rows; the 4-bit kernel reads 40 of 48), used by the backend and the
    tests alike.

    ``gemm(X, W, N, K, mode, Y=..., act=..., ks=...)``: W is the 16-bit array or the (Q, SZ, sbf) triple; mode "store"
    (Y = X W^T; ks must be 1), "add" (Y += X W^T with atomics, split-K over ks blocks) or "swiglu" (act = silu(X
    Wg^T) * (X Wu^T) for W = [gate rows; up rows], N = 2I; no split). ``xfmt``: X (and act) as "bf16" or "fp16": the
    tensor cores multiply X and W in one format, so bf16 weights take bf16 X, fp16 weights fp16 X (the default for
    them), and 4-bit weights either (gemm_w4h_*: q - z and X multiplied in fp16). ``run`` is a callable with the
    Launcher's signature (name, grid, block, args, shared_mem=, dependent=) or None for a plain launch of the function.
    ``cfg`` overrides GEMM_CFG[fmt] (dev/cuda/gemm_micro.py, for kernels compiled with the matching -D); ``tokens``:
    the real rows of the buffer (gemm_kernel_rows). ``zsplit``: token slices over grid.z (gemm_token_split): the
    buffer's rows as ``zsplit`` slices of the ``rows // zsplit``-row instance, every row of each multiplied."""

    def __init__(self, kernels, fmt: str, rows: int, cfg: dict | None = None, tokens: int | None = None,
                 xfmt: str | None = None, zsplit: int = 1):
        if fmt not in WEIGHT_FORMATS or rows not in GEMM_ROWS:
            raise ValueError(f"no prefill GEMM for {fmt} x {rows} rows")
        if zsplit < 1 or rows % zsplit or rows // zsplit not in GEMM_ROWS:
            raise ValueError(f"no prefill GEMM for {rows} rows in {zsplit} token slices")
        native = {"bf16": "bf16", "f16": "fp16"}.get(fmt)  # 16-bit weights multiply X of their own format
        xfmt = xfmt or native or "bf16"
        if xfmt not in ("bf16", "fp16") or (native is not None and xfmt != native):
            raise ValueError(f"no prefill GEMM for {fmt} weights with {xfmt} activations")
        self.k, self.fmt, self.rows, self.xfmt, self.zsplit = kernels, fmt, rows, xfmt, zsplit
        c = self.cfg = dict(cfg or GEMM_CFG[fmt])
        self.nb = gemm_block_rows(fmt, c)  # W rows a block
        kind = "w4h" if fmt == "w4" and xfmt == "fp16" else fmt
        slice_rows, slice_tokens = (rows, tokens) if zsplit == 1 else (rows // zsplit, rows // zsplit)
        instance_rows = gemm_kernel_rows(fmt, slice_rows, slice_tokens)  # the rows one block multiplies
        self.kernel_rows = instance_rows * zsplit  # the buffer rows multiplied (<= rows)
        self.name = f"gemm_{kind}_t{instance_rows}"
        self.smem = gemm_smem_bytes(fmt, slice_rows, c, slice_tokens)
        self.threads = 128 * c.get("kw", 1)
        self.kstage = 64 * c.get("kw", 1)  # k per pipeline stage
        _set_max_dynamic_smem(getattr(kernels, self.name), self.smem)  # over the 48 KB default

    def blocks(self, N: int, mode: str) -> int:
        """Blocks along N."""
        return (N // 2 if mode == "swiglu" else N) // (self.nb // 2 if mode == "swiglu" else self.nb)

    def split(self, N: int, K: int, mode: str, slots: int) -> int:
        """Split-K for "add": as many K slices as fill ``slots`` resident blocks in one wave (each slice whole
        stages, none empty); 1 otherwise."""
        if mode != "add":
            return 1
        nch = K // self.kstage
        ks = max(1, min(nch, slots // max(1, self.blocks(N, mode) * self.zsplit)))
        per = -(-nch // ks)
        return -(-nch // per)

    def __call__(self, X, W, N, K, mode, Y=None, act=None, ks=1, run=None):
        m = GEMM_MODES[mode]
        kq = max(128, self.kstage)
        if N % self.nb or K % kq:
            raise ValueError(f"prefill GEMM needs N % {self.nb} == 0 and K % {kq} == 0 (N={N}, K={K})")
        if mode != "add" and ks != 1:
            raise ValueError("only mode 'add' splits K")
        null = np.uint64(0)
        Y = null if Y is None else Y
        act = null if act is None else act
        if self.fmt == "w4":
            Q, SZ, sbf = W
            args = (X, Q, SZ, np.int32(sbf), Y, act, np.int32(N), np.int32(K), np.int32(m))
        else:
            args = (X, W, Y, act, np.int32(N), np.int32(K), np.int32(m))
        grid = (self.blocks(N, mode), int(ks), self.zsplit)
        if run is None:
            getattr(self.k, self.name)(grid, (self.threads,), args, shared_mem=self.smem)
        else:
            run(self.name, grid, (self.threads,), args, shared_mem=self.smem, dependent=False)


# Decode GEMVs as kernels/gemv.cu compiles them (gemv.cuh's defaults): rows (gate/up: row pairs) a warp takes per
# iteration (GV_RB_W4_*; bf16 1) and the stages of each warp's shared-memory ring (GV_NS_*). KV = 16-byte (bf16) or
# 4-byte (4-bit) chunks per lane per K segment: q/k/v and gate/up take the whole row (the norm needs all of x); the
# o / down projections split K into segments of at most PROJ_KV chunks.
# fp16 weights ("f16") run the bf16 body (gemv.cuh's W16): the same shape.
GEMV_RB = {"bf16": {"qkv": 1, "gateup": 1, "proj": 1}, "f16": {"qkv": 1, "gateup": 1, "proj": 1},
           "w4": {"qkv": 1, "gateup": 1, "proj": 2}}
GEMV_STAGES = {"bf16": 3, "f16": 3, "w4": 4}
PROJ_KV = {"bf16": {"o": 3, "down": 7}, "f16": {"o": 3, "down": 7}, "w4": {"o": 3, "down": 5}}
GEMV_WARPS = 8  # 256 threads a block
ATTN_HEAD_DIMS = (64, 128)  # the attn_partial_<D> / attn_combine_<D> instances kernels/attention.cu compiles


def gemv_smem_bytes(fmt: str, op: str, kv: int, rb: int, stages: int) -> int:
    """Dynamic shared memory of one GEMV block: a ring of ``stages`` iterations per warp, an iteration rb rows (gate/up:
    2 rb), a row segment 512 kv bytes (16-bit) or 32 kv words + 2 kv scale|zero words (4-bit); as gemv.cuh's GvRing."""
    row = 4 * 34 * kv if fmt == "w4" else 512 * kv
    return GEMV_WARPS * stages * (2 * rb if op == "gateup" else rb) * row


class Gemv:
    """Typed launchers of the decode GEMVs (kernels/gemv.cu, one body per op, the weight format (WEIGHT_FORMATS) a
    policy), used by the backend and the tests alike. W: the 16-bit array, or the (Q, SZ, sbf) triple. ``kv``: 256-wide
    K chunks a lane holds per segment (the kernel instance); ``blocks``: the grid; ``run``: a callable with the
    Launcher's signature, or None for a plain launch of the function. ``rb`` / ``stages`` override GEMV_RB /
    GEMV_STAGES (dev/cuda/gemv_micro.py, for kernels compiled with the matching -D)."""

    def __init__(self, kernels, fmt: str, rb: dict | None = None, stages: int | None = None):
        if fmt not in WEIGHT_FORMATS:
            raise ValueError(f"no decode GEMV for weights {fmt!r}")
        self.k, self.fmt = kernels, fmt
        self.rb = dict(GEMV_RB[fmt], **(rb or {}))
        self.stages = int(stages or GEMV_STAGES[fmt])

    def name(self, op: str, kv: int, partial: bool = False) -> str:
        """The kernel instance: op "qkv" | "gateup" | "proj", kv chunks of 256 a lane; ``partial``: the instance
        that masks a last segment K does not fill (suffix p)."""
        return f"gemv_{self.fmt}_{op}_{kv}" + ("p" if partial else "")

    def smem(self, op: str, kv: int, partial: bool = False) -> int:
        """Dynamic shared memory of a block of instance (op, kv); raises the kernel's limit once."""
        n = gemv_smem_bytes(self.fmt, op, kv, self.rb[op], self.stages)
        raise_dynamic_smem(self.k, self.name(op, kv, partial), n)
        return n

    def _w(self, W) -> tuple:
        return (W[0], W[1], np.int32(W[2])) if self.fmt == "w4" else (W,)

    def _go(self, run, op, kv, blocks, args, partial=False):
        name, smem = self.name(op, kv, partial), self.smem(op, kv, partial)
        if run is None:
            getattr(self.k, name)((int(blocks),), (256,), args, shared_mem=smem)
        else:
            run(name, (int(blocks),), (256,), args, shared_mem=smem)

    def qkv(self, x, ln, eps, W, bias, H, NQ, NKVD, q, kc, vc, order, params, q_off, cap, D, blocks, run=None):
        """q = rms_norm(x) Wq^T + bq (fp32), K/V rows of the same into slot order[params[0] + q_off] (bf16)."""
        i = np.int32
        self._go(run, "qkv", gemv_kv(H), blocks,
                 (x, ln, np.float32(eps), *self._w(W), bias, i(H), i(NQ), i(NKVD), q, kc, vc, order, params, i(q_off),
                  i(cap), i(D)), gemv_partial(H, gemv_kv(H)))

    def gateup(self, x, ln, eps, W, H, I, act, blocks, run=None):  # noqa: E741 - I: the intermediate size
        """act = silu(rms_norm(x) Wg^T) * (rms_norm(x) Wu^T), W = [gate rows; up rows] (2I rows)."""
        i = np.int32
        self._go(run, "gateup", gemv_kv(H), blocks, (x, ln, np.float32(eps), *self._w(W), i(H), i(I), act),
                 gemv_partial(H, gemv_kv(H)))

    def proj(self, a, W, K, N, y, kv, blocks, run=None):
        """y += a W^T (o / down projection + residual), K split into ceil(K / (256 kv)) segments (the last one may
        be partial)."""
        i = np.int32
        self._go(run, "proj", kv, blocks, (a, *self._w(W), i(K), i(N), y, i(proj_segments(K, kv))),
                 gemv_partial(K, kv))


def gemv_kv(K: int) -> int:
    """The instance (chunks of 256 a lane holds) of a one-segment GEMV (q/k/v, gate/up) over rows of K elements:
    ceil(K / 256), the last chunks of a lane zero when K is not a multiple of 256 (K a multiple of 8)."""
    return -(-int(K) // 256)


def gemv_partial(K: int, kv: int) -> bool:
    """Whether rows of K elements leave the last segment of 256 kv partial (then the masking instance runs)."""
    return int(K) % (256 * int(kv)) != 0


def proj_segments(K: int, kv: int) -> int:
    """K segments of 256 kv elements of an o / down GEMV (the last one partial when they do not divide K)."""
    return -(-int(K) // (256 * int(kv)))


PROJ_WASTE = 0.125  # the largest share of a split's lanes that may idle on a partial last segment


def proj_kv(K: int, kv_max: int) -> int:
    """Chunks a lane holds per K segment of an o / down GEMV: the largest kv <= kv_max whose segments waste at most
    PROJ_WASTE of their lanes on the partial last one (an exact divisor of K / 256 wastes none: 1.5B's kv 3 / 7 / 5),
    else the kv that wastes least."""
    n8 = int(K) // 8

    def waste(kv):
        return (proj_segments(K, kv) * 32 * kv - n8) / (proj_segments(K, kv) * 32 * kv)

    ok = [kv for kv in range(1, kv_max + 1) if waste(kv) <= PROJ_WASTE]
    return max(ok) if ok else min(range(1, kv_max + 1), key=lambda kv: (waste(kv), -kv))


def gemv_plan(gemv: Gemv, launcher: Launcher, H: int, I: int, NQKV: int, NQ: int, sms: int) -> dict:  # noqa: E741
    """Kernel name, chunks a lane holds (kv), K segments S and grid of each decode GEMV of one layer: a fixed grid of
    the resident blocks (occupancy API, with the ring's shared memory), fewer when the rows run out."""
    plan = {}
    for key, K, N in (("qkv", H, NQKV), ("gateup", H, I), ("o", NQ, H), ("down", I, H)):
        op = "proj" if key in ("o", "down") else key
        if op != "proj":
            kv = gemv_kv(K)  # one segment: the warp needs all of x for the norm
        else:
            kv = proj_kv(K, PROJ_KV[gemv.fmt][key])
        S = proj_segments(K, kv)
        part = gemv_partial(K, kv)
        name = gemv.name(op, kv, part)
        per_sm = launcher.blocks_per_sm(name, 256, fallback=1, smem=gemv.smem(op, kv, part))
        units = math.ceil(N / gemv.rb[op]) * S
        blocks = max(math.ceil(S / 8), min(sms * per_sm, math.ceil(units / 8)))
        plan[key] = {"name": name, "kv": kv, "S": S, "blocks": blocks, "partial": part}
    return plan


# --------------------------------------------------------------------------------- the small kernels, typed too
def _launch(kernels, run, name, grid, block, args, shared_mem=0, dependent=True):
    """A plain launch of ``name`` (run None) or through ``run`` (the Launcher's signature)."""
    if run is None:
        getattr(kernels, name)(tuple(grid), tuple(block), tuple(args), shared_mem=shared_mem)
    else:
        run(name, grid, block, args, shared_mem=shared_mem, dependent=dependent)


def rmsnorm_bf16(kernels, x, ln, eps, H, T, out, bias=None, N=0, y=None, run=None, dependent=True, f16=False):
    """out = rms_norm(x[:T]) as bf16 (kernels/rmsnorm.cu, one block a row; ``f16``: as fp16, rmsnorm_f16); with
    bias: also y[t, :N] = bias (the split-K GEMM that follows adds into it)."""
    null = np.uint64(0)
    _launch(kernels, run, "rmsnorm_f16" if f16 else "rmsnorm_bf16", (int(T),), (256,),
            (x, ln, np.float32(eps), np.int32(H), out, null if bias is None else bias, np.int32(N),
             null if y is None else y), dependent=dependent)


def kv_write(kernels, qkv, T, NQ, NKVD, D, kc, vc, order, params, q_off, cap, run=None, dependent=True):
    """K/V rows t < T of the prefill's q/k/v (fp32, row stride NQ + 2 NKVD) into slots order[params[0] + q_off + t]
    of the cache (bf16, un-rotated)."""
    i = np.int32
    _launch(kernels, run, "kv_write", (max(1, int(T) * 2 * int(NKVD) // 256),), (256,),
            (qkv, i(T), i(NQ), i(NKVD), i(D), kc, vc, order, params, i(q_off), i(cap)), dependent=dependent)


def embed_gather(kernels, table, start_row, idx, H, out, run=None):
    """out = table[idx[0]] as fp32, or start_row when idx[0] < 0 (the chunk's first decode pass)."""
    _launch(kernels, run, "embed_gather", (max(1, int(H) // 256),), (256,), (table, start_row, idx, np.int32(H), out))


def lm_head_argmax(kernels, x, ln, eps, H, head, logits, ticket, tok_idx, tokens, step, vocab0, run=None, n_x=1):
    """logits = rms_norm(x) head^T over the head's rows (8 a block), and by the last block the argmax: tok_idx[0] =
    its row (0 when a logit is not finite), tokens[step] = vocab0 + row (-1 when not finite); ticket resets.
    ``n_x`` > 1: one launch for rows x[0..n_x) (fp32, stride H) into logits rows 0..n_x (stride: the head's rows) and
    tokens[step..step + n_x), ticket[r] for row r (tok_idx from row 0): a parallel chunk's K x 8 action rows."""
    i = np.int32
    nrows = int(head.shape[0])
    _launch(kernels, run, "lm_head_argmax", (nrows // 8, int(n_x)), (256,),
            (x, ln, np.float32(eps), i(H), head, i(nrows), logits, ticket, tok_idx, tokens, i(step), i(vocab0)),
            shared_mem=4 * int(H))


def state_project(kernels, s, W1, b1, W2, b2, S, H, hidden, x, run=None, dependent=True):
    """x [H] (float32, a prefill input row) = fc2(GELU(fc1 s)) of the normalized state s [S] (kernels/state.cu);
    hidden [H] float32 scratch."""
    i = np.int32
    _launch(kernels, run, "state_fc1", (-(-int(H) // 256),), (256,), (s, W1, b1, i(S), i(H), hidden),
            dependent=dependent)
    _launch(kernels, run, "state_fc2", (-(-int(H) // 8),), (256,), (hidden, W2, b2, i(H), x),
            shared_mem=4 * int(H))


def vision_encode(kernels, frame, W, b, pos, H, x, pooled, run=None, dependent=True):
    """x = the frame's 32 patch rows through the projector (+ bias, + position rows), pooled = their mean."""
    _launch(kernels, run, "vision_encode", (int(H) // 32,), (256,), (frame, W, b, pos, np.int32(H), x, pooled),
            dependent=dependent)


def stamp(kernels, ts, i, run=None):
    """ts[i] = %globaltimer (ns) once everything before it has run."""
    _launch(kernels, run, "stamp", (1,), (1,), (ts, np.int32(i)))


ATT_TILE = 32  # keys a tile (kernels/attention.cuh)


def att_smem_bytes(D: int, warps: int) -> int:
    """Shared memory of an attn_partial block of ``warps`` warps (attention.cuh ATT_SMEM_BYTES): Q's 16-row slabs, a K
    tile and two V tiles, rows of D + 8 bf16."""
    return (16 * int(warps) + 3 * ATT_TILE) * (int(D) + 8) * 2


def att_partial_name(D: int, T: int, warps: int | None = None) -> tuple[str, int]:
    """The partial kernel of a call of T query tokens and its warps: attn_partial_w8_<D> (8 warps, 128 rows a block:
    two row groups share each K/V tile) for a prefill, attn_partial_<D> (4 warps, 64 rows) for a decode pass's T = 1;
    ``warps`` 4 forces the 64-row instance (dev/cuda/attn_micro.py's A/B)."""
    if warps is None:
        warps = 8 if int(T) > 1 else 4
    if warps not in (4, 8):
        raise ValueError(f"attention blocks of 4 or 8 warps, not {warps}")
    return (f"attn_partial_w8_{D}" if warps == 8 else f"attn_partial_{D}"), warps


def attention(kernels, q, q_stride, kc, vc, order, params, q_off, T, nkv, group, cap, cos, sin, bidir_from, nsplit,
              part_o, part_ml, out, out_bf=None, run=None, dependent=True, out_f16=False, warps=None):
    """Typed launcher of kernels/attention.cu for one layer: the partial kernel (att_partial_name, ``warps``) over
    (nkv, row blocks, nsplit) blocks, then attn_combine_<D> into out [T, nkv*group*D] fp32 (and out_bf bf16 when
    given; fp16 with ``out_f16``: attn_combine_h_<D>) over the partials' 64-row groups; D = head_dim, read from the
    cache's last axis (kc [nkv, cap, D]). Query t of q (row stride q_stride) has position params[0] + q_off + t; rows
    t >= bidir_from see every key of the call."""
    i = np.int32
    D = int(kc.shape[-1])
    if D not in ATTN_HEAD_DIMS:
        raise ValueError(f"no attention kernel for head_dim {D} (built: {ATTN_HEAD_DIMS})")
    nrg = -(-T * group // 64)
    partial, warps = att_partial_name(D, T, warps)
    smem = 0
    if warps == 8:  # dynamic shared memory (over 48 KB at D 128)
        smem = att_smem_bytes(D, warps)
        raise_dynamic_smem(kernels, partial, smem)
    scale = np.float32(np.log2(np.e) / np.sqrt(D))
    calls = ((partial, (nkv, -(-T * group // (16 * warps)), nsplit), 32 * warps,
              (q, i(q_stride), kc, vc, order, params, i(q_off), i(T), i(group), i(cap), cos, sin, scale,
               i(bidir_from), part_o, part_ml), smem),
             (f"attn_combine_{'h_' if out_f16 else ''}{D}", (nkv * nrg * 64,), D,
              (part_o, part_ml, i(nrg), i(nsplit), i(T), i(group), i(nkv * group * D), out,
               np.uint64(0) if out_bf is None else out_bf), 0))
    for name, grid, threads, args, shared in calls:
        _launch(kernels, run, name, grid, (threads,), args, shared_mem=shared, dependent=dependent)
