#!/usr/bin/env bash
# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
# Issue 27's measurements in one device call (the shapes of the published Qwen2.5 backbones):
#   the random seed-0 models of the 0.5B, 1.5B and 3B shapes are generated in the background (bench/lib.sh make_models),
#   then 0.5B: the full-depth test vs the reference and HF (tshape), chunk_bench confined to 8 and 16 SMs (every kind);
#   1.5B: chunk_bench whole GPU (every kind) + 8 SMs 4-bit parallel (regression check against the earlier kernels);
#   3B: chunk_bench whole GPU (every kind) + 8 / 16 SMs (parallel kinds).   -> $OUT/cb_<preset>_<kind>[_sm<N>].json
#   bash bench/gpu_issue27.sh          (STAGES="05b 15b 3b" picks the shapes)
set -o pipefail
. "$(dirname "$0")/lib.sh"
ALL="bf16 awq bf16-parallel awq-parallel"
gen() { (PRESET=$1; M=/tmp/vla_models/$1; mkdir -p "$M"; make_models > "$OUT/models_$1.log" 2>&1; echo done > "$M/.ok") & }
waitfor() { while [ ! -f "/tmp/vla_models/$1/.ok" ]; do sleep 2; done; }
run() {  # PRESET STEPS [VAR=value ...]
  local p=$1 s=$2; shift 2
  env PRESET="$p" MODELS="/tmp/vla_models/$p" STEPS="$s" "$@" bash "$(dirname "$0")/gpu_run.sh" 2>&1 | grep -v "^NVIDIA"
}
for st in ${STAGES:-05b 15b 3b}; do
  case $st in 05b) gen qwen2.5-0.5b ;; 15b) gen qwen2.5-1.5b ;; 3b) gen qwen2.5-3b ;; esac
done
for st in ${STAGES:-05b 15b 3b}; do
  case $st in
  05b) waitfor qwen2.5-0.5b; say "0.5B models ready"
       run qwen2.5-0.5b tshape
       run qwen2.5-0.5b sms SMS="8 16" SMS_KINDS="$ALL" ;;
  15b) waitfor qwen2.5-1.5b; say "1.5B models ready"
       run qwen2.5-1.5b "bench sms" CHUNKS=100 SMS=8 SMS_KINDS=awq-parallel ;;
  3b)  waitfor qwen2.5-3b; say "3B models ready"
       run qwen2.5-3b "bench sms" CHUNKS=100 SMS="8 16" SMS_KINDS="awq-parallel bf16-parallel" ;;
  esac
done
say "all done"
