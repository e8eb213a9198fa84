#!/usr/bin/env bash
# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
# Every published Qwen2.5 backbone shape (0.5B, 1.5B, 3B) in one device call: what config/boards.yaml `measured`
# holds. The random seed-0 models of the shapes in STAGES are generated in the background (bench/lib.sh make_models);
# then per shape, in order, the gpu_run.sh steps of SHAPE_STEPS (default "bench sms": chunk_bench of every kind on the
# whole GPU, CHUNKS=100, then confined to 8 and 16 SMs by a green context, 30 chunks).
#   -> $OUT/cb_<preset>_<kind>[_sm<N>].json
#   bash bench/gpu_shapes.sh     (STAGES="05b 15b 3b" picks the shapes; SHAPE_STEPS="bench peers" the steps;
#                                 PRE_STEPS="tests" runs gpu_run.sh steps once before the shapes, e.g. the GPU tests)
# (Replaces bench/gpu_issue27.sh of 2026-12-01, whose numbers are in BENCHMARKS.md.)
set -o pipefail
. "$(dirname "$0")/lib.sh"
ALL="bf16 awq bf16-parallel awq-parallel"
gen() { (PRESET=$1; M=/tmp/vla_models/$1; mkdir -p "$M"; make_models > "$OUT/models_$1.log" 2>&1; echo done > "$M/.ok") & }
waitfor() { while [ ! -f "/tmp/vla_models/$1/.ok" ]; do sleep 2; done; }
run() {  # PRESET STEPS [VAR=value ...]
  local p=$1 s=$2; shift 2
  env PRESET="$p" MODELS="/tmp/vla_models/$p" STEPS="$s" "$@" bash "$(dirname "$0")/gpu_run.sh" 2>&1 | grep -v "^NVIDIA"
}
for st in ${STAGES:-05b 15b 3b}; do gen "$(preset_of "$st")"; done
[ -n "${PRE_STEPS:-}" ] && run qwen2.5-1.5b "$PRE_STEPS"
for st in ${STAGES:-05b 15b 3b}; do
  p=$(preset_of "$st"); waitfor "$p"; say "$p models ready"
  run "$p" "${SHAPE_STEPS:-bench sms}" CHUNKS="${CHUNKS:-100}" SMS="${SMS:-8 16}" KINDS="${KINDS:-$ALL}" \
    SMS_KINDS="${SMS_KINDS:-$ALL}"
done
say "all done"
