"""CudaBackend: the whole reasoning chunk as ONE CUDA graph of hand-written kernels (CuPy + NVRTC).

Graph (captured once, replayed per chunk; see docs/cuda_notes.md):
  H2D copy of the chunk inputs (frame, order table, n_prefix, start-token row) from a pinned buffer
  -> stamp -> vision encoder -> stamp -> prefill 32 tokens through all layers (KV written into the
  frame's slots) -> stamp -> 8 decode passes (embedding gather, per layer: qkv+norm+KV write,
  split-K attention, combine, o-proj+residual, gate/up+norm+SwiGLU, down+residual; constrained LM
  head with on-device argmax feeding the next pass) with a stamp after each -> D2H copy of
  tokens + timestamps + pooled into a pinned buffer.
Lengths, positions and slots are read on the device from the uploaded buffers, so the graph never
needs re-capture. No cuBLAS, no PyTorch.

Variants (constructor arg `variant`, else env VLA_EDGE_CUDA_VARIANT, else DEFAULT_VARIANT; docs/cuda_notes.md):
  v3   the v3 kernels, plain launches (the reference path, kept intact);
  v3p  the v3 kernels compiled with -DVLA_PDL and launched with Programmatic Dependent Launch;
  v4   PDL + the v4 decode GEMVs (kernels/gemv_v4.cu: x in registers, per-warp norm, weights loaded before the
       dependency wait, fixed grids, split-K down projection).
  v5   v4 + decode attention from kernels/attention_v5.cu (128 splits, the K/V tile of old keys staged before
       the dependency wait) + the prefill launched plainly (PDL slowed it down in v3p/v4) + the stamp after the
       prefill and after each decode pass launched plainly (a full barrier per pass: what makes the pre-wait
       K/V reads of earlier passes' keys safe).
  v5w  v5 with wider prefill GEMM grids: split-K sized for 4 blocks per SM instead of 2 (the GEMM uses 88
       registers, 128 threads: 5 fit), and the gate/up GEMM split too (its output zeroed by the RMSNorm kernel's
       bias-init path, then accumulated with atomics).
  v5p  v5w with the prefill launched with PDL too, its GEMM's L2 prefetch moved after the dependency wait
       (-DVLA_GEMM_LATE_PREFETCH).
PDL launches go through cuda-python's cuLaunchKernelEx (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
on the capturing stream, so the graph gets programmatic edges; it needs compute capability >= 9.0 (else v3p/v4
launch plainly, the PDL hooks are then no-ops).
"""
from __future__ import annotations

import ctypes
import math
import os
import time

import cupy
import cupyx
import numpy as np

from ..admission import PhaseTimings
from ..constants import ACTION_TOKENS, ACTION_VOCAB, FRAME_C, FRAME_H, FRAME_W, VISION_TOKENS
from ..model import ops
from ..model.safetensors_io import bf16_to_f32
from .kernels import Kernels

try:
    from ..engine import BackendResult
except ImportError:  # engine.py not there yet (parallel development)
    from dataclasses import dataclass

    @dataclass
    class BackendResult:  # type: ignore[no-redef]
        tokens: np.ndarray
        pooled: np.ndarray
        timings: PhaseTimings
        logits: np.ndarray | None = None


GIB = 1 << 30
NULLP = np.uint64(0)  # a null pointer kernel argument
T_PRE = VISION_TOKENS  # prefill GEMM rows (fixed 32)
N_STAMPS = 3 + ACTION_TOKENS  # vision start, vision end, prefill end, after each decode pass


VARIANTS = ("v3", "v3p", "v4", "v5", "v5w", "v5p")
DEFAULT_VARIANT = "v5"  # fastest variant that passed every GPU test (BENCHMARKS.md, 2026-11-29)


class VramPlanError(RuntimeError):
    pass


def _g4_overrides() -> dict:
    """VLA_EDGE_G4="qkv=6x1,gateup=6x2,o=3x1,down=7x1" (KVxRB per GEMV; for qkv/gateup KV is fixed to H/256)."""
    out = {}
    for item in filter(None, os.environ.get("VLA_EDGE_G4", "").split(",")):
        k, v = item.split("=")
        kv, rb = v.split("x")
        out[k.strip()] = (int(kv), int(rb))
    return out


G4_DEFAULTS = {"qkv": (0, 1), "gateup": (0, 1), "o": (3, 1), "down": (7, 1)}  # KV 0: fixed by the shape
G4_MAX_KV = 8


def _align(n: int, a: int = 256) -> int:
    return (n + a - 1) // a * a


class CudaBackend:
    name = "cuda"

    def __init__(self, weights, capacity: int, vram_ceiling_gb: float = 8.0, decode_splits: int = 64,
                 variant: str | None = None):
        variant = variant or os.environ.get("VLA_EDGE_CUDA_VARIANT") or DEFAULT_VARIANT
        if variant not in VARIANTS:
            raise ValueError(f"unknown CUDA variant {variant!r} (known: {', '.join(VARIANTS)})")
        self.variant = variant
        cfg = self.cfg = weights.cfg
        self.capacity = int(capacity)
        self.vram_ceiling_gb = float(vram_ceiling_gb)
        H, I, D = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
        NH, NKV, L = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_hidden_layers
        if D != 128:
            raise ValueError(f"the CUDA kernels are specialised for head_dim 128, got {D}")
        if H % 256 or I % 256:
            raise ValueError(f"hidden ({H}) and intermediate ({I}) sizes must be multiples of 256")
        self.H, self.I, self.D, self.NH, self.NKV, self.L = H, I, D, NH, NKV, L
        self.group = NH // NKV
        self.NQ, self.NKVD = NH * D, NKV * D
        self.NQKV = self.NQ + 2 * self.NKVD
        self.V0 = cfg.vocab_size - ACTION_VOCAB
        dev = cupy.cuda.Device()
        self.sms = dev.attributes["MultiProcessorCount"]
        # v5's combine takes up to 128 partials: one 32-key tile per block at a full 4096-slot cache
        self.decode_splits = 128 if variant in ("v5", "v5w", "v5p") else max(1, min(64, int(decode_splits)))
        self.nrg_pre = math.ceil(T_PRE * self.group / 64)
        self.prefill_splits = max(1, min(64, round(2 * self.sms / (NKV * self.nrg_pre))))

        self.plan = self.vram_plan()
        if self.plan["total"] > self.vram_ceiling_gb * GIB:
            raise VramPlanError(
                "VRAM plan " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in self.plan.items())
                + f" exceeds the ceiling vram_ceiling_gb={self.vram_ceiling_gb} ({self.vram_ceiling_gb * GIB / 2**20:.0f} MiB)")
        pool = cupy.get_default_memory_pool()
        self._pool = pool
        self._pool_base = pool.used_bytes()
        self.pdl_requested = variant in ("v3p", "v4", "v5", "v5w", "v5p")
        self.gemm_wide = variant in ("v5w", "v5p")  # prefill GEMM grids for 4 blocks per SM, gate/up split too
        self._pdl_suspend = False  # v5: prefill launched plainly
        self.plain_stamps = variant in ("v5", "v5w", "v5p")
        self.k = Kernels(pdl=self.pdl_requested, defines=("VLA_GEMM_LATE_PREFETCH",) if variant == "v5p" else ())
        cc = dev.compute_capability  # e.g. "90"
        self.pdl = self.pdl_requested and int(cc) >= 90
        self._pdl_prev = False  # the previous op in the stream is a kernel (PDL only applies kernel -> kernel)
        if self.pdl:
            try:
                from cuda.bindings import driver as drv
            except ImportError:  # no cuda-python: plain launches (the PDL hooks are then no-ops; still correct)
                drv = None
                self.pdl = False
        if self.pdl:
            self._drv = drv
            (err,) = drv.cuInit(0)
            if err != drv.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"cuInit: {err}")
            attr = drv.CUlaunchAttribute()
            attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            self._pdl_attr = attr
        self.g4 = self._g4_plan() if variant in ("v4", "v5", "v5w", "v5p") else None
        self._upload_weights(weights)
        self._allocate()
        self._peak = 0
        self._note_peak()
        self.graph = None
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.last_pass_ms: list[float] = []

    # ---------------------------------------------------------------------------------------- plan
    def vram_plan(self) -> dict:
        """Bytes of every device allocation, computed from the config before anything is allocated."""
        H, I, D, L, NKV = self.H, self.I, self.D, self.L, self.NKV
        cap = self.capacity
        per_layer = 2 * (self.NQKV * H + H * self.NQ + 2 * I * H + H * I + 2 * H) + 4 * self.NQKV
        tied = True  # action rows of the head (and, if untied, of the embedding too) only
        weights = L * per_layer + 2 * H + 2 * ACTION_VOCAB * H * (1 if tied else 2) + 2 * (H * 768 + H + 32 * H)
        kv = L * 2 * NKV * cap * D * 2
        act = (4 * T_PRE * H + 2 * T_PRE * max(H, I) + 4 * T_PRE * self.NQKV + 4 * T_PRE * 2 * I
               + (4 + 2) * T_PRE * self.NQ + 4 * (H + self.NQ * 2 + I) + 4 * ACTION_TOKENS * ACTION_VOCAB)
        parts = max(NKV * self.nrg_pre * self.prefill_splits, NKV * self.decode_splits) * 64
        workspace = (parts * (D + 2) * 4 + 2 * cap * (D // 2) * 4 + self._in_layout()[1] + self._out_layout()[1]
                     + 16 * 2**20)  # + 16 MiB allowance: graph exec, module images, pool rounding
        total = weights + kv + act + workspace
        return {"weights": weights, "kv": kv, "activations": act, "graph_workspace": workspace, "total": total}

    def _in_layout(self):
        frame = FRAME_H * FRAME_W * FRAME_C
        o_order = _align(frame)
        o_params = _align(o_order + 4 * self.capacity)
        o_start = _align(o_params + 16)
        return {"frame": 0, "order": o_order, "params": o_params, "start": o_start}, _align(o_start + 2 * self.H)

    def _out_layout(self):
        o_ts = 64
        o_pooled = _align(o_ts + 8 * N_STAMPS, 64)
        return {"tokens": 0, "ts": o_ts, "pooled": o_pooled}, _align(o_pooled + 4 * self.H)

    @property
    def peak_vram_bytes(self) -> int:
        self._note_peak()
        return self._peak

    def _note_peak(self):
        self._peak = max(getattr(self, "_peak", 0), self._pool.used_bytes() - self._pool_base)

    # ------------------------------------------------------------------------------------ uploads
    def _upload_weights(self, w):
        cp, f32 = cupy, bf16_to_f32
        self.layers = []
        for lw in w.layers:
            self.layers.append({
                "ln1": cp.asarray(lw["ln1"]), "ln2": cp.asarray(lw["ln2"]),
                "wqkv": cp.asarray(np.concatenate([lw["wq"], lw["wk"], lw["wv"]], axis=0)),
                "bqkv": cp.asarray(np.concatenate([f32(lw["bq"]), f32(lw["bk"]), f32(lw["bv"])])),
                "wo": cp.asarray(lw["wo"]),
                "wgu": cp.asarray(np.concatenate([lw["wg"], lw["wu"]], axis=0)),
                "wd": cp.asarray(lw["wd"]),
            })
        self.norm = cp.asarray(w.norm)
        self.head_act = cp.asarray(np.ascontiguousarray(w.head[self.V0:]))
        self.emb_act = self.head_act if w.lm_head is None else cp.asarray(np.ascontiguousarray(w.embed[self.V0:]))
        self.embed_host = w.embed  # host copy: prompt and start-token rows are gathered on the CPU
        self.patch_w = cp.asarray(w.vision.patch_w)
        self.patch_b = cp.asarray(w.vision.patch_b)
        self.pos_embed = cp.asarray(w.vision.pos_embed)
        cos, sin = ops.rope_cos_sin(np.arange(self.capacity), self.D, self.cfg.rope_theta)
        self.cos, self.sin = cp.asarray(cos), cp.asarray(sin)

    def _allocate(self):
        cp = cupy
        H, I, D, L, NKV, cap = self.H, self.I, self.D, self.L, self.NKV, self.capacity
        self.kc = cp.zeros((L, NKV, cap, D), cp.uint16)
        self.vc = cp.zeros((L, NKV, cap, D), cp.uint16)
        self.x_pre = cp.zeros((T_PRE, H), cp.float32)
        self.xb = cp.zeros((T_PRE, max(H, I)), cp.uint16)
        self.qkv = cp.zeros((T_PRE, self.NQKV), cp.float32)
        self.gu = cp.zeros((T_PRE, 2 * I), cp.float32)
        self.zeros_gu = cp.zeros(2 * I, cp.float32) if self.gemm_wide else None  # 4*2I bytes: in the plan's allowance
        self.att = cp.zeros((T_PRE, self.NQ), cp.float32)
        self.att_bf = cp.zeros((T_PRE, self.NQ), cp.uint16)
        self.xdec = cp.zeros(H, cp.float32)
        self.qdec = cp.zeros(self.NQ, cp.float32)
        self.attdec = cp.zeros(self.NQ, cp.float32)
        self.act = cp.zeros(I, cp.float32)
        self.logits = cp.zeros((ACTION_TOKENS, ACTION_VOCAB), cp.float32)
        self.ticket = cp.zeros(1, cp.int32)
        parts = max(NKV * self.nrg_pre * self.prefill_splits, NKV * self.decode_splits) * 64
        self.part_o = cp.zeros(parts * D, cp.float32)
        self.part_ml = cp.zeros(parts * 2, cp.float32)
        lay, nin = self._in_layout()
        self.in_dev = cp.zeros(nin, cp.uint8)
        self.in_host = cupyx.empty_pinned(nin, np.uint8)
        self.in_host[:] = 0
        self.frame_dev = self.in_dev[lay["frame"]:lay["order"]]
        self.order_dev = self.in_dev[lay["order"]:lay["order"] + 4 * cap].view(cp.int32)
        self.params_dev = self.in_dev[lay["params"]:lay["params"] + 16].view(cp.int32)
        self.tokidx_dev = self.params_dev[1:2]
        self.start_dev = self.in_dev[lay["start"]:lay["start"] + 2 * H].view(cp.uint16)
        self.h_frame = self.in_host[:lay["order"]]
        self.h_order = self.in_host[lay["order"]:lay["order"] + 4 * cap].view(np.int32)
        self.h_params = self.in_host[lay["params"]:lay["params"] + 16].view(np.int32)
        self.h_start = self.in_host[lay["start"]:lay["start"] + 2 * H].view(np.uint16)
        olay, nout = self._out_layout()
        self.out_dev = cp.zeros(nout, cp.uint8)
        self.out_host = cupyx.empty_pinned(nout, np.uint8)
        self.tokens_dev = self.out_dev[:4 * ACTION_TOKENS].view(cp.int32)
        self.ts_dev = self.out_dev[olay["ts"]:olay["ts"] + 8 * N_STAMPS].view(cp.uint64)
        self.pooled_dev = self.out_dev[olay["pooled"]:olay["pooled"] + 4 * H].view(cp.float32)
        self.o_tokens = self.out_host[:4 * ACTION_TOKENS].view(np.int32)
        self.o_ts = self.out_host[olay["ts"]:olay["ts"] + 8 * N_STAMPS].view(np.uint64)
        self.o_pooled = self.out_host[olay["pooled"]:olay["pooled"] + 4 * H].view(np.float32)

    # ------------------------------------------------------------------------------------ launches
    @staticmethod
    def _carg(a):
        if isinstance(a, cupy.ndarray):
            return ctypes.c_void_p(a.data.ptr)
        if isinstance(a, np.int32):
            return ctypes.c_int32(int(a))
        if isinstance(a, np.float32):
            return ctypes.c_float(float(a))
        if isinstance(a, np.uint64):
            return ctypes.c_uint64(int(a))
        if isinstance(a, np.int64):
            return ctypes.c_int64(int(a))
        raise TypeError(f"kernel argument of type {type(a).__name__}: use numpy scalars or cupy arrays")

    @staticmethod
    def _fn_ptr(fn):
        """CUfunction handle of a CuPy kernel (RawKernel.kernel.ptr, or Function.ptr); None for anything else."""
        f = getattr(fn, "kernel", fn)
        ptr = getattr(f, "ptr", None)
        return int(ptr) if ptr else None

    def _launch(self, name, grid, block, args, shared_mem=0, stream=None):
        """Launch kernel `name`; with PDL on and a kernel before it in the stream, as a programmatic dependent."""
        fn = getattr(self.k, name)
        s = stream if stream is not None else cupy.cuda.get_current_stream()
        use_pdl = self.pdl and self._pdl_prev and not getattr(self, "_pdl_suspend", False)
        ptr = self._fn_ptr(fn) if use_pdl else None
        if ptr is not None:
            drv = self._drv
            cargs = [self._carg(a) for a in args]
            ptrs = (ctypes.c_void_p * len(cargs))(*[ctypes.addressof(c) for c in cargs])
            g = tuple(grid) + (1,) * (3 - len(grid))
            b = tuple(block) + (1,) * (3 - len(block))
            cfg = drv.CUlaunchConfig()
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = (int(v) for v in g)
            cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = (int(v) for v in b)
            cfg.sharedMemBytes = int(shared_mem)
            cfg.hStream = drv.CUstream(s.ptr)
            cfg.attrs = [self._pdl_attr]
            cfg.numAttrs = 1
            (err,) = drv.cuLaunchKernelEx(cfg, drv.CUfunction(ptr), ctypes.addressof(ptrs), 0)
            if err != drv.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"cuLaunchKernelEx({name}): {err}")
        else:
            fn(tuple(grid), tuple(block), tuple(args), shared_mem=shared_mem, stream=s)
        self._pdl_prev = True

    def _blocks_per_sm(self, name: str) -> int:
        fn = getattr(self.k, name)
        try:
            from cuda.bindings import driver as drv

            err, n = drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(drv.CUfunction(self._fn_ptr(fn)), 256, 0)
            if err == drv.CUresult.CUDA_SUCCESS and n > 0:
                return int(n)
        except Exception:  # noqa: BLE001 - no cuda-python: the __launch_bounds__ minimum
            pass
        return 1 if "gateup" in name else 2

    def _g4_plan(self) -> dict:
        """Kernel name, KV, RB, segments and grid of each v4 decode GEMV (None: that GEMV stays on v3)."""
        ov = _g4_overrides()
        plan = {}
        for key, K, N in (("qkv", self.H, self.NQKV), ("gateup", self.H, self.I), ("o", self.NQ, self.H),
                          ("down", self.I, self.H)):
            kv, rb = ov.get(key, G4_DEFAULTS[key])
            chunks = K // 256
            if key in ("qkv", "gateup"):
                kv = chunks  # one segment: the warp needs all of x for the norm
            else:
                kv = max(d for d in range(1, min(kv, G4_MAX_KV) + 1) if chunks % d == 0)
            if kv > G4_MAX_KV or (kv == G4_MAX_KV and rb > 1):
                plan[key] = None
                continue
            S = chunks // kv
            name = f"g4_{'proj' if key in ('o', 'down') else key}_{kv}x{rb}"
            units = math.ceil(N / rb) * S
            blocks = max(math.ceil(S / 8), min(self.sms * self._blocks_per_sm(name), math.ceil(units / 8)))
            plan[key] = {"name": name, "kv": kv, "rb": rb, "S": S, "blocks": blocks}
        return plan

    def _ks(self, n_tiles: int, k: int) -> int:
        per_sm = 4 if getattr(self, "gemm_wide", False) else 2
        return max(1, min(k // 64, math.ceil(per_sm * self.sms / n_tiles)))

    def _prefill_layers(self, s, T: int):
        """All layers for T (<= 32) tokens at positions n_prefix..n_prefix+T-1 (x in self.x_pre)."""
        H, I, eps = self.H, self.I, np.float32(self.cfg.rms_norm_eps)
        i32 = np.int32
        NQKV, NQ, NKVD, D, cap = self.NQKV, self.NQ, self.NKVD, self.D, self.capacity
        nrg = math.ceil(T * self.group / 64)
        nsp = self.prefill_splits
        if self.variant in ("v5", "v5w"):
            self._pdl_suspend = True
            try:
                self._prefill_body(s, T, H, I, eps, i32, NQKV, NQ, NKVD, D, cap, nrg, nsp)
            finally:
                self._pdl_suspend = False
        else:
            self._prefill_body(s, T, H, I, eps, i32, NQKV, NQ, NKVD, D, cap, nrg, nsp)

    def _prefill_body(self, s, T, H, I, eps, i32, NQKV, NQ, NKVD, D, cap, nrg, nsp):
        scale = np.float32(math.log2(math.e) / math.sqrt(D))
        for li, lw in enumerate(self.layers):
            kc, vc = self.kc[li], self.vc[li]
            self._launch("rmsnorm_bf16", (T_PRE,), (256,), (self.x_pre, lw["ln1"], eps, i32(H), self.xb, lw["bqkv"], i32(NQKV),
                                              self.qkv), stream=s)
            self._launch("gemm_bf16_t32", (NQKV // 64, self._ks(NQKV // 64, H)), (128,),
                            (self.xb, lw["wqkv"], self.qkv, i32(NQKV), i32(H), i32(1)), stream=s)
            self._launch("kv_write", (max(1, T * 2 * NKVD // 256),), (256,), (self.qkv, i32(T), i32(NQ), i32(NKVD), i32(D), kc, vc,
                                                                self.order_dev, self.params_dev, i32(0), i32(cap)),
                       stream=s)
            self._launch("attn_partial", (self.NKV, nrg, nsp), (128,), (self.qkv, i32(NQKV), kc, vc, self.order_dev, self.params_dev,
                                                          i32(0), i32(T), i32(self.group), i32(cap), self.cos, self.sin,
                                                          scale, self.part_o, self.part_ml), stream=s)
            self._launch("attn_combine", (self.NKV * nrg * 64,), (128,),
                           (self.part_o, self.part_ml, i32(nrg), i32(nsp), i32(T), i32(self.group), i32(NQ), self.att,
                            self.att_bf), stream=s)
            self._launch("gemm_bf16_t32", (H // 64, self._ks(H // 64, NQ)), (128,),
                            (self.att_bf, lw["wo"], self.x_pre, i32(H), i32(NQ), i32(1)), stream=s)
            if self.gemm_wide:  # gu zeroed by the norm kernel (bias = zeros), then split-K with atomics
                self._launch("rmsnorm_bf16", (T_PRE,), (256,), (self.x_pre, lw["ln2"], eps, i32(H), self.xb,
                                                                self.zeros_gu, i32(2 * I), self.gu), stream=s)
                self._launch("gemm_bf16_t32", (2 * I // 64, self._ks(2 * I // 64, H)), (128,),
                             (self.xb, lw["wgu"], self.gu, i32(2 * I), i32(H), i32(1)), stream=s)
            else:
                self._launch("rmsnorm_bf16", (T_PRE,), (256,), (self.x_pre, lw["ln2"], eps, i32(H), self.xb, NULLP,
                                                                i32(0), NULLP), stream=s)
                self._launch("gemm_bf16_t32", (2 * I // 64, 1), (128,),
                             (self.xb, lw["wgu"], self.gu, i32(2 * I), i32(H), i32(0)), stream=s)
            self._launch("silu_mul_bf16", (min(1024, T_PRE * I // 256),), (256,), (self.gu, i32(T_PRE), i32(I), self.xb), stream=s)
            self._launch("gemm_bf16_t32", (H // 64, self._ks(H // 64, I)), (128,), (self.xb, lw["wd"], self.x_pre, i32(H), i32(I),
                                                                     i32(1)), stream=s)

    def _decode_pass(self, s, step: int):
        H, I, eps = self.H, self.I, np.float32(self.cfg.rms_norm_eps)
        i32 = np.int32
        NQKV, NQ, NKVD, D, cap = self.NQKV, self.NQ, self.NKVD, self.D, self.capacity
        q_off = i32(VISION_TOKENS + step)
        scale = np.float32(math.log2(math.e) / math.sqrt(D))
        nsp = self.decode_splits
        self._launch("embed_gather", (max(1, H // 256),), (256,), (self.emb_act, self.start_dev, self.tokidx_dev, i32(H), self.xdec),
                       stream=s)
        g4 = self.g4 or {}
        att_p, att_c = (("attn_partial_v5", "attn_combine_v5") if self.variant in ("v5", "v5w", "v5p")
                        else ("attn_partial", "attn_combine"))
        for li, lw in enumerate(self.layers):
            kc, vc = self.kc[li], self.vc[li]
            if g4.get("qkv"):
                c = g4["qkv"]
                self._launch(c["name"], (c["blocks"],), (256,), (self.xdec, lw["ln1"], eps, lw["wqkv"], lw["bqkv"],
                                                                  i32(H), i32(NQ), i32(NKVD), self.qdec, kc, vc,
                                                                  self.order_dev, self.params_dev, q_off, i32(cap),
                                                                  i32(D)), stream=s)
            else:
                self._launch("dec_qkv", (math.ceil(NQKV / 16),), (256,), (self.xdec, lw["ln1"], eps, lw["wqkv"], lw["bqkv"], i32(H),
                                                        i32(NQ), i32(NKVD), self.qdec, kc, vc, self.order_dev,
                                                        self.params_dev, q_off, i32(cap), i32(D)),
                      shared_mem=4 * H, stream=s)
            self._launch(att_p, (self.NKV, 1, nsp), (128,), (self.qdec, i32(NQ), kc, vc, self.order_dev, self.params_dev,
                                                        q_off, i32(1), i32(self.group), i32(cap), self.cos, self.sin,
                                                        scale, self.part_o, self.part_ml), stream=s)
            self._launch(att_c, (self.NKV * 64,), (128,),
                           (self.part_o, self.part_ml, i32(1), i32(nsp), i32(1), i32(self.group), i32(NQ), self.attdec,
                            NULLP), stream=s)
            if g4.get("o"):
                c = g4["o"]
                self._launch(c["name"], (c["blocks"],), (256,), (self.attdec, lw["wo"], i32(NQ), i32(H), self.xdec,
                                                                  i32(c["S"])), stream=s)
            else:
                self._launch("dec_proj_residual", (math.ceil(H / 8),), (256,),
                             (self.attdec, lw["wo"], i32(NQ), i32(H), self.xdec), shared_mem=4 * NQ, stream=s)
            if g4.get("gateup"):
                c = g4["gateup"]
                self._launch(c["name"], (c["blocks"],), (256,), (self.xdec, lw["ln2"], eps, lw["wgu"], i32(H), i32(I),
                                                                  self.act), stream=s)
            else:
                self._launch("dec_gateup", (math.ceil(I / 16),), (256,),
                             (self.xdec, lw["ln2"], eps, lw["wgu"], i32(H), i32(I), self.act), shared_mem=4 * H, stream=s)
            if g4.get("down"):
                c = g4["down"]
                self._launch(c["name"], (c["blocks"],), (256,), (self.act, lw["wd"], i32(I), i32(H), self.xdec,
                                                                  i32(c["S"])), stream=s)
            else:
                self._launch("dec_proj_residual", (math.ceil(H / 8),), (256,),
                             (self.act, lw["wd"], i32(I), i32(H), self.xdec), shared_mem=4 * I, stream=s)
        self._launch("lm_head_argmax", (ACTION_VOCAB // 8,), (256,), (self.xdec, self.norm, eps, i32(H), self.head_act,
                                                         i32(ACTION_VOCAB), self.logits[step], self.ticket,
                                                         self.tokidx_dev, self.tokens_dev, i32(step), i32(self.V0)),
                         shared_mem=4 * H, stream=s)

    def _stamp(self, s, i):
        if self.plain_stamps:
            self._pdl_prev = False  # a full barrier: everything before the stamp completes before anything after
        self._launch("stamp", (1,), (1,), (self.ts_dev, np.int32(i)), stream=s)

    def _enqueue_chunk(self, s):
        rt = cupy.cuda.runtime
        rt.memcpyAsync(self.in_dev.data.ptr, self.in_host.ctypes.data, self.in_dev.nbytes,
                       rt.memcpyHostToDevice, s.ptr)
        self._pdl_prev = False
        self._stamp(s, 0)
        self._launch("vision_encode", (self.H // 32,), (256,), (self.frame_dev, self.patch_w, self.patch_b, self.pos_embed,
                                                       np.int32(self.H), self.x_pre, self.pooled_dev), stream=s)
        self._stamp(s, 1)
        self._prefill_layers(s, T_PRE)
        self._stamp(s, 2)
        for step in range(ACTION_TOKENS):
            self._decode_pass(s, step)
            self._stamp(s, 3 + step)
        rt.memcpyAsync(self.out_host.ctypes.data, self.out_dev.data.ptr, self.out_dev.nbytes,
                       rt.memcpyDeviceToHost, s.ptr)
        self._pdl_prev = False

    def _capture(self):
        s = self.stream
        s.synchronize()
        self._pdl_prev = False
        s.begin_capture()
        try:
            self._enqueue_chunk(s)
        finally:
            self.graph = s.end_capture()
        self.graph.upload(s) if hasattr(self.graph, "upload") else None
        s.synchronize()

    # --------------------------------------------------------------------------------- the protocol
    def _set_order(self, order: np.ndarray):
        n = len(order)
        if n > self.capacity:
            raise ValueError(f"order of {n} tokens does not fit a cache of {self.capacity} slots")
        order = np.asarray(order, dtype=np.int32)
        if n and (order.min() < 0 or order.max() >= self.capacity):
            raise ValueError("slot out of range")
        self.h_order[:n] = order
        self.h_order[n:] = 0

    def load_prompt(self, token_ids: np.ndarray, slots: np.ndarray) -> None:
        token_ids = np.asarray(token_ids, dtype=np.int64)
        slots = np.asarray(slots, dtype=np.int32)
        if len(token_ids) != len(slots):
            raise ValueError("token_ids and slots differ in length")
        s = self.stream
        s.synchronize()
        self._set_order(slots)
        emb = bf16_to_f32(self.embed_host[token_ids])
        with s:
            for b0 in range(0, len(token_ids), T_PRE):
                T = min(T_PRE, len(token_ids) - b0)
                self.h_params[0] = b0
                self.h_params[1] = -1
                x = np.zeros((T_PRE, self.H), np.float32)
                x[:T] = emb[b0:b0 + T]
                self.x_pre.set(x, stream=s)
                rt = cupy.cuda.runtime
                rt.memcpyAsync(self.in_dev.data.ptr, self.in_host.ctypes.data, self.in_dev.nbytes,
                               rt.memcpyHostToDevice, s.ptr)
                self._pdl_prev = False
                self._prefill_layers(s, T)
                s.synchronize()
        self._note_peak()

    def _fill_inputs(self, frame, plan, start_token):
        frame = np.asarray(frame)
        if frame.shape != (FRAME_H, FRAME_W, FRAME_C) or frame.dtype != np.uint8:
            raise ValueError(f"frame must be uint8 {(FRAME_H, FRAME_W, FRAME_C)}, got {frame.dtype} {frame.shape}")
        n_prefix = int(plan.n_prefix)
        if len(plan.order) != n_prefix + VISION_TOKENS + ACTION_TOKENS:
            raise ValueError("plan.order must hold n_prefix + 32 + 8 slots")
        self.h_frame[:] = frame.reshape(-1)
        self._set_order(plan.order)
        self.h_params[0] = n_prefix
        self.h_params[1] = -1
        self.h_start[:] = self.embed_host[int(start_token)]

    def run_chunk(self, frame: np.ndarray, plan, start_token: int, collect_logits: bool = False):
        s = self.stream
        s.synchronize()
        self._fill_inputs(frame, plan, start_token)
        if self.graph is None:
            self._capture()
        t0 = time.perf_counter()
        self.graph.launch(s)
        s.synchronize()
        t1 = time.perf_counter()
        ts = self.o_ts.astype(np.int64)
        dms = lambda a, b: (int(ts[b]) - int(ts[a])) * 1e-6  # noqa: E731
        self.last_pass_ms = [dms(2 + i, 3 + i) for i in range(ACTION_TOKENS)]
        timings = PhaseTimings(vision_ms=dms(0, 1), prefill_ms=dms(1, 2), decode_ms=dms(2, 2 + ACTION_TOKENS),
                               total_ms=(t1 - t0) * 1e3)
        res = BackendResult(tokens=self.o_tokens.copy(), pooled=self.o_pooled.copy(), timings=timings)
        if collect_logits:
            res.logits = cupy.asnumpy(self.logits)
        return res

    def device_chunk_ms(self) -> float:
        """Device time of the last chunk from the first to the last stamp (vision..last decode pass)."""
        ts = self.o_ts.astype(np.int64)
        return (int(ts[2 + ACTION_TOKENS]) - int(ts[0])) * 1e-6
