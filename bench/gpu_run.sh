#!/usr/bin/env bash
# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
# One device call, parameterised (replaces the dated per-call scripts gpu_call2/gpu_call4/gpu_final.sh of
# 2026-11-30 and gpu_round3.sh of 2026-12-01, whose numbers are in BENCHMARKS.md; round 3 is
# STEPS="tests models bench sms base t15b" KINDS="awq-parallel bf16-parallel awq bf16" BREAKDOWN=1 CHUNKS=150
# T15B_K=parallel). Steps run in the order given:
#   STEPS="tests micro models t15b bench sms peers dmicro"  KINDS="bf16 awq bf16-parallel awq-parallel" \
#     bash bench/gpu_run.sh
#   PRESET=qwen2.5-0.5b | qwen2.5-1.5b (default) | qwen2.5-3b picks the shape of models / bench / sms (JSON names carry
#   it: cb_<preset>_<kind>.json); tshape runs the slow full-depth test of that shape (0.5B, 1.5B)
#   tests  kernels vs NumPy twins + tiny engine vs the NumPy reference (every kind)      -> $OUT/tests_tiny.xml
#   micro  prefill GEMMs alone in the variants and rows of MICRO_ARGS (dev/cuda/gemm_micro.py) -> $OUT/gemm_micro$MICRO_TAG.json
#   verify the tree's correctness in one call (bench/lib.sh verify_all): the 0.5B and 1.5B models of every kind, then
#          at once both shapes' full-depth tests, the kernel tests and the GPU mutants (VERIFY_S caps it, default 560)
#                                                                  -> $OUT/tests_{05b,15b,kernels}.xml, verify_*.log
#   targets issue 41's targets, by part (TARGET_PARTS, default "15b 05b peers"; all three are estimated, not measured,
#          at more than one 600 s call: "15b 05b" then "peers" on the same warm machine): per shape the models, chunk_bench of every kind
#          (K = 8 too) on the whole GPU and of the 8-SM targets' kinds on 8 SMs, the 0.5B text paths; the 1.5B peers
#          beside its autoregressive kinds; then bench/targets.py OUT prints each target, what was measured and
#          met / missed (bench/targets.py OUT_PEERS OUT_ENGINE reads the calls together) -> $OUT (the steps' files)
#   models the qwen2.5-1.5b models of every kind (bench/lib.sh make_models)
#   cmodels the 4-bit model and its parallel dirs awq-parallel (one action) and awq-parallel-k8 (8 actions a chunk,
#          issue 37) of PRESET (bench/lib.sh make_chunk_models); then e.g. KINDS="awq-parallel awq-parallel-k8"
#          SMS=8 SMS_KINDS="awq-parallel awq-parallel-k8" STEPS="bench sms"
#   smodels the KIND-state twins of the model dirs there (bench/lib.sh make_state_models: a 14-value state input, the
#          stand-in projector), for KINDS="awq-parallel awq-parallel-state" STEPS=bench
#   t15b   1.5B: CUDA vs the reference (every kind in KINDS) and vs HF (bf16); T15B_K selects (pytest -k, e.g.
#          parallel); unselected it runs the 0.5B's full-depth tests too and took over 370 s on an H100 (twenty-fifth
#          session): give it a call of its own                                             -> $OUT/tests_15b.xml
#   diag   dev/fidelity/w4_weight_rounding.py on PRESET's awq-parallel: the golden model with exact / old-GEMM-rounded /
#          scale-rounded 4-bit weights and the CUDA engine (this tree; the base tree's too when BASE exists)
#   actround dev/fidelity/act_rounding.py on PRESET's awq-parallel and bf16-parallel (models first): the CPU twin of
#          the engine's 16-bit rounding points against the exact golden model, 8 runs of fp32-level noise each, and
#          the 4-bit kind's GEMM inputs in fp16 (issue 41)                               -> $OUT/actround_<kind>.json
#   hostrss the node's core (Runtime.build: checks, engine, warm-up; bench/host_rss_gpu.py) per kind in RSS_KINDS
#          (default "bf16 awq") of PRESET: host RSS after warm-up and the seconds to ready (issue 42)
#                                                                                          -> $OUT/rss_<preset>_<kind>.json
#   bench  chunk_bench per kind in KINDS (CHUNKS chunks; BREAKDOWN=1 adds the leave-one-out breakdowns)
#                                                                                          -> $OUT/cb_<kind>.json
#   sms    chunk_bench confined to SMS (default "8 16") SMs by a green context, kinds in SMS_KINDS
#                                                                                          -> $OUT/cb_<kind>_sm<N>.json
#   base   chunk_bench of another tree (BASE, default .device/base: e.g. `git archive <rev>` carried there) per kind
#          in KINDS, the A/B against `bench` in the same call (BREAKDOWN, SMS_BASE=<N> confines it)
#                                                                                          -> $OUT/cb_base_<kind>.json
#   peers  torch.compile + CUDA graphs peer (.device/peers/torch_peer.py, SHAPE of PRESET, HEAD_ROWS=256), bf16 and
#          WEIGHTS=int4                                                           -> $OUT/torch_peer_<shape>_<w>.txt
#   textspeed the prompt and text paths (bench/text_speed.py: load_prompt of TS_PROMPT (352) tokens, text prefill, greedy
#          tokens/s) per kind in TS_KINDS (default "bf16 awq") of PRESET (models first), on this tree and on BASE when
#          it exists; then vla-edge-generate --backend cuda itself (256 tokens, capture included)
#                                                                                 -> $OUT/ts_<preset>_<kind>[_base].json
#   amicro the attention alone (dev/cuda/attn_micro.py, the PRESET's shape) on the whole GPU and on AM_SMS (default 8)
#          SMs: this tree's 8-warp prefill blocks and its 4-warp ones, and BASE's kernels when BASE exists
#                                                                                 -> $OUT/am_<preset>_sm<N>.json
#   bundle every file in $OUT into one $OUT/out_<time>.tgz (last in STEPS): the device tool brings back at most 8
#          files a call, and the next call's $OUT starts empty (twenty-eighth session: 9 of a targets call's 17 lost)
#   dmicro the persistent decode pass (dev/cuda/decode_persistent.cu) against the per-op chain, per kind in DM_KINDS
#          (default "awq bf16"), variants DM_VARIANTS (default all), DM_SMS confines (0: whole GPU)
#                                                                                          -> $OUT/dm_<preset>_<kind>.json
set -o pipefail
. "$(dirname "$0")/lib.sh"
KINDS=${KINDS:-bf16 awq bf16-parallel awq-parallel}
CHUNKS=${CHUNKS:-200}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
for step in ${STEPS:-tests models bench peers}; do
  case $step in
  tests) say "tests"; gpu_tests 8 ;;
  micro) say "gemm micro $MICRO_ARGS"; timeout 300 $PY dev/cuda/gemm_micro.py $MICRO_ARGS \
    --json "$OUT/gemm_micro${MICRO_TAG:-}.json" 2>&1 | grep -E "SUMMARY|  [bfw]_|Error|error|Traceback" ;;
  verify) say "verify: both shapes' full-depth tests, the kernel tests, the GPU mutants"; verify_all ;;
  targets)  # issue 41's targets, the parts in TARGET_PARTS, then the table (bench/targets.py)
    for part in ${TARGET_PARTS:-15b 05b peers}; do
      case $part in
      15b|05b)
        p=$(preset_of "$part"); sm8=awq-parallel
        [ "$part" = 15b ] && sm8="awq-parallel awq bf16"
        PRESET=$p STEPS="models cmodels bench sms" KINDS="bf16 awq bf16-parallel awq-parallel awq-parallel-k8" \
          SMS=8 SMS_KINDS="$sm8" CHUNKS="$CHUNKS" bash "$0" | grep -v "^NVIDIA"
        [ "$part" = 05b ] && PRESET=$p STEPS=textspeed TS_KINDS="bf16 awq" bash "$0" | grep -v "^NVIDIA" ;;
      peers)  # the 1.5B autoregressive kinds again beside the peers: the ratios from one call
        PRESET=qwen2.5-1.5b STEPS="models bench peers" KINDS="bf16 awq" CHUNKS="$CHUNKS" bash "$0" | grep -v "^NVIDIA" ;;
      esac
    done
    $PY bench/targets.py "$OUT" ;;
  models) say "models"; make_models ;;
  cmodels) say "chunk models ($PRESET)"; make_chunk_models ;;
  smodels) say "state models ($PRESET)"; make_state_models ;;
  tshape)
    say "$PRESET full-depth tests"
    tag=$(echo "$PRESET" | sed 's/qwen2.5-//; s/\.//'); up=$(echo "$tag" | tr a-z A-Z)
    env VLA_EDGE_${up}_DIR_BF16=$M/bf16 VLA_EDGE_${up}_DIR_AWQ=$M/awq VLA_EDGE_${up}_DIR_BF16_PARALLEL=$M/bf16-parallel \
    VLA_EDGE_${up}_DIR_AWQ_PARALLEL=$M/awq-parallel VLA_EDGE_${up}_DIR_AWQ_PARALLEL_K8=$M/awq-parallel-k8 $PY -m pytest -q -s -p no:cacheprovider test/test_cuda_engine.py \
      -m slow -k "qwen$tag" --junitxml="$OUT/tests_$tag.xml" 2>&1 | grep -E "0.5B|1.5B|passed|failed|Error|assert" \
      | tail -n 12 ;;
  t15b)
    say "1.5B tests"
    VLA_EDGE_15B_DIR_BF16=$M/bf16 VLA_EDGE_15B_DIR_AWQ=$M/awq VLA_EDGE_15B_DIR_BF16_PARALLEL=$M/bf16-parallel \
    VLA_EDGE_15B_DIR_AWQ_PARALLEL=$M/awq-parallel VLA_EDGE_15B_DIR_AWQ_PARALLEL_K8=$M/awq-parallel-k8 $PY -m pytest -q -s -p no:cacheprovider test/test_cuda_engine.py \
      -m slow ${T15B_K:+-k "$T15B_K"} --junitxml="$OUT/tests_15b.xml" 2>&1 | grep -E "1.5B|passed|failed|Error|assert" \
      | tail -n 12 ;;
  diag)
    say "4-bit weight rounding vs the golden model ($PRESET awq-parallel; dev/fidelity/w4_weight_rounding.py)"
    timeout 300 $PY dev/fidelity/w4_weight_rounding.py --model "$M/awq-parallel" 2>&1 | grep -E "RESULT|LAYERS|Error"
    if [ -d "${BASE:-.device/base}" ]; then
      say "the same, CUDA of the base tree ${BASE:-.device/base}"
      cp dev/fidelity/w4_weight_rounding.py "${BASE:-.device/base}/dev/fidelity/"
      (cd "${BASE:-.device/base}" && timeout 300 $PY dev/fidelity/w4_weight_rounding.py --model "$M/awq-parallel" \
        --cuda-only 2>&1 \
        | grep -E "RESULT cuda|Error")
    fi ;;
  actround)
    for k in awq-parallel bf16-parallel; do
      say "activation rounding, CPU twin ($PRESET $k; dev/fidelity/act_rounding.py)"
      v=exact,cuda,cuda@1,cuda@2,cuda@3,cuda@4,cuda@5,cuda@6,cuda@7,only-x,only-kv,only-krot,only-q,only-p,only-att,only-act
      [ "$k" = awq-parallel ] && v=$v,gemm-in-fp16,gemm-in-fp16@1,gemm-in-fp16@2,gemm-in-fp16@3
      OPENBLAS_NUM_THREADS=8 timeout 300 $PY dev/fidelity/act_rounding.py --model "$M/$k" --variants "$v" \
        --json "$OUT/actround_${PRESET}_$k.json" 2>&1 | grep -E "RESULT|Error"
    done ;;
  hostrss)
    for k in ${RSS_KINDS:-bf16 awq}; do
      say "host RSS and start of $k ($PRESET; bench/host_rss_gpu.py)"
      timeout 200 $PY bench/host_rss_gpu.py --model "$M/$k" --json "$OUT/rss_${PRESET}_$k.json" 2>&1 \
        | grep -E "RESULT|Error|error"
    done ;;
  bench)
    for k in $KINDS; do
      say "chunk_bench $k"
      extra=""; [ "${BREAKDOWN:-0}" = 1 ] && extra="--breakdown"
      timeout 150 $PY -m vla_edge_ros.tools.chunk_bench --model "$M/$k" --chunks "$CHUNKS" $extra \
        --json "$OUT/cb_${PRESET}_$k.json" 2>&1 | grep -E "chunk \(|decode pass|chunk bytes|vision /|GEMM rows|BREAKDOWN|Error|error"
    done ;;
  sms)
    for n in ${SMS:-8 16}; do for k in ${SMS_KINDS:-awq-parallel bf16-parallel}; do
      say "chunk_bench $k on $n SMs"
      timeout 150 $PY -m vla_edge_ros.tools.chunk_bench --model "$M/$k" --chunks 30 --sms "$n" \
        --json "$OUT/cb_${PRESET}_${k}_sm$n.json" 2>&1 | grep -E "device \||chunk \(|vision /|GEMM rows|Error|error"
    done; done ;;
  base)
    for k in $KINDS; do
      say "chunk_bench $k, base tree ${BASE:-.device/base}"
      extra=""; [ "${BREAKDOWN:-0}" = 1 ] && extra="--breakdown"; [ -n "${SMS_BASE:-}" ] && extra="$extra --sms $SMS_BASE"
      cb base "$(pwd)/${BASE:-.device/base}" "$k" --chunks "$CHUNKS" $extra
    done ;;
  peers)
    shape=${PRESET#qwen2.5-}
    say "torch peer bf16, SHAPE=$shape HEAD_ROWS=256"
    SHAPE=$shape HEAD_ROWS=256 timeout 300 $PY .device/peers/torch_peer.py 4072 2>&1 | grep RESULTS \
      | tee "$OUT/torch_peer_${shape}_bf16.txt"
    say "torch peer int4 (tinygemm), SHAPE=$shape HEAD_ROWS=256"
    SHAPE=$shape WEIGHTS=int4 HEAD_ROWS=256 timeout 300 $PY .device/peers/torch_peer.py 4072 2>&1 | grep RESULTS \
      | tee "$OUT/torch_peer_${shape}_int4.txt" ;;
  textspeed)
    for k in ${TS_KINDS:-bf16 awq}; do
      say "text_speed $k ($PRESET)"
      timeout 200 $PY bench/text_speed.py --model "$M/$k" --prompt "${TS_PROMPT:-352}" --json "$OUT/ts_${PRESET}_$k.json" \
        2>&1 | grep -E "TEXT_SPEED|Error|error"
      if [ -d "${BASE:-.device/base}" ]; then
        say "text_speed $k ($PRESET), base tree ${BASE:-.device/base}"
        timeout 200 $PY bench/text_speed.py --tree "${BASE:-.device/base}" --model "$M/$k" --tag base \
          --prompt "${TS_PROMPT:-352}" --json "$OUT/ts_${PRESET}_${k}_base.json" 2>&1 | grep -E "TEXT_SPEED|Error|error"
      fi
      say "vla-edge-generate --backend cuda $k ($PRESET), 256 tokens"
      ids=$($PY -c "import numpy as np; print(','.join(map(str, np.random.default_rng(1).integers(0, 150000, 32))))")
      timeout 200 $PY -m vla_edge_ros.tools.generate --model "$M/$k" --backend cuda --prompt-ids "$ids" --tokens 256 \
        --no-stop --json 2>&1 | $PY -c "import json,sys; t=sys.stdin.read(); i=t.find('{'); \
r=json.loads(t[i:]) if i >= 0 else {}; print('GENERATE', {k: v for k, v in r.items() if k not in ('ids', 'text', 'prompt_ids')} \
if r else t[-2000:])"
    done ;;
  amicro)
    shape=${PRESET#qwen2.5-}; base=""; [ -d "${BASE:-.device/base}/kernels" ] && base="--base-dir ${BASE:-.device/base}"
    for n in 0 ${AM_SMS:-8}; do
      say "attention micro $shape, SMs ${n/#0/all}"
      timeout 200 $PY dev/cuda/attn_micro.py --new-only --shape "$shape" --sms "$n" $base \
        --json "$OUT/am_${PRESET}_sm$n.json" 2>&1 | grep -E "ATTN_MICRO|Error|error"
    done ;;
  dmicro)
    for k in ${DM_KINDS:-awq bf16}; do
      say "decode_micro $k"
      timeout 200 $PY dev/cuda/decode_micro.py --model "$M/$k" --sms "${DM_SMS:-0}" \
        ${DM_VARIANTS:+--variants "$DM_VARIANTS"} --json "$OUT/dm_${PRESET}_$k.json" 2>&1 \
        | grep -E "DECODE_MICRO|Error|error"
    done ;;
  bundle)  # one archive of $OUT (the header says why)
    f=out_$(date +%H%M%S).tgz
    tar czf "/tmp/$f" -C "$OUT" --exclude='*.tgz' . && find "$OUT" -maxdepth 1 -type f ! -name '*.tgz' -delete \
      && mv "/tmp/$f" "$OUT/" && say "bundle: $OUT/$f (tar xzf it into a folder for bench/targets.py)" ;;
  *) echo "unknown step $step" ;;
  esac
done
say done
