# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""vla-edge-bench runs what the node runs (issue 31): one clip through the bench and through the real bringup over
Fast DDS, the same settings; the per-reason fallback counts and the clamped command components agree.

The settings make every cycle's outcome a property of the loop, not of the host's timing: a period several times the
micro chunk (every tick finds a new frame of the 30 fps clip, every chunk fits), and action bins from 2 to 3, so every
component of a model action is over the velocity limits (0.25 m/s, 0.5 rad/s, the node's defaults) and all six are
clamped. A frame counts as stale only after 10 s (``max_frame_age_ms``): the replay is another process, which a loaded
host can keep off the CPU for more than the default 200 ms (a run under slow_host.sh -f 3 had one such `stale_frame`
in the node and none in the bench, whose camera is simulated); the stale-frame check has its own tests. The node's
first cycles before its first frame (``no_frame``: discovery, the camera process starting) are not
part of the comparison; the bench's first tick finds a frame, as on a running robot."""

from __future__ import annotations

import collections
import json

import pytest

pytest.importorskip("rclpy")

from ros_helpers import Listener, plumbing_period_ms, start_replay, start_vla_edge  # noqa: E402

from vla_edge_ros.cycle import FALLBACK_REASONS  # noqa: E402
from vla_edge_ros.tools import bench  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

ACTION_RANGE = {"action_low": 2.0, "action_high": 3.0}  # every twist component over its velocity limit
SETTINGS = {**ACTION_RANGE, "max_frame_age_ms": 10000.0}  # the bench's and the node's, beyond period and backend
CLIP_FPS = 30.0
CYCLES = 24


def test_the_bench_and_the_node_count_the_same_fallbacks_and_clamps(domain, tmp_path, procs, micro_model):
    from vla_edge_ros.synthetic_bag import make_test_bag

    period_ms = max(100.0, 3.0 * plumbing_period_ms())
    bag = make_test_bag(tmp_path / "bag", frames=90, fps=CLIP_FPS, storage="sqlite3")
    out = tmp_path / "bench"
    rc = bench.main(["--model", micro_model, "--clip", str(bag), "--policies", "fifo", "--backend", "numpy",
                     "--seconds", str(CYCLES * period_ms / 1000.0), "--period-ms", str(period_ms),
                     "--camera-hz", str(CLIP_FPS), "--kv-capacity", "512", "--out", str(out), "--quiet",
                     *(x for k, v in SETTINGS.items() for x in ("--" + k.replace("_", "-"), str(v)))])
    assert rc == 0
    with open(out / "report.json") as f:
        m = json.load(f)["clips"][0]["policies"]["fifo"]
    assert m["cycles"] >= CYCLES - 2, m["cycles"]  # a tick more than a period late is skipped, as a ROS timer would

    node = start_vla_edge(procs, domain, tmp_path, micro_model, {"period_ms": period_ms, "backend": "numpy",
                                                                 **SETTINGS},
                          remaps=[("image", "/camera/image_raw")])
    lst = Listener(domain)
    try:
        start_replay(procs, domain, tmp_path, bag, "--loop")

        def window():  # the node's cycles from its first frame on, as many as the bench ran
            seen = [v for _, v, _ in lst.cycles]
            first = next((i for i, v in enumerate(seen) if v["reason"] != "no_frame"), None)
            return [] if first is None else seen[first:first + m["cycles"]]

        lst.wait_for(lambda: len(window()) == m["cycles"], 90, f"{m['cycles']} cycles of the node with frames")
        with lst.lock:
            cycles = window()
    finally:
        lst.close()
    assert node.stop() == 0, node.output()[-3000:]

    node_fallbacks = collections.Counter(v["reason"] for v in cycles if v["source"] == "fallback")
    assert {r: node_fallbacks.get(r, 0) for r in FALLBACK_REASONS} == m["fallbacks"], (node_fallbacks, m["fallbacks"])
    node_model = sum(v["source"] == "model" for v in cycles)
    node_clamped = sum(int(v["clamped"]) for v in cycles)
    assert (m["model_actions"], m["clamped_velocity"] + m["clamped_acceleration"]) == (node_model, node_clamped)
    # the limits really ran in both: all six components of every model action clamped, nothing else
    assert node_model > 0 and node_clamped == 6 * node_model and m["clamped_velocity"] == 6 * m["model_actions"]
