#!/usr/bin/env bash
# One device call: the engine's bf16 and 4-bit chunks and the peers in the same call, so the ratios come from one
# run. .device/peers/ holds copies of ../shared/peers/{hf_baseline,torch_peer}.py (sha256 in BENCHMARKS.md).
#   bash bench/gpu_peers.sh
set -o pipefail
OUT=${OUT:-/tmp/vla_out}
mkdir -p "$OUT"
PY=${PY:-python3}
M=${MODELS:-/tmp/vla_models}
export PYTHONUNBUFFERED=1
say() { echo "=== $(date +%T) $*"; }
[ -d "$M/bf16" ] || $PY -m vla_edge_ros.tools.make_model --preset qwen2.5-1.5b --seed 0 --out "$M/bf16" | tail -n 1
say "engine bf16"
timeout 120 $PY -m vla_edge_ros.tools.chunk_bench --model "$M/bf16" --chunks 200 --json "$OUT/peer_cb_bf16.json" \
  2>&1 | grep -E "chunk \(|decode pass" 
say "HF eager peer"
timeout 200 $PY .device/peers/hf_baseline.py 4072 2>&1 | grep RESULTS | tee "$OUT/hf_peer.txt"
say "torch.compile + CUDA graphs peer, HEAD_ROWS=256"
HEAD_ROWS=256 timeout 420 $PY .device/peers/torch_peer.py 4072 2>&1 | grep RESULTS | tee "$OUT/torch_peer.txt"
say done
