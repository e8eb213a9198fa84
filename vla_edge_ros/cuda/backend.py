# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""CudaBackend: the whole reasoning chunk as ONE CUDA graph of hand-written kernels (CuPy + NVRTC).

Graph (captured once, replayed per chunk; docs/cuda_notes.md):
  H2D copy of the chunk inputs (frame, order table, n_prefix, start-token row) from a pinned buffer -> stamp
  -> vision encoder -> stamp -> prefill through all layers (KV written into the frame's slots) -> stamp ->
  autoregressive models: 8 decode passes (embedding gather; per layer: q/k/v + norm + KV write, split-K
      attention, combine, o-proj + residual, gate/up + norm + SwiGLU, down + residual; the constrained LM head
      with on-device argmax feeding the next pass), a stamp after each;
  parallel models: the 8 K action queries of K planned actions ride in the prefill (32 + 8 K rows; they attend to
      the whole frame and each other), then the LM head on those rows (one action: 8 launches; K > 1: one launch
      over the 8 K rows), then a stamp;
  -> D2H copy of tokens + timestamps + pooled embedding into a pinned buffer.
Lengths, positions and slots are read on the device from the uploaded buffers, so the graph never needs
re-capture. No cuBLAS, no PyTorch. The prefill is launched plainly; the decode kernels with Programmatic
Dependent Launch (sm_90+), each stamp plainly (a full barrier per pass, which the attention kernel's pre-wait
loads of older keys rely on).

Prefill, per layer: rmsnorm(+bias) -> GEMM q/k/v -> kv_write -> attn_partial -> attn_combine -> GEMM o (+res) ->
rmsnorm -> GEMM gate/up + SwiGLU -> GEMM down (+res): 9 kernels (kernels/gemm.cu, through cuda.launch.Gemm). The GEMMs'
inputs (the norms' outputs, the attention output, silu(gate) * up) are bf16, or fp16 where the model's weights bound
them inside fp16's range (act_format.fp16_prefill; issue 41): a 4-bit model's gemm_w4h_* instances, a bf16 model's
gemm_f16_* (its layers stored in fp16 on the device, the decode GEMVs reading them as such).
Weights: bf16 (fp16 on the device, as above), or 4-bit (W4A16, model/quant.py QuantTensor) for the seven linear
layers of every layer; the kernels for each (gemv.cu for decode, gemm.cu's instance for the prefill) are chosen by
the model, not by a switch.
Every device array comes from vram_plan.layout(): the plan checked at start-up is what is allocated.

Prompt (``load_prompt``, an instruction change) and text prefill: blocks of up to PROMPT_ROWS (96) rows through the
same layers (the 96-row GEMM instance; a last block that fits the chunk's GEMM takes that one), each block one CUDA
graph (captured once per block size) launched after an H2D copy of its rows and params from pinned staging, so a long
prompt is queued without a host sync between blocks.
Text (``text_logits``, for vla-edge-generate and the real-weight gates): full-vocabulary logits of a token sequence,
outside the chunk graph: prefill in those blocks, decode (one token) as one graph (the GEMV pass and the full head
GEMV, logits back into pinned memory), the full LM head (all V rows, bf16) of a block through the bf16 prefill GEMM.
The head and its logits buffer (vram_plan.text_head_bytes: 0.31 GiB for the 0.5B shape) are uploaded on the first
text_logits call, so the robot chunk's VRAM plan does not change. Text shares the KV cache with the robot chunk
(slot == position): a text call overwrites slots start..start+T-1, so load the prompt again before the next
run_chunk.
"""
from __future__ import annotations

import time

import cupy
import cupyx
import numpy as np

from ..constants import ACTION_TOKENS, ACTION_VOCAB, FRAME_C, FRAME_H, FRAME_W, VISION_TOKENS
from ..contract import BackendResult, PhaseTimings
from ..model import ops
from ..model.safetensors_io import bf16_to_f32, f32_to_bf16, release_pages
from ..model.weights import action_queries
from ..vram_plan import (GIB, N_STAMPS, PROMPT_ROWS, TEXT_ROWS_ALIGN, VramPlanError, check_cuda_shape,  # noqa: F401
                         check_vram_plan, in_layout, layout, out_layout, prefill_attention_splits, text_head_bytes)
from .act_format import fp16_prefill, fp16_weights_fit
from .kernels import Kernels
from .launch import (Gemm, Gemv, Launcher, attention, embed_gather, gemm_token_split, gemv_plan, kv_write,
                     lm_head_argmax, rmsnorm_bf16, stamp, state_project, vision_encode)

i32, f32 = np.int32, np.float32
F16_SLAB = 1 << 22  # elements of a bf16 weight converted to fp16 on the device at once (_linear)


def w4_device_arrays(qt) -> tuple[np.ndarray, np.ndarray, int]:
    """(Q uint32 [N, K/8], SZ uint32 [N, K/128], sbf) for kernels/gemv.cu and gemm.cu from a QuantTensor:
    SZ = the scale's 16-bit pattern in the file's dtype | zero << 16."""
    if qt.scale_dtype == "bfloat16":
        bits, sbf = f32_to_bf16(np.asarray(qt.scales, np.float32)).astype(np.uint32), 1
    else:
        bits, sbf = np.asarray(qt.scales, np.float32).astype(np.float16).view(np.uint16).astype(np.uint32), 0
    sz = bits | (np.asarray(qt.zeros).astype(np.uint32) << 16)
    return np.ascontiguousarray(qt.qweight, dtype=np.uint32), np.ascontiguousarray(sz, dtype=np.uint32), sbf


class CudaBackend:
    name = "cuda"

    def __init__(self, weights, capacity: int, vram_ceiling_gb: float = 8.0, sms: int | None = None, stream=None,
                 fp16_act: bool | None = None):
        """``sms``: the multiprocessors to plan the grids for (default: the device's); ``stream``: the stream the
        chunk's graph is captured and launched on (default: a new non-blocking one). chunk_bench --sms passes a
        green context's stream and its SM count. ``fp16_act``: the prefill GEMM inputs (the RMSNorm outputs, the
        attention output, silu(gate) * up) in fp16 instead of bf16, and a bf16 model's layers stored in fp16 on the
        device for it; None (default): where act_format.fp16_prefill proves they fit."""
        cfg = self.cfg = weights.cfg
        check_cuda_shape(cfg)
        self.capacity = int(capacity)
        self.vram_ceiling_gb = float(vram_ceiling_gb)
        H, I, D = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
        NH, NKV, L = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_hidden_layers
        self.H, self.I, self.D, self.NH, self.NKV, self.L = H, I, D, NH, NKV, L
        self.group = NH // NKV
        self.NQ, self.NKVD = NH * D, NKV * D
        self.NQKV = self.NQ + 2 * self.NKVD
        self.V0 = cfg.vocab_size - ACTION_VOCAB
        self.parallel = cfg.parallel
        self.A = cfg.action_tokens  # 8 K action tokens a chunk
        self.S = cfg.state_tokens  # the state's token (1 with a state input): x_pre row 32, before the action rows
        self.F = VISION_TOKENS + self.S  # the chunk's rows before its action rows (the bidirectional ones)
        self.sms = int(sms) if sms else cupy.cuda.Device().attributes["MultiProcessorCount"]
        self.lay = layout(cfg, self.capacity, self.sms)
        self.plan = self.lay.parts
        check_vram_plan(self.plan, self.vram_ceiling_gb, self.capacity)
        self._pool = cupy.get_default_memory_pool()
        self._pool_base = self._pool.used_bytes()
        self.stream = stream if stream is not None else cupy.cuda.Stream(non_blocking=True)
        self.k = Kernels()
        self.launch = Launcher(self.k, self.stream)
        self.weight_format = cfg.weight_format
        self.w4 = self.weight_format == "w4"
        if fp16_act is None:
            fp16_act = fp16_prefill(weights)
        elif fp16_act and not self.w4 and not fp16_weights_fit(weights):
            raise ValueError("fp16 prefill of a bf16 model: a linear weight is not finite or past fp16's 65504")
        self.x16 = bool(fp16_act)  # the prefill's xb / att_bf / act_pre hold fp16 (else bf16)
        # the layers' weights on the device (launch.WEIGHT_FORMATS): a bf16 model with fp16 activations keeps them in
        # fp16, as its GEMMs multiply them
        self.device_format = "w4" if self.w4 else ("f16" if self.x16 else "bf16")
        self._upload_weights(weights)
        self.gemv_launch = Gemv(self.k, self.device_format)
        self.gemv = gemv_plan(self.gemv_launch, self.launch, self.H, self.I, self.NQKV, self.NQ, self.sms)
        xfmt = "fp16" if self.x16 else "bf16"
        # the chunk's prefill GEMM and its gate/up's, and the prompt blocks' (the same when the chunk has PROMPT_ROWS
        # rows); a block of at most gemm.kernel_rows rows takes the chunk's
        self.gemm, self.gemm_gu = self._prefill_gemms(self.lay.rows, self.lay.tokens, xfmt)
        self.gemm_prompt, self.gemm_prompt_gu = (self.gemm, self.gemm_gu) if self.lay.rows == PROMPT_ROWS else \
            self._prefill_gemms(PROMPT_ROWS, PROMPT_ROWS, xfmt)
        self.gemm_slots = {g.name: self.sms * self.launch.blocks_per_sm(g.name, g.threads, 1, g.smem)
                           for g in (self.gemm, self.gemm_prompt)}
        self._allocate()
        # the uploads, the fp16 conversion and the zero fills ran on CuPy's default stream, which a non-blocking stream
        # does not wait for: done before anything runs on self.stream
        cupy.cuda.Device().synchronize()
        self._peak = 0
        self._note_peak()
        self.graph = None
        self._block_graphs: dict[int, object] = {}  # a prompt / text prefill block of T rows -> its graph
        self._stage = None  # pinned host rows and params of a call's prefill blocks (_block_staging)
        self._order_identity = False  # the device's order table is slot == position (the text path's)
        self.last_pass_ms: list[float] = []

    # ------------------------------------------------------------------------------------ uploads
    def _linear(self, parts):
        """Row-concatenated linear weight on the device: 16-bit array (bf16 bits, or fp16 bits for device_format
        "f16": each part converted on the device, exact for magnitudes 2^-14 .. 65504), or (Q, SZ) for 4-bit."""
        if self.w4:
            qs, szs = zip(*(w4_device_arrays(p)[:2] for p in parts))
            return cupy.asarray(np.concatenate(qs)), cupy.asarray(np.concatenate(szs))
        if self.device_format == "f16":
            out = cupy.empty((sum(p.shape[0] for p in parts), parts[0].shape[1]), cupy.uint16)
            r = 0
            for p in parts:
                p = np.asarray(p)
                if p.dtype != np.uint16:
                    raise TypeError(f"a bf16 layer weight as {p.dtype}, not bf16 bits (uint16)")
                # a slab of rows at a time: the conversion's temporaries (8 bytes an element) stay near 32 MB on top
                # of the plan at start-up, where a whole weight at once (the 3B's gate: 22.5M elements) took ~270 MB
                step = max(1, F16_SLAB // p.shape[1])
                for i in range(0, p.shape[0], step):
                    w = cupy.asarray(np.ascontiguousarray(p[i:i + step])).astype(cupy.uint32)
                    w <<= 16  # bf16 bits -> float32 bits (exact)
                    out[r + i:r + i + w.shape[0]] = w.view(cupy.float32).astype(cupy.float16).view(cupy.uint16)
                r += p.shape[0]
            return out
        return cupy.asarray(np.concatenate(parts, axis=0))

    def _upload_weights(self, w):
        cp = cupy
        self.sbf = i32(self.w4 and w.layers[0]["wq"].scale_dtype == "bfloat16")  # the scale bits' type
        self.layers = []
        for lw in w.layers:
            self.layers.append({
                "ln1": cp.asarray(lw["ln1"]), "ln2": cp.asarray(lw["ln2"]),
                "wqkv": self._linear([lw["wq"], lw["wk"], lw["wv"]]),
                "bqkv": cp.asarray(np.concatenate([bf16_to_f32(lw[b]) for b in ("bq", "bk", "bv")])),
                "wo": self._linear([lw["wo"]]),
                "wgu": self._linear([lw["wg"], lw["wu"]]),
                "wd": self._linear([lw["wd"]]),
            })
        self.norm = cp.asarray(w.norm)
        self.head_act = cp.asarray(np.ascontiguousarray(w.head[self.V0:]))
        self.emb_act = self.head_act if w.lm_head is None else cp.asarray(np.ascontiguousarray(w.embed[self.V0:]))
        self.embed_host = w.embed  # host copy: prompt and start-token rows are gathered on the CPU
        self.head_host = w.head  # all V rows (bf16), uploaded by the first text_logits call only
        self._text = None
        self.patch_w = cp.asarray(w.vision.patch_w)
        self.patch_b = cp.asarray(w.vision.patch_b)
        self.pos_embed = cp.asarray(w.vision.pos_embed)
        if self.parallel:
            self.queries = cp.asarray(action_queries(w))  # float32 [8 K, H]
        st = w.vision.state
        if self.S:
            self.state_w = [cp.asarray(np.ascontiguousarray(a)) for a in (st.fc1_w, st.fc1_b, st.fc2_w, st.fc2_b)]
        # Each host array was read once for its upload: a memory-mapped model's pages (a converted GGUF, a bf16
        # safetensors file) leave this process; the rows embed_host gathers later fault back in one by one.
        for a in (w.embed, w.norm, w.lm_head, *(t for lw in w.layers for t in lw.values())):
            if isinstance(a, np.ndarray):
                release_pages(a)

    def _allocate(self):
        cp = cupy
        L, NKV, cap, D = self.L, self.NKV, self.capacity, self.D
        self.kc = cp.zeros((L, NKV, cap, D), cp.uint16)
        self.vc = cp.zeros((L, NKV, cap, D), cp.uint16)
        for name, (shape, dtype) in self.lay.buffers.items():
            setattr(self, name, cp.zeros(shape, dtype))
        # the prefill's SwiGLU output (bf16 [rows, I], written by the gate/up GEMM, read by the down GEMM) lives in
        # the plan's "gu" buffer (sized for the fp32 gate|up pair the unfused path needed: twice what this uses)
        rows = self.lay.buffer_rows
        self.act_pre = self.gu.reshape(-1).view(cp.uint16)[:rows * self.I].reshape(rows, self.I)
        cos, sin = ops.rope_cos_sin(np.arange(cap), D, self.cfg.rope_theta)
        self.cos.set(cos)
        self.sin.set(sin)
        lay, nin = in_layout(self.H, cap)
        self._in_lay = lay
        self.in_host = cupyx.empty_pinned(nin, np.uint8)
        self.in_host[:] = 0
        self.frame_dev = self.in_dev[lay["frame"]:lay["order"]]
        self.order_dev = self.in_dev[lay["order"]:lay["order"] + 4 * cap].view(cp.int32)
        self.params_dev = self.in_dev[lay["params"]:lay["params"] + 16].view(cp.int32)
        self.tokidx_dev = self.params_dev[1:2]
        self.start_dev = self.in_dev[lay["start"]:lay["start"] + 2 * self.H].view(cp.uint16)
        self.h_frame = self.in_host[:lay["order"]]
        self.h_order = self.in_host[lay["order"]:lay["order"] + 4 * cap].view(np.int32)
        self.h_params = self.in_host[lay["params"]:lay["params"] + 16].view(np.int32)
        self.h_start = self.in_host[lay["start"]:lay["start"] + 2 * self.H].view(np.uint16)
        sd = max(1, self.cfg.state_dim)
        self.state_dev = self.in_dev[lay["state"]:lay["state"] + 4 * sd].view(cp.float32)
        self.h_state = self.in_host[lay["state"]:lay["state"] + 4 * sd].view(np.float32)
        olay, nout = out_layout(self.H, self.A)
        self.out_host = cupyx.empty_pinned(nout, np.uint8)
        n_ts = 8 * N_STAMPS
        self.tokens_dev = self.out_dev[:4 * self.A].view(cp.int32)
        self.ts_dev = self.out_dev[olay["ts"]:olay["ts"] + n_ts].view(cp.uint64)
        self.pooled_dev = self.out_dev[olay["pooled"]:olay["pooled"] + 4 * self.H].view(cp.float32)
        self.o_tokens = self.out_host[:4 * self.A].view(np.int32)
        self.o_ts = self.out_host[olay["ts"]:olay["ts"] + n_ts].view(np.uint64)
        self.o_pooled = self.out_host[olay["pooled"]:olay["pooled"] + 4 * self.H].view(np.float32)

    @property
    def peak_vram_bytes(self) -> int:
        self._note_peak()
        return self._peak

    def _note_peak(self):
        self._peak = max(self._peak if hasattr(self, "_peak") else 0, self._pool.used_bytes() - self._pool_base)

    # ------------------------------------------------------------------------------------ kernel plans
    def _prefill_gemms(self, rows: int, tokens: int, xfmt: str) -> tuple[Gemm, Gemm]:
        """The prefill GEMM of a ``rows``-row buffer, and the one its gate/up runs: the same, or in token slices where
        its grid holds few blocks an SM of this GPU (launch.gemm_token_split)."""
        g = Gemm(self.k, self.device_format, rows, tokens=tokens, xfmt=xfmt)
        z = gemm_token_split(rows, g.blocks(2 * self.I, "swiglu"), self.sms)
        return g, (g if z == 1 else Gemm(self.k, self.device_format, rows, tokens=tokens, xfmt=xfmt, zsplit=z))

    def _gemm(self, g, X, W, Y, N, K, mode):
        """Prefill GEMM ``g`` (kernels/gemm.cu through the typed launcher); mode "add" splits K to fill one wave."""
        if mode == "swiglu":
            g(X, self._w(W), N, K, mode, act=Y, run=self.launch)
        else:
            g(X, self._w(W), N, K, mode, Y=Y, ks=g.split(N, K, mode, self.gemm_slots[g.name]), run=self.launch)

    # ------------------------------------------------------------------------------------ the graph body
    def _prefill_layers(self, T: int, bidir_from: int):
        """All layers for T tokens at positions n_prefix..n_prefix+T-1 (x in self.x_pre); plain launches. The chunk's
        T takes the chunk's GEMM; a prompt block the chunk's GEMM if it fits, else the PROMPT_ROWS one. The attention
        splits are those of T rows (vram_plan sized the partials for every T up to PROMPT_ROWS)."""
        H, I, eps = self.H, self.I, f32(self.cfg.rms_norm_eps)
        NQKV, NQ, NKVD, D, cap = self.NQKV, self.NQ, self.NKVD, self.D, self.capacity
        if T > PROMPT_ROWS:
            raise ValueError(f"a prefill of {T} rows: at most {PROMPT_ROWS} a block")
        gm, gu = (self.gemm, self.gemm_gu) if T <= self.gemm.kernel_rows else (self.gemm_prompt, self.gemm_prompt_gu)
        nsp = prefill_attention_splits(self.sms, self.NKV, T, self.group, D)  # the chunk's: lay.prefill_splits
        go = self.launch
        for li, lw in enumerate(self.layers):
            kc, vc = self.kc[li], self.vc[li]
            rmsnorm_bf16(self.k, self.x_pre, lw["ln1"], eps, H, T, self.xb, lw["bqkv"], NQKV, self.qkv, run=go,
                         dependent=False, f16=self.x16)
            self._gemm(gm, self.xb, lw["wqkv"], self.qkv, NQKV, H, "add")
            kv_write(self.k, self.qkv, T, NQ, NKVD, D, kc, vc, self.order_dev, self.params_dev, 0, cap, run=go,
                     dependent=False)
            attention(self.k, self.qkv, NQKV, kc, vc, self.order_dev, self.params_dev, 0, T, self.NKV, self.group, cap,
                      self.cos, self.sin, bidir_from, nsp, self.part_o, self.part_ml, self.att, self.att_bf, run=go,
                      dependent=False, out_f16=self.x16)
            self._gemm(gm, self.att_bf, lw["wo"], self.x_pre, H, NQ, "add")
            rmsnorm_bf16(self.k, self.x_pre, lw["ln2"], eps, H, T, self.xb, run=go, dependent=False, f16=self.x16)
            self._gemm(gu, self.xb, lw["wgu"], self.act_pre, 2 * I, H, "swiglu")  # act = silu(gate) * up, bf16 (fp16)
            self._gemm(gm, self.act_pre, lw["wd"], self.x_pre, H, I, "add")

    def _decode_layers(self, q_off: int):
        """One token (x in self.xdec) through every layer at position params[0] + q_off, its K/V written into slot
        order[params[0] + q_off]: per layer q/k/v + norm + KV write, split-K attention, combine, o-proj + residual,
        gate/up + norm + SwiGLU, down + residual (PDL launches)."""
        H, I, eps = self.H, self.I, f32(self.cfg.rms_norm_eps)
        NQ, NKVD, D, cap = self.NQ, self.NKVD, self.D, self.capacity
        q_off = i32(q_off)
        nsp = self.lay.decode_splits
        go, g, gv = self.launch, self.gemv, self.gemv_launch
        for li, lw in enumerate(self.layers):
            kc, vc = self.kc[li], self.vc[li]
            gv.qkv(self.xdec, lw["ln1"], eps, self._w(lw["wqkv"]), lw["bqkv"], H, NQ, NKVD, self.qdec, kc, vc,
                   self.order_dev, self.params_dev, q_off, cap, D, g["qkv"]["blocks"], run=go)
            attention(self.k, self.qdec, NQ, kc, vc, self.order_dev, self.params_dev, q_off, 1, self.NKV, self.group,
                      cap, self.cos, self.sin, 1, nsp, self.part_o, self.part_ml, self.attdec, run=go)
            gv.proj(self.attdec, self._w(lw["wo"]), NQ, H, self.xdec, g["o"]["kv"], g["o"]["blocks"], run=go)
            gv.gateup(self.xdec, lw["ln2"], eps, self._w(lw["wgu"]), H, I, self.act, g["gateup"]["blocks"], run=go)
            gv.proj(self.act, self._w(lw["wd"]), I, H, self.xdec, g["down"]["kv"], g["down"]["blocks"], run=go)

    def _decode_pass(self, step: int):
        embed_gather(self.k, self.emb_act, self.start_dev, self.tokidx_dev, self.H, self.xdec, run=self.launch)
        self._decode_layers(self.F + step)
        self._head(self.xdec, step)

    def _w(self, w):
        """A projection's weight: W for bf16, (Q, SZ, sbf) for 4-bit."""
        return (w[0], w[1], self.sbf) if self.w4 else w

    def _head(self, x, step: int):
        eps = f32(self.cfg.rms_norm_eps)
        lm_head_argmax(self.k, x, self.norm, eps, self.H, self.head_act, self.logits[step], self.ticket,
                       self.tokidx_dev, self.tokens_dev, step, self.V0, run=self.launch)

    def _action_heads(self):
        """The LM head over the parallel action rows (x_pre rows F = 32 (+ the state row) ..): one action keeps its 8
        launches (the graph of before); K > 1 actions take one launch over the 8 K rows (a ticket a row), not 8 K
        launches."""
        if self.A == ACTION_TOKENS:
            for i in range(ACTION_TOKENS):
                self._head(self.x_pre[self.F + i], i)
            return
        lm_head_argmax(self.k, self.x_pre[self.F], self.norm, f32(self.cfg.rms_norm_eps), self.H,
                       self.head_act, self.logits, self.ticket, self.tokidx_dev, self.tokens_dev, 0, self.V0,
                       run=self.launch, n_x=self.A)

    def enqueue_prefill(self):
        """Enqueue the chunk's prefill (all layers, the frame's rows + the parallel action queries) on the stream,
        as the graph does: for timing it alone (chunk_bench --breakdown)."""
        self._prefill_layers(self.lay.tokens, self.F)

    def enqueue_decode_pass(self, step: int):
        """Enqueue decode pass ``step`` (autoregressive models) on the stream, as the graph does."""
        self._decode_pass(step)

    def enqueue_decode_layers(self, q_off: int):
        """Enqueue the layers of one decode token (x in xdec, position params[0] + q_off) alone, without the embedding
        gather and the head (dev/cuda/decode_micro.py times them against the persistent pass)."""
        self._decode_layers(q_off)

    def _stamp(self, i):
        self.launch.barrier()  # a full barrier: everything before the stamp completes before anything after
        stamp(self.k, self.ts_dev, i, run=self.launch)

    def _enqueue_chunk(self):
        rt, s = cupy.cuda.runtime, self.stream
        rt.memcpyAsync(self.in_dev.data.ptr, self.in_host.ctypes.data, self.in_dev.nbytes, rt.memcpyHostToDevice,
                       s.ptr)
        self._stamp(0)
        vision_encode(self.k, self.frame_dev, self.patch_w, self.patch_b, self.pos_embed, self.H, self.x_pre,
                      self.pooled_dev, run=self.launch, dependent=False)
        if self.S:
            state_project(self.k, self.state_dev, *self.state_w, self.cfg.state_dim, self.H, self.state_hidden,
                          self.x_pre[VISION_TOKENS], run=self.launch, dependent=False)
        if self.parallel:
            rt.memcpyAsync(self.x_pre[self.F].data.ptr, self.queries.data.ptr, self.queries.nbytes,
                           rt.memcpyDeviceToDevice, s.ptr)
        self._stamp(1)
        if self.parallel:
            self._prefill_layers(self.lay.tokens, self.F)
            self._stamp(2)
            self.launch.barrier()
            self._action_heads()
            self._stamp(2 + ACTION_TOKENS)
        else:
            self._prefill_layers(self.F, self.F)
            self._stamp(2)
            for step in range(ACTION_TOKENS):
                self._decode_pass(step)
                self._stamp(3 + step)
        rt.memcpyAsync(self.out_host.ctypes.data, self.out_dev.data.ptr, self.out_dev.nbytes, rt.memcpyDeviceToHost,
                       s.ptr)
        self.launch.barrier()

    def _captured(self, enqueue):
        """A CUDA graph of what ``enqueue`` launches on the stream (captured, instantiated and uploaded)."""
        s = self.stream
        s.synchronize()
        self.launch.barrier()
        s.begin_capture()
        try:
            enqueue()
        finally:
            g = s.end_capture()
            self.launch.barrier()  # the first launch after a graph is a plain one
        if hasattr(g, "upload"):
            g.upload(s)
        s.synchronize()
        return g

    def _capture(self):
        self.graph = self._captured(self._enqueue_chunk)

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
        self._order_identity = False

    def load_prompt(self, token_ids: np.ndarray, slots: np.ndarray) -> None:
        token_ids = np.asarray(token_ids, dtype=np.int64)
        slots = np.asarray(slots, dtype=np.int32)
        if len(token_ids) != len(slots):
            raise ValueError("token_ids and slots differ in length")
        s = self.stream
        s.synchronize()
        self._set_order(slots)
        self._upload_inputs()
        if len(token_ids):
            self._prefill_blocks(bf16_to_f32(self.embed_host[token_ids]), 0)
        s.synchronize()
        self._note_peak()

    def _upload_inputs(self):
        """The whole input block (the order table, params, start row) to the device, on the stream."""
        rt = cupy.cuda.runtime
        rt.memcpyAsync(self.in_dev.data.ptr, self.in_host.ctypes.data, self.in_dev.nbytes, rt.memcpyHostToDevice,
                       self.stream.ptr)

    def _block_staging(self, T: int, n: int):
        """Pinned host rows (float32 [>= T, H]) and params (int32 [>= n, 4]) of one call's prefill blocks: each block
        is copied from them by its own H2D copy, so the host never waits for a block before queueing the next. Grown
        when a call needs more; reused once the previous call has synchronized."""
        st = self._stage
        if st is None or st[0].shape[0] < T or st[1].shape[0] < n:
            rows = max(T, st[0].shape[0] if st else 0)
            st = self._stage = (cupyx.empty_pinned((rows, self.H), np.float32),
                                cupyx.empty_pinned((-(-rows // PROMPT_ROWS), 4), np.int32))
        return st

    def _block_graph(self, T: int):
        """The prefill of one block of T <= PROMPT_ROWS rows (x_pre rows 0..T-1 at positions params[0].., their K/V
        written into the slots the order table gives) as one CUDA graph, captured on first use for each T: x_pre's
        rows T.. zeroed, then every layer. A long prompt is then a graph launch a block with no host sync between
        blocks, not 9 host launches a layer a block (BENCHMARKS.md "Prompt and text paths")."""
        g = self._block_graphs.get(T)
        if g is None:
            rt, row = cupy.cuda.runtime, 4 * self.H

            def enqueue():
                rt.memsetAsync(self.x_pre.data.ptr + T * row, 0, self.x_pre.nbytes - T * row, self.stream.ptr)
                self._prefill_layers(T, T)

            g = self._block_graphs[T] = self._captured(enqueue)
        return g

    def _prefill_blocks(self, emb: np.ndarray, position: int, after_block=None) -> None:
        """Rows ``emb`` (float32 [T, H]) through every layer at positions position.., PROMPT_ROWS rows a block (the
        order table already on the device), their KV written: the prompt's and the text path's prefill. Per block: its
        rows and params copied from pinned staging, then its graph; ``after_block(b0, Tb)`` (the text head) runs after
        each block's graph is queued. Returns with the work queued, not done."""
        T, blk = len(emb), PROMPT_ROWS
        n = -(-T // blk)
        xs, ps = self._block_staging(T, n)
        xs[:T] = emb
        ps[:n, 0] = position + blk * np.arange(n)
        ps[:n, 1] = -1
        ps[:n, 2:] = 0
        rt, s, row = cupy.cuda.runtime, self.stream, 4 * self.H
        for b in range(n):
            b0 = b * blk
            Tb = min(blk, T - b0)
            g = self._block_graph(Tb)
            rt.memcpyAsync(self.x_pre.data.ptr, xs.ctypes.data + b0 * row, Tb * row, rt.memcpyHostToDevice, s.ptr)
            rt.memcpyAsync(self.params_dev.data.ptr, ps.ctypes.data + 16 * b, 16, rt.memcpyHostToDevice, s.ptr)
            g.launch(s)
            if after_block is not None:
                after_block(b0, Tb)

    def _fill_inputs(self, frame, plan, start_token, state=None):
        frame = np.asarray(frame)
        if frame.shape != (FRAME_H, FRAME_W, FRAME_C) or frame.dtype != np.uint8:
            raise ValueError(f"frame must be uint8 {(FRAME_H, FRAME_W, FRAME_C)}, got {frame.dtype} {frame.shape}")
        n_prefix = int(plan.n_prefix)
        if len(plan.order) != n_prefix + self.F + self.A:
            raise ValueError(f"plan.order must hold n_prefix + {self.F} + {self.A} slots (the frame"
                             f"{', the state' if self.S else ''} and the model's action tokens)")
        if self.S:
            if state is None or np.shape(state) != (self.cfg.state_dim,):
                raise ValueError(f"this model takes a robot state of {self.cfg.state_dim} values, got "
                                 f"{None if state is None else np.shape(state)}")
            self.h_state[:self.cfg.state_dim] = np.asarray(state, np.float32)
        self.h_frame[:] = frame.reshape(-1)
        self._set_order(plan.order)
        self.h_params[0] = n_prefix
        self.h_params[1] = -1
        self.h_start[:] = self.embed_host[int(start_token)]

    def run_chunk(self, frame: np.ndarray, plan, start_token: int, collect_logits: bool = False, state=None):
        s = self.stream
        s.synchronize()
        self._fill_inputs(frame, plan, start_token, state)
        if self.graph is None:
            self._capture()
        t0 = time.perf_counter()
        self.graph.launch(s)
        s.synchronize()
        t1 = time.perf_counter()
        ts = self.o_ts.astype(np.int64)

        def dms(a, b):
            return (int(ts[b]) - int(ts[a])) * 1e-6

        last = 2 + ACTION_TOKENS
        if self.parallel:
            # one pass: the prefill carries the 8 K action queries; the head is part of it (no decode phase)
            self.last_pass_ms = [dms(1, last)]
            timings = PhaseTimings(vision_ms=dms(0, 1), prefill_ms=dms(1, last), decode_ms=0.0,
                                   total_ms=(t1 - t0) * 1e3, prefill_tokens=self.lay.tokens, decode_tokens=0)
        else:
            self.last_pass_ms = [dms(2 + i, 3 + i) for i in range(ACTION_TOKENS)]
            timings = PhaseTimings(vision_ms=dms(0, 1), prefill_ms=dms(1, 2), decode_ms=dms(2, last),
                                   total_ms=(t1 - t0) * 1e3, prefill_tokens=self.F)
        res = BackendResult(tokens=self.o_tokens.copy(), pooled=self.o_pooled.copy(), timings=timings)
        if collect_logits:
            res.logits = cupy.asnumpy(self.logits)
        return res

    # --------------------------------------------------------------------------------- text (not in the chunk's graph)
    def _text_setup(self):
        """The full LM head on the device (padded to TEXT_ROWS_ALIGN rows with zeros), its logits buffer and the
        head's scratch (ticket, argmax outputs): allocated on the first text_logits call only."""
        if self._text is not None:
            return self._text
        cp = cupy
        V, H = self.cfg.vocab_size, self.H
        vp = -(-V // TEXT_ROWS_ALIGN) * TEXT_ROWS_ALIGN
        head = cp.zeros((vp, H), cp.uint16)
        head[:V].set(np.ascontiguousarray(self.head_host, dtype=np.uint16))
        rows = PROMPT_ROWS  # a prefill block's
        self._text = {
            "vp": vp, "head": head, "gemm": Gemm(self.k, "bf16", rows),
            "logits": cp.zeros((rows, vp), cp.float32), "ticket": cp.zeros(1, cp.int32),
            "tokidx": cp.zeros(1, cp.int32), "tokens": cp.zeros(ACTION_TOKENS, cp.int32),
            "bytes": text_head_bytes(self.cfg, rows),
            "row_host": cupyx.empty_pinned(V, np.float32), "decode_graph": None,  # the one-token graph's output
        }
        self._note_peak()
        return self._text

    def _text_decode_graph(self):
        """One text token as one CUDA graph, captured on the first call: the params and start row to the device (from
        the pinned input block), the embedding row, the decode GEMV pass at position params[0] (slot = position), the
        full head GEMV and the logits back into pinned memory. A token is then one launch and one sync, not 5 host
        launches a layer (BENCHMARKS.md "Prompt and text paths")."""
        tx = self._text_setup()
        if tx["decode_graph"] is None:
            rt, s, lay = cupy.cuda.runtime, self.stream, self._in_lay
            o, n = lay["params"], lay["start"] + 2 * self.H - lay["params"]
            V = self.cfg.vocab_size
            eps = f32(self.cfg.rms_norm_eps)

            def enqueue():
                rt.memcpyAsync(self.in_dev.data.ptr + o, self.in_host.ctypes.data + o, n, rt.memcpyHostToDevice,
                               s.ptr)
                embed_gather(self.k, self.emb_act, self.start_dev, self.tokidx_dev, self.H, self.xdec,
                             run=self.launch)
                self._decode_layers(0)
                self.launch.barrier()
                lm_head_argmax(self.k, self.xdec, self.norm, eps, self.H, tx["head"], tx["logits"][0], tx["ticket"],
                               tx["tokidx"], tx["tokens"], 0, 0, run=self.launch)
                rt.memcpyAsync(tx["row_host"].ctypes.data, tx["logits"].data.ptr, 4 * V, rt.memcpyDeviceToHost,
                               s.ptr)

            tx["decode_graph"] = self._captured(enqueue)
        return tx["decode_graph"]

    def text_logits(self, token_ids, start: int, last_only: bool = False) -> np.ndarray:
        """Full-vocabulary logits (float32 [T, V], or [1, V] with last_only) of tokens token_ids at positions start ..
        start+T-1, slot == position (identity order); each token attends causally to positions 0 .. its own; start 0
        begins a new text (the twin: ReferenceModel.text_logits). Needs start + T <= capacity. T == 1 runs the decode
        GEMV pass and the head GEMV (one graph); longer runs go through the prefill in blocks of PROMPT_ROWS rows (a
        graph a block) and the bf16 GEMM head."""
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        T, start = len(ids), int(start)
        V = self.cfg.vocab_size
        if T == 0 or start < 0 or start + T > self.capacity:
            raise ValueError(f"tokens at positions {start}..{start + T - 1} do not fit a cache of {self.capacity}")
        if ids.min() < 0 or ids.max() >= V:
            raise ValueError(f"token id out of range 0..{V - 1}")
        tx = self._text_setup()
        s = self.stream
        s.synchronize()
        if not self._order_identity:  # after a chunk or a prompt: slot == position again
            self._set_order(np.arange(self.capacity, dtype=np.int32))
            self._upload_inputs()
            self._order_identity = True
        eps = f32(self.cfg.rms_norm_eps)
        out = np.empty((1 if last_only else T, V), np.float32)
        if T == 1:
            graph = self._text_decode_graph()
            self.h_params[0] = start
            self.h_params[1] = -1  # embed_gather takes the start row
            self.h_start[:] = self.embed_host[int(ids[0])]
            graph.launch(s)
            s.synchronize()
            out[0] = tx["row_host"]
            self._note_peak()
            return out

        def head(b0, Tb):
            if last_only and b0 + Tb < T:
                return
            rmsnorm_bf16(self.k, self.x_pre, self.norm, eps, self.H, Tb, self.xb, run=self.launch, dependent=False)
            tx["gemm"](self.xb, tx["head"], tx["vp"], self.H, "store", Y=tx["logits"], run=self.launch)
            # last_only copies one row back, not the block: 64 rows of the 0.5B head are 39 MB of pageable copy, 11.7 ms
            # on the H100 host (BENCHMARKS.md "Prompt blocks of 96 rows")
            first, dst = (Tb - 1, out[0:1]) if last_only else (0, out[b0:b0 + Tb])
            res = tx["logits"][first:Tb, :V].get(stream=s)
            s.synchronize()  # (an older CuPy's get with a stream does not wait for the copy)
            dst[:] = res

        with s:
            self._prefill_blocks(bf16_to_f32(self.embed_host[ids]), start, after_block=head)
        s.synchronize()
        self._note_peak()
        return out

    def device_chunk_ms(self) -> float:
        """Device time of the last chunk from the first to the last stamp."""
        ts = self.o_ts.astype(np.int64)
        return (int(ts[2 + ACTION_TOKENS]) - int(ts[0])) * 1e-6
