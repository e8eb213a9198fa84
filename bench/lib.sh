# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
# Sourced by the bench/gpu_*.sh device scripts: the shared set-up of one device call.
#   OUT (JSON/XML/logs), PY, M (the generated models), say, gpu_tests, make_models
OUT=${OUT:-/tmp/vla_out}
PY=${PY:-python3}
M=${MODELS:-/tmp/vla_models}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$M"

say() { echo "=== $(date +%T) $*"; }

# The kernel + tiny-engine GPU tests (every kernel against its NumPy twin, every model kind against the reference).
gpu_tests() {
  $PY -m pytest -q -p no:cacheprovider test/test_cuda_kernels.py test/test_cuda_engine.py -m "not slow" \
    --junitxml="$OUT/tests_tiny.xml" 2>&1 | tail -n "${1:-6}"
}

# The qwen2.5-1.5b models of every kind in $M: bf16 and awq (the same seed-0 weights, rounded), and the two
# parallel-decoding dirs, which share those weights (links) and differ only in config.json.
make_models() {
  [ -d "$M/bf16" ] || $PY -m vla_edge_ros.tools.make_model --preset qwen2.5-1.5b --seed 0 --out "$M/bf16" | tail -n 1
  [ -d "$M/awq" ] || $PY -m vla_edge_ros.tools.make_model --preset qwen2.5-1.5b --seed 0 --quant awq --out "$M/awq" \
    | tail -n 1
  for k in bf16 awq; do
    local d="$M/$k-parallel"
    [ -d "$d" ] && continue
    mkdir -p "$d"
    for f in "$M/$k"/*; do [ "$(basename "$f")" = config.json ] || ln -s "$f" "$d/"; done
    $PY -c "import json,sys; c=json.load(open(sys.argv[1])); c['vla_action_decoding']='parallel'; \
json.dump(c, open(sys.argv[2],'w'))" "$M/$k/config.json" "$d/config.json"
  done
}
