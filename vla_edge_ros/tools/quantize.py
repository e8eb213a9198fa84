"""vla-edge-quantize: round a bf16 model's decoder linears to 4 bits (W4A16, group 128) in a published layout.

Round-to-nearest per group of 128 input channels: asymmetric min/max with a zero point (AWQ gemm, or
compressed-tensors pack-quantized by default), or symmetric (compressed-tensors with --symmetric).
Norms, biases, embeddings, an untied LM head and vision.safetensors stay as they are. config.json gets
the format's `quantization_config`; tokenizer and other files are copied. The output loads in this
package and in the format's own library; it is written through a temporary directory and renamed.

Example: vla-edge-quantize --model models/my-vla --format compressed-tensors --out models/my-vla-w4a16
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time

from ..model.config import QuantConfig
from ..model.quant import FORMATS, default_scale_dtype, quantize_rtn, stored_tensors
from ..model.safetensors_io import ModelLoadError, OutputDirError, atomic_output_dir, bf16_to_f32, save_file
from ..model.weights import LAYER_TENSORS, LINEARS, load_weights

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


class QuantizeError(Exception):
    """Input this tool refuses; the message is one line."""


def _is_weight_file(name: str) -> bool:
    return name in WEIGHT_FILES or (name.startswith("model-") and name.endswith(".safetensors"))


def quantize_model(src: str, out: str, fmt: str, symmetric: bool = False, force: bool = False) -> dict:
    """Quantize the model in `src` into `out`. Returns counts for the summary line."""
    if fmt not in FORMATS:
        raise QuantizeError(f"unknown format {fmt!r} (one of {', '.join(FORMATS)})")
    if symmetric and fmt != "compressed-tensors":
        raise QuantizeError("--symmetric applies to compressed-tensors only (AWQ gemm always has zero points)")
    if os.path.abspath(src) == os.path.abspath(out):
        raise QuantizeError("--out must differ from --model")
    w = load_weights(src)  # every tensor checked: a broken input fails here, before anything is written
    cfg = w.cfg
    if cfg.quant is not None:
        raise QuantizeError(f"{src} is already quantized ({cfg.quant.method}); give it the bf16 model")
    quant = QuantConfig(fmt, symmetric=symmetric)
    sdt = default_scale_dtype(fmt)
    tensors = {"model.embed_tokens.weight": ("BF16", w.embed), "model.norm.weight": ("BF16", w.norm)}
    if w.lm_head is not None:
        tensors["lm_head.weight"] = ("BF16", w.lm_head)
    n_quant = 0
    for i, layer in enumerate(w.layers):
        for short, suffix in LAYER_TENSORS.items():
            name = f"model.layers.{i}.{suffix}"
            if short in LINEARS:
                qt = quantize_rtn(bf16_to_f32(layer[short]), symmetric, sdt, fmt)
                tensors.update(stored_tensors(name[:-len(".weight")], qt, fmt, symmetric))
                n_quant += 1
            else:
                tensors[name] = ("BF16", layer[short])
    with open(os.path.join(src, "config.json"), encoding="utf-8") as f:
        raw = json.load(f)  # kept as the user wrote it (tokenizer ids, architectures, ...), plus the quant block
    raw["quantization_config"] = quant.to_hf()
    with atomic_output_dir(out, force) as tmp:
        save_file(tensors, os.path.join(tmp, "model.safetensors"),
                  {"note": f"4-bit {fmt} (round-to-nearest, group 128) by vla-edge-quantize"})
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
            json.dump(raw, f, indent=1)
        copied = []
        for name in sorted(os.listdir(src)):
            p = os.path.join(src, name)
            if name == "config.json" or _is_weight_file(name) or not os.path.isfile(p):
                continue
            shutil.copy2(p, os.path.join(tmp, name))
            copied.append(name)
    return {"linears": n_quant, "bytes_in": sum(os.path.getsize(f) for f in w.files),
            "bytes_out": os.path.getsize(os.path.join(out, "model.safetensors")), "copied": copied,
            "layers": cfg.num_hidden_layers, "config": dataclasses.replace(cfg, quant=quant)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="vla-edge-quantize", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.strip().splitlines()[-1],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", required=True, help="bf16 (or fp16/fp32) HF-layout model directory")
    p.add_argument("--format", required=True, choices=FORMATS, help="published 4-bit layout to write")
    p.add_argument("--symmetric", action="store_true",
                   help="compressed-tensors only: symmetric 4-bit (scale = max|w|/7.5), no zero points")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out")
    p.add_argument("--out", required=True, help="output model directory (absent or empty)")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    try:
        r = quantize_model(a.model, a.out, a.format, a.symmetric, a.force)
    except (QuantizeError, ModelLoadError, OutputDirError, ValueError, OSError) as e:
        print(f"vla-edge-quantize: error: {e}", file=sys.stderr)
        return 2
    print(f"quantized {r['linears']} linears of {r['layers']} layers to 4-bit {a.format}"
          f"{' symmetric' if a.symmetric else ''}: weights {r['bytes_in'] / 2**20:.1f} MiB -> "
          f"{r['bytes_out'] / 2**20:.1f} MiB in {time.perf_counter() - t0:.1f} s; copied "
          f"{', '.join(r['copied']) or 'no other files'}; wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
