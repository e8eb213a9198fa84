#!/usr/bin/env bash
# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
# Start-up footprint of a GGUF on the NumPy backend (issue 42): wall time and peak RSS (/usr/bin/time) of
# `vla-edge-generate --backend numpy --tokens 4`, first start (an empty converted-weights cache), second and third
# start (the entry memory-mapped), and with the cache off. TREE (default: this checkout) runs another tree's code,
# e.g. a `git archive` of the commit before, for the A/B in one run.
#   bash bench/footprint_cpu.sh [MODEL.gguf] [TREE]
set -eo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
model="$(realpath "${1:-$(python3 "$here/scripts/fetch_test_model.py" --print-path)}")"
tree="${2:-$here}"
. "$here/scripts/env.sh"
cache="$(mktemp -d)"
trap 'rm -rf "$cache"' EXIT
run() {  # $1: label; rest: environment for the run
  local label="$1" wall kb
  shift
  # run from inside the tree: `python3 -m` puts the working directory first on sys.path, ahead of PYTHONPATH (the
  # sixteenth session's A/B ran this checkout's code for both trees that way)
  (cd "$tree" && env "$@" PYTHONPATH="$tree" /usr/bin/time -f "%e %M" python3 -m vla_edge_ros.tools.generate \
    --model "$model" --prompt "def fibonacci(n):" --tokens 4 --backend numpy > "$cache/out.txt" 2> "$cache/err.txt") \
    || true
  read -r wall kb <<< "$(tail -n 1 "$cache/err.txt")"  # /usr/bin/time's line comes last
  printf '%-28s wall %6.1f s   peak RSS %5.2f GB   text %s\n' "$label" "$wall" "$(echo "$kb / 1048576" | bc -l)" \
    "$(tr '\n' ' ' < "$cache/out.txt" | cut -c1-60)"
}
echo "footprint: $model on $(getconf _NPROCESSORS_ONLN) cores, tree $tree ($(git -C "$tree" rev-parse --short HEAD 2>/dev/null || echo archive))"
run "first start (empty cache)" VLA_EDGE_CONVERTED_CACHE="$cache/c"
run "second start (cached)" VLA_EDGE_CONVERTED_CACHE="$cache/c"
run "third start (cached)" VLA_EDGE_CONVERTED_CACHE="$cache/c"
run "cache off" VLA_EDGE_CONVERTED_CACHE=off
du -sh "$cache/c" 2>/dev/null | sed 's/^/cache entry size: /' || true
