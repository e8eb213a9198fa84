#!/usr/bin/env bash
# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
# Issue 18, round 3 (2026-12-01): the final device call of the session, in one command:
#   GPU tests (kernels + tiny engine) while the 1.5B models are made; chunk_bench on the new kernels
#   (--breakdown) and on the previous round's tree (BASE, e.g. `git archive 5d7a360` carried in .device/base) for
#   the A/B in the same call, parallel kinds first; the parallel kinds on 8 SMs (green context); the 1.5B tests of
#   the parallel kinds (CUDA vs the NumPy reference, every step).
#   BASE=.device/base bash bench/gpu_round3.sh
set -o pipefail
. "$(dirname "$0")/lib.sh"
ROOT=$(pwd)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
say "tests + models"
(make_models > "$OUT/models.txt" 2>&1) &
gpu_tests 4
wait
cat "$OUT/models.txt"
say "chunk_bench, parallel kinds: new, then base"
for k in awq-parallel bf16-parallel; do cb new "$ROOT" $k --chunks 150 --breakdown; done
for k in awq-parallel bf16-parallel; do cb base "$ROOT/${BASE:-.device/base}" $k --chunks 150; done
say "8 SMs, new"
for k in awq-parallel bf16-parallel; do cb new8 "$ROOT" $k --chunks 20 --sms 8; done
say "chunk_bench, autoregressive kinds: new, then base"
for k in awq bf16; do cb new "$ROOT" $k --chunks 150 --breakdown; done
for k in awq bf16; do cb base "$ROOT/${BASE:-.device/base}" $k --chunks 150; done
say "1.5B tests, parallel kinds"
VLA_EDGE_15B_DIR_BF16_PARALLEL=$M/bf16-parallel VLA_EDGE_15B_DIR_AWQ_PARALLEL=$M/awq-parallel timeout 100 \
  $PY -m pytest -q -s -p no:cacheprovider test/test_cuda_engine.py -m slow -k parallel --junitxml="$OUT/tests_15b.xml" 2>&1 \
  | grep -E "1.5B|cosine|passed|failed|Error|assert" | tail -n 8
say "8 SMs, base"
cb base8 "$ROOT/${BASE:-.device/base}" awq-parallel --chunks 20 --sms 8
say done
