# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The reasoning node's 1 Hz /diagnostics roll-up (DESIGN.md §8): the loop's and the camera's records
(diagnostics.LoopRecord, CameraRecord) with the node's own values, their levels and messages, one DiagnosticArray.

Also the graph check behind the roll-up: one publisher per action topic (a second vla_edge in the namespace, a teleop
node on the same cmd_vel is an ERROR), and the no-/clock warning under use_sim_time.
"""

from __future__ import annotations

import os

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

from ..diagnostics import CameraRecord, CameraStatus, LoopRecord, QualityStatus, Rollup

LEVELS = {"OK": DiagnosticStatus.OK, "WARN": DiagnosticStatus.WARN, "ERROR": DiagnosticStatus.ERROR}


def key_values(values: dict) -> list[KeyValue]:
    """/diagnostics key-values: floats to 4 significant digits, None as n/a."""
    return [KeyValue(key=k, value=("n/a" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)))
            for k, v in values.items()]


class DiagnosticsOutput:
    """Builds and publishes the roll-up of a ReasoningNode (`node`: its runtime, settings, camera, publishers)."""

    def __init__(self, node):
        self.node = node
        self.pub = node.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.rollup, self.camera_status, self.quality_status = Rollup(), CameraStatus(), QualityStatus()
        self.quality_blocks_last = b""  # the latest cycle's frame's block map (frame_quality)
        self.action_publishers = 0  # publishers on ~/action's topic, this one included (graph, 1 Hz)
        self._duplicate_logged = False
        self.frame_age_last: float | None = None  # the latest cycle's frame age (ms)

    def after_cycle(self, out) -> None:
        """What the roll-up keeps of the latest cycle (the node calls it after each)."""
        self.frame_age_last = out.frame_age_ms
        self.quality_blocks_last = out.quality_blocks

    def records(self) -> tuple[dict, LoopRecord | None, CameraRecord]:
        """(reasoning key-values, the loop's record or None while unconfigured, the camera's record)."""
        n = self.node
        r: dict = {"lifecycle_state": n.lifecycle_state}
        rec = None
        if n.runtime is None:  # unconfigured: no engine, no cycle
            r.update(policy=n.p.policy, backend=n.backend_name, period_ms=n.p.period_ms)
        else:
            rec = n.runtime.record()
            r.update(rec.values())
            r.update(n.gc_pauses.summary())
        r["stamps_replaced"] = n.action.stamps_replaced
        r["use_sim_time"] = self.sim_time_active()
        r["action_topic"], r["action_publishers"], r["pid"] = n.action.topic_name, self.action_publishers, \
            os.getpid()
        cam = CameraRecord.of(n.fb, n.camera.stats() if n.camera is not None else None, self.frame_age_last)
        return r, rec, cam

    def check_action_publishers(self) -> str | None:
        """One publisher per action topic: a graph query. Returns the ERROR line when another publisher is on
        ~/action, and logs a warning when one appears."""
        n = self.node
        topic = n.action.topic_name
        try:
            count = n.count_publishers(topic)
        except Exception:  # noqa: BLE001 - the graph is best effort
            return None
        self.action_publishers = count
        if count <= 1:
            self._duplicate_logged = False
            return None
        try:
            names = sorted(f"{i.node_namespace.rstrip('/')}/{i.node_name}" for i in
                           n.get_publishers_info_by_topic(topic))
        except Exception:  # noqa: BLE001
            names = []
        line = (f"{count} publishers on {topic} ({', '.join(names)}): another node drives the same base (two "
                f"vla_edge in one namespace? set namespace:= or action_topic:=)")
        if not self._duplicate_logged:
            n.get_logger().warn(line)
            self._duplicate_logged = True
        return line

    def sim_time_active(self) -> bool:
        try:
            return bool(self.node.get_clock().ros_time_is_active)
        except Exception:  # noqa: BLE001 - a clock without ROS time (steady/system)
            return False

    def status_warnings(self) -> list[str]:
        """What the reasoning status warns about besides the cycle counts: the admission estimate over budget,
        use_sim_time with no /clock (every command stamped 0)."""
        n, out = self.node, []
        if n.runtime is not None and n.runtime.deadline_warning:
            out.append(n.runtime.deadline_warning)
        state = n.runtime.state_warning() if n.runtime is not None else None
        if state:
            out.append(state)
        if self.sim_time_active() and n.get_clock().now().nanoseconds == 0:
            out.append("no /clock: use_sim_time is true and no clock message arrived, so every command is stamped 0 "
                       "(play the bag with --clock, or set use_sim_time false)")
        return out

    def publish(self) -> None:
        """One roll-up (the diagnostics timer)."""
        n = self.node
        try:
            duplicate = self.check_action_publishers()
            r, rec, cam = self.records()
            if rec is None or n.lifecycle_state != "active":
                lvl, msg = "WARN", (f"{n.lifecycle_state}: no control output (lifecycle transitions: configure, "
                                    "activate)")
            else:
                lvl, msg = self.rollup.level(rec, "; ".join(self.status_warnings()) or None)
            if duplicate:  # whatever else is going on: two nodes command one base
                lvl, msg = "ERROR", duplicate + "; " + msg
            clvl, cmsg = self.camera_status.level(cam)
            cstats = n.camera.stats() if n.camera is not None else {}
            qlvl, qmsg, qvals = self.quality_status.level(
                cstats.get("quality", {}), self.quality_blocks_last,
                n.runtime.cycle.quality_refused if n.runtime is not None else None)
        except Exception as e:  # noqa: BLE001
            n.get_logger().error(f"diagnostics failed: {e}", throttle_duration_sec=10.0)
            return
        arr = DiagnosticArray()
        arr.header.stamp = n.get_clock().now().to_msg()
        arr.status = [
            DiagnosticStatus(level=LEVELS[lvl], name=f"{n.status_prefix}: reasoning", message=msg,
                             hardware_id=n.backend_name, values=key_values(r)),
            DiagnosticStatus(level=LEVELS[clvl], name=f"{n.status_prefix}: camera", message=cmsg,
                             hardware_id="camera", values=key_values(cam.values())),
            DiagnosticStatus(level=LEVELS[qlvl], name=f"{n.status_prefix}: camera quality", message=qmsg,
                             hardware_id="camera", values=key_values(qvals)),
        ]
        self.pub.publish(arr)
