# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The reasoning node's control output (DESIGN.md §8, §17): ``~/action`` (TwistStamped or Twist, ``action_type``),
``~/action_vector`` (Float32MultiArray, every action dimension labelled in layout.dim) and, for a model with action
chunks, ``~/action_chunk`` (trajectory_msgs/JointTrajectory: the plan from this tick on), all lifecycle publishers:
silent unless the node is active."""

from __future__ import annotations

import time

import numpy as np
from geometry_msgs.msg import Twist, TwistStamped
from rclpy.exceptions import ParameterException
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.qos_overriding_options import QoSOverridingOptions, QoSPolicyKind
from std_msgs.msg import Float32MultiArray, MultiArrayDimension
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from ..settings import ParamError

# the policies of ~/action that qos_overrides.<topic>.publisher.<policy> may set
ACTION_QOS_POLICIES = (QoSPolicyKind.HISTORY, QoSPolicyKind.DEPTH, QoSPolicyKind.RELIABILITY, QoSPolicyKind.DURABILITY)


def one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


class ActionOutput:
    def __init__(self, node):
        self.node, p = node, node.p
        self.msg_type = TwistStamped if p.action_type == "twist_stamped" else Twist
        self.stamp_sent = 0  # header stamp of the last ~/action sent (ns)
        self.stamps_replaced = 0  # action_stamp frame: frame stamps too far from this node's clock, sent as now
        self._dims = [MultiArrayDimension(label=str(x), size=1, stride=1) for x in p.action_labels]
        reliable = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10, reliability=ReliabilityPolicy.RELIABLE)
        # qos_overrides./<ns>/vla_edge/action.publisher.{history,depth,reliability,durability} adjust its QoS (rclpy
        # declares them and applies them to the profile object in place: this one is its own); an impossible value
        # is a parameter error (one line, exit 2)
        action_qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10, reliability=ReliabilityPolicy.RELIABLE)
        try:
            self.pub = node.create_lifecycle_publisher(
                self.msg_type, "~/action", action_qos, qos_overriding_options=QoSOverridingOptions(
                    policy_kinds=ACTION_QOS_POLICIES))
            action_qos.get_c_qos_profile()
        except (ParameterException, RuntimeError, ValueError, TypeError) as e:
            raise ParamError(f"qos_overrides for {node.resolve_topic_name('~/action')}: {one_line(e)}") from None
        self.pub_vector = node.create_lifecycle_publisher(Float32MultiArray, "~/action_vector", reliable)
        # the plan as a trajectory, re-sent whenever a chunk lands or the plan is discarded (an empty one: a
        # joint_trajectory_controller stops); joint names are the action dimensions' labels
        self.pub_chunk = node.create_lifecycle_publisher(JointTrajectory, "~/action_chunk", reliable)
        self.trajectories_sent = 0

    @property
    def topic_name(self) -> str:
        return self.pub.topic_name

    def send(self, c: list[float], out) -> float:
        """The control output: the (limited) twist first, then the action vector. Returns when the twist went out.

        TwistStamped carries this node's clock at publish (``action_stamp: now``, sim time under use_sim_time) or
        the source frame's capture stamp (``frame``; "now" before any frame); Twist carries no stamp."""
        p = self.node.p
        if self.msg_type is TwistStamped:
            msg = TwistStamped()
            now = self.node.get_clock().now()
            if p.action_stamp == "frame" and out.stamp_ns is not None and \
                    abs(int(out.stamp_ns) - now.nanoseconds) <= p.action_stamp_max_offset_s * 1e9:
                msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(int(out.stamp_ns), 1_000_000_000)
            else:
                if p.action_stamp == "frame" and out.stamp_ns is not None:
                    self.stamps_replaced += 1  # a camera clock far from ours: now, never a stamp from 2038
                msg.header.stamp = now.to_msg()
            msg.header.frame_id = p.action_frame_id
            tw = msg.twist
        else:
            msg = tw = Twist()
        tw.linear.x, tw.linear.y, tw.linear.z = c[0], c[1], c[2]
        tw.angular.x, tw.angular.y, tw.angular.z = c[3], c[4], c[5]
        self.pub.publish(msg)
        t_pub = time.monotonic()
        if self.msg_type is TwistStamped:
            self.stamp_sent = int(msg.header.stamp.sec) * 1_000_000_000 + int(msg.header.stamp.nanosec)
        vec = Float32MultiArray()
        vec.layout.dim = self._dims
        vec.data = [float(x) for x in np.asarray(out.action, np.float32)]
        self.pub_vector.publish(vec)
        if out.trajectory is not None:
            self.pub_chunk.publish(self.trajectory(out))
            self.trajectories_sent += 1
        return t_pub

    def trajectory(self, out) -> JointTrajectory:
        """``out.trajectory`` as a JointTrajectory: point k at time_from_start k x period, header.stamp the tick
        of point 0 (this node's clock at the scheduled tick), the values in positions or velocities
        (``action_chunk_field``). The plan's values are the action dimensions before twist_map / the command limits,
        as ~/action_vector carries them."""
        p = self.node.p
        msg = JointTrajectory()
        clock_now = self.node.get_clock().now().nanoseconds
        since_tick = max(0.0, time.monotonic() - (out.scheduled if out.scheduled is not None else out.t0))
        msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(max(0, clock_now - int(since_tick * 1e9)),
                                                                1_000_000_000)
        msg.header.frame_id = p.action_frame_id
        msg.joint_names = [str(x) for x in p.action_labels]
        period_ns = int(round(p.period_ms * 1e6))
        for k, row in enumerate(np.asarray(out.trajectory, np.float32)):
            pt = JointTrajectoryPoint()
            values = [float(x) for x in row]
            if p.action_chunk_field == "velocities":
                pt.velocities = values
            else:
                pt.positions = values
            pt.time_from_start.sec, pt.time_from_start.nanosec = divmod(k * period_ns, 1_000_000_000)
            msg.points.append(pt)
        return msg
