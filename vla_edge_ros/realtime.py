# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""How the control thread is scheduled: the GIL switch interval and real-time priority (ROS-free).

The reasoning process (`nodes/bringup.py`) and `vla-edge-bench` use the same settings, so the bench measures
the deadline guard as the node runs it.
"""
from __future__ import annotations

import os
import sys

# A thread waiting for the GIL gets it after at most this long: the control thread must not sit 5 ms (the
# default) behind the engine worker or a camera callback before it can publish.
GIL_SWITCH_INTERVAL_S = 0.0005


def tighten_gil_switch() -> None:
    """Set the interpreter's GIL switch interval to GIL_SWITCH_INTERVAL_S for this process."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)


def set_realtime_priority(priority: int) -> str | None:
    """Run the calling thread at SCHED_FIFO `priority` (1-99); 0 leaves it alone. Returns None, or why the
    system refused (no CAP_SYS_NICE / rtprio limit): the caller reports it and runs with normal scheduling.

    On a busy CPU the thread that waits for a chunk wakes milliseconds late; real-time priority lets it
    preempt the engine worker, the camera and other processes the moment its wait ends."""
    if priority <= 0:
        return None
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(int(priority)))  # 0: this thread
    except (AttributeError, PermissionError, OSError) as e:
        return f"realtime_priority {priority} refused ({e}); normal scheduling"
    return None


def normal_scheduling() -> None:
    """Put the calling thread back on normal scheduling. Threads inherit their creator's scheduling: a helper
    started from a SCHED_FIFO thread calls this so that the engine worker it creates never runs real-time."""
    try:
        if os.sched_getscheduler(0) != os.SCHED_OTHER:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except (AttributeError, OSError):
        pass
