# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Numerical fidelity of a forward pass on real weights (DESIGN.md §13, §16): teacher-forced logits compared
over the full vocabulary.

Free-running greedy text agrees only up to the first near-tie, so the gates compare logits position by
position on the same input: top-1 equal wherever the reference's top-1/top-2 margin is at least `MARGIN`,
full-vocabulary cosine, max |Δ| and KL(reference || candidate). Used by the CPU gate against HF transformers
(test/test_real_weights.py) and by the GPU gate (bench/real_weights_gpu.py).
"""
from __future__ import annotations

import numpy as np

MARGIN = 0.5  # a float32 top-1/top-2 gap below this is a near-tie that rounding may legitimately flip
POSITIONS = 128  # teacher-forced positions per text

# Three real texts of different kinds (public-domain prose, Python code, technical English), each longer than
# POSITIONS tokens under the Qwen2 tokenizer.
TEXTS = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, it "
    "was the season of Darkness, it was the spring of hope, it was the winter of despair, we had everything "
    "before us, we had nothing before us, we were all going direct to Heaven, we were all going direct the "
    "other way - in short, the period was so far like the present period, that some of its noisiest "
    "authorities insisted on its being received, for good or for evil, in the superlative degree of "
    "comparison only. There were a king with a large jaw and a queen with a plain face, on the throne of "
    "England; there were a king with a large jaw and a queen with a fair face, on the throne of France.",
    "import heapq\n\n\ndef dijkstra(graph, source):\n    \"\"\"Shortest distances from source in a graph given "
    "as {node: [(neighbour, weight), ...]}.\"\"\"\n    dist = {node: float(\"inf\") for node in graph}\n    "
    "dist[source] = 0\n    queue = [(0, source)]\n    while queue:\n        d, node = heapq.heappop(queue)\n"
    "        if d > dist[node]:\n            continue\n        for neighbour, weight in graph[node]:\n"
    "            nd = d + weight\n            if nd < dist[neighbour]:\n                dist[neighbour] = nd\n"
    "                heapq.heappush(queue, (nd, neighbour))\n    return dist\n\n\nif __name__ == \"__main__\":\n"
    "    g = {\"a\": [(\"b\", 1), (\"c\", 4)], \"b\": [(\"c\", 2), (\"d\", 5)], \"c\": [(\"d\", 1)], \"d\": []}\n"
    "    print(dijkstra(g, \"a\"))\n",
    "A mobile robot localizes itself by fusing wheel odometry with measurements from its sensors. Odometry is "
    "smooth and available at a high rate, but its error grows without bound as the wheels slip; a laser "
    "scanner or a camera gives absolute corrections, but only at a lower rate and with occasional outliers. "
    "An extended Kalman filter keeps an estimate of the pose and its covariance: the prediction step moves the "
    "estimate with the odometry and inflates the covariance, and the update step pulls it toward each "
    "measurement in proportion to how much the filter trusts it. When the robot is kidnapped, or the map is "
    "ambiguous, a particle filter that keeps many hypotheses at once recovers where a single Gaussian cannot.",
)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def top2(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(top-1 ids, top-1 minus top-2 logit) per row."""
    x = np.asarray(logits, np.float32)
    part = np.argpartition(-x, 1, axis=-1)[:, :2]
    vals = np.take_along_axis(x, part, axis=-1)
    first = np.where(vals[:, 0] >= vals[:, 1], part[:, 0], part[:, 1])
    return first, np.abs(vals[:, 0] - vals[:, 1])


def compare(logits: np.ndarray, ref_logits: np.ndarray | None = None, ref_top1=None, ref_gap=None) -> dict:
    """Candidate `logits` [T, V] against the reference: its full logits (`ref_logits`, gives cosine, max |Δ| and
    KL) and/or its per-position top-1 and top-1/top-2 gap (`ref_top1`, `ref_gap`; computed from ref_logits when
    not given). Returns plain numbers."""
    cand = np.asarray(logits, np.float32)
    if ref_top1 is None:
        ref_top1, ref_gap = top2(ref_logits)
    ref_top1, ref_gap = np.asarray(ref_top1), np.asarray(ref_gap)
    top1 = cand.argmax(axis=-1)
    decisive = ref_gap >= MARGIN
    out = {"positions": int(len(cand)), "decisive": int(decisive.sum()),
           "top1_agree_decisive": int((top1 == ref_top1)[decisive].sum()),
           "top1_agree_all": int((top1 == ref_top1).sum())}
    out["top1_agree_decisive_frac"] = out["top1_agree_decisive"] / max(out["decisive"], 1)
    if ref_logits is not None:
        ref = np.asarray(ref_logits, np.float64)
        c = cand.astype(np.float64)
        cos = (ref * c).sum(-1) / (np.linalg.norm(ref, axis=-1) * np.linalg.norm(c, axis=-1))
        p_log, q_log = log_softmax(ref), log_softmax(c)
        kl = (np.exp(p_log) * (p_log - q_log)).sum(-1)
        out.update(cosine_min=float(cos.min()), cosine_mean=float(cos.mean()),
                   max_abs_diff=float(np.abs(ref - c).max()), kl_mean=float(kl.mean()), kl_max=float(kl.max()))
    return out


def teacher_forced(model, ids, chunk: int = 64) -> np.ndarray:
    """Full-vocabulary logits [T, V] of `ids` from a model with `text_logits` (the NumPy reference or the CUDA
    backend), fed in chunks of `chunk` tokens (each chunk attends to everything before it)."""
    ids = np.asarray(ids, np.int64)
    return np.concatenate([model.text_logits(ids[s:s + chunk], s) for s in range(0, len(ids), chunk)])
