# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Frame sources for replay and benchmarks, ROS-free: rosbag2 bag, video file, image folder, synthetic clip.

One layer for both tools: ``vla-edge-replay`` publishes the :class:`Item` records a source yields, and
``vla-edge-bench`` decodes the same records into model frames.  Bag images are converted with the node's
own converter (:mod:`vla_edge_ros.image_convert`, ROS-free), so every encoding the node accepts
(mono16, bayer, yuv422, ...) works in the bench too.

    open_clip("run.mp4") | open_clip("frames/") | open_clip("bag.mcap") | open_clip("bag_dir/")
    open_clip("synthetic") | open_clip("synthetic-cut")           # generated, see SyntheticClip

Each source has ``items(counters)`` (records in recording order; damaged frames are skipped and counted
in ``counters.skipped_corrupt``) and is iterable as ``(rgb uint8 HxWx3, stamp_ns)`` pairs (the counters of
the last pass are ``source.counters``).  ``expected`` is the number of frames the source says it holds
(bag message count, video frame count, image files), or None when unknown.
"""

from __future__ import annotations

import math
import os
import types
from pathlib import Path
from typing import Iterator

import cv2
import numpy as np

from .image_convert import ImageError, compressed_msg_to_rgb, decode_compressed, image_msg_to_rgb, \
    rgb_to_image_fields, to_model_frame

VIDEO_EXTS = (".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v", ".mpg", ".mpeg")
IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".bmp", ".ppm", ".pgm", ".tif", ".tiff", ".webp")
BAG_EXTS = (".mcap", ".db3")
SYNTHETIC = ("synthetic", "synthetic-cut")
IMAGE_T = "sensor_msgs/msg/Image"
COMPRESSED_T = "sensor_msgs/msg/CompressedImage"
IMAGE_TYPES = (IMAGE_T, COMPRESSED_T)
JOINT_STATE_T = "sensor_msgs/msg/JointState"
DEFAULT_FRAME_ID = "camera"
# A video read that fails this many times in a row (no frame decodes) is the end of the readable file.
MAX_CONSECUTIVE_VIDEO_FAILURES = 100

# FFmpeg prints several lines per damaged packet; the sources count damaged frames instead.
os.environ.setdefault("OPENCV_FFMPEG_LOGLEVEL", "-8")


class ClipError(ValueError):
    """A clip that cannot be opened or decoded; the message names the file."""


def to_model_input(rgb: np.ndarray) -> np.ndarray:
    """Resize an RGB uint8 frame to the model's 64x128x3 input exactly as the camera node does."""
    return to_model_frame(rgb)


class Counters:
    """What one pass over a source did: frames yielded, damaged frames / messages skipped, other topics."""

    def __init__(self):
        self.frames = 0
        self.published = 0  # replay: messages actually published
        self.skipped_corrupt = 0
        self.skipped_other = 0
        self.loops = 0


class Item:
    """One recorded frame: as a message (``raw`` Image fields or ``data``+``fmt`` CompressedImage) or RGB.

    ``t_ns`` is the recording time that drives a replay schedule (bag receive time, or the frame's
    position in the clip); ``stamp_ns`` and ``frame_id`` are the header to publish.
    """

    __slots__ = ("t_ns", "stamp_ns", "frame_id", "kind", "_raw", "data", "fmt", "_rgb")

    def __init__(self, t_ns: int, stamp_ns: int, frame_id: str, kind: str, raw: dict | None = None,
                 data: bytes | None = None, fmt: str = "", rgb: np.ndarray | None = None):
        self.t_ns, self.stamp_ns, self.frame_id, self.kind = int(t_ns), int(stamp_ns), str(frame_id), kind
        self._raw, self.data, self.fmt, self._rgb = raw, data, fmt, rgb

    @property
    def raw(self) -> dict | None:
        """sensor_msgs/Image fields (height, width, encoding, is_bigendian, step, data) of a raw item."""
        if self._raw is None and self.kind == "raw" and self._rgb is not None:
            self._raw = rgb_to_image_fields(self._rgb)
        return self._raw

    def rgb(self) -> np.ndarray:
        """Full-size RGB uint8, decoded by the node's converter.  Raises ImageError on a damaged payload."""
        if self._rgb is not None:
            return self._rgb
        if self.kind == "raw":
            return image_msg_to_rgb(types.SimpleNamespace(**self._raw), resize=False)
        return decode_compressed(self.data, self.fmt)

    def model_frame(self) -> np.ndarray:
        """Return the 64x128 model input the camera node would make of this message."""
        if self._rgb is not None:
            return to_model_frame(self._rgb)
        if self.kind == "raw":
            return image_msg_to_rgb(types.SimpleNamespace(**self._raw), resize=True)
        return compressed_msg_to_rgb(types.SimpleNamespace(data=self.data, format=self.fmt), resize=True)


def _positive_fps(fps, what: str) -> float:
    if fps is None or not math.isfinite(fps) or fps <= 0:
        raise ClipError(f"{what}: frame rate must be a finite number > 0 (got {fps})")
    return float(fps)


class _Source:
    name = ""
    fps: float | None = None
    expected: int | None = None
    counters: Counters | None = None

    def items(self, counters: Counters | None = None, base_ns: int = 0) -> Iterator[Item]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[tuple[np.ndarray, int]]:
        self.counters = c = Counters()
        for item in self.items(c):
            try:
                rgb = item.rgb()
            except ImageError:
                c.skipped_corrupt += 1
                c.frames -= 1
                continue
            yield rgb, item.stamp_ns


class VideoClip(_Source):
    """A video file (cv2.VideoCapture); stamps = ``base_ns`` + the frame's position / fps.

    A frame that does not decode (damaged data) is skipped and counted, and reading goes on past it; a
    frame's stamp comes from its position in the file, so the gap stays visible in the stamps.
    """

    def __init__(self, path: str, fps: float | None = None, frame_id: str = DEFAULT_FRAME_ID):
        self.path, self.frame_id = str(path), frame_id
        self.name = os.path.basename(self.path)
        cap = cv2.VideoCapture(self.path)
        if not cap.isOpened():
            raise ClipError(f"{self.path}: cannot open as a video")
        native = cap.get(cv2.CAP_PROP_FPS)
        count = int(cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
        cap.release()
        self.native_fps = native if native and math.isfinite(native) and 0 < native < 1000 else None
        self.fps = _positive_fps(fps, self.path) if fps is not None else (self.native_fps or 30.0)
        self.expected = count if count > 0 else None

    def items(self, counters: Counters | None = None, base_ns: int = 0) -> Iterator[Item]:
        c = counters if counters is not None else Counters()
        cap = cv2.VideoCapture(self.path)
        try:
            index = 0  # position of the next frame in the file
            failures = 0
            while True:
                ok, bgr = cap.read()
                if not ok:
                    if self.expected is None or index >= self.expected:
                        break
                    failures += 1
                    index += 1  # a damaged frame: skipped, counted below from the frame count
                    if failures >= MAX_CONSECUTIVE_VIDEO_FAILURES:
                        break
                    continue
                failures = 0
                t = int(round(index * 1e9 / self.fps))
                index += 1
                c.frames += 1
                yield Item(t, base_ns + t, self.frame_id, "raw", rgb=cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
        finally:
            cap.release()
        if self.expected is not None:
            c.skipped_corrupt += max(0, self.expected - c.frames)


class ImageFolderClip(_Source):
    """Images in a folder, in file-name order, stamped at ``fps``.  JPEGs stay compressed (passed through)."""

    def __init__(self, path: str, fps: float = 30.0, frame_id: str = DEFAULT_FRAME_ID):
        self.path, self.fps, self.frame_id = str(path), _positive_fps(fps, str(path)), frame_id
        self.name = os.path.basename(os.path.normpath(self.path))
        named = sorted(p for p in Path(self.path).iterdir() if p.suffix.lower() in IMAGE_EXTS)
        # only regular files (or links to them): a folder, FIFO or socket named like an image is skipped
        self.files = [p for p in named if p.is_file()]
        self.not_files = [p.name for p in named if p not in self.files]
        if not self.files:
            raise ClipError(f"{self.path}: no images ({', '.join(IMAGE_EXTS)}){self.not_files_note(', ')}")
        self.expected = len(self.files)

    def not_files_note(self, sep: str = "") -> str:
        """'' or `sep` + how many entries named like images were skipped because they are not files."""
        n = len(self.not_files)
        if not n:
            return ""
        names = ", ".join(self.not_files[:3]) + (", ..." if n > 3 else "")
        return f"{sep}skipped {n} {'entry' if n == 1 else 'entries'} named like an image but not a file ({names})"

    def items(self, counters: Counters | None = None, base_ns: int = 0) -> Iterator[Item]:
        c = counters if counters is not None else Counters()
        for index, file in enumerate(self.files):
            t = int(round(index * 1e9 / self.fps))
            try:
                blob = file.read_bytes() if file.is_file() else None
            except OSError:
                blob = None
            if blob is None:  # removed, replaced or made unreadable since the folder was listed: damaged
                c.skipped_corrupt += 1
                continue
            if file.suffix.lower() in (".jpg", ".jpeg"):
                c.frames += 1
                yield Item(t, base_ns + t, self.frame_id, "compressed", data=blob, fmt="jpeg")
                continue
            bgr = cv2.imdecode(np.frombuffer(blob, np.uint8), cv2.IMREAD_COLOR) if blob else None
            if bgr is None:
                c.skipped_corrupt += 1
                continue
            c.frames += 1
            yield Item(t, base_ns + t, self.frame_id, "raw", rgb=cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))


def _typestore():
    from rosbags.typesys import Stores, get_typestore

    return get_typestore(Stores.ROS2_JAZZY)


def bag_paths(path: Path) -> list[Path]:
    """Return what AnyReader opens: the bag folder when a storage file sits next to its metadata.yaml."""
    if path.is_file() and (path.parent / "metadata.yaml").is_file():
        return [path.parent]
    return [path]


def is_bag(path: Path) -> bool:
    path = Path(path)
    if path.is_dir():
        return (path / "metadata.yaml").is_file() or any(p.suffix in BAG_EXTS and p.is_file() for p in path.iterdir())
    return path.suffix in BAG_EXTS


class BagClip(_Source):
    """Image or CompressedImage messages of one topic of a rosbag2 bag (.mcap / .db3 file or bag folder).

    Read with ``rosbags`` (AnyReader; bags that do not embed their message definitions are read with the
    Jazzy types).  Items keep the message as recorded (encoding, payload, header stamp and frame_id);
    without ``topic`` the first image topic (by name) is used.  Messages that do not deserialize are
    skipped and counted; messages of other topics are never deserialized and are counted as other.
    """

    def __init__(self, path: str, topic: str | None = None):
        self.path, self.topic = str(path), topic
        self.name = os.path.basename(os.path.normpath(self.path))
        try:
            with self._reader() as reader:
                topics = {c.topic: c.msgtype for c in reader.connections if c.msgtype in IMAGE_TYPES}
                if not topics:
                    found = sorted({f"{c.topic} [{c.msgtype}]" for c in reader.connections})
                    raise ClipError(f"{self.path}: no sensor_msgs/Image or CompressedImage topic "
                                    f"(topics: {', '.join(found) or 'none'})")
                if self.topic is None:
                    self.topic = sorted(topics)[0]
                elif self.topic not in topics:
                    raise ClipError(f"{self.path}: no image topic {self.topic!r} (has {', '.join(sorted(topics))})")
                self.kind = "raw" if topics[self.topic] == IMAGE_T else "compressed"
                duration_s = reader.duration / 1e9
                count = sum(c.msgcount for c in reader.connections if c.topic == self.topic)
        except ClipError:
            raise
        except Exception as e:  # noqa: BLE001 - rosbags raises its own errors for unreadable bags
            raise ClipError(f"{self.path}: not a readable rosbag2 bag ({type(e).__name__}: {e})") from e
        self.expected = count or None
        self.fps = (count - 1) / duration_s if duration_s > 0 and count > 1 else 30.0

    def _reader(self):
        from rosbags.highlevel import AnyReader  # imported here: only bag users need rosbags

        return AnyReader(bag_paths(Path(self.path)), default_typestore=_typestore())

    def items(self, counters: Counters | None = None, base_ns: int = 0) -> Iterator[Item]:
        c = counters if counters is not None else Counters()
        with self._reader() as reader:
            conns = [x for x in reader.connections if x.topic == self.topic]
            c.skipped_other += sum(int(getattr(x, "msgcount", 0) or 0) for x in reader.connections if x not in conns)
            for conn, t_ns, rawdata in reader.messages(connections=conns):
                try:
                    msg = reader.deserialize(rawdata, conn.msgtype)
                    stamp = int(msg.header.stamp.sec) * 1_000_000_000 + int(msg.header.stamp.nanosec)
                    data = np.asarray(msg.data, dtype=np.uint8).tobytes()
                    if conn.msgtype == IMAGE_T:
                        item = Item(t_ns, stamp, str(msg.header.frame_id), "raw", raw={
                            "height": int(msg.height), "width": int(msg.width), "encoding": str(msg.encoding),
                            "is_bigendian": int(msg.is_bigendian), "step": int(msg.step), "data": data})
                    else:
                        item = Item(t_ns, stamp, str(msg.header.frame_id), "compressed", data=data,
                                    fmt=str(msg.format))
                except Exception:  # noqa: BLE001 - corrupt CDR, wrong fields: skip and count
                    c.skipped_corrupt += 1
                    continue
                c.frames += 1
                yield item


class SyntheticClip(_Source):
    """Moving shapes over a textured background; with `cut_at`, a hard scene cut at that frame.

    The two scenes differ in palette and layout (a dark blue room with a circle and a bar, then a bright
    orange yard with boxes), so their frames are far apart in the vision encoder's embedding while frames
    within a scene change only slowly, like a camera that turns a corner.
    """

    def __init__(self, n_frames: int = 600, cut_at: int | None = None, fps: float = 60.0, seed: int = 0,
                 size: tuple[int, int] = (240, 320), frame_id: str = DEFAULT_FRAME_ID):
        self.n_frames, self.cut_at, self.fps, self.seed, self.size = int(n_frames), cut_at, float(fps), seed, size
        self.frame_id = frame_id
        self.name = "synthetic" if cut_at is None else f"synthetic-cut@{cut_at}"
        self.expected = self.n_frames
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

    def items(self, counters: Counters | None = None, base_ns: int = 0) -> Iterator[Item]:
        c = counters if counters is not None else Counters()
        for index in range(self.n_frames):
            t = int(round(index * 1e9 / self.fps))
            c.frames += 1
            yield Item(t, base_ns + t, self.frame_id, "raw", rgb=self.frame(index))


def open_clip(spec: str, *, n_frames: int = 600, cut_at: int | None = None, seed: int = 0, topic: str | None = None,
              fps: float | None = None, frame_id: str = DEFAULT_FRAME_ID):
    """Open a frame source from a path or a synthetic name.

    `synthetic-cut` cuts at `cut_at` (default: a third of `n_frames`); `fps` is the stamp rate of image
    folders and synthetic clips (default 30 and 60) and overrides a video's own rate; bags carry their own.
    `frame_id` is the header frame of sources that have none (bags keep theirs).
    """
    if fps is not None:
        _positive_fps(fps, spec)
    if spec in SYNTHETIC:
        if spec == "synthetic-cut" and cut_at is None:
            cut_at = n_frames // 3
        return SyntheticClip(n_frames, cut_at if spec == "synthetic-cut" else None, fps=fps or 60.0, seed=seed,
                             frame_id=frame_id)
    path = Path(spec).expanduser()
    if not path.exists():
        raise ClipError(f"{spec}: no such file or folder (or use one of {', '.join(SYNTHETIC)})")
    if path.is_dir():
        if not os.access(path, os.R_OK | os.X_OK):
            raise ClipError(f"{spec}: folder not readable")
        if is_bag(path):
            return BagClip(str(path), topic)
        return ImageFolderClip(str(path), fps or 30.0, frame_id)
    if not os.access(path, os.R_OK):
        raise ClipError(f"{spec}: file not readable")
    if path.suffix.lower() in BAG_EXTS:
        return BagClip(str(path), topic)
    if path.suffix.lower() in VIDEO_EXTS:
        return VideoClip(str(path), fps, frame_id)
    raise ClipError(f"{spec}: unknown clip type (video {', '.join(VIDEO_EXTS)}, bag {', '.join(BAG_EXTS)}, "
                    f"an image folder, or {', '.join(SYNTHETIC)})")


class BagJointStates:
    """The sensor_msgs/JointState messages of one topic of a bag, in stamp order: `stamps` (int64 ns), and per message
    its names and arrays (field -> values) as robot_state.StateMapper takes them. Messages that do not deserialize are
    counted (`skipped_corrupt`) and left out."""

    def __init__(self, path: str, topic: str):
        self.path, self.topic = str(path), topic
        self.skipped_corrupt = 0
        rows = []
        try:
            from rosbags.highlevel import AnyReader

            with AnyReader(bag_paths(Path(self.path)), default_typestore=_typestore()) as reader:
                conns = [c for c in reader.connections if c.topic == topic]
                if not conns or conns[0].msgtype != JOINT_STATE_T:
                    found = sorted({f"{c.topic} [{c.msgtype}]" for c in reader.connections})
                    raise ClipError(f"{self.path}: no {JOINT_STATE_T} topic {topic!r} (topics: {', '.join(found)})")
                for conn, _, rawdata in reader.messages(connections=conns):
                    try:
                        msg = reader.deserialize(rawdata, conn.msgtype)
                        stamp = int(msg.header.stamp.sec) * 1_000_000_000 + int(msg.header.stamp.nanosec)
                        rows.append((stamp, [str(x) for x in msg.name],
                                     {"position": np.asarray(msg.position, np.float64),
                                      "velocity": np.asarray(msg.velocity, np.float64)}))
                    except Exception:  # noqa: BLE001 - corrupt CDR: skipped and counted
                        self.skipped_corrupt += 1
        except ClipError:
            raise
        except Exception as e:  # noqa: BLE001 - rosbags raises its own errors for unreadable bags
            raise ClipError(f"{self.path}: not a readable rosbag2 bag ({type(e).__name__}: {e})") from e
        rows.sort(key=lambda r: r[0])
        self.stamps = np.asarray([r[0] for r in rows], np.int64)
        self.messages = [(r[1], r[2]) for r in rows]

    def __len__(self) -> int:
        return len(self.messages)

    def at(self, stamps_ns) -> list[int | None]:
        """For each frame stamp: the index of the latest message stamped at or before it (None: none yet)."""
        idx = np.searchsorted(self.stamps, np.asarray(stamps_ns, np.int64), side="right") - 1
        return [int(i) if i >= 0 else None for i in idx]


def load_model_frames(source, max_frames: int | None = None, min_fraction: float = 0.5, gate=None,
                      verdicts: list | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Decode and resize a whole clip up front: (frames uint8 [N, 64, 128, 3], stamps int64 [N]).

    A benchmark replays from memory so that video decoding does not compete with the engine for the CPU.
    Damaged frames are skipped and counted in ``source.counters``; a clip that yields nothing, or (read to
    its end) fewer than ``min_fraction`` of the frames it declares, raises ClipError.

    ``gate`` (a ``frame_quality.QualityGate``) checks each full-size frame in clip order, as the camera node does, and
    appends its verdict (``QualityResult.word()``, the block map) to ``verdicts``; the model frame is then made from
    the full-size frame, as the node makes it.
    """
    counters = Counters()
    source.counters = counters
    frames, stamps = [], []
    for item in source.items(counters):
        try:
            if gate is None:
                frames.append(item.model_frame())
            else:
                full = item.rgb()
                q = gate.update(full, item.stamp_ns)
                frames.append(to_model_frame(full))
                verdicts.append((q.word(), q.blocks))
        except ImageError:
            counters.skipped_corrupt += 1
            continue
        stamps.append(item.stamp_ns)
        if max_frames is not None and len(frames) >= max_frames:
            break
    name = getattr(source, "name", source)
    if not frames:
        raise ClipError(f"{name}: no decodable frames ({counters.skipped_corrupt} damaged)")
    expected = getattr(source, "expected", None)
    read_all = max_frames is None or len(frames) < max_frames
    if read_all and expected and len(frames) < min_fraction * expected:
        raise ClipError(f"{name}: only {len(frames)} of {expected} frames decodable "
                        f"({counters.skipped_corrupt} damaged)")
    return np.stack(frames), np.asarray(stamps, np.int64)
