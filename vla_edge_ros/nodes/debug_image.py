# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The ~/debug_image picture: the frame, the retained-frame strip and the action bar (for rviz / rqt_image_view), and
its publisher (`DebugImageOutput`)."""

from __future__ import annotations

import time

import cv2
import numpy as np

from ..constants import FRAME_H, FRAME_W
from ..frame_quality import BLOCK_BLOCKED, BLOCK_DARK, BLOCK_FLAT, BLOCK_OVEREXPOSED, GRID


# 256 x 224 pixels, ~170 KB a message: the reasoning process sends it over UDP (no shared memory, nodes/bringup.py),
# best effort, and a sample is lost with any of its 64 KB fragments; at scale 4 (~540 KB, 9 fragments) none got
# through in 30 s to a subscriber on a ~3x slower host.
DEBUG_SCALE = 2


def render_debug(frame: np.ndarray | None, retained: list[np.ndarray], action: np.ndarray, low: float, high: float,
                 label: str = "", names: list[str] | None = None, scale: int = DEBUG_SCALE,
                 blocks: bytes = b"") -> np.ndarray:
    """The ~/debug_image picture (RGB uint8): the frame (x scale), the retained-frame strip, the action bar.

    ``blocks``: the frame's quality block map (frame_quality.py, 5 x 5, BLOCK_* bits): each failed block is
    outlined (blue dark, magenta blocked, yellow over-exposed, cyan no edge).

    ``retained`` are small thumbnails (oldest -> newest) of the frames the KV cache keeps; the newest
    ones that fit the width are drawn.  The action bar draws every dimension from the zero line,
    green for positive, red for negative, full scale = max(|low|, |high|).
    """
    W = FRAME_W * scale
    top = np.zeros((FRAME_H * scale, W, 3), np.uint8)
    if frame is not None:
        top = cv2.resize(np.ascontiguousarray(frame), (W, FRAME_H * scale), interpolation=cv2.INTER_NEAREST)
    draw_blocks(top, blocks)
    th_h, th_w = FRAME_H // 2, FRAME_W // 2
    strip = np.full((th_h + 4, W, 3), 30, np.uint8)
    n_fit = max(1, W // (th_w + 2))
    for i, th in enumerate(retained[-n_fit:]):
        t = th if th.shape[:2] == (th_h, th_w) else cv2.resize(th, (th_w, th_h), interpolation=cv2.INTER_AREA)
        x = 2 + i * (th_w + 2)
        strip[2:2 + th_h, x:x + th_w] = t
    bar_h = 60
    bar = np.full((bar_h, W, 3), 15, np.uint8)
    a = np.asarray(action, np.float32).ravel()
    full = max(abs(low), abs(high), 1e-6)
    n = max(1, len(a))
    bw = W // n
    mid = bar_h // 2
    cv2.line(bar, (0, mid), (W - 1, mid), (120, 120, 120), 1)
    for i, v in enumerate(a):
        h = int(round(np.clip(v / full, -1, 1) * (mid - 12)))
        x0, x1 = i * bw + 4, (i + 1) * bw - 4
        color = (60, 200, 80) if h >= 0 else (220, 60, 60)
        cv2.rectangle(bar, (x0, mid - max(h, 0)), (x1, mid - min(h, 0)), color, -1)
        if names and i < len(names):
            chars = max(1, (x1 - x0) // 5)  # ~5 px a character at this font size
            cv2.putText(bar, str(names[i])[:chars], (x0, bar_h - 2), cv2.FONT_HERSHEY_SIMPLEX, 0.3, (200, 200, 200),
                        1)
        cv2.putText(bar, f"{v:+.2f}", (x0, 9), cv2.FONT_HERSHEY_SIMPLEX, 0.3, (200, 200, 200), 1)
    if label:
        cv2.putText(top, label, (4, 14), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (255, 255, 0), 1)
    return np.ascontiguousarray(np.vstack([top, strip, bar]))


BLOCK_COLOURS = ((BLOCK_BLOCKED, (255, 0, 255)), (BLOCK_DARK, (60, 60, 255)), (BLOCK_OVEREXPOSED, (255, 255, 0)),
                 (BLOCK_FLAT, (0, 255, 255)))  # the first bit a block has decides its colour


def draw_blocks(img: np.ndarray, blocks: bytes) -> None:
    """Outline the failed blocks of a 5 x 5 block map on ``img`` (in place)."""
    if len(blocks) != GRID * GRID:
        return
    h, w = img.shape[:2]
    for k, bits in enumerate(blocks):
        colour = next((c for bit, c in BLOCK_COLOURS if bits & bit), None)
        if colour is None:
            continue
        r, c = divmod(k, GRID)
        y0, y1 = r * h // GRID, (r + 1) * h // GRID - 1
        x0, x1 = c * w // GRID, (c + 1) * w // GRID - 1
        cv2.rectangle(img, (x0 + 1, y0 + 1), (x1 - 1, y1 - 1), colour, 2)


class DebugImageOutput:
    """~/debug_image of a ReasoningNode: the thumbnails of the retained frames, kept only while someone subscribes,
    and one picture per cycle at most `debug_image_max_hz` (sensor-data QoS)."""

    def __init__(self, node):
        from rclpy.qos import qos_profile_sensor_data
        from sensor_msgs.msg import Image

        self.node, self._image = node, Image
        self.pub = node.create_publisher(Image, "~/debug_image", qos_profile_sensor_data)
        self.thumbs: dict[int, np.ndarray] = {}
        self._last = 0.0

    def clear(self) -> None:
        self.thumbs.clear()

    def after_cycle(self, out) -> None:
        """After a cycle's outcome went out: nothing unless subscribed (the thumbnails only matter to a viewer)."""
        if self.pub.get_subscription_count() == 0:
            return
        if out.chunk is not None and out.image is not None:
            self.thumbs[out.chunk.frame_id] = out.image[::2, ::2].copy()
            keep = set(int(i) for i in out.chunk.retained)
            for fid in [f for f in self.thumbs if f not in keep]:
                del self.thumbs[fid]
        now = time.monotonic()
        n = self.node
        if now - self._last < 1.0 / n.p.debug_image_max_hz:
            return
        self._last = now
        frame = out.image
        if frame is None:
            latest = n.fb.latest()
            frame = None if latest is None else latest.image
        rgb = render_debug(frame, [self.thumbs[f] for f in sorted(self.thumbs)], np.asarray(out.action),
                           n.p.action_low, n.p.action_high, f"{out.source}:{out.reason}"
                           + (f" {out.frame_quality}" if out.frame_quality else ""), n.p.action_labels,
                           blocks=out.quality_blocks)
        msg = self._image()
        msg.header.stamp = n.get_clock().now().to_msg()
        msg.header.frame_id = "vla_edge_debug"
        msg.height, msg.width = rgb.shape[:2]
        msg.encoding, msg.is_bigendian, msg.step = "rgb8", 0, rgb.shape[1] * 3
        msg.data = rgb.tobytes()
        self.pub.publish(msg)
