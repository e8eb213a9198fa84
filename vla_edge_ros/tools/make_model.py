# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""vla-edge-make-model: write random weights in HF Qwen2 layout (+ vision.safetensors).

The output loads unchanged in `transformers.AutoModelForCausalLM.from_pretrained(DIR)` (a 4-bit one there
with the format's library installed). Speed does not depend on weight values, so these serve tests, demos
and benchmarks alike. `--quant` writes the same random model with its decoder linears rounded to 4 bits in
a published layout (AWQ gemm or compressed-tensors pack-quantized); `--action-decoding parallel` marks it
as a parallel-decoding model and adds random `action_queries` to vision.safetensors; `--action-chunk K` with it
makes the model plan K actions a chunk (config.json `vla_action_chunk`, K x 8 action queries); `--state-dim N`
gives it a robot-state input (a random state projector and bounds; DESIGN.md §17).

Example: vla-edge-make-model --preset tiny --quant awq --out /tmp/tiny-awq
"""
from __future__ import annotations

import argparse
import sys

from ..constants import MAX_ACTION_CHUNK, MAX_STATE_DIM, STATE_FIELDS
from ..model.config import ACTION_DECODING, PRESETS
from ..model.generate import make_model
from ..model.quant import FORMATS
from ..model.safetensors_io import ModelLoadError
from ..output_dir import OutputDirError


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="vla-edge-make-model", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.strip().splitlines()[-1],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny", help="model shape")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    p.add_argument("--shards", type=int, default=1, help="write model-0000N-of-0000M.safetensors + index")
    p.add_argument("--quant", choices=("none", *FORMATS), default="none",
                   help="round the decoder linears to 4 bits (group 128) in this published layout")
    p.add_argument("--symmetric", action="store_true", help="compressed-tensors: symmetric 4-bit, no zero points")
    p.add_argument("--action-decoding", choices=ACTION_DECODING, default="autoregressive",
                   help="parallel: config key vla_action_decoding and random action_queries in vision.safetensors")
    p.add_argument("--action-chunk", type=int, default=1, metavar="K",
                   help=f"actions one parallel chunk plans, 1..{MAX_ACTION_CHUNK}: config key vla_action_chunk and "
                        "K x 8 random action_queries (K > 1 needs --action-decoding parallel)")
    p.add_argument("--state-dim", type=int, default=0, metavar="N",
                   help=f"a robot-state input of N values, 0..{MAX_STATE_DIM} (joints joint_0.. unless --state-joints "
                        "names them): config keys vla_state_dim / vla_state_joints / vla_state_fields and a random "
                        "state projector in vision.safetensors")
    p.add_argument("--state-joints", default="", metavar="A,B,..",
                   help="the state's joint names in the model's order (comma-separated; with --state-fields, "
                        "N = joints x fields)")
    p.add_argument("--state-fields", default="position", metavar="F,..",
                   help=f"the JointState fields per joint: {', '.join(STATE_FIELDS)}")
    p.add_argument("--force", action="store_true", help="replace a non-empty --out")
    p.add_argument("--out", required=True, help="output model directory (absent or empty)")
    a = p.parse_args(argv)
    if a.shards < 1:
        p.error("--shards must be >= 1")
    if a.symmetric and a.quant != "compressed-tensors":
        p.error("--symmetric needs --quant compressed-tensors (AWQ gemm always has zero points)")
    if not 1 <= a.action_chunk <= MAX_ACTION_CHUNK:
        p.error(f"--action-chunk {a.action_chunk} must be between 1 and {MAX_ACTION_CHUNK}")
    if a.action_chunk > 1 and a.action_decoding != "parallel":
        p.error(f"--action-chunk {a.action_chunk} needs --action-decoding parallel (an autoregressive model decodes "
                "one action a chunk)")
    fields = [x for x in a.state_fields.split(",") if x]
    joints = [x for x in a.state_joints.split(",") if x]
    if not 0 <= a.state_dim <= MAX_STATE_DIM:
        p.error(f"--state-dim {a.state_dim} must be between 0 and {MAX_STATE_DIM}")
    if not joints and a.state_dim:
        if a.state_dim % max(len(fields), 1):
            p.error(f"--state-dim {a.state_dim} is not a whole number of joints x {len(fields)} fields")
        joints = [f"joint_{i}" for i in range(a.state_dim // max(len(fields), 1))]
    elif joints and a.state_dim and a.state_dim != len(joints) * len(fields):
        p.error(f"--state-dim {a.state_dim} must be {len(joints)} joints x {len(fields)} fields")
    try:
        make_model(a.out, a.preset, a.seed, a.shards, quant=a.quant, symmetric=a.symmetric,
                   action_decoding=a.action_decoding, force=a.force, action_chunk=a.action_chunk,
                   state_joints=joints if joints else None, state_fields=fields if joints else None)
    except ModelLoadError as e:
        p.error(str(e))
    except (OutputDirError, OSError) as e:
        print(f"vla-edge-make-model: error: {e}", file=sys.stderr)
        return 2
    kind = "" if a.quant == "none" else f" {a.quant}{' symmetric' if a.symmetric else ''} 4-bit"
    chunk = f", {a.action_chunk} actions a chunk" if a.action_chunk > 1 else ""
    state = f", a state of {len(joints) * len(fields)} ({', '.join(fields)} of {len(joints)} joints)" if joints else ""
    print(f"wrote {a.preset}{kind} {a.action_decoding}{chunk}{state} (seed {a.seed}) to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
