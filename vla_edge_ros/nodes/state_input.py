# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The node's robot-state input (ROS only): `~/joint_states` (sensor_msgs/JointState) into the runtime's StateBuffer.

Subscribed only while a model with a state input is configured (Runtime.state is not None); a model without one
subscribes nothing. A message is taken serialized and checked before it is decoded: larger than
robot_state.MAX_STATE_MESSAGE_BYTES, or naming more than MAX_STATE_JOINTS joints (read from its CDR), it is refused
without being decoded; the rest is decoded and matched by name (robot_state.StateMapper). Every refusal is counted
(/diagnostics state_refused, state_last_refusal) and logged as one WARN line, the same reason at most once a second.
The stamp's age is taken against this node's clock (sim time under use_sim_time) when the message arrives.

The callback runs on the node's executor, in the control process: rclpy copies each serialized message into Python
there, so a very large message costs that copy (~0.3 ms a MB) before it is refused.
"""
from __future__ import annotations

import time

from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.serialization import deserialize_message
from sensor_msgs.msg import JointState

from ..robot_state import MAX_STATE_JOINTS, MAX_STATE_MESSAGE_BYTES, joint_count_from_cdr

# Best effort takes a reliable publisher too (joint_state_broadcaster's default); only the latest state matters.
STATE_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1, reliability=ReliabilityPolicy.BEST_EFFORT)


class StateInput:
    def __init__(self, node):
        self.node = node
        self.sub = None
        self.buffer = None  # the configured runtime's StateBuffer
        self._last_warn = ("", 0.0)

    def configure(self, runtime) -> None:
        """Subscribe when the runtime's model takes the robot's state (else nothing)."""
        self.release()
        self.buffer = runtime.state
        if self.buffer is None:
            return
        self.sub = self.node.create_subscription(JointState, "~/joint_states", self._on_message, STATE_QOS, raw=True)
        m = self.buffer.mapper
        self.node.get_logger().info(
            f"robot state: {self.node.resolve_topic_name('~/joint_states')} -> {m.dim} values ({', '.join(m.fields)} "
            f"of {len(m.joints)} joints: {', '.join(m.joints)[:200]})")

    def release(self) -> None:
        if self.sub is not None:
            self.node.destroy_subscription(self.sub)
        self.sub = self.buffer = None

    def _on_message(self, raw: bytes) -> None:
        buf = self.buffer
        if buf is None:
            return
        now_ns = self.node.get_clock().now().nanoseconds
        if len(raw) > MAX_STATE_MESSAGE_BYTES:
            return self._refused(buf.refuse(f"a message of {len(raw)} bytes (at most {MAX_STATE_MESSAGE_BYTES})"))
        count = joint_count_from_cdr(raw)
        if count is not None and count > MAX_STATE_JOINTS:
            return self._refused(buf.refuse(f"{count} joints in one message (at most {MAX_STATE_JOINTS})"))
        try:
            msg = deserialize_message(raw, JointState)
        except Exception as e:  # noqa: BLE001 - a malformed message is one refusal
            return self._refused(buf.refuse(f"undecodable JointState ({type(e).__name__})"))
        stamp = msg.header.stamp
        why = buf.offer(msg.name, {"position": msg.position, "velocity": msg.velocity},
                        stamp.sec * 1_000_000_000 + stamp.nanosec, now_ns)
        if why is not None:
            self._refused(why)

    def _refused(self, why: str) -> None:
        line, now = f"~/joint_states refused: {why}; the model keeps the previous state until it is too old", \
            time.monotonic()
        if line != self._last_warn[0] or now - self._last_warn[1] >= 1.0:
            self.node.get_logger().warn(line)
            self._last_warn = (line, now)
