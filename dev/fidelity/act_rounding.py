# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Where does the CUDA prefill's error against the golden model come from (issue 41 item 1)? A CPU emulation.

The golden model (model/reference.py) keeps every activation in float32. The CUDA prefill path (cuda/backend.py
_prefill_layers; the parallel kinds' action rows go through it at every layer) rounds to bf16 at these points:
  x     the RMSNorm outputs, the GEMMs' input (kernels/rmsnorm.cu)                      q/k/v and gate/up
  kv    K and V into the cache (kv_write.cu / the GEMVs)
  krot  K again after RoPE, into the attention's shared memory (attention.cuh rope_store_k)
  q     Q after RoPE x log2(e)/sqrt(D) (attention.cuh, Qs)
  p     the softmax weights into the P.V MMA (the row sum stays fp32)
  att   the attention output, the o GEMM's input (attn_combine out_bf)
  act   silu(gate) * up, the down GEMM's input (gemm.cu mode 2 epilogue)
Everything else (the GEMMs' products and sums, the residual stream, the LM head) is fp32 on both sides.
This re-runs the full-depth test's chunk (test_cuda_engine.full_chunk_vs_reference_and_hf: a 24-token prompt, one
frame, identity slots) through a NumPy twin of the golden model that rounds at a chosen set of those points (bf16 or
fp16), optionally with fp32-level noise on every GEMM output (the split-K atomics' order: a relative 2^-24 Gaussian,
one seed a run), and prints, against the exact golden model, DESIGN 13's measure over the action rows (worst cosine,
max |delta| / max |ref|: the full-depth bound is 3e-2) and the action rows' residual-stream error every few layers.

    OPENBLAS_NUM_THREADS=1 PYTHONPATH=. python3 dev/fidelity/act_rounding.py --model DIR [--variants a,b,..]
A variant is `name` from VARIANTS, or `point=fmt+point=fmt..[@seed]` (fmt bf16 | fp16), e.g. `x=fp16+act=bf16@3`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from vla_edge_ros.constants import VISION_TOKENS  # noqa: E402
from vla_edge_ros.model import ops  # noqa: E402
from vla_edge_ros.model.reference import ReferenceModel  # noqa: E402
from vla_edge_ros.model.safetensors_io import bf16_to_f32, f32_to_bf16  # noqa: E402
from vla_edge_ros.model.weights import load_weights  # noqa: E402
from w4_weight_rounding import measure  # noqa: E402 - the same metric as the weight-rounding study (this folder)

POINTS = ("x", "kv", "krot", "q", "p", "att", "act")
CUDA = {p: "bf16" for p in POINTS}  # the engine as shipped
VARIANTS = {
    "exact": {},
    "cuda": CUDA, "cuda@1": CUDA, "cuda@2": CUDA, "cuda@3": CUDA,
    **{f"only-{p}": {p: "bf16"} for p in POINTS},
    **{f"all-but-{p}": {q: "bf16" for q in POINTS if q != p} for p in POINTS},
    "gemm-in-fp16": {**CUDA, "x": "fp16", "att": "fp16", "act": "fp16"},
    "x-fp16": {**CUDA, "x": "fp16"},
    "x-act-fp16": {**CUDA, "x": "fp16", "act": "fp16"},
    "attn-fp16": {**CUDA, "q": "fp16", "krot": "fp16", "p": "fp16"},
}


def bf16(x):
    return bf16_to_f32(f32_to_bf16(np.asarray(x, np.float32))).reshape(np.shape(x))


def fp16(x):
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


FMT = {"bf16": bf16, "fp16": fp16}


def parse_variant(name: str) -> tuple[dict, int]:
    base, _, seed = name.partition("@")
    if name in VARIANTS:
        spec = VARIANTS[name]
    elif base in VARIANTS:
        spec = VARIANTS[base]
    else:
        spec = {}
        for part in base.split("+"):
            p, _, f = part.partition("=")
            if p not in POINTS or f not in FMT:
                raise SystemExit(f"bad variant part {part!r}: point in {POINTS}, fmt in {tuple(FMT)}")
            spec[p] = f
    return spec, int(seed) if seed else 0


class Emu:
    """The golden model's forward (identity slot order, no eviction) rounding at the points of `spec`."""

    def __init__(self, ref: ReferenceModel, spec: dict, seed: int = 0):
        self.ref, self.cfg = ref, ref.cfg
        self.r = {p: FMT[spec[p]] if p in spec else (lambda a: a) for p in POINTS}
        self.rng = np.random.default_rng(seed) if seed else None
        L = self.cfg.num_hidden_layers
        self.K = [None] * L  # [n, NKV, D] un-rotated keys as the cache holds them
        self.V = [None] * L

    def _gemm_out(self, y):
        if self.rng is None:
            return y
        return (y * (1.0 + np.float32(2.0 ** -24) * self.rng.standard_normal(y.shape, dtype=np.float32))).astype(
            np.float32)

    def _attention(self, li, q, q_start, bidir_from):
        cfg, r = self.cfg, self.r
        t = q.shape[0]
        nh, nkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        n = q_start + t
        group = nh // nkv
        qp = np.arange(q_start, n)
        scale = np.float32(np.log2(np.e) / np.sqrt(d))
        qs = r["q"](ops.apply_rope(q, self.ref.cos[qp], self.ref.sin[qp]) * scale)  # [t, nh, d]
        kr = r["krot"](ops.apply_rope(self.K[li][:n], self.ref.cos[:n], self.ref.sin[:n]))  # [n, nkv, d]
        limit = qp.copy()
        limit[bidir_from:] = n - 1
        allowed = np.arange(n)[None, :] <= limit[:, None]
        neg = np.where(allowed, np.float32(0), np.float32(-np.inf))
        out = np.empty((t, nh, d), np.float32)
        for g in range(nkv):
            qg = qs[:, g * group:(g + 1) * group, :].reshape(t * group, d)
            s = (qg @ kr[:, g, :].T).reshape(t, group, n) + neg[:, None, :]
            s -= s.max(axis=-1, keepdims=True)
            p = np.exp2(s)
            l_ = p.sum(axis=-1, keepdims=True)
            o = (r["p"](p).reshape(t * group, n) @ self.V[li][:n, g, :]).reshape(t, group, d) / l_
            out[:, g * group:(g + 1) * group, :] = o
        return out.reshape(t, nh * d)

    def forward(self, x, q_start, bidir_from):
        cfg, r = self.cfg, self.r
        t = x.shape[0]
        nh, nkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        eps = cfg.rms_norm_eps
        x = x.astype(np.float32)
        hidden = []
        for li, w in enumerate(self.ref.layers):
            h = r["x"](ops.rms_norm(x, w["ln1"], eps))
            q = self._gemm_out(ops.linear(h, w["wq"], w["bq"])).reshape(t, nh, d)
            k = r["kv"](self._gemm_out(ops.linear(h, w["wk"], w["bk"])).reshape(t, nkv, d))
            v = r["kv"](self._gemm_out(ops.linear(h, w["wv"], w["bv"])).reshape(t, nkv, d))
            self.K[li] = k if self.K[li] is None else np.concatenate([self.K[li][:q_start], k])
            self.V[li] = v if self.V[li] is None else np.concatenate([self.V[li][:q_start], v])
            a = r["att"](self._attention(li, q, q_start, bidir_from))
            x = x + self._gemm_out(ops.linear(a, w["wo"]))
            h = r["x"](ops.rms_norm(x, w["ln2"], eps))
            g_ = self._gemm_out(ops.linear(h, w["wg"]))
            u_ = self._gemm_out(ops.linear(h, w["wu"]))
            x = x + self._gemm_out(ops.linear(r["act"](ops.silu_mul(g_, u_)), w["wd"]))
            hidden.append(x.copy())
        return ops.rms_norm(x, self.ref.final_norm, eps), hidden


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a parallel-decoding model directory (bf16 or 4-bit)")
    ap.add_argument("--variants", default="exact,cuda,cuda@1,cuda@2," + ",".join(f"only-{p}" for p in POINTS))
    ap.add_argument("--check-ref", action="store_true", help="also run ReferenceModel: the exact twin must match it")
    ap.add_argument("--json", help="write every variant's numbers here")
    a = ap.parse_args()
    w = load_weights(a.model)
    if not w.cfg.parallel:
        print("act_rounding: the model must use parallel decoding", file=sys.stderr)
        return 2
    cap, P = 4096, 24
    rng = np.random.default_rng(2)  # as the full-depth test: prompt, frame
    prompt = rng.integers(0, w.cfg.vocab_size, P)
    frame = rng.integers(0, 256, (64, 128, 3), dtype=np.uint8)
    ref = ReferenceModel(w, cap)
    x = np.concatenate([ref.vision(frame), ref.queries])
    F = VISION_TOKENS
    L = w.cfg.num_hidden_layers
    names = a.variants.split(",")
    if "exact" not in names:
        names = ["exact"] + names
    out = {}
    if a.check_ref:
        r2 = ReferenceModel(w, cap)
        r2.load_prompt(prompt, np.arange(P, dtype=np.int32))
        h, _ = r2.forward(x, np.arange(P + len(x)), P, bidir_from=F)
        out["golden"] = h[F:] @ ref.action_head.T
        del r2
    logits, streams = {}, {}
    for name in names:
        t0 = time.time()
        spec, seed = parse_variant(name)
        emu = Emu(ref, spec, seed)
        emu.forward(ref.embed[prompt], 0, P)  # load_prompt: causal
        h, hidden = emu.forward(x, P, F)
        logits[name] = h[F:] @ ref.action_head.T
        streams[name] = [s_[F:] for s_ in hidden]
        del emu
        print(f"# {name} {time.time() - t0:.1f} s", flush=True)
    res = {}
    if a.check_ref:
        c, d = measure(logits["exact"], out["golden"])
        print(f"CHECK exact twin vs ReferenceModel: worst cosine {c:.7f}, max |delta| / max |ref| {d:.2e}")
        res["check"] = [c, d]
    shown = sorted(set(list(range(0, L, 4)) + [L - 1]))
    print(f"model {a.model}: {L} layers, hidden {w.cfg.hidden_size}, {len(x) - F} action rows; vs the exact twin")
    for name in names:
        if name == "exact":
            continue
        c, d = measure(logits[name], logits["exact"])
        per_row = [measure(logits[name][i:i + 1], logits["exact"][i:i + 1])[1] for i in range(len(logits[name]))]
        errs = [float(np.linalg.norm(streams[name][i] - streams["exact"][i]) / np.linalg.norm(streams["exact"][i]))
                for i in range(L)]
        res[name] = {"cos": c, "delta": d, "row_delta": per_row, "layers": errs}
        print(f"RESULT {name:16s} worst cosine {c:.6f}  max|d|/max|ref| {d:.3e}  rows median {np.median(per_row):.2e}  "
              + "stream " + " ".join(f"L{i}:{errs[i]:.1e}" for i in shown), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
