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
"""
from __future__ import annotations

import math
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


class VramPlanError(RuntimeError):
    pass


def _align(n: int, a: int = 256) -> int:
    return (n + a - 1) // a * a


class CudaBackend:
    name = "cuda"

    def __init__(self, weights, capacity: int, vram_ceiling_gb: float = 8.0, decode_splits: int = 64):
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
        self.decode_splits = max(1, min(64, int(decode_splits)))
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
        self.k = Kernels()
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
    def _ks(self, n_tiles: int, k: int) -> int:
        return max(1, min(k // 64, math.ceil(2 * self.sms / n_tiles)))

    def _prefill_layers(self, s, T: int):
        """All layers for T (<= 32) tokens at positions n_prefix..n_prefix+T-1 (x in self.x_pre)."""
        k, H, I, eps = self.k, self.H, self.I, np.float32(self.cfg.rms_norm_eps)
        i32 = np.int32
        NQKV, NQ, NKVD, D, cap = self.NQKV, self.NQ, self.NKVD, self.D, self.capacity
        nrg = math.ceil(T * self.group / 64)
        nsp = self.prefill_splits
        scale = np.float32(math.log2(math.e) / math.sqrt(D))
        for li, lw in enumerate(self.layers):
            kc, vc = self.kc[li], self.vc[li]
            k.rmsnorm_bf16((T_PRE,), (256,), (self.x_pre, lw["ln1"], eps, i32(H), self.xb, lw["bqkv"], i32(NQKV),
                                              self.qkv), stream=s)
            k.gemm_bf16_t32((NQKV // 64, self._ks(NQKV // 64, H)), (128,),
                            (self.xb, lw["wqkv"], self.qkv, i32(NQKV), i32(H), i32(1)), stream=s)
            k.kv_write((max(1, T * 2 * NKVD // 256),), (256,), (self.qkv, i32(T), i32(NQ), i32(NKVD), i32(D), kc, vc,
                                                                self.order_dev, self.params_dev, i32(0), i32(cap)),
                       stream=s)
            k.attn_partial((self.NKV, nrg, nsp), (128,), (self.qkv, i32(NQKV), kc, vc, self.order_dev, self.params_dev,
                                                          i32(0), i32(T), i32(self.group), i32(cap), self.cos, self.sin,
                                                          scale, self.part_o, self.part_ml), stream=s)
            k.attn_combine((self.NKV * nrg * 64,), (128,),
                           (self.part_o, self.part_ml, i32(nrg), i32(nsp), i32(T), i32(self.group), i32(NQ), self.att,
                            self.att_bf), stream=s)
            k.gemm_bf16_t32((H // 64, self._ks(H // 64, NQ)), (128,),
                            (self.att_bf, lw["wo"], self.x_pre, i32(H), i32(NQ), i32(1)), stream=s)
            k.rmsnorm_bf16((T_PRE,), (256,), (self.x_pre, lw["ln2"], eps, i32(H), self.xb, NULLP, i32(0), NULLP),
                           stream=s)
            k.gemm_bf16_t32((2 * I // 64, 1), (128,), (self.xb, lw["wgu"], self.gu, i32(2 * I), i32(H), i32(0)),
                            stream=s)
            k.silu_mul_bf16((min(1024, T_PRE * I // 256),), (256,), (self.gu, i32(T_PRE), i32(I), self.xb), stream=s)
            k.gemm_bf16_t32((H // 64, self._ks(H // 64, I)), (128,), (self.xb, lw["wd"], self.x_pre, i32(H), i32(I),
                                                                     i32(1)), stream=s)

    def _decode_pass(self, s, step: int):
        k, H, I, eps = self.k, self.H, self.I, np.float32(self.cfg.rms_norm_eps)
        i32 = np.int32
        NQKV, NQ, NKVD, D, cap = self.NQKV, self.NQ, self.NKVD, self.D, self.capacity
        q_off = i32(VISION_TOKENS + step)
        scale = np.float32(math.log2(math.e) / math.sqrt(D))
        nsp = self.decode_splits
        k.embed_gather((max(1, H // 256),), (256,), (self.emb_act, self.start_dev, self.tokidx_dev, i32(H), self.xdec),
                       stream=s)
        for li, lw in enumerate(self.layers):
            kc, vc = self.kc[li], self.vc[li]
            k.dec_qkv((math.ceil(NQKV / 16),), (256,), (self.xdec, lw["ln1"], eps, lw["wqkv"], lw["bqkv"], i32(H),
                                                        i32(NQ), i32(NKVD), self.qdec, kc, vc, self.order_dev,
                                                        self.params_dev, q_off, i32(cap), i32(D)),
                      shared_mem=4 * H, stream=s)
            k.attn_partial((self.NKV, 1, nsp), (128,), (self.qdec, i32(NQ), kc, vc, self.order_dev, self.params_dev,
                                                        q_off, i32(1), i32(self.group), i32(cap), self.cos, self.sin,
                                                        scale, self.part_o, self.part_ml), stream=s)
            k.attn_combine((self.NKV * 64,), (128,),
                           (self.part_o, self.part_ml, i32(1), i32(nsp), i32(1), i32(self.group), i32(NQ), self.attdec,
                            NULLP), stream=s)
            k.dec_proj_residual((math.ceil(H / 8),), (256,), (self.attdec, lw["wo"], i32(NQ), i32(H), self.xdec),
                                shared_mem=4 * NQ, stream=s)
            k.dec_gateup((math.ceil(I / 16),), (256,), (self.xdec, lw["ln2"], eps, lw["wgu"], i32(H), i32(I), self.act),
                         shared_mem=4 * H, stream=s)
            k.dec_proj_residual((math.ceil(H / 8),), (256,), (self.act, lw["wd"], i32(I), i32(H), self.xdec),
                                shared_mem=4 * I, stream=s)
        k.lm_head_argmax((ACTION_VOCAB // 8,), (256,), (self.xdec, self.norm, eps, i32(H), self.head_act,
                                                         i32(ACTION_VOCAB), self.logits[step], self.ticket,
                                                         self.tokidx_dev, self.tokens_dev, i32(step), i32(self.V0)),
                         shared_mem=4 * H, stream=s)

    def _stamp(self, s, i):
        self.k.stamp((1,), (1,), (self.ts_dev, np.int32(i)), stream=s)

    def _enqueue_chunk(self, s):
        rt = cupy.cuda.runtime
        rt.memcpyAsync(self.in_dev.data.ptr, self.in_host.ctypes.data, self.in_dev.nbytes,
                       rt.memcpyHostToDevice, s.ptr)
        self._stamp(s, 0)
        self.k.vision_encode((self.H // 32,), (256,), (self.frame_dev, self.patch_w, self.patch_b, self.pos_embed,
                                                       np.int32(self.H), self.x_pre, self.pooled_dev), stream=s)
        self._stamp(s, 1)
        self._prefill_layers(s, T_PRE)
        self._stamp(s, 2)
        for step in range(ACTION_TOKENS):
            self._decode_pass(s, step)
            self._stamp(s, 3 + step)
        rt.memcpyAsync(self.out_host.ctypes.data, self.out_dev.data.ptr, self.out_dev.nbytes,
                       rt.memcpyDeviceToHost, s.ptr)

    def _capture(self):
        s = self.stream
        s.synchronize()
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
