#!/usr/bin/env bash
# One device call: kernel + engine tests, the chunk benchmark on the qwen2.5-1.5b preset (full 4096-slot
# cache), then the PyTorch peers in the same call. Usage (repo root): bash bench/gpu_bench.sh [quick|full]
# Peers are read from .device/peers/ (git-ignored; copy /work/shared/peers/*.py there and carry it).
set -o pipefail
export PYTHONUNBUFFERED=1
MODE=${1:-full}
OUT=${OUT:-out}
mkdir -p "$OUT"
PY=python3
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
M=/tmp/vla_q15
[ -f $M/model.safetensors ] || $PY -m vla_edge_ros.tools.make_model --preset qwen2.5-1.5b --seed 0 --out $M
export VLA_EDGE_15B_DIR=$M
$PY -m pytest -q -m gpu test/test_cuda_kernels.py test/test_cuda_engine.py -k "not qwen15b" 2>&1 | tee "$OUT/tests.log"
$PY -m vla_edge_ros.tools.chunk_bench --model $M --chunks ${CHUNKS:-300} --json "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
$PY -m pytest -q -s -m gpu test/test_cuda_engine.py -k qwen15b 2>&1 | tee "$OUT/tests_15b.log"
if [ "$MODE" = full ]; then
  timeout 420 $PY .device/peers/torch_peer.py 4072 2>&1 | grep -v Warning | tail -5 | tee "$OUT/torch_peer.log"
  timeout 240 $PY .device/peers/hf_baseline.py 4072 2>&1 | tail -3 | tee "$OUT/hf_baseline.log"
fi
grep -h "RESULTS" "$OUT"/*.log | cut -c1-600
