# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Drift of a 4-bit model from the bf16 model it was quantized from, on the CUDA engine over a real clip.

  python bench/drift.py --bf16 DIR --w4 DIR --clip FILE [--frames 120] [--capacity 4096] [--json OUT]

Both engines see the same frames (fifo cache, same prompt); per chunk it compares the 8 action tokens and the
action logits (cosine, at every step while the tokens agree, since a differing token changes what follows).
Not installed with the package (bench/ is a development tool).
"""
import argparse
import json
import sys

import numpy as np


def cos(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def main(argv=None):
    from vla_edge_ros.clips import load_model_frames, open_clip
    from vla_edge_ros.engine import Engine

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bf16", required=True)
    p.add_argument("--w4", required=True)
    p.add_argument("--clip", required=True)
    p.add_argument("--frames", type=int, default=120)
    p.add_argument("--capacity", type=int, default=4096)
    p.add_argument("--backend", default="cuda")
    p.add_argument("--json")
    a = p.parse_args(argv)
    frames, _ = load_model_frames(open_clip(a.clip), max_frames=a.frames)
    engines = [Engine(d, backend=a.backend, kv_capacity_tokens=a.capacity) for d in (a.bf16, a.w4)]
    agree_tok, agree_chunk, coss = 0, 0, []
    for f in frames:
        r0, r1 = (e.run_chunk(f, collect_logits=True) for e in engines)
        same = r0.tokens == r1.tokens
        agree_tok += int(same.sum())
        agree_chunk += int(same.all())
        for s in range(len(same)):
            coss.append(cos(r0.logits[s], r1.logits[s]))
            if not same[s]:
                break
    n = len(frames)
    res = {"frames": n, "clip": a.clip, "token_agreement": agree_tok / (8 * n), "chunk_agreement": agree_chunk / n,
           "logits_cosine": {"min": min(coss), "p50": float(np.median(coss)), "mean": float(np.mean(coss))},
           "weights": [e.weight_format for e in engines]}
    print("RESULTS " + json.dumps(res))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(res, fh, indent=1)
    for e in engines:
        e.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
