# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The camera watchdog's restart state machine (issue 30.3): at most one camera process at a time, ever, whatever
fails at which step of a restart: the spawn, the child's first answer, the logging (an rclpy logger that refuses
a second severity at one call site, a log that always raises), the swap lock (a full /dev/shm). Real spawned
processes (``CameraProcess`` with stand-in child bodies, test/camera_children.py), counted from /proc after every
watchdog poll."""

from __future__ import annotations

import os
import time

import pytest

from camera_children import beating_child, silent_child
from vla_edge_ros.frame_buffer import FrameBuffer
from vla_edge_ros.nodes.camera_process import CameraProcess


def camera_children() -> list[int]:
    """Live (not zombie) spawned children of this process: camera processes (the resource tracker excluded)."""
    me, out = os.getpid(), []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z" and b"spawn_main" in cmd:
            out.append(int(d))
    return out


@pytest.fixture
def make_camera():
    made = []

    def make(target=beating_child, log=None):
        cam = CameraProcess(FrameBuffer(shared=True), ["camera_test"], log=log or (lambda level, msg: None),
                            child_target=target)
        cam.restart_interval_s, cam.hang_s, cam.ready_timeout_s = 0.2, 1.0, 0.6
        made.append(cam)
        cam.launch()
        assert cam.wait_ready(timeout=30)["ok"]
        return cam

    yield make
    for cam in made:
        cam.stop()


def run_watchdog(cam, seconds: float, kill_every: float | None = None, each=None) -> tuple[int, int]:
    """Poll as the bringup does (every 0.05 s here), killing the child every `kill_every` s; returns (most camera
    processes alive at once, polls)."""
    most, polls, t_kill = 0, 0, time.monotonic()
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        if kill_every is not None and time.monotonic() - t_kill >= kill_every and cam.proc.is_alive():
            os.kill(cam.proc.pid, 9)
            t_kill = time.monotonic()
        if each is not None:
            each()
        cam.poll()
        polls += 1
        most = max(most, len(camera_children()))
        time.sleep(0.05)
    return most, polls


def test_an_rclpy_logger_at_two_severities_through_the_bringup_adapter():
    """The root cause: one call site at two severities raised in rclpy (and left the restart pending)."""
    rclpy_logging = pytest.importorskip("rclpy.logging")
    from vla_edge_ros.nodes.bringup import node_log

    log = node_log(rclpy_logging.get_logger("vla_edge_test_two_severities"))
    for level in ("error", "info", "warn", "error", "info", "debug"):
        log(level, f"a line at {level}")


def test_a_log_that_always_raises_never_multiplies_the_camera(make_camera):
    def broken(level, msg):
        raise RuntimeError("Logger severity cannot be changed between calls.")

    cam = make_camera(log=broken)
    most, _ = run_watchdog(cam, 4.0, kill_every=0.5)
    assert most == 1, most
    assert cam.restarts >= 3 and not cam._restart_pending, (cam.restarts, cam._restart_pending)


def test_a_failing_spawn_is_retried_with_one_process_at_most(make_camera):
    cam = make_camera()
    real, fails = cam._ctx.Process, {"left": 3}

    def flaky(*a, **kw):
        if fails["left"] > 0:
            fails["left"] -= 1
            raise OSError(24, "Too many open files")
        return real(*a, **kw)

    cam._ctx.Process = flaky
    os.kill(cam.proc.pid, 9)
    most, _ = run_watchdog(cam, 3.0)
    assert most <= 1 and fails["left"] == 0, most
    assert cam.proc.is_alive() and cam.process_error == "" and not cam._restart_pending, cam.stats()


def test_a_child_that_never_answers_is_replaced_not_joined_by_another(make_camera):
    cam = make_camera(target=silent_child)
    first = cam.proc.pid
    most, _ = run_watchdog(cam, 3.0)
    assert most == 1, most
    assert cam.restarts >= 2 and cam.proc.pid != first, cam.stats()


def test_dev_shm_full_then_free_with_the_rclpy_log_adapter(make_camera):
    """The issue's sequence: the swap lock cannot be renewed (a full /dev/shm), the camera is killed, space comes
    back: one camera process, restarted once space returned, and the error cleared."""
    rclpy_logging = pytest.importorskip("rclpy.logging")
    from vla_edge_ros.nodes.bringup import node_log

    cam = make_camera(log=node_log(rclpy_logging.get_logger("vla_edge_test_shm_full")))
    real_renew, full = cam.fb.renew_lock, {"on": True}

    def renew():
        if full["on"]:
            raise OSError(28, "No space left on device")
        real_renew()

    cam.fb.renew_lock = renew
    os.kill(cam.proc.pid, 9)
    cam.proc.join(10)  # gone (reaped) before counting: from here no camera process may exist until space returns
    most, _ = run_watchdog(cam, 1.5)
    assert most == 0 and cam.stats()["process_state"] == "cannot start", cam.stats()
    full["on"] = False
    most, _ = run_watchdog(cam, 3.0)
    assert most == 1, most
    assert cam.proc.is_alive() and cam.process_error == "" and cam.stats()["process_state"] == "running", cam.stats()
