# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Stand-in bodies of the camera child process for the watchdog's state-machine tests (test_camera_restart.py):
real spawned processes that behave like the camera child at one step of its life (report, heartbeat) or fail
there. Module-level, so ``multiprocessing``'s spawn can import them in the child."""

from __future__ import annotations

import os
import time

import numpy as np


def _stats(stats_path):
    from vla_edge_ros.nodes.camera_process import STATS_BYTES
    from vla_edge_ros.shared_block import open_block

    m = open_block(stats_path, STATS_BYTES)
    return m, np.frombuffer(m, np.float64, STATS_BYTES // 8)


def beating_child(fb_handle, stats_path, ros_args, conn, parent_pid, env):
    """Reports ready, then heartbeats every 50 ms until told to stop or its parent is gone."""
    from vla_edge_ros.nodes.camera_process import CMD_STOP, HEARTBEAT

    _m, s = _stats(stats_path)
    conn.send({"ok": True, "declared": [], "undeclared": [], "transport": "raw", "topic": "/image"})
    while not s[CMD_STOP] and os.getppid() == parent_pid:
        s[HEARTBEAT] = time.monotonic()
        time.sleep(0.05)


def silent_child(fb_handle, stats_path, ros_args, conn, parent_pid, env):
    """Reports ready and then never answers (a child stuck before its first heartbeat / first frame)."""
    conn.send({"ok": True, "declared": [], "undeclared": [], "transport": "raw", "topic": "/image"})
    while os.getppid() == parent_pid:
        time.sleep(0.05)
