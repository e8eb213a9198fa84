#!/usr/bin/env bash
# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
# One device call: the engine's bf16 and 4-bit chunks and the peers in the same call, so the ratios come from one
# run. .device/peers/ holds copies of ../shared/peers/{hf_baseline,torch_peer}.py (sha256 in BENCHMARKS.md).
#   bash bench/gpu_peers.sh
set -o pipefail
. "$(dirname "$0")/lib.sh"
make_models
say "engine bf16"
timeout 120 $PY -m vla_edge_ros.tools.chunk_bench --model "$M/bf16" --chunks 200 --json "$OUT/peer_cb_bf16.json" \
  2>&1 | grep -E "chunk \(|decode pass"
say "HF eager peer"
timeout 200 $PY .device/peers/hf_baseline.py 4072 2>&1 | grep RESULTS | tee "$OUT/hf_peer.txt"
say "torch.compile + CUDA graphs peer, HEAD_ROWS=256"
HEAD_ROWS=256 timeout 420 $PY .device/peers/torch_peer.py 4072 2>&1 | grep RESULTS | tee "$OUT/torch_peer.txt"
say done
