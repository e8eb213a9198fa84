# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""A one-image publisher: W H N HZ. Prints when it starts, has its message, is matched and publishes."""
import sys, time
t = time.monotonic
print(f"{t():.3f} start", flush=True)
import rclpy
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import Image
print(f"{t():.3f} imported", flush=True)
w, h, n, hz = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
rclpy.init()
print(f"{t():.3f} init", flush=True)
node = rclpy.create_node("big_camera")
print(f"{t():.3f} node", flush=True)
pub = node.create_publisher(Image, "/image", QoSProfile(depth=2, reliability=ReliabilityPolicy.RELIABLE))
print(f"{t():.3f} publisher", flush=True)
m = Image(height=h, width=w, encoding="rgb8", step=w * 3)
m.data = bytes(w * h * 3)
print(f"{t():.3f} data set", flush=True)
t_end = time.monotonic() + 20
while pub.get_subscription_count() == 0 and time.monotonic() < t_end:
    time.sleep(0.05)
print(f"{t():.3f} matched", flush=True)
for i in range(n):
    m.header.stamp.sec = 100 + i
    pub.publish(m)
    print(f"{t():.3f} published {i}", flush=True)
    time.sleep(1.0 / hz)
time.sleep(2.0)
node.destroy_node()
rclpy.shutdown()
print(f"{t():.3f} done", flush=True)
