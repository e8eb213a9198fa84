"""Listen to a running vla_edge: its per-cycle statuses and the latest /diagnostics roll-up (tools only)."""
from __future__ import annotations

import threading

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rclpy.qos import QoSProfile, ReliabilityPolicy


class OutputListener:
    """`cycles`: every /vla_edge/cycle status as a key->value dict, in arrival order; `diag`: the key->value
    pairs of the latest /diagnostics array. Read both under `lock` (callbacks run on the spinning thread)."""

    def __init__(self, node, cycle_depth: int = 100):
        self.lock = threading.Lock()
        self.cycles: list[dict] = []
        self.diag: dict = {}
        node.create_subscription(DiagnosticStatus, "/vla_edge/cycle", self._on_cycle,
                                 QoSProfile(depth=cycle_depth, reliability=ReliabilityPolicy.RELIABLE))
        node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 10)

    def _on_cycle(self, msg) -> None:
        with self.lock:
            self.cycles.append({v.key: v.value for v in msg.values})

    def _on_diag(self, msg) -> None:
        d = {}
        for status in msg.status:
            d.update({v.key: v.value for v in status.values})
        with self.lock:
            self.diag = d
