"""Frame sources for replay and benchmarks, ROS-free: video file, image folder, rosbag2 bag, synthetic clip.

Every source is an iterable of `(rgb uint8 HxWx3, stamp_ns)` in recording order; `to_model_input`
resizes a frame to the model's 64x128 input the way the CameraNode does (cv2 INTER_AREA).

    open_clip("run.mp4") | open_clip("frames/") | open_clip("bag.mcap") | open_clip("bag_dir/")
    open_clip("synthetic") | open_clip("synthetic-cut")           # generated, see SyntheticClip
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import cv2
import numpy as np

from .constants import FRAME_H, FRAME_W

VIDEO_EXTS = (".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v", ".mpg", ".mpeg")
IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")
BAG_EXTS = (".mcap", ".db3")
SYNTHETIC = ("synthetic", "synthetic-cut")
IMAGE_TYPES = ("sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage")


class ClipError(ValueError):
    """A clip that cannot be opened or decoded; the message names the file."""


def to_model_input(rgb: np.ndarray) -> np.ndarray:
    """Resize an RGB uint8 frame to the model's 64x128x3 input (area interpolation, as the camera node)."""
    if rgb.shape[:2] == (FRAME_H, FRAME_W):
        return np.ascontiguousarray(rgb)
    return cv2.resize(rgb, (FRAME_W, FRAME_H), interpolation=cv2.INTER_AREA)


class VideoClip:
    def __init__(self, path: str):
        self.path = str(path)
        self.name = os.path.basename(self.path)
        cap = cv2.VideoCapture(self.path)
        if not cap.isOpened():
            raise ClipError(f"{self.path}: cannot open as a video")
        self.fps = cap.get(cv2.CAP_PROP_FPS) or 30.0
        cap.release()

    def __iter__(self) -> Iterator[tuple[np.ndarray, int]]:
        cap = cv2.VideoCapture(self.path)
        try:
            index = 0
            while True:
                ok, bgr = cap.read()
                if not ok:
                    break
                yield cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), int(round(index * 1e9 / self.fps))
                index += 1
        finally:
            cap.release()


class ImageFolderClip:
    """Images in a folder, in file-name order, stamped at `fps`."""

    def __init__(self, path: str, fps: float = 30.0):
        self.path, self.fps = str(path), float(fps)
        self.name = os.path.basename(os.path.normpath(self.path))
        self.files = sorted(p for p in Path(self.path).iterdir() if p.suffix.lower() in IMAGE_EXTS)
        if not self.files:
            raise ClipError(f"{self.path}: no images ({', '.join(IMAGE_EXTS)})")

    def __iter__(self):
        for index, file in enumerate(self.files):
            bgr = cv2.imread(str(file), cv2.IMREAD_COLOR)
            if bgr is None:
                raise ClipError(f"{file}: not a readable image")
            yield cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), int(round(index * 1e9 / self.fps))


class BagClip:
    """Image or CompressedImage messages of one topic of a rosbag2 bag (.mcap / .db3 file or bag folder).

    Stamps are the message header stamps. Without `topic` the first image topic of the bag is used.
    """

    def __init__(self, path: str, topic: str | None = None):
        self.path, self.topic = str(path), topic
        self.name = os.path.basename(os.path.normpath(self.path))
        self.fps = None
        with self._reader() as reader:
            topics = {c.topic: c.msgtype for c in reader.connections if c.msgtype in IMAGE_TYPES}
            if not topics:
                raise ClipError(f"{self.path}: no sensor_msgs Image/CompressedImage topic")
            if self.topic is None:
                self.topic = sorted(topics)[0]
            elif self.topic not in topics:
                raise ClipError(f"{self.path}: no image topic {self.topic!r} (has {', '.join(sorted(topics))})")
            duration_s = reader.duration / 1e9
            count = sum(c.msgcount for c in reader.connections if c.topic == self.topic)
            self.fps = count / duration_s if duration_s > 0 and count > 1 else 30.0

    def _reader(self):
        from rosbags.highlevel import AnyReader  # imported here: only bag users need rosbags
        from rosbags.typesys import Stores, get_typestore

        path = Path(self.path)
        # A single .mcap/.db3 file is opened as the bag folder it sits in when that folder has metadata.
        if path.is_file() and (path.parent / "metadata.yaml").is_file():
            path = path.parent
        # Bags that do not embed their message definitions are read with the Jazzy types.
        return AnyReader([path], default_typestore=get_typestore(Stores.ROS2_JAZZY))

    def __iter__(self):
        with self._reader() as reader:
            conns = [c for c in reader.connections if c.topic == self.topic]
            for conn, _, raw in reader.messages(connections=conns):
                msg = reader.deserialize(raw, conn.msgtype)
                stamp = int(msg.header.stamp.sec) * 1_000_000_000 + int(msg.header.stamp.nanosec)
                yield decode_image_msg(msg, conn.msgtype), stamp


def decode_image_msg(msg, msgtype: str) -> np.ndarray:
    """sensor_msgs Image (rgb8/bgr8/rgba8/bgra8/mono8) or CompressedImage -> RGB uint8."""
    if msgtype.endswith("CompressedImage"):
        bgr = cv2.imdecode(np.frombuffer(bytes(msg.data), np.uint8), cv2.IMREAD_COLOR)
        if bgr is None:
            raise ClipError(f"undecodable CompressedImage ({msg.format!r})")
        return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
    channels = {"rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1}.get(msg.encoding)
    if channels is None:
        raise ClipError(f"unsupported Image encoding {msg.encoding!r}")
    data = np.frombuffer(bytes(msg.data), np.uint8).reshape(msg.height, msg.step)
    img = data[:, : msg.width * channels].reshape(msg.height, msg.width, channels)
    convert = {"bgr8": cv2.COLOR_BGR2RGB, "rgba8": cv2.COLOR_RGBA2RGB, "bgra8": cv2.COLOR_BGRA2RGB,
               "mono8": cv2.COLOR_GRAY2RGB}.get(msg.encoding)
    return cv2.cvtColor(img, convert) if convert is not None else img.copy()


class SyntheticClip:
    """Moving shapes over a textured background; with `cut_at`, a hard scene cut at that frame.

    The two scenes differ in palette and layout (a dark blue room with a circle and a bar, then a bright
    orange yard with boxes), so their frames are far apart in the vision encoder's embedding while frames
    within a scene change only slowly, like a camera that turns a corner.
    """

    def __init__(self, n_frames: int = 600, cut_at: int | None = None, fps: float = 60.0, seed: int = 0,
                 size: tuple[int, int] = (240, 320)):
        self.n_frames, self.cut_at, self.fps, self.seed, self.size = int(n_frames), cut_at, float(fps), seed, size
        self.name = "synthetic" if cut_at is None else f"synthetic-cut@{cut_at}"
        rng = np.random.default_rng(seed)
        h, w = size
        # Low-frequency texture per scene, so the background is not flat.
        self._textures = [cv2.resize(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8), (w, h),
                                     interpolation=cv2.INTER_CUBIC) for _ in range(2)]

    def frame(self, index: int) -> np.ndarray:
        h, w = self.size
        scene = 1 if self.cut_at is not None and index >= self.cut_at else 0
        t = index / self.fps
        if scene == 0:
            img = (0.25 * self._textures[0] + np.array([10, 20, 90])).astype(np.uint8)
            cx = int(w * (0.5 + 0.35 * np.sin(2 * np.pi * 0.25 * t)))
            cv2.circle(img, (cx, h // 2), h // 6, (230, 230, 40), -1)
            bar_y = int(h * (0.5 + 0.3 * np.cos(2 * np.pi * 0.15 * t)))
            cv2.rectangle(img, (w // 8, bar_y - 6), (w // 8 + w // 3, bar_y + 6), (240, 240, 240), -1)
        else:
            img = (0.3 * self._textures[1] + np.array([170, 110, 20])).astype(np.uint8)
            for k in range(3):
                x = int((w * (0.2 + 0.3 * k) + 40 * t * (k + 1)) % w)
                cv2.rectangle(img, (x, h // 4 + 20 * k), (x + w // 8, h // 4 + 20 * k + h // 5), (30, 60, 20), -1)
        return img

    def __iter__(self):
        for index in range(self.n_frames):
            yield self.frame(index), int(round(index * 1e9 / self.fps))


def open_clip(spec: str, *, n_frames: int = 600, cut_at: int | None = None, seed: int = 0, topic: str | None = None,
              fps: float = 30.0):
    """A frame source from a path or a synthetic name.

    `synthetic-cut` cuts at `cut_at` (default: a third of `n_frames`); `fps` is the stamp rate of image
    folders (videos and bags carry their own)."""
    if spec in SYNTHETIC:
        if spec == "synthetic-cut" and cut_at is None:
            cut_at = n_frames // 3
        return SyntheticClip(n_frames, cut_at if spec == "synthetic-cut" else None, seed=seed)
    path = Path(spec)
    if not path.exists():
        raise ClipError(f"{spec}: no such file or folder (or use one of {', '.join(SYNTHETIC)})")
    if path.is_dir():
        if (path / "metadata.yaml").is_file() or any(p.suffix in BAG_EXTS for p in path.iterdir()):
            return BagClip(spec, topic)
        return ImageFolderClip(spec, fps)
    if path.suffix.lower() in BAG_EXTS:
        return BagClip(spec, topic)
    if path.suffix.lower() in VIDEO_EXTS:
        return VideoClip(spec)
    raise ClipError(f"{spec}: unknown clip type (video {', '.join(VIDEO_EXTS)}, bag {', '.join(BAG_EXTS)}, "
                    f"an image folder, or {', '.join(SYNTHETIC)})")


def load_model_frames(source, max_frames: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Decode and resize a whole clip up front: (frames uint8 [N, 64, 128, 3], stamps int64 [N]).

    A benchmark replays from memory so that video decoding does not compete with the engine for the CPU.
    """
    frames, stamps = [], []
    for rgb, stamp in source:
        frames.append(to_model_input(rgb))
        stamps.append(stamp)
        if max_frames is not None and len(frames) >= max_frames:
            break
    if not frames:
        raise ClipError(f"{getattr(source, 'name', source)}: no frames")
    return np.stack(frames), np.asarray(stamps, np.int64)
