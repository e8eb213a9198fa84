"""vla-edge-make-model: write random weights in HF Qwen2 layout (+ vision.safetensors).

The output loads unchanged in `transformers.AutoModelForCausalLM.from_pretrained(DIR)`. Speed does
not depend on weight values, so these serve tests, demos and benchmarks alike.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

import numpy as np

from ..model.config import PRESETS, ModelConfig
from ..model.safetensors_io import f32_to_bf16, save_file
from ..model.weights import VISION_FILE, hf_tensor_shapes, random_vision_weights


def _random_tensor(rng, name, shape) -> np.ndarray:
    if name.endswith("norm.weight"):
        # Not exactly ones, so a test notices a norm weight that was skipped or misapplied.
        return 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
    return 0.02 * rng.standard_normal(shape, dtype=np.float32)


def make_model(out: str, preset: str = "tiny", seed: int = 0, shards: int = 1, cfg: ModelConfig | None = None) -> str:
    cfg = cfg or PRESETS[preset]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(seed)
    # Draw in one fixed order so the values do not depend on how the tensors are sharded.
    names = sorted(hf_tensor_shapes(cfg).items())
    values = {name: f32_to_bf16(_random_tensor(rng, name, shape)) for name, shape in names}
    weight_map = {}
    for i in range(shards):
        fn = "model.safetensors" if shards == 1 else f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        group = [name for name, _ in names[i::shards]]
        save_file({name: ("BF16", values.pop(name)) for name in group}, os.path.join(out, fn))
        weight_map.update({name: fn for name in group})
    if shards > 1:
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)
    vision = {k: ("BF16", f32_to_bf16(v)) for k, v in random_vision_weights(cfg, seed + 1).items()}
    save_file(vision, os.path.join(out, VISION_FILE), {"note": "untrained patch projector (random)"})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg.to_hf_dict(), f, indent=1)
    return out


def ensure_model(out: str, preset: str = "tiny", seed: int = 0) -> str:
    """Generate `preset` into `out` unless a model is already there. Atomic: concurrent callers (the demo
    and the node it starts, say) all end with one complete directory."""
    if os.path.isfile(os.path.join(out, "config.json")):
        return out
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(out) + ".", dir=parent)
    try:
        make_model(tmp, preset=preset, seed=seed)
        try:
            os.rename(tmp, out)
        except OSError:
            if not os.path.isfile(os.path.join(out, "config.json")):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="vla-edge-make-model", description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shards", type=int, default=1, help="write model-0000N-of-0000M.safetensors + index")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    if a.shards < 1:
        p.error("--shards must be >= 1")
    make_model(a.out, a.preset, a.seed, a.shards)
    print(f"wrote {a.preset} (seed {a.seed}) to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
