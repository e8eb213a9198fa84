# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""How much of the 4-bit parallel chunk's error against the golden model is the 4-bit GEMM's weight rounding (issue 41)?

The golden model multiplies the exact dequantized weights ((q - z) * s in float32). The 4-bit prefill GEMM of
2026-12-02 multiplied (q - z) * bf16(s) rounded once to bf16 on the tensor cores; the shipped one multiplies the exact
integers and applies s in fp32. This runs one full-depth chunk (the test_cuda_engine full-depth set-up: a 24-token
prompt, one frame, 4096 slots) through
  exact    the golden model as shipped,
  rounded  the golden model with every 4-bit weight rounded as the old GEMM rounded it,
  scale    the golden model with only the group scales rounded to bf16 (the product exact),
  cuda     the CUDA engine of this tree (GPU; skipped with --no-cuda),
and prints, for each pair, the worst cosine and max |delta| / max |ref| over the chunk's action rows (DESIGN 13's
measure, the full-depth bound is 3e-2), and the per-layer relative error of the residual stream of `rounded` and
`scale` against `exact` (every 4th layer and the last).

    PYTHONPATH=. python3 dev/fidelity/w4_weight_rounding.py --model DIR   # a 4-bit parallel model directory
"""
from __future__ import annotations

import argparse
import os
import sys
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from vla_edge_ros.constants import VISION_TOKENS  # noqa: E402
from vla_edge_ros.model.quant import QuantTensor  # noqa: E402
from vla_edge_ros.model.reference import ReferenceModel  # noqa: E402
from vla_edge_ros.model.safetensors_io import bf16_to_f32, f32_to_bf16  # noqa: E402
from vla_edge_ros.model.weights import load_weights  # noqa: E402


def bf16_round(x: np.ndarray) -> np.ndarray:
    return bf16_to_f32(f32_to_bf16(np.asarray(x, np.float32)))


def old_gemm_weights(qt: QuantTensor) -> np.ndarray:
    """(q - z) * bf16(s), the product rounded once to bf16: what the GEMM of 2026-12-02 multiplied."""
    return bf16_round(qt.dequantize(bf16_round(qt.scales)))


def reference_with(weights, cap: int, policy) -> ReferenceModel:
    """The golden model with each 4-bit layer weight replaced by policy(QuantTensor) (None: as shipped)."""
    ref = ReferenceModel(weights, cap)
    if policy is not None:
        for li, layer in enumerate(weights.layers):
            for k, v in layer.items():
                if isinstance(v, QuantTensor):
                    ref.layers[li][k] = policy(v)
    return ref


def measure(a_logits: np.ndarray, b_logits: np.ndarray) -> tuple[float, float]:
    """(worst cosine, max |a - b| / max |b| over rows) of two [rows, 256] logit arrays; b is the reference."""
    cos, delta = 1.0, 0.0
    for a, b in zip(np.asarray(a_logits, np.float64), np.asarray(b_logits, np.float64)):
        cos = min(cos, float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b))))
        delta = max(delta, float(np.abs(a - b).max() / np.abs(b).max()))
    return cos, delta


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a 4-bit parallel model directory")
    ap.add_argument("--no-cuda", action="store_true", help="the three golden-model policies only")
    ap.add_argument("--cuda-only", action="store_true", help="the CUDA engine against the exact golden model only")
    a = ap.parse_args()
    w = load_weights(a.model)
    if not w.cfg.parallel:
        print("w4_weight_rounding: the model must use parallel decoding", file=sys.stderr)
        return 2
    cap, P = 4096, 24
    rng = np.random.default_rng(2)
    prompt = rng.integers(0, w.cfg.vocab_size, P)
    slots = np.arange(P, dtype=np.int32)
    A = w.cfg.action_tokens
    order = np.arange(P + VISION_TOKENS + A, dtype=np.int32)
    plan = SimpleNamespace(order=order, n_prefix=P, frame_slots=order[P:P + VISION_TOKENS], action_slots=order[-A:],
                           frame_id=0, evicted=[])
    frame = rng.integers(0, 256, (64, 128, 3), dtype=np.uint8)
    policies = {"exact": None, "rounded": old_gemm_weights, "scale": lambda qt: qt.dequantize(bf16_round(qt.scales))}
    if a.cuda_only:
        policies = {"exact": None}
    logits, streams = {}, {}
    for name, policy in policies.items():
        ref = reference_with(w, cap, policy)
        ref.load_prompt(prompt, slots)
        x = np.concatenate([ref.vision(frame), ref.queries])
        h, hidden = ref.forward(x, plan.order, P, collect=True, bidir_from=VISION_TOKENS)  # as _run_parallel
        logits[name] = h[VISION_TOKENS:] @ ref.action_head.T
        streams[name] = [s[VISION_TOKENS:] for s in hidden]  # the action rows' residual stream after each layer
        del ref
    if not a.no_cuda:
        from vla_edge_ros.cuda.backend import CudaBackend

        gpu = CudaBackend(w, cap, vram_ceiling_gb=8.0)
        gpu.load_prompt(prompt, slots)
        logits["cuda"] = gpu.run_chunk(frame, plan, int(w.cfg.vocab_size - 300), collect_logits=True).logits
    L = w.cfg.num_hidden_layers
    print(f"model {a.model}: {L} layers, hidden {w.cfg.hidden_size}, {A} action rows")
    pairs = [] if a.cuda_only else [("rounded", "exact"), ("scale", "exact")]
    if "cuda" in logits:
        pairs += [("cuda", "exact")] + ([] if a.cuda_only else [("cuda", "rounded")])
    for x, y in pairs:
        c, d = measure(logits[x], logits[y])
        print(f"RESULT {x:8s} vs {y:8s}: worst cosine {c:.6f}, max |delta| / max |ref| {d:.3e}")
    for name in [] if a.cuda_only else ["rounded", "scale"]:
        errs = [float(np.linalg.norm(streams[name][i] - streams["exact"][i]) / np.linalg.norm(streams["exact"][i]))
                for i in range(L)]
        shown = sorted(set(list(range(0, L, 4)) + [L - 1]))
        print(f"LAYERS {name:8s} residual-stream rel. error vs exact: "
              + ", ".join(f"L{i} {errs[i]:.2e}" for i in shown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
