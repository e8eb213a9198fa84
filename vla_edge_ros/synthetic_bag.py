# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""A synthetic camera: deterministic moving-shapes frames, and small rosbag2 bags of them (raw or JPEG), written with
`rosbags` (no ROS install needed). The demo's clip, the soak's and the tests' bags come from here.
"""
from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

from .clips import COMPRESSED_T, IMAGE_T, ClipError


def synthetic_frame(i: int, height: int = 240, width: int = 320) -> np.ndarray:
    """RGB uint8 frame ``i`` of a deterministic moving-shapes clip (a circle, a square, a bar)."""
    img = np.empty((height, width, 3), np.uint8)
    yy = np.linspace(0, 255, height, dtype=np.float32)[:, None]
    img[..., 0] = 40
    img[..., 1] = (yy * 0.4).astype(np.uint8)
    img[..., 2] = 90
    t = i / 30.0
    cx = int((0.5 + 0.4 * np.sin(2 * np.pi * 0.25 * t)) * width)
    cy = int((0.5 + 0.3 * np.cos(2 * np.pi * 0.25 * t)) * height)
    cv2.circle(img, (cx, cy), max(3, height // 8), (230, 60, 40), -1)
    sx = int((i * 3) % max(1, width))
    s = max(4, height // 6)
    cv2.rectangle(img, (sx, height - 2 * s), (min(width - 1, sx + s), height - s), (40, 220, 80), -1)
    by = int((0.5 + 0.45 * np.sin(2 * np.pi * 0.1 * t)) * (height - 1))
    cv2.line(img, (0, by), (width - 1, by), (250, 250, 250), max(1, height // 60))
    return img


def _typestore():
    from rosbags.typesys import Stores, get_typestore

    return get_typestore(Stores.ROS2_JAZZY)


def make_test_bag(
    path,
    frames: int = 90,
    fps: float = 30.0,
    width: int = 320,
    height: int = 240,
    fmt: str = "raw",
    storage: str = "mcap",
    topic: str | None = None,
    start_ns: int = 1_700_000_000_000_000_000,
    corrupt: tuple[int, ...] = (),
    encoding: str = "rgb8",
    frame_id: str = "camera",
    joints: tuple[str, ...] = (),
    joint_hz: float = 100.0,
    joint_gap: tuple[float, float] | None = None,
) -> Path:
    """Write a rosbag2 bag of ``frames`` synthetic images at ``fps`` and return its directory.

    ``fmt`` raw -> sensor_msgs/Image (``encoding`` rgb8 or bgr8), compressed -> CompressedImage (jpeg).
    Message indices in ``corrupt`` are written as undeserializable garbage (to test skipping).
    Header stamps = ``start_ns + i/fps``; bag receive time = header stamp.
    ``joints``: also a sensor_msgs/JointState topic ``/joint_states`` at ``joint_hz`` over the same time, position
    and velocity of each joint a slow sine (joint j: sin(t + j), cos(t + j)), the names in a different order in each
    message (a subscriber must match them by name); none in the ``joint_gap`` (start, end) seconds (a stalled
    publisher).
    """
    from rosbags.rosbag2 import StoragePlugin, Writer

    from .image_convert import encode_jpeg

    path = Path(path)
    if path.exists():
        raise ClipError(f"{path} exists: rosbag2 writers need a new directory")
    ts = _typestore()
    Header = ts.types["std_msgs/msg/Header"]
    Time = ts.types["builtin_interfaces/msg/Time"]
    msgtype = IMAGE_T if fmt == "raw" else COMPRESSED_T
    if topic is None:
        topic = "/camera/image_raw" if fmt == "raw" else "/camera/image_raw/compressed"
    plugin = {"mcap": StoragePlugin.MCAP, "sqlite3": StoragePlugin.SQLITE3, "db3": StoragePlugin.SQLITE3}[storage]
    writer = Writer(path, version=9, storage_plugin=plugin)
    writer.open()
    try:
        conn = writer.add_connection(topic, msgtype, typestore=ts)
        if joints:
            _write_joint_states(writer, ts, Header, Time, joints, start_ns, frames / fps, joint_hz, joint_gap)
        for i in range(frames):
            t = start_ns + int(round(i * 1e9 / fps))
            if i in corrupt:
                writer.write(conn, t, b"\x00\x01\x00\x00garbage")
                continue
            header = Header(stamp=Time(sec=t // 1_000_000_000, nanosec=t % 1_000_000_000), frame_id=frame_id)
            rgb = synthetic_frame(i, height, width)
            if fmt == "raw":
                img = rgb if encoding == "rgb8" else cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)
                msg = ts.types[IMAGE_T](
                    header=header, height=height, width=width, encoding=encoding, is_bigendian=0,
                    step=width * 3, data=np.ascontiguousarray(img).reshape(-1),
                )
            else:
                msg = ts.types[COMPRESSED_T](
                    header=header, format="jpeg", data=np.frombuffer(encode_jpeg(rgb), np.uint8).copy()
                )
            writer.write(conn, t, ts.serialize_cdr(msg, msgtype))
    finally:
        writer.close()
    return path


def joint_values(joints, t: float) -> dict:
    """The made-up state of `make_test_bag` at `t` seconds, in `joints` order: field -> float64 values."""
    j = np.arange(len(joints), dtype=np.float64)
    return {"position": np.sin(t + j), "velocity": np.cos(t + j)}


def _write_joint_states(writer, ts, Header, Time, joints, start_ns: int, seconds: float, hz: float, gap) -> None:
    msgtype = "sensor_msgs/msg/JointState"
    conn = writer.add_connection("/joint_states", msgtype, typestore=ts)
    rng = np.random.default_rng(0)
    for k in range(int(seconds * hz) + 1):
        t_s = k / hz
        if gap is not None and gap[0] <= t_s < gap[1]:
            continue
        t = start_ns + int(round(t_s * 1e9))
        order = rng.permutation(len(joints))
        vals = joint_values(joints, t_s)
        msg = ts.types[msgtype](header=Header(stamp=Time(sec=t // 1_000_000_000, nanosec=t % 1_000_000_000),
                                              frame_id=""),
                                name=[joints[i] for i in order], position=vals["position"][order],
                                velocity=vals["velocity"][order], effort=np.zeros(0, np.float64))
        writer.write(conn, t, ts.serialize_cdr(msg, msgtype))


def write_degraded_bag(source, path, schedule: dict[int, str], seed: int = 0, quality: int = 90,
                       frames: int | None = None) -> Path:
    """Copy a bag of images (any frame source: ``clips.open_clip``) into a new JPEG bag (``/camera/image_raw/
    compressed``, the recorded stamps and frame ids), with the frames whose index is in ``schedule`` replaced by a
    blind camera's (``frame_quality.degrade``: index -> degradation; a ``repeat`` repeats the last frame before its
    spell); ``frames``: only the first that many.  Returns the bag's directory."""
    from rosbags.rosbag2 import StoragePlugin, Writer

    from .clips import open_clip
    from .frame_quality import degrade
    from .image_convert import encode_jpeg

    path = Path(path)
    if path.exists():
        raise ClipError(f"{path} exists: rosbag2 writers need a new directory")
    src = open_clip(str(source)) if isinstance(source, (str, Path)) else source
    rng = np.random.default_rng(seed)
    ts = _typestore()
    Header, Time = ts.types["std_msgs/msg/Header"], ts.types["builtin_interfaces/msg/Time"]
    writer = Writer(path, version=9, storage_plugin=StoragePlugin.MCAP)
    writer.open()
    try:
        conn = writer.add_connection("/camera/image_raw/compressed", COMPRESSED_T, typestore=ts)
        last_good = None
        for i, item in enumerate(src.items()):
            if frames is not None and i >= frames:
                break
            rgb = item.rgb()
            kind = schedule.get(i)
            if kind is None:
                last_good = rgb
            else:
                rgb = degrade(rgb, kind, rng, previous=last_good)
            t = item.stamp_ns
            header = Header(stamp=Time(sec=t // 1_000_000_000, nanosec=t % 1_000_000_000), frame_id=item.frame_id)
            msg = ts.types[COMPRESSED_T](header=header, format="jpeg",
                                         data=np.frombuffer(encode_jpeg(rgb, quality), np.uint8).copy())
            writer.write(conn, item.t_ns, ts.serialize_cdr(msg, COMPRESSED_T))
    finally:
        writer.close()
    return path
