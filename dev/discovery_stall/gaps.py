# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Listen to /vla_edge/cycle (and the other outputs) for SECONDS; print every gap over 45 ms between publishes
(on the node's clock: tick + cycle_ms) and between receipts here."""
# listen to /vla_edge/cycle; print every cycle whose since_scheduled_tick or gap > 40 ms, with tick_monotonic
import sys, time, rclpy
from rclpy.qos import QoSProfile, ReliabilityPolicy
from diagnostic_msgs.msg import DiagnosticStatus, DiagnosticArray
from geometry_msgs.msg import TwistStamped
from std_msgs.msg import Float32MultiArray
rclpy.init()
n = rclpy.create_node("gapwatch")
last = [None]
lastrx = [None]
def cb(m):
    kv = {x.key: x.value for x in m.values}
    tick = float(kv["tick_monotonic"]); cyc = float(kv["cycle_ms"])
    pub = tick + cyc / 1000
    if last[0] is not None and pub - last[0] > 0.045:
        print(f"GAP {(pub-last[0])*1000:.0f} ms ending at {pub:.3f} (tick {tick:.3f}, cycle {cyc:.1f} ms, missed {kv['missed_before']}, reason {kv['reason']})", flush=True)
    last[0] = pub
    rx = time.monotonic()
    if lastrx[0] is not None and rx - lastrx[0] > 0.045:
        print(f'RXGAP {(rx-lastrx[0])*1000:.0f} ms ending at {rx:.3f}', flush=True)
    lastrx[0] = rx
n.create_subscription(DiagnosticStatus, "/vla_edge/cycle", cb, QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
rel = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
n.create_subscription(TwistStamped, "/vla_edge/action", lambda m: None, rel)
n.create_subscription(Float32MultiArray, "/vla_edge/action_vector", lambda m: None, rel)
n.create_subscription(DiagnosticArray, "/diagnostics", lambda m: None, 10)
t_end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < t_end:
    rclpy.spin_once(n, timeout_sec=0.1)
