#!/usr/bin/env bash
# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
# One device call for the prefill-attention change (issue 18): the attention micro-benchmark (new vs
# dev/cuda/attention_v4.cu), the GPU tests while the 1.5B models are made, then chunk_bench per kind on the new
# tree and on a base tree (this tree with kernels/attention.cu replaced by attention_v4.cu), new then base per kind.
#   bash dev/cuda/attn_call.sh
set -o pipefail
. bench/lib.sh
ROOT=$(pwd)
CH=${CHUNKS:-100}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
(make_models > "$OUT/models.txt" 2>&1) &
say "attention micro"
timeout 120 $PY dev/cuda/attn_micro.py --json "$OUT/attn_micro.json" 2>&1 | tail -n 12
say "GPU tests"
gpu_tests 4
wait
tail -n 3 "$OUT/models.txt"
rm -rf /tmp/base && mkdir -p /tmp/base && cp -r vla_edge_ros kernels config /tmp/base/ \
  && cp dev/cuda/attention_v4.cu /tmp/base/kernels/attention.cu
(cd /tmp/base && $PY -c "from vla_edge_ros.cuda.kernels import kernel_dir; print('base kernels:', kernel_dir())")
$PY -c "from vla_edge_ros.cuda.kernels import kernel_dir; print('new kernels:', kernel_dir())"
cb() {  # cb TAG DIR KIND ARGS...: chunk_bench, one summary line
  local tag=$1 dir=$2 k=$3; shift 3
  (cd "$dir" && timeout 80 $PY -m vla_edge_ros.tools.chunk_bench --model "$M/$k" --json "$OUT/cb_${tag}_$k.json" "$@" \
    > "$OUT/cb_${tag}_$k.txt" 2>&1)
  $PY - "$OUT/cb_${tag}_$k.json" "$tag $k" <<'PYEOF'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print(sys.argv[2], "FAILED", e); sys.exit()
b = r.get("breakdown_prefill_ms", {})
print(f"{sys.argv[2]:22s} chunk p50/p99 {r['chunk_host_ms']['p50']:.3f}/{r['chunk_host_ms']['p99']:.3f} "
      f"dev {r['chunk_device_ms']['p50']:.3f} pre {r['prefill_ms_p50']:.3f} dec {r['decode_ms_p50']:.3f} "
      f"pass {r.get('decode_pass_ms', {}).get('p50', 0):.4f} loo {json.dumps(b)}")
PYEOF
}
for k in ${KINDS:-awq-parallel bf16-parallel awq bf16}; do
  say "chunk_bench $k"
  cb new "$ROOT" $k --chunks "$CH" --breakdown
  cb base /tmp/base $k --chunks "$CH" --breakdown
done
say done
