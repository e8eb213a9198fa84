"""vla-edge-replay: publish a rosbag2 bag, a video file or an image folder as a camera topic.

    vla-edge-replay SOURCE [--topic T] [--format auto|raw|compressed] [--rate R] [--loop]
                    [--reliable] [--duration S] [--fps F] [--bag-topic T]
    vla-edge-replay --make-bag DIR [--bag-format raw|compressed] [--storage mcap|sqlite3] [--frames N]

* rosbag2 (.mcap or .db3, a bag directory or the storage file) is read with ``rosbags``
  (AnyReader + the Jazzy typestore), so no rosbag2 install is needed.  Messages are replayed at the
  recorded rate (bag receive times / ``--rate``) and keep their header stamps.  Messages that do
  not deserialize, or are not images, are skipped and counted.
* A video file (``cv2.VideoCapture``) is replayed at its frame rate (``--fps`` overrides); stamps
  are synthesized: start wall time + the frame's position in the clip.
* An image folder (png/jpg/bmp, sorted by name) is replayed at ``--fps``.

The output topic defaults to the bag topic, else ``/camera/image_raw``; with ``--format
compressed`` (or a compressed bag and ``auto``) messages are CompressedImage and ``/compressed`` is
appended to a default topic.  ``--make-bag`` writes a small synthetic bag (moving shapes) used by the
tests and the demo; :func:`make_test_bag` is the same as a function.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import cv2
import numpy as np

IMAGE_T = "sensor_msgs/msg/Image"
COMPRESSED_T = "sensor_msgs/msg/CompressedImage"
IMAGE_EXT = (".png", ".jpg", ".jpeg", ".bmp", ".ppm", ".pgm", ".tif", ".tiff", ".webp")
VIDEO_EXT = (".mp4", ".avi", ".mkv", ".mov", ".webm", ".m4v", ".mpg", ".mpeg")
RESYNC_S = 0.5  # when the publisher falls this far behind (e.g. SIGSTOP), restart the schedule


class ReplayError(RuntimeError):
    pass


@dataclass
class Item:
    """One frame to publish."""

    t_ns: int  # recorded time (bag receive time or frame time): drives the schedule
    stamp_ns: int  # header stamp to publish
    frame_id: str
    kind: str  # "raw" | "compressed"
    raw: dict | None = None  # Image fields: height, width, encoding, is_bigendian, step, data(bytes)
    data: bytes | None = None  # CompressedImage payload
    fmt: str = ""  # CompressedImage format


# --------------------------------------------------------------------------------------------
# synthetic frames and test bags
# --------------------------------------------------------------------------------------------

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
) -> Path:
    """Write a rosbag2 bag of ``frames`` synthetic images at ``fps`` and return its directory.

    ``fmt`` raw -> sensor_msgs/Image (``encoding`` rgb8 or bgr8), compressed -> CompressedImage (jpeg).
    Message indices in ``corrupt`` are written as undeserializable garbage (to test skipping).
    Header stamps = ``start_ns + i/fps``; bag receive time = header stamp.
    """
    from rosbags.rosbag2 import StoragePlugin, Writer

    from ..nodes.image_convert import encode_jpeg

    path = Path(path)
    if path.exists():
        raise ReplayError(f"{path} exists: rosbag2 writers need a new directory")
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
        for i in range(frames):
            t = start_ns + int(round(i * 1e9 / fps))
            if i in corrupt:
                writer.write(conn, t, b"\x00\x01\x00\x00garbage")
                continue
            header = Header(stamp=Time(sec=t // 1_000_000_000, nanosec=t % 1_000_000_000), frame_id="camera")
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


# --------------------------------------------------------------------------------------------
# sources
# --------------------------------------------------------------------------------------------

class Counters:
    def __init__(self):
        self.published = 0
        self.skipped_corrupt = 0
        self.skipped_other = 0
        self.loops = 0


def _bag_paths(source: Path) -> list[Path]:
    if source.is_dir():
        return [source]
    if source.suffix in (".mcap", ".db3"):
        # AnyReader wants the bag directory when metadata.yaml exists, else the storage file itself
        if (source.parent / "metadata.yaml").is_file():
            return [source.parent]
        return [source]
    raise ReplayError(f"{source}: not a bag")


def is_bag(source: Path) -> bool:
    if source.is_dir():
        return (source / "metadata.yaml").is_file() or any(source.glob("*.mcap")) or any(source.glob("*.db3"))
    return source.suffix in (".mcap", ".db3")


def bag_items(source: Path, counters: Counters, topic: str | None = None) -> Iterator[Item]:
    from rosbags.highlevel import AnyReader

    with AnyReader(_bag_paths(source), default_typestore=_typestore()) as reader:
        conns = [c for c in reader.connections if c.msgtype in (IMAGE_T, COMPRESSED_T)]
        if topic:
            conns = [c for c in conns if c.topic == topic]
        if not conns:
            raise ReplayError(
                f"{source}: no sensor_msgs/Image or CompressedImage topic"
                + (f" named {topic}" if topic else "")
                + f" (topics: {sorted({c.topic + ' [' + c.msgtype + ']' for c in reader.connections})})"
            )
        conns = [c for c in conns if c.topic == conns[0].topic]  # one camera topic
        # messages of other topics / types (known or not) are never deserialized: counted as skipped
        counters.skipped_other += sum(int(getattr(c, "msgcount", 0) or 0) for c in reader.connections
                                      if c not in conns)
        for conn, t_ns, rawdata in reader.messages(connections=conns):
            try:
                msg = reader.deserialize(rawdata, conn.msgtype)
                stamp = int(msg.header.stamp.sec) * 1_000_000_000 + int(msg.header.stamp.nanosec)
                data = np.asarray(msg.data, dtype=np.uint8)
                if conn.msgtype == IMAGE_T:
                    yield Item(t_ns, stamp, msg.header.frame_id, "raw", raw={
                        "height": int(msg.height), "width": int(msg.width), "encoding": str(msg.encoding),
                        "is_bigendian": int(msg.is_bigendian), "step": int(msg.step), "data": data.tobytes()})
                else:
                    yield Item(t_ns, stamp, msg.header.frame_id, "compressed", data=data.tobytes(),
                               fmt=str(msg.format))
            except Exception:  # noqa: BLE001 - corrupt CDR, wrong fields: skip and count
                counters.skipped_corrupt += 1


def video_items(source: Path, counters: Counters, fps: float | None, base_ns: int) -> Iterator[Item]:
    cap = cv2.VideoCapture(str(source))
    if not cap.isOpened():
        raise ReplayError(f"{source}: cannot open video")
    try:
        rate = fps or cap.get(cv2.CAP_PROP_FPS) or 30.0
        if not (0 < rate < 1000):
            rate = 30.0
        i = 0
        while True:
            ok, bgr = cap.read()
            if not ok:
                break
            t = int(round(i * 1e9 / rate))
            rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
            yield Item(t, base_ns + t, "camera", "raw", raw=_raw_fields(rgb))
            i += 1
        if i == 0:
            raise ReplayError(f"{source}: no frames decoded")
    finally:
        cap.release()


def folder_items(source: Path, counters: Counters, fps: float | None, base_ns: int) -> Iterator[Item]:
    files = sorted(p for p in source.iterdir() if p.suffix.lower() in IMAGE_EXT)
    if not files:
        raise ReplayError(f"{source}: no images ({', '.join(IMAGE_EXT)})")
    rate = fps or 30.0
    for i, f in enumerate(files):
        t = int(round(i * 1e9 / rate))
        blob = f.read_bytes()
        if f.suffix.lower() in (".jpg", ".jpeg"):
            yield Item(t, base_ns + t, "camera", "compressed", data=blob, fmt="jpeg")
            continue
        bgr = cv2.imdecode(np.frombuffer(blob, np.uint8), cv2.IMREAD_COLOR)
        if bgr is None:
            counters.skipped_corrupt += 1
            continue
        yield Item(t, base_ns + t, "camera", "raw", raw=_raw_fields(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)))


def _raw_fields(rgb: np.ndarray) -> dict:
    h, w = rgb.shape[:2]
    return {"height": h, "width": w, "encoding": "rgb8", "is_bigendian": 0, "step": w * 3,
            "data": np.ascontiguousarray(rgb).tobytes()}


def convert(item: Item, out_kind: str, jpeg_quality: int = 90) -> Item:
    """Raw <-> compressed for ``--format``; undecodable payloads raise (the caller counts them)."""
    if out_kind == item.kind:
        return item
    from ..nodes.image_convert import decode_compressed, encode_jpeg, image_msg_to_rgb

    if out_kind == "raw":
        rgb = decode_compressed(item.data, item.fmt)
        return Item(item.t_ns, item.stamp_ns, item.frame_id, "raw", raw=_raw_fields(rgb))

    class _M:  # duck-typed Image for image_convert
        pass

    m = _M()
    m.__dict__.update(item.raw)
    rgb = image_msg_to_rgb(m, resize=False)
    return Item(item.t_ns, item.stamp_ns, item.frame_id, "compressed", data=encode_jpeg(rgb, jpeg_quality),
                fmt="rgb8; jpeg compressed bgr8")


# --------------------------------------------------------------------------------------------
# publishing
# --------------------------------------------------------------------------------------------

def _make_msg(item: Item):
    from sensor_msgs.msg import CompressedImage, Image

    if item.kind == "raw":
        m = Image()
        r = item.raw
        m.height, m.width, m.encoding = r["height"], r["width"], r["encoding"]
        m.is_bigendian, m.step, m.data = r["is_bigendian"], r["step"], r["data"]
    else:
        m = CompressedImage()
        m.format, m.data = item.fmt, item.data
    m.header.stamp.sec = item.stamp_ns // 1_000_000_000
    m.header.stamp.nanosec = item.stamp_ns % 1_000_000_000
    m.header.frame_id = item.frame_id
    return m


def _source_kind(source: Path) -> str:
    if is_bag(source):
        return "bag"
    if source.is_dir():
        return "folder"
    if source.suffix.lower() in VIDEO_EXT or source.is_file():
        return "video"
    raise ReplayError(f"{source}: not found")


def _peek_bag_kind(source: Path, topic: str | None) -> str:
    from rosbags.highlevel import AnyReader

    with AnyReader(_bag_paths(source), default_typestore=_typestore()) as reader:
        for c in reader.connections:
            if c.msgtype in (IMAGE_T, COMPRESSED_T) and (not topic or c.topic == topic):
                return ("raw" if c.msgtype == IMAGE_T else "compressed"), c.topic
    raise ReplayError(f"{source}: no image topic" + (f" named {topic}" if topic else ""))


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="vla-edge-replay", description=__doc__.split("\n\n")[0])
    p.add_argument("source", nargs="?", help="rosbag2 dir/.mcap/.db3, video file or image folder")
    p.add_argument("--topic", help="output topic (default: the bag's topic, else /camera/image_raw[/compressed])")
    p.add_argument("--format", choices=("auto", "raw", "compressed"), default="auto",
                   help="output message type (auto: as recorded; video/folder: raw)")
    p.add_argument("--rate", type=float, default=1.0, help="playback speed factor (default 1.0)")
    p.add_argument("--loop", action="store_true", help="start again at the end")
    p.add_argument("--reliable", action="store_true", help="RELIABLE QoS (default BEST_EFFORT, sensor data)")
    p.add_argument("--depth", type=int, default=5, help="publisher history depth")
    p.add_argument("--duration", type=float, default=0.0, help="stop after this many seconds (0: no limit)")
    p.add_argument("--fps", type=float, default=None, help="frame rate for image folders / override for videos")
    p.add_argument("--bag-topic", help="which image topic of the bag to replay (default: the first)")
    p.add_argument("--wait-subscriber", type=float, default=0.0,
                   help="wait up to this many seconds for a subscriber before starting")
    p.add_argument("--jpeg-quality", type=int, default=90)
    p.add_argument("--quiet", action="store_true")
    g = p.add_argument_group("test bags")
    g.add_argument("--make-bag", metavar="DIR", help="write a synthetic bag to DIR and exit")
    g.add_argument("--bag-format", choices=("raw", "compressed"), default="raw")
    g.add_argument("--storage", choices=("mcap", "sqlite3"), default="mcap")
    g.add_argument("--frames", type=int, default=90)
    g.add_argument("--width", type=int, default=320)
    g.add_argument("--height", type=int, default=240)
    a = p.parse_args(argv)
    if not a.make_bag and not a.source:
        p.error("SOURCE is required (or --make-bag DIR)")
    if not (a.rate > 0):
        p.error("--rate must be > 0")
    return a


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    # strip ROS arguments (a launch file may add --ros-args ...)
    ros_args = []
    if "--ros-args" in argv:
        i = argv.index("--ros-args")
        argv, ros_args = argv[:i], argv[i:]
    a = parse_args(argv)
    if a.make_bag:
        try:
            out = make_test_bag(a.make_bag, frames=a.frames, fps=a.fps or 30.0, width=a.width, height=a.height,
                                fmt=a.bag_format, storage=a.storage, topic=a.topic)
        except ReplayError as e:
            print(f"vla-edge-replay: {e}", file=sys.stderr)
            return 2
        print(out)
        return 0

    source = Path(a.source).expanduser()
    try:
        kind = _source_kind(source)
        in_kind, bag_topic = _peek_bag_kind(source, a.bag_topic) if kind == "bag" else ("raw", None)
    except ReplayError as e:
        print(f"vla-edge-replay: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - unreadable bag
        print(f"vla-edge-replay: cannot read {source}: {e}", file=sys.stderr)
        return 2
    out_kind = in_kind if a.format == "auto" else a.format
    if kind == "folder" and a.format == "auto":
        out_kind = "raw"
    topic = a.topic or (bag_topic if bag_topic and out_kind == in_kind else None)
    if topic is None:
        topic = "/camera/image_raw" + ("/compressed" if out_kind == "compressed" else "")

    import rclpy
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
    from rclpy.signals import SignalHandlerOptions
    from sensor_msgs.msg import CompressedImage, Image

    stop = threading.Event()

    def _on_signal(signum, frame):
        stop.set()

    rclpy.init(args=["replay"] + ros_args, signal_handler_options=SignalHandlerOptions.NO)
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    node = rclpy.create_node("vla_edge_replay")
    qos = QoSProfile(
        history=HistoryPolicy.KEEP_LAST, depth=max(1, a.depth),
        reliability=ReliabilityPolicy.RELIABLE if a.reliable else ReliabilityPolicy.BEST_EFFORT,
        durability=DurabilityPolicy.VOLATILE,
    )
    pub = node.create_publisher(Image if out_kind == "raw" else CompressedImage, topic, qos)
    counters = Counters()
    log = (lambda *x: None) if a.quiet else (lambda *x: print("vla-edge-replay:", *x, file=sys.stderr, flush=True))
    log(f"{source} ({kind}, {in_kind}) -> {topic} [{out_kind}, "
        f"{'reliable' if a.reliable else 'best_effort'}] rate x{a.rate}{' loop' if a.loop else ''}")

    if a.wait_subscriber > 0:
        t_end = time.monotonic() + a.wait_subscriber
        while pub.get_subscription_count() == 0 and time.monotonic() < t_end and not stop.is_set():
            time.sleep(0.05)

    t_begin = time.monotonic()
    deadline = t_begin + a.duration if a.duration > 0 else float("inf")
    wall_base = time.time_ns()
    rc = 0
    try:
        while not stop.is_set():
            if kind == "bag":
                items = bag_items(source, counters, a.bag_topic or bag_topic)
                base_stamp = 0
            else:
                base_stamp = wall_base  # synthesized stamps keep increasing across loops
                items = (video_items(source, counters, a.fps, base_stamp) if kind == "video"
                         else folder_items(source, counters, a.fps, base_stamp))
            first_t = None
            t0 = time.monotonic()
            last_t = 0
            n_this = 0
            for item in items:
                if first_t is None:
                    first_t = item.t_ns
                rel = (item.t_ns - first_t) / 1e9 / a.rate
                last_t = item.t_ns - first_t
                target = t0 + rel
                now = time.monotonic()
                if now - target > RESYNC_S:  # fell behind (stopped process, slow disk): restart the schedule
                    t0 = now - rel
                    target = now
                if target > deadline:
                    stop.set()
                    break
                while not stop.is_set():
                    d = target - time.monotonic()
                    if d <= 0:
                        break
                    stop.wait(min(d, 0.1))
                if stop.is_set():
                    break
                try:
                    pub.publish(_make_msg(convert(item, out_kind, a.jpeg_quality)))
                except Exception as e:  # noqa: BLE001 - a payload that cannot be converted / published
                    counters.skipped_corrupt += 1
                    log(f"skipped a message: {e}")
                    continue
                counters.published += 1
                n_this += 1
            counters.loops += 1
            if not a.loop or stop.is_set():
                break
            if n_this == 0:
                log("nothing to publish in the source")
                rc = 1
                break
            # keep the recorded spacing across the wrap-around
            frame_gap = last_t / max(1, n_this - 1) / 1e9 / a.rate if n_this > 1 else 0.033
            stop.wait(frame_gap)
            wall_base += int(last_t + frame_gap * 1e9 * a.rate)
    except ReplayError as e:
        print(f"vla-edge-replay: {e}", file=sys.stderr)
        rc = 2
    finally:
        log(f"published {counters.published} messages in {time.monotonic() - t_begin:.1f} s, "
            f"skipped {counters.skipped_corrupt} corrupt and {counters.skipped_other} of other topics/types, "
            f"loops {counters.loops}")
        node.destroy_node()
        rclpy.try_shutdown()
    return rc


if __name__ == "__main__":
    sys.exit(main())
