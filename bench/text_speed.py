# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The CUDA engine's prompt and text paths (issue 41 item 4), timed on a model dir, with the bytes each must move.

  python bench/text_speed.py --model DIR [--prompt 352] [--tokens 256] [--reps 20] [--json OUT]

- prompt: CudaBackend.load_prompt of --prompt random tokens into slots 0.. (what an instruction change costs the
  robot: Engine.apply_instruction), host wall time with the stream synchronized, p50 of --reps;
- text prefill: text_logits of the same tokens from position 0, last_only (vla-edge-generate's prompt), p50;
- decode: textgen.generate of --tokens greedy tokens after a 32-token prompt (no stop): tokens/s as
  vla-edge-generate reports it, after one warm-up token (the one-token graph's capture is not timed; the step
  textspeed also runs vla-edge-generate itself, capture included).
Floors: a prompt block (PROMPT_ROWS rows, 32 in older trees) reads every layer's weights once (ceil(P / rows)
reads), a text token the layers and the full head (bf16 V x H); both over the device's measured copy bandwidth. Uses
only the backend's public methods, so the same file times an older tree (bench/gpu_run.sh step textspeed runs it on
BASE too).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt", type=int, default=352)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--capacity", type=int, default=4096)
    ap.add_argument("--tag", default="this tree")
    ap.add_argument("--tree", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="the repository whose vla_edge_ros is timed (default: this file's)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    sys.path.insert(0, os.path.abspath(a.tree))

    import cupy as cp

    from vla_edge_ros import textgen
    from vla_edge_ros.cuda.backend import CudaBackend
    from vla_edge_ros.model.weights import load_weights
    from vla_edge_ros.tools.chunk_bench import copy_bandwidth_gbps
    from vla_edge_ros.vram_plan import linear_bytes

    w = load_weights(a.model)
    cfg = w.cfg
    be = CudaBackend(w, a.capacity)
    rng = np.random.default_rng(0)
    V, H, ffn = cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size
    q = cfg.weight_format == "w4"
    kv = cfg.num_key_value_heads * cfg.head_dim
    layer = (linear_bytes(H + 2 * kv, H, q) + linear_bytes(H, H, q) + linear_bytes(2 * ffn, H, q)
             + linear_bytes(H, ffn, q))
    layers_bytes = cfg.num_hidden_layers * layer
    bw = copy_bandwidth_gbps(cp)

    def p50_ms(fn):
        fn()  # first call: graphs captured, head uploaded
        ts = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return float(np.median(ts)), float(np.percentile(ts, 90))

    ids = rng.integers(0, V, a.prompt)
    slots = np.arange(a.prompt, dtype=np.int32)
    prompt_ms, prompt_p90 = p50_ms(lambda: be.load_prompt(ids, slots))
    text_ms, text_p90 = p50_ms(lambda: be.text_logits(ids, 0, last_only=True))
    from vla_edge_ros import vram_plan
    block_rows = getattr(vram_plan, "PROMPT_ROWS", 32)  # a prefill block's rows (32 in trees before PROMPT_ROWS)
    blocks = -(-a.prompt // block_rows)
    prompt_floor = blocks * layers_bytes / (bw * 1e9) * 1e3
    be.text_logits(ids[:1], 0)  # warm-up: the one-token graph
    g = textgen.generate(be, rng.integers(0, V, 32), a.tokens)
    tok_s = g.tokens_per_s
    token_bytes = layers_bytes + 2 * V * H
    token_floor = token_bytes / (bw * 1e9) * 1e3
    r = {"tag": a.tag, "model": a.model, "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
         "weights": cfg.weight_format, "layers": cfg.num_hidden_layers, "hidden": H, "copy_gbps": bw,
         "prompt_tokens": a.prompt, "prompt_ms_p50": prompt_ms, "prompt_ms_p90": prompt_p90,
         "prompt_floor_ms": prompt_floor, "prompt_gbps": blocks * layers_bytes / (prompt_ms * 1e-3) / 1e9,
         "text_prefill_ms_p50": text_ms, "text_prefill_ms_p90": text_p90,
         "decode_tokens": len(g.ids), "decode_tokens_per_s": tok_s, "token_floor_ms": token_floor,
         "token_gbps": token_bytes * tok_s / 1e9}
    print(f"TEXT_SPEED {a.tag} | {r['device']} {cfg.weight_format} {cfg.num_hidden_layers}x{H} | prompt "
          f"{a.prompt} tokens: load_prompt p50 {prompt_ms:.2f} ms (p90 {prompt_p90:.2f}; floor {prompt_floor:.2f} ms "
          f"= {blocks} blocks x {layers_bytes / 1e9:.3f} GB at {bw:.0f} GB/s; {r['prompt_gbps']:.0f} GB/s), "
          f"text prefill p50 {text_ms:.2f} ms | decode {tok_s:.0f} tokens/s ({1e3 / max(tok_s, 1e-9):.3f} ms a "
          f"token; floor {token_floor:.3f} ms: layers + {2 * V * H / 1e6:.0f} MB head; {r['token_gbps']:.0f} GB/s)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
