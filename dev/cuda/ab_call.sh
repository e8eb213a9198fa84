#!/usr/bin/env bash
# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
# One device call for a kernel change (issue 18): the micro-benchmarks, the GPU tests while the 1.5B models are
# made, then chunk_bench per kind on this tree ("new") and on a base tree ("base": vla_edge_ros, kernels and config
# of an earlier commit, made here with
#   rm -rf .device/base && mkdir -p .device/base && git archive COMMIT vla_edge_ros kernels config | tar -x -C .device/base
# and carried), new then base per kind, same process order, same chunk count.
#   MICRO="gemv attn" KINDS="awq bf16" CHUNKS=100 bash dev/cuda/ab_call.sh
set -o pipefail
RESULTS=${OUT:-/tmp}
OUT=/tmp/ab_out  # everything lands here, then comes back as one archive (a device call returns at most 8 files)
. bench/lib.sh
ROOT=$(pwd)
CH=${CHUNKS:-100}
BASE=${BASE:-$ROOT/.device/base}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
(make_models > "$OUT/models.txt" 2>&1) &
for m in ${MICRO:-gemv attn}; do
  case $m in
  gemv) say "gemv micro"; timeout 200 $PY dev/cuda/gemv_micro.py --json "$OUT/gemv_micro.json" 2>&1 | tail -n 16 ;;
  attn) say "attention micro"
    timeout 150 $PY dev/cuda/attn_micro.py --new-only --pdl --decode-splits "${DECODE_SPLITS:-64}" \
      --prefill-splits "${PREFILL_SPLITS:-auto}" --json "$OUT/attn_micro.json" 2>&1 | tail -n 12 ;;
  esac
done
say "GPU tests"
gpu_tests 4
wait
tail -n 3 "$OUT/models.txt"
[ -d "$BASE/vla_edge_ros" ] || echo "no base tree at $BASE: new only"
for k in ${KINDS:-awq bf16 awq-parallel bf16-parallel}; do
  say "chunk_bench $k"
  cb new "$ROOT" $k --chunks "$CH" --breakdown
  [ -d "$BASE/vla_edge_ros" ] && cb base "$BASE" $k --chunks "$CH" --breakdown
done
say done
tar -czf "$RESULTS/ab_out.tgz" -C "$OUT" .
