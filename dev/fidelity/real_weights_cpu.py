# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The golden model on the real 0.5B GGUF against HF transformers (float32, same file), on the CPU.

Teacher-forced over fidelity.POSITIONS tokens of each of fidelity.TEXTS, full vocabulary, for three weight
policies of the same file: float32 (dequantized, as HF), bf16 (the engine's path: one rounding) and W4A16
(re-quantized by vla-edge-quantize --format awq, the engine's 4-bit path). Also writes HF's per-position top-1
and top-1/top-2 gap (<model>.hf_top.npz) for the GPU gate (bench/real_weights_gpu.py).

    python3 scripts/fetch_test_model.py
    PYTHONPATH=. python3 dev/fidelity/real_weights_cpu.py [--awq DIR]   # ~3 min on 2 cores
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from vla_edge_ros.model import fidelity as F  # noqa: E402
from vla_edge_ros.model.checkpoint import load_model  # noqa: E402
from vla_edge_ros.model.reference import ReferenceModel  # noqa: E402
from vla_edge_ros.model.tokenizer import load_tokenizer  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--awq", help="an AWQ dir made from the file (default: made now in a temporary folder)")
    a = ap.parse_args()
    repo = os.path.join(os.path.dirname(__file__), "..", "..")
    path = subprocess.run([sys.executable, os.path.join(repo, "scripts", "fetch_test_model.py"), "--print-path"],
                          capture_output=True, text=True, check=True).stdout.strip()
    import torch
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer(path)
    ids = [tok.encode(t)[:F.POSITIONS] for t in F.TEXTS]
    hf = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                              dtype=torch.float32)
    with torch.no_grad():
        ref = [hf(torch.tensor([x])).logits[0].numpy() for x in ids]
    del hf
    tops = [F.top2(r) for r in ref]
    np.savez(path + ".hf_top.npz", ids=np.array(ids, np.int64), top1=np.stack([t[0] for t in tops]),
             gap=np.stack([t[1] for t in tops]))
    awq = a.awq
    tmp = None
    if awq is None:
        tmp = tempfile.TemporaryDirectory()
        awq = os.path.join(tmp.name, "awq")
        subprocess.run([sys.executable, "-m", "vla_edge_ros.tools.quantize", "--model", path, "--format", "awq",
                        "--out", awq], check=True, cwd=repo)
    print("| weights | decisive positions | top-1 equal there | top-1 equal, all | cosine min | max abs diff | "
          "KL mean | KL max |")
    print("|---|---|---|---|---|---|---|---|")
    for label, src, keep in (("float32 (dequantized)", path, True), ("bf16 (engine path)", path, False),
                             ("W4A16 g128 re-quantized", awq, False)):
        t0 = time.time()
        m = ReferenceModel(load_model(src, keep_f32=keep), F.POSITIONS)
        rs = [F.compare(F.teacher_forced(m, x), r) for x, r in zip(ids, ref)]
        dec = sum(r["decisive"] for r in rs)
        print(f"| {label} | {dec} | {sum(r['top1_agree_decisive'] for r in rs)} | "
              f"{sum(r['top1_agree_all'] for r in rs)} / {sum(r['positions'] for r in rs)} | "
              f"{min(r['cosine_min'] for r in rs):.6f} | {max(r['max_abs_diff'] for r in rs):.3g} | "
              f"{np.mean([r['kl_mean'] for r in rs]):.3g} | {max(r['kl_max'] for r in rs):.3g} | "
              f"({time.time() - t0:.0f} s)")
        del m
    return 0


if __name__ == "__main__":
    sys.exit(main())
