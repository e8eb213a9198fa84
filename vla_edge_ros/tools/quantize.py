# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""vla-edge-quantize: round a bf16 model's decoder linears to 4 bits (W4A16, group 128) in a published layout.

Round-to-nearest per group of 128 input channels: asymmetric min/max with a zero point (AWQ gemm, or
compressed-tensors pack-quantized by default), or symmetric (compressed-tensors with --symmetric).
With --calib-clip, each group's range is first shrunk by the ratio (1.0 .. 0.5) that gives the smallest
output error on the activations of frames from that clip (AWQ's clip search, without activation scaling).
Norms, biases, embeddings, an untied LM head and vision.safetensors stay as they are. config.json gets
the format's `quantization_config`; tokenizer and other files are copied. The output loads in this
package and in the format's own library; it is written through a temporary directory and renamed.

Exit status: 0 written; 2 a bad option or --out (not empty, the model itself), a model that is already quantized;
3 a model that cannot load or cannot be quantized (missing, not a model, a corrupt file, NaN or Inf weights, a hidden
or FFN size that is not a multiple of the 128-channel group); 128 + the signal on Ctrl-C / SIGTERM. One line each.

Example: vla-edge-quantize --model models/my-vla --format compressed-tensors --out models/my-vla-w4a16
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import sys
import threading
import time

import numpy as np

from ..model import ops
from ..model.config import QuantConfig
from ..constants import GROUP_SIZE
from ..model.checkpoint import check_model_path, load_config, load_model
from ..model.gguf import is_gguf
from ..model.quant import FORMATS, as_f32, default_scale_dtype, quantize_rtn, search_clip, stored_tensors
from ..model.safetensors_io import ModelLoadError, f32_to_bf16, save_file
from ..output_dir import OutputDirError, atomic_output_dir
from ..model.weights import LAYER_TENSORS, LINEARS, Weights
from .cli import Parser, bounded

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
MAX_CALIB_FRAMES = 256  # x 32 tokens: the calibration pass holds [32 N, 32 N] attention scores per head
MAX_CALIB_TOKENS = 1 << 16


class QuantizeError(Exception):
    """Input this tool refuses; the message is one line."""


class UnquantizableModel(QuantizeError):
    """A model that cannot load or cannot be quantized (exit 3, as a model that cannot load in the other tools)."""


class _StopOnSignal:
    """SIGINT and SIGTERM raise KeyboardInterrupt once (so `finally` blocks clean up), later ones are ignored
    until the cleanup is done; the one that came is `signum` / `name` (SIGINT when none came)."""

    def __init__(self):
        self.signum, self.name = int(signal.SIGINT), "Ctrl-C"
        self._hit = False
        self._old = {}
        if threading.current_thread() is threading.main_thread():  # signal handlers: the main thread only
            self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}

    def _handle(self, signum, frame):
        if self._hit:
            return
        self._hit = True
        self.signum, self.name = signum, "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        raise KeyboardInterrupt

    def restore(self):
        for s, h in self._old.items():
            signal.signal(s, h)


def _is_weight_file(name: str) -> bool:
    return name in WEIGHT_FILES or (name.startswith("model-") and name.endswith(".safetensors"))


def calibration_inputs(w: Weights, frames: np.ndarray, max_tokens: int = 256, seed: int = 0):
    """Yield (layer index, {linear short name: its input activations [<=max_tokens, in]}) for the bf16 model
    reading `frames` (uint8 [N, 64, 128, 3]) as one causal stream of 32 vision tokens a frame, positions 0..32N-1.
    Layer by layer, so only one layer's activations are held at a time."""
    cfg = w.cfg
    pw, pb, pe = (as_f32(a) for a in (w.vision.patch_w, w.vision.patch_b, w.vision.pos_embed))
    x = np.concatenate([ops.vision_encode(f, pw, pb, pe) for f in frames]).astype(np.float32)
    t, nh, nkv, d = len(x), cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    cos, sin = ops.rope_cos_sin(np.arange(t), d, cfg.rope_theta)
    allowed = np.tril(np.ones((t, t), bool))
    pick = np.sort(np.random.default_rng(seed).permutation(t)[:max_tokens])
    for i, layer in enumerate(w.layers):
        f = {k: as_f32(v) for k, v in layer.items()}
        h = ops.rms_norm(x, f["ln1"], cfg.rms_norm_eps)
        q = ops.apply_rope(ops.linear(h, f["wq"], f["bq"]).reshape(t, nh, d), cos, sin)
        k = ops.apply_rope(ops.linear(h, f["wk"], f["bk"]).reshape(t, nkv, d), cos, sin)
        v = ops.linear(h, f["wv"], f["bv"]).reshape(t, nkv, d)
        a = ops.attention(q, k.transpose(1, 0, 2), v.transpose(1, 0, 2), allowed).reshape(t, nh * d)
        x = x + ops.linear(a, f["wo"])
        h2 = ops.rms_norm(x, f["ln2"], cfg.rms_norm_eps)
        m = ops.silu_mul(ops.linear(h2, f["wg"]), ops.linear(h2, f["wu"]))
        yield i, {"wq": h[pick], "wk": h[pick], "wv": h[pick], "wo": a[pick], "wg": h2[pick], "wu": h2[pick],
                  "wd": m[pick]}
        x = x + ops.linear(m, f["wd"])


def load_calibration_frames(spec: str, n: int) -> np.ndarray:
    """`n` frames spread over the clip `spec` (a video, image folder, bag, or 'synthetic'), as model frames."""
    from ..clips import ClipError, load_model_frames, open_clip  # cv2 and the bag reader only when asked for

    try:
        frames, _ = load_model_frames(open_clip(spec))
    except ClipError as e:
        raise QuantizeError(f"--calib-clip: {e}") from None
    return frames[np.linspace(0, len(frames) - 1, min(n, len(frames))).round().astype(int)]


def _bf16(a: np.ndarray) -> np.ndarray:
    """bf16 bits of a weight held as bf16 bits or (a GGUF's dequantized values) float32."""
    return f32_to_bf16(a) if a.dtype == np.float32 else a


def _write_gguf_tokenizer(src: str, out: str) -> list[str]:
    """A GGUF's tokenizer as tokenizer.json + tokenizer_config.json (chat template, special tokens) in `out`."""
    from ..model.tokenizer import load_tokenizer

    tok = load_tokenizer(src)
    if tok is None:
        return []
    tok.tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"chat_template": tok.chat_template, "eos_token": tok.eos_token, "bos_token": tok.bos_token,
                   "tokenizer_class": "Qwen2Tokenizer"}, f, indent=1)
    return ["tokenizer.json", "tokenizer_config.json"]


def quantize_model(src: str, out: str, fmt: str, symmetric: bool = False, force: bool = False,
                   calib_frames: np.ndarray | None = None, calib_tokens: int = 256) -> dict:
    """Quantize the model in `src` into `out` (with a clip search on `calib_frames` if given). Returns counts
    for the summary line."""
    if fmt not in FORMATS:
        raise QuantizeError(f"unknown format {fmt!r} (one of {', '.join(FORMATS)})")
    if symmetric and fmt != "compressed-tensors":
        raise QuantizeError("--symmetric applies to compressed-tensors only (AWQ gemm always has zero points)")
    if os.path.abspath(src) == os.path.abspath(out):
        raise QuantizeError("--out must differ from --model")
    problem = check_model_path(src)
    if problem:
        raise UnquantizableModel(problem)
    gguf = is_gguf(src)
    # every tensor checked: a broken input fails here, before anything is written. A GGUF file is quantized from
    # its dequantized float32 values (not from their bf16 rounding), its other tensors stored as bf16.
    try:
        cfg = load_config(src)  # the shapes first: a model that cannot be quantized is refused before it is read
        if cfg.quant is not None:
            raise QuantizeError(f"{src} is already quantized ({cfg.quant.method}); give it the bf16 model")
        odd = [f"{name} {v}" for name, v in (("hidden_size", cfg.hidden_size),
                                             ("intermediate_size", cfg.intermediate_size)) if v % GROUP_SIZE]
        if odd:
            raise UnquantizableModel(f"{src}: {' and '.join(odd)} not a multiple of the {GROUP_SIZE}-channel group "
                                     "(the 4-bit formats quantize whole groups of input channels)")
        w = load_model(src, keep_f32=gguf)
    except ModelLoadError as e:
        raise UnquantizableModel(str(e)) from None
    cfg = w.cfg
    quant = QuantConfig(fmt, symmetric=symmetric)
    sdt = default_scale_dtype(fmt)
    tensors = {"model.embed_tokens.weight": ("BF16", _bf16(w.embed)), "model.norm.weight": ("BF16", _bf16(w.norm))}
    if w.lm_head is not None:
        tensors["lm_head.weight"] = ("BF16", _bf16(w.lm_head))
    n_quant = 0
    stats: dict = {}
    calib = calibration_inputs(w, calib_frames, calib_tokens) if calib_frames is not None else None
    for i, layer in enumerate(w.layers):
        acts = next(calib)[1] if calib is not None else {}
        for short, suffix in LAYER_TENSORS.items():
            name = f"model.layers.{i}.{suffix}"
            if short in LINEARS:
                wf = as_f32(layer[short])
                clip = search_clip(wf, acts[short], symmetric, sdt, stats=stats) if acts else None
                qt = quantize_rtn(wf, symmetric, sdt, fmt, clip=clip)
                tensors.update(stored_tensors(name[:-len(".weight")], qt, fmt, symmetric))
                n_quant += 1
            else:
                tensors[name] = ("BF16", _bf16(layer[short]))
    if gguf:
        raw = cfg.to_hf_dict()
    else:
        with open(os.path.join(src, "config.json"), encoding="utf-8") as f:
            raw = json.load(f)  # kept as the user wrote it (tokenizer ids, architectures, ...), plus the quant block
    raw["quantization_config"] = quant.to_hf()
    with atomic_output_dir(out, force) as tmp:
        save_file(tensors, os.path.join(tmp, "model.safetensors"),
                  {"note": f"4-bit {fmt} (round-to-nearest, group 128) by vla-edge-quantize"})
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
            json.dump(raw, f, indent=1)
        copied = _write_gguf_tokenizer(src, tmp) if gguf else []
        for name in ([] if gguf else sorted(os.listdir(src))):
            p = os.path.join(src, name)
            if name == "config.json" or _is_weight_file(name) or not os.path.isfile(p):
                continue
            shutil.copy2(p, os.path.join(tmp, name))
            copied.append(name)
    return {"linears": n_quant, "bytes_in": sum(os.path.getsize(f) for f in w.files),
            "bytes_out": os.path.getsize(os.path.join(out, "model.safetensors")), "copied": copied,
            "layers": cfg.num_hidden_layers, "config": dataclasses.replace(cfg, quant=quant),
            "calib_error": (stats["searched"] / stats["rtn"]) if stats.get("rtn") else None}


def main(argv=None) -> int:
    p = Parser(prog="vla-edge-quantize", description=__doc__.split("\n\n")[0],
               epilog=__doc__.strip().splitlines()[-1], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", required=True, help="bf16 (or fp16/fp32) HF-layout model directory, or a GGUF file "
                   "(quantized from its dequantized weights; its tokenizer is written as tokenizer.json)")
    p.add_argument("--format", required=True, choices=FORMATS, help="published 4-bit layout to write")
    p.add_argument("--symmetric", action="store_true",
                   help="compressed-tensors only: symmetric 4-bit (scale = max|w|/7.5), no zero points")
    p.add_argument("--calib-clip", default=None,
                   help="clip (video, image folder, bag, or 'synthetic') whose frames drive a per-group clip search "
                        "(without it: plain round-to-nearest)")
    p.add_argument("--calib-frames", type=bounded(1, MAX_CALIB_FRAMES, int), default=16,
                   help=f"frames taken from --calib-clip (32 tokens each), 1 to {MAX_CALIB_FRAMES}")
    p.add_argument("--calib-tokens", type=bounded(1, MAX_CALIB_TOKENS, int), default=256,
                   help=f"activation rows each search uses, 1 to {MAX_CALIB_TOKENS}")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out")
    p.add_argument("--out", required=True, help="output model directory (absent or empty)")
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    stop = _StopOnSignal()
    try:
        frames = load_calibration_frames(a.calib_clip, a.calib_frames) if a.calib_clip else None
        r = quantize_model(a.model, a.out, a.format, a.symmetric, a.force, frames, a.calib_tokens)
    except (UnquantizableModel, ModelLoadError) as e:
        print(f"vla-edge-quantize: error: {e}", file=sys.stderr)
        return 3
    except (QuantizeError, OutputDirError, ValueError, OSError) as e:
        print(f"vla-edge-quantize: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: atomic_output_dir has removed its temporary folder
        print(f"vla-edge-quantize: interrupted ({stop.name}); {a.out} not written", file=sys.stderr)
        return 128 + stop.signum
    finally:
        stop.restore()
    if r["calib_error"] is not None:
        print(f"clip search on {len(frames)} frames of {a.calib_clip}: calibration output error "
              f"{r['calib_error']:.3f}x that of plain round-to-nearest")
    print(f"quantized {r['linears']} linears of {r['layers']} layers to 4-bit {a.format}"
          f"{' symmetric' if a.symmetric else ''}: weights {r['bytes_in'] / 2**20:.1f} MiB -> "
          f"{r['bytes_out'] / 2**20:.1f} MiB in {time.perf_counter() - t0:.1f} s; copied "
          f"{', '.join(r['copied']) or 'no other files'}; wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
