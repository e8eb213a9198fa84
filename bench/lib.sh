# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
# Sourced by the bench/gpu_*.sh device scripts: the shared set-up of one device call.
#   OUT (JSON/XML/logs), PY, PRESET (the model shape, default qwen2.5-1.5b), M (its generated models), say, gpu_tests,
#   make_models, make_chunk_models, cb
OUT=${OUT:-/tmp/vla_out}
PY=${PY:-python3}
PRESET=${PRESET:-qwen2.5-1.5b}
M=${MODELS:-/tmp/vla_models/$PRESET}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$M"

say() { echo "=== $(date +%T) $*"; }

# The preset of a shape's short tag (05b, 15b, 3b), as STAGES, TARGET_PARTS and VERIFY_SHAPES name them.
preset_of() { case $1 in 05b) echo qwen2.5-0.5b ;; 15b) echo qwen2.5-1.5b ;; 3b) echo qwen2.5-3b ;; esac; }

# The kernel + tiny-engine GPU tests (every kernel against its NumPy twin, every model kind against the reference).
gpu_tests() {
  $PY -m pytest -q -p no:cacheprovider test/test_cuda_kernels.py test/test_cuda_engine.py -m "not slow" \
    --junitxml="$OUT/tests_tiny.xml" 2>&1 | tail -n "${1:-6}"
}

# The $PRESET models of every kind in $M: bf16 and awq (the same seed-0 weights, rounded), and the two
# parallel-decoding dirs, which share those weights (links) and differ only in config.json.
make_models() {
  [ -d "$M/bf16" ] || $PY -m vla_edge_ros.tools.make_model --preset "$PRESET" --seed 0 --out "$M/bf16" | tail -n 1
  [ -d "$M/awq" ] || $PY -m vla_edge_ros.tools.make_model --preset "$PRESET" --seed 0 --quant awq --out "$M/awq" \
    | tail -n 1
  for k in bf16 awq; do link_parallel "$k" "$k-parallel" 1; done
}

# $M/DST: the weights of $M/SRC (links) with config.json saying parallel decoding of K actions a chunk (K > 1:
# vla_action_chunk; the vision file has no action_queries, so the K x 8 stand-in rows are used, as for K = 1).
#   link_parallel SRC DST K
link_parallel() {
  local d="$M/$2"
  [ -d "$d" ] && return
  mkdir -p "$d"
  for f in "$M/$1"/*; do [ "$(basename "$f")" = config.json ] || ln -s "$f" "$d/"; done
  $PY -c "import json,sys; c=json.load(open(sys.argv[1])); c['vla_action_decoding']='parallel'; k=int(sys.argv[3]); \
c.update({'vla_action_chunk': k} if k > 1 else {}); json.dump(c, open(sys.argv[2],'w'))" "$M/$1/config.json" \
    "$d/config.json" "$3"
}

# $M/DST: the weights of $M/SRC (links) with config.json adding a robot-state input of 7 joints x (position,
# velocity) = 14 values (no state projector in the vision file: the engine's seeded stand-in; timing only).
#   link_state SRC DST
link_state() {
  local d="$M/$2"
  [ -d "$d" ] && return
  mkdir -p "$d"
  for f in "$M/$1"/*; do [ "$(basename "$f")" = config.json ] || ln -s "$(readlink -f "$f")" "$d/"; done
  $PY -c "import json,sys; c=json.load(open(sys.argv[1])); c.update(vla_state_dim=14, vla_state_fields=['position', \
'velocity'], vla_state_joints=[f'joint_{i}' for i in range(7)]); json.dump(c, open(sys.argv[2],'w'))" \
    "$M/$1/config.json" "$d/config.json"
}

# The state twins of the dirs make_models / make_chunk_models wrote (those that exist): KIND-state.
make_state_models() {
  for k in bf16 awq bf16-parallel awq-parallel; do [ -d "$M/$k" ] && link_state "$k" "$k-state"; done
  true
}

# The $PRESET 4-bit model and its parallel dirs of one action and of 8 a chunk (issue 37: K = 1 vs K = 8 on the
# same weights), without the bf16 dir make_models also writes.
make_chunk_models() {
  [ -d "$M/awq" ] || $PY -m vla_edge_ros.tools.make_model --preset "$PRESET" --seed 0 --quant awq --out "$M/awq" \
    | tail -n 1
  link_parallel awq awq-parallel 1
  link_parallel awq awq-parallel-k8 8
}

# chunk_bench of model $M/KIND run from tree DIR (this one, or a base tree), one summary line; JSON and log in $OUT.
#   cb TAG DIR KIND ARGS...
cb() {
  local tag=$1 dir=$2 k=$3; shift 3
  (cd "$dir" && timeout 90 $PY -m vla_edge_ros.tools.chunk_bench --model "$M/$k" --json "$OUT/cb_${tag}_$k.json" "$@" \
    > "$OUT/cb_${tag}_$k.txt" 2>&1)
  $PY - "$OUT/cb_${tag}_$k.json" "$tag $k" <<'PYEOF'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print(sys.argv[2], "FAILED", e); sys.exit()
b = r.get("breakdown_prefill_ms", {})
print(f"{sys.argv[2]:28s} sms {r['sms']} chunk p50/p99 {r['chunk_host_ms']['p50']:.3f}/{r['chunk_host_ms']['p99']:.3f} "
      f"dev {r['chunk_device_ms']['p50']:.3f} pre {r['prefill_ms_p50']:.3f} dec {r['decode_ms_p50']:.3f} "
      f"pass {r.get('decode_pass_ms', {}).get('p50', 0):.4f} eff {r['efficiency_of_copy_bw']:.3f} "
      f"loo {json.dumps(b)} {json.dumps(r.get('breakdown_pass_ms', {}))}")
PYEOF
}

# The tree's correctness in one device call (issue 41: every shape's full-depth tests on the final tree). Per shape
# (0.5B, 1.5B) its models of every kind and their state twins, then at once: both shapes' full-depth tests (bound by
# the golden model on the CPU: 6 and 8 BLAS threads), the kernels against their NumPy twins, and the GPU mutants of
# dev/mutants (header "GPU tests") through scripts/mutation_check.sh, each of which must turn its tests red. VERIFY_S (default
# 560) caps the whole step; VERIFY_SHAPES (default "05b 15b") picks the shapes.
#                                                                  -> $OUT/tests_{05b,15b,kernels}.xml, verify_*.log
verify_all() {
  local t0 cap
  t0=$(date +%s); cap=${VERIFY_S:-560}
  left() { local s=$((cap - $(date +%s) + t0)); echo $((s > 1 ? s : 1)); }  # never 0: `timeout 0` waits forever
  for spec in 05b:6 15b:8; do
    IFS=: read -r tag threads <<<"$spec"; p=$(preset_of "$tag")
    case " ${VERIFY_SHAPES:-05b 15b} " in *" $tag "*) ;; *) continue ;; esac
    (PRESET=$p; M=/tmp/vla_models/$p; mkdir -p "$M"; make_models; make_chunk_models; make_state_models
     for k in bf16 awq bf16-parallel awq-parallel awq-parallel-k8 bf16-state awq-parallel-state; do
       export "VLA_EDGE_$(echo "$tag" | tr a-z A-Z)_DIR_$(echo "$k" | tr a-z- A-Z_)=$M/$k"
     done
     say "$p full-depth tests"
     OPENBLAS_NUM_THREADS=$threads timeout "$(left)" $PY -m pytest -q -s -p no:cacheprovider -m slow \
       test/test_cuda_engine.py -k "qwen$tag" --junitxml="$OUT/tests_$tag.xml"
     say "$p full-depth tests end") > "$OUT/verify_$tag.log" 2>&1 &
  done
  local gpu_mutants=()
  for patch in dev/mutants/*.patch; do sed -n 2p "$patch" | grep -q "GPU tests" && gpu_mutants+=("$patch"); done
  [ ${#gpu_mutants[@]} -gt 0 ] && OPENBLAS_NUM_THREADS=1 MUTATION_TIMEOUT_S="$(left)" \
    bash scripts/mutation_check.sh "${gpu_mutants[@]}" > "$OUT/verify_mutants.log" 2>&1 &
  say "kernel tests"
  OPENBLAS_NUM_THREADS=2 timeout "$(left)" $PY -m pytest -q -p no:cacheprovider test/test_cuda_kernels.py \
    --junitxml="$OUT/tests_kernels.xml" 2>&1 | tail -n 3
  say "kernel tests end"
  wait
  cat "$OUT"/verify_mutants.log 2>/dev/null
  cat "$OUT"/verify_05b.log "$OUT"/verify_15b.log 2>/dev/null | grep -E "===|0\.5B|1\.5B|passed|failed|Error|assert" \
    | tail -n 40
}
