#!/usr/bin/env bash
# Device call 4 of 2026-11-30: cheaper 4-bit dequantization (16+n float trick in the GEMVs, bf16 magic + bf16x2
# subtract in the prefill GEMM, gate/up at 2 blocks/SM), with prefill and decode leave-one-out breakdowns.
set -o pipefail
. "$(dirname "$0")/lib.sh"
say tests
gpu_tests 4
say models
make_models
say "1.5B awq test"
VLA_EDGE_15B_DIR_AWQ=$M/awq VLA_EDGE_15B_DIR_AWQ_PARALLEL=$M/awq-parallel $PY -m pytest -q -s -p no:cacheprovider \
  test/test_cuda_engine.py -m slow -k "awq" 2>&1 | grep -E "1.5B|passed|failed|Error" | tail -n 6
for k in bf16 awq bf16-parallel awq-parallel; do
  say "chunk_bench $k"
  timeout 90 $PY -m vla_edge_ros.tools.chunk_bench --model "$M/$k" --chunks 200 --breakdown --json "$OUT/cb_$k.json" \
    2>&1 | grep -E "chunk \(|decode pass|chunk bytes|prefill p50|vision /|BREAKDOWN"
done
say done
