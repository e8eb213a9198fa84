# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The bond a Nav2 lifecycle manager expects from a node it activates (``bondpy``, when a ROS install has it).

``nav2_lifecycle_manager`` (``bond_timeout`` > 0, its default 4 s) waits after activating a node for a bond on the
``bond`` topic whose id is the node's name, and treats a node without one as failed. A full ROS 2 Jazzy install has
``bondpy`` (package ``ros-jazzy-bondpy``); the PyPI wheels this package's ``.venv`` uses do not, and an unrelated
PyPI project of the same name exists, so the import is checked for the ROS API. Without it the node runs unbonded
and logs once how to configure the manager (``bond_timeout: 0.0``, README "On a real robot").
"""
from __future__ import annotations

HEARTBEAT_PERIOD_S = 0.1  # what nav2_util::LifecycleNode uses (its timeout, 4 s, is bondpy's default too)


def _bond_class():
    try:
        from bondpy.bondpy import Bond  # ROS 2 bondpy: Bond(topic, id, node, on_broken=None, on_formed=None)
    except Exception:  # noqa: BLE001 - not installed, or not the ROS package
        return None
    return Bond


def form(node):
    """Start the bond ``bond``/<node name> (call on activate). Returns it, or None without bondpy."""
    cls = _bond_class()
    if cls is None:
        node.get_logger().info("bondpy is not installed: no bond for a Nav2 lifecycle manager (set its "
                               "bond_timeout: 0.0; README 'On a real robot')", once=True)
        return None
    try:
        b = cls("bond", node.get_name(), node)
        b.heartbeat_period = HEARTBEAT_PERIOD_S
        b.start()
        return b
    except Exception as e:  # noqa: BLE001 - a bond that cannot start must not stop the node
        node.get_logger().warn(f"bond with the lifecycle manager not started: {type(e).__name__}: {e}")
        return None


def release(b):
    """Break the bond and drop its topics (deactivate, shutdown, error); returns None for the caller to keep."""
    if b is not None:
        try:
            b.shutdown()
        except Exception:  # noqa: BLE001 - best effort at a transition
            pass
    return None
