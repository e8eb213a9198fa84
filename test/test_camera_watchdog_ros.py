# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The camera child process over real DDS: the no-frame watchdog and the image subscription's qos_overrides.

A real ``CameraProcess`` (a spawned child running ``CameraNode``) and a real publisher node in this process, on a
random domain.  Budgets come from what is measured here (DESIGN.md §15): the no-frame limit is a multiple of the
longest gap between frames seen while the publisher sends.
"""

from __future__ import annotations

import time

import pytest

rclpy = pytest.importorskip("rclpy")

from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.qos import ReliabilityPolicy  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from vla_edge_ros.frame_buffer import FrameBuffer  # noqa: E402
from vla_edge_ros.nodes.camera_process import RESTART_INTERVAL_S, CameraProcess  # noqa: E402

pytestmark = pytest.mark.ros

FRAME = dict(height=64, width=128, encoding="rgb8", step=128 * 3, data=bytes(64 * 128 * 3))


class GraphNode:
    """A node in this process on the test's domain, spun by hand (no threads)."""

    def __init__(self, domain: int):
        self.ctx = rclpy.Context()
        rclpy.init(context=self.ctx, domain_id=domain)
        self.node = rclpy.create_node("watchdog_test", context=self.ctx)
        self.ex = SingleThreadedExecutor(context=self.ctx)
        self.ex.add_node(self.node)

    def close(self):
        self.ex.shutdown()
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.ctx)


def poll_for(cam, seconds: float, tick=None):
    """What the bringup's main thread does: poll() every 0.2 s (``tick`` too: publishing, spinning)."""
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        if tick is not None:
            tick()
        cam.poll()
        time.sleep(0.05)


def wait(cam, pred, timeout: float, what: str, tick=None):
    t_end = time.monotonic() + timeout
    while time.monotonic() < t_end:
        if tick is not None:
            tick()
        cam.poll()
        s = cam.stats()
        if pred(s):
            return s
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}: {cam.stats()}")


@pytest.fixture
def camera(domain):
    made = []

    def make(ros_args, **kw):
        fb = FrameBuffer(shared=True)
        cam = CameraProcess(fb, ["camera_test", "--ros-args", *ros_args], **kw)
        made.append(cam)
        return cam

    yield make
    for cam in made:
        cam.stop()


def test_a_matched_publisher_that_stops_sending_gets_the_camera_restarted(domain, camera):
    """Subscribed, a publisher matched, nothing received for no_frames_restart_s: the child is restarted and it
    is counted (restarts_no_frames, process_last_exit says why); the new child receives again.  Without a matched
    publisher, silence is not a reason."""
    cam = camera(["-r", "image:=/watchdog_test/image"], no_frames_restart_s=0)  # off until the limit is measured
    cam.launch()
    assert cam.wait_ready()["ok"]
    cam.start()
    t = GraphNode(domain)
    pub = t.node.create_publisher(Image, "/watchdog_test/image", 10)
    msg = Image(**FRAME)
    period = 0.05
    last = [0.0]

    def send():
        if time.monotonic() - last[0] >= period:
            pub.publish(msg)
            last[0] = time.monotonic()

    try:
        s = wait(cam, lambda s: s["valid"] >= 10 and s["process_state"] == "running", 120, "frames", send)
        pid = s["process_pid"]
        # the longest gap between frames while sending, measured here: the limit is well above it
        gaps = []
        t_end = time.monotonic() + 3.0
        while time.monotonic() < t_end:
            send()
            cam.poll()
            gaps.append(cam.stats()["last_frame_age_s"])
            time.sleep(0.02)
        limit = max(1.0, 5 * max(gaps))
        cam.no_frames_restart_s = limit
        poll_for(cam, 2 * limit, send)
        s = cam.stats()
        assert s["restarts_no_frames"] == 0 and s["process_restarts"] == 0 and s["process_pid"] == pid, s

        # the publisher stays (matched) and stops sending
        assert s["publishers_matched"] == 1, s
        t_stop = last[0]  # the last frame sent
        s = wait(cam, lambda s: s["restarts_no_frames"] == 1, limit + RESTART_INTERVAL_S + 30,
                 "a no-frame restart")
        took = time.monotonic() - t_stop
        assert took >= limit, f"restarted {took:.1f} s after the last frame, limit {limit:.1f} s"
        assert s["process_restarts"] == 1 and s["process_last_exit"].startswith("no frame for "), s
        assert s["process_last_exit"].endswith("with 1 publisher matched: killed"), s

        # sending again: the new child receives
        v0 = s["valid"]
        s = wait(cam, lambda s: s["process_state"] == "running" and s["process_pid"] not in (0, pid)
                 and s["valid"] >= v0 + 5, 120, "frames in the new camera process", send)
        pid = s["process_pid"]

        # no publisher at all: silence is not a fault of the camera process. (Until the child has seen the
        # publisher go, which takes seconds on a slow host, it still counts as matched and silent: a restart then
        # is right, so the count starts once it is unmatched.)
        t.node.destroy_publisher(pub)
        s = wait(cam, lambda s: s["publishers_matched"] == 0 and s["process_state"] == "running", 30,
                 "the publisher unmatched")
        n0, pid = s["restarts_no_frames"], s["process_pid"]
        poll_for(cam, 3 * limit)
        s = cam.stats()
        assert s["restarts_no_frames"] == n0 and s["process_restarts"] == n0 and s["process_pid"] == pid, s
    finally:
        t.close()


def test_qos_overrides_reach_the_image_subscription(domain, camera):
    """The standard qos_overrides.<resolved topic>.subscription.* parameters set the image subscription's QoS (seen
    by another node through the ROS graph), over qos_reliability; a bad one is a parameter error at start-up."""
    topic = "/qos_test/image"
    cam = camera(["-r", "__ns:=/qos_test", "-p", "qos_reliability:=best_effort",
                  "-p", f"qos_overrides.{topic}.subscription.reliability:=reliable",
                  "-p", f"qos_overrides.{topic}.subscription.depth:=3"])
    cam.launch()
    report = cam.wait_ready()
    assert report["ok"] and report["topic"] == topic, report
    cam.start()
    t = GraphNode(domain)
    try:
        t_end = time.monotonic() + 60
        subs = []
        while time.monotonic() < t_end and not subs:
            subs = [i for i in t.node.get_subscriptions_info_by_topic(topic) if i.node_name == "vla_camera"]
            time.sleep(0.1)
        assert subs, f"no vla_camera subscription on {topic}"
        assert subs[0].qos_profile.reliability == ReliabilityPolicy.RELIABLE, subs[0].qos_profile
    finally:
        t.close()

    bad = camera(["-p", "qos_overrides./image.subscription.reliability:=sometimes"])
    bad.launch()
    report = bad.wait_ready()
    assert report == {"ok": False, "param_error": "qos_overrides for /image: Unexpected QoS override for policy "
                                                  "`reliability`: `sometimes`"}, report
