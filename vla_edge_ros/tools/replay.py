# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""vla-edge-replay: publish a rosbag2 bag, a video file, an image folder or a synthetic clip as a camera topic.

Behaves like a camera driver: RELIABLE QoS by default (``--best-effort`` for the sensor-data profile),
the recorded header stamps and ``frame_id`` passed through (sources without one get ``--frame-id``).
The frames come from :mod:`vla_edge_ros.clips`, the same source layer the bench reads:

* rosbag2 (.mcap or .db3, a bag folder or its storage file), read with ``rosbags`` (no rosbag2 install
  needed); messages are published as recorded (any encoding) at the recorded rate (receive times /
  ``--rate``).  Messages that do not deserialize are skipped and counted.
* a video file at its frame rate (``--fps`` overrides); damaged frames are skipped and counted, and
  reading goes on past them; stamps = start wall time + the frame's position in the clip.
* an image folder (png/jpg/..., sorted by name) at ``--fps`` (default 30); ``synthetic`` / ``synthetic-cut``.

The robot's state for a model with a state input (``--state-out``, default /joint_states, sensor_msgs/JointState):
``--state-topic T`` takes a bag's JointState topic T and publishes, just before each frame, the latest message stamped
at or before it (once; a stalled recording publishes nothing new, so the node's state ages). Without ``--clock`` its
stamp is moved to now minus its age at the frame, so it is as old at the node as it was in the recording; with
``--clock`` it keeps its recorded stamp (the node follows /clock). ``--state-joints A,B,..`` gives any other source a
made-up state of those joints (position sin(t + j), velocity cos(t + j), the names shuffled), stamped now.

Exit status: 0 when the source was played; 1 when nothing was published, or a full pass published less
than ``--min-fraction`` of the frames the source declares (a damaged file); 2 for bad options or a
source that cannot be opened (one line on stderr).  ``--make-bag DIR`` writes a small synthetic test
bag (moving shapes; ``synthetic_bag.make_test_bag``).

Usage examples:
  vla-edge-replay /data/run1_bag --loop
  vla-edge-replay /data/run1_bag --clock         # with vla_edge ... -p use_sim_time:=true
  vla-edge-replay drive.mp4 --topic /camera/image_raw --rate 0.5 --frame-id front_camera
  vla-edge-replay frames/ --fps 15 --format compressed --best-effort
  vla-edge-replay --make-bag /tmp/test_bag --frames 90 --bag-format compressed
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time

from ..clips import BagClip, BagJointStates, ClipError, Counters, Item, open_clip
from ..synthetic_bag import make_test_bag
from .cli import Parser, bounded, fail, finite_non_negative

RESYNC_S = 0.5  # when the publisher falls this far behind (e.g. SIGSTOP), restart the schedule
MAX_ACK_TIMEOUT_S = 3600.0  # --ack-timeout: an hour (rclpy turns seconds into int64 nanoseconds)
DEFAULT_TOPIC = "/camera/image_raw"


# --------------------------------------------------------------------------------------------
# sources (clips.py) and conversion
# --------------------------------------------------------------------------------------------

def bag_items(source, counters: Counters, topic: str | None = None):
    """Return the image messages of a bag as :class:`Item` (clips.BagClip): corrupt ones skipped, counted."""
    return BagClip(str(source), topic).items(counters)


def _source_kind(source) -> str:
    """'raw' or 'compressed': what the source holds (bags: the topic's type; everything else raw)."""
    return getattr(source, "kind", "raw")


def convert(item: Item, out_kind: str, jpeg_quality: int = 90) -> Item:
    """Raw <-> compressed for ``--format``; undecodable payloads raise ImageError (the caller counts them)."""
    if out_kind == item.kind:
        return item
    from ..image_convert import encode_jpeg

    rgb = item.rgb()
    if out_kind == "raw":
        return Item(item.t_ns, item.stamp_ns, item.frame_id, "raw", rgb=rgb)
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


def _int_range(lo: int, hi: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be in {lo}..{hi}, not {v}")
        return v
    return parse


def check_topic(name: str) -> str | None:
    """None when ``name`` is a valid ROS 2 topic name, else why not (rcl's own rules, through rclpy)."""
    from rclpy.exceptions import NameValidationException
    from rclpy.validate_full_topic_name import validate_full_topic_name
    from rclpy.validate_topic_name import validate_topic_name

    try:
        validate_topic_name(name)
        if not name.startswith("~"):  # the full-name rules (e.g. no '//') as the publisher will check them
            validate_full_topic_name(name if name.startswith("/") else "/" + name)
    except NameValidationException as e:
        return " ".join(str(e).split())
    return None


def build_parser() -> Parser:
    p = Parser(prog="vla-edge-replay", description=__doc__.split("\n\n")[0],
               epilog=__doc__[__doc__.index("Usage examples:"):], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", nargs="?",
                   help="rosbag2 folder/.mcap/.db3, video file, image folder, synthetic or synthetic-cut")
    p.add_argument("--topic", help="output topic (default: the bag's topic, else /camera/image_raw, "
                                   "+ /compressed for compressed output)")
    p.add_argument("--format", choices=("auto", "raw", "compressed"), default="auto",
                   help="output message type; auto: as recorded (video/folder/synthetic: raw) (default: auto)")
    p.add_argument("--rate", type=bounded(0.001, 1000.0), default=1.0,
                   help="playback speed factor, 0.001 to 1000 (default: 1.0)")
    p.add_argument("--loop", action="store_true", help="start again at the end (default: one pass)")
    p.add_argument("--clock", action="store_true",
                   help="also publish /clock (rosgraph_msgs/Clock) with each frame's stamp, for nodes running with "
                        "use_sim_time (as ros2 bag play --clock) (default: off)")
    qos = p.add_mutually_exclusive_group()
    qos.add_argument("--best-effort", action="store_true",
                     help="BEST_EFFORT QoS (the sensor-data profile) instead of RELIABLE (default: reliable)")
    qos.add_argument("--reliable", action="store_true", help="RELIABLE QoS; this is the default")
    p.add_argument("--depth", type=_int_range(1, 10000), default=5, help="publisher history depth (default: 5)")
    p.add_argument("--instruction", default=None,
                   help="also publish this task once on --instruction-topic (std_msgs/String, reliable + transient "
                        "local: a node that starts later still gets it) (default: none)")
    p.add_argument("--instruction-topic", default="/vla_edge/instruction",
                   help="where --instruction goes (default: /vla_edge/instruction)")
    p.add_argument("--duration", type=finite_non_negative, default=0.0,
                   help="stop after this many seconds (default: 0 = no limit)")
    p.add_argument("--fps", type=bounded(0.01, 10000.0), default=None,
                   help="frame rate (0.01 to 10000) of image folders and synthetic clips; overrides a video's own rate "
                        "(default: the video's rate, 30 for folders, 60 for synthetic)")
    p.add_argument("--frame-id", default="camera",
                   help="header frame_id for videos, folders and synthetic clips; bags keep their own "
                        "(default: camera)")
    p.add_argument("--bag-topic", help="which image topic of the bag to replay (default: the first by name)")
    p.add_argument("--wait-subscriber", type=finite_non_negative, default=0.0,
                   help="wait up to this many seconds for a subscriber before starting (default: 0)")
    p.add_argument("--ack-timeout", type=bounded(0.0, MAX_ACK_TIMEOUT_S), default=10.0,
                   help="with reliable QoS, wait up to this many seconds at the end for every subscriber to "
                        "acknowledge the last frames; a lost message is repaired after the writer's next "
                        "heartbeat (every 3 s by default in Fast DDS); 0: exit at once; at most 3600 (default: 10)")
    p.add_argument("--jpeg-quality", type=_int_range(1, 100), default=90,
                   help="JPEG quality for --format compressed from raw frames (default: 90)")
    p.add_argument("--min-fraction", type=bounded(0.0, 1.0), default=0.5,
                   help="exit 1 when a full pass publishes less than this fraction of the frames the source "
                        "declares (default: 0.5)")
    p.add_argument("--state-topic", default=None, metavar="TOPIC",
                   help="a bag's sensor_msgs/JointState topic: before each frame, the latest state stamped at or "
                        "before it is published on --state-out (default: none)")
    p.add_argument("--state-joints", default=None, metavar="A,B,..",
                   help="publish a made-up state of these joints on --state-out with each frame (sources without "
                        "a recorded state) (default: none)")
    p.add_argument("--state-out", default="/joint_states", help="the state's topic (default: /joint_states)")
    p.add_argument("--quiet", action="store_true", help="no progress and no summary (default: show them)")
    g = p.add_argument_group("test bags")
    g.add_argument("--make-bag", metavar="DIR",
                   help="write a synthetic bag to DIR (must not exist) and exit (default: replay SOURCE)")
    g.add_argument("--bag-format", choices=("raw", "compressed"), default="raw",
                   help="Image (rgb8) or CompressedImage (jpeg) messages (default: raw)")
    g.add_argument("--storage", choices=("mcap", "sqlite3"), default="mcap", help="bag storage (default: mcap)")
    g.add_argument("--frames", type=_int_range(1, 1_000_000), default=90, help="frames in the bag (default: 90)")
    g.add_argument("--width", type=_int_range(1, 16384), default=320, help="frame width (default: 320)")
    g.add_argument("--height", type=_int_range(1, 16384), default=240, help="frame height (default: 240)")
    return p


def parse_args(argv=None):
    p = build_parser()
    a = p.parse_args(argv)
    if not a.make_bag and not a.source:
        p.error("SOURCE is required (or --make-bag DIR)")
    for opt in ("topic", "state_out"):
        value = getattr(a, opt)
        why = check_topic(value) if value is not None else None
        if why:
            p.error(f"--{opt.replace('_', '-')} {value!r}: {why}")
    if a.state_topic and a.state_joints:
        p.error("--state-topic and --state-joints: give one (a recorded state or a made-up one)")
    if a.state_joints is not None:
        a.state_joints = tuple(x.strip() for x in a.state_joints.split(",") if x.strip())
        if not a.state_joints or len(set(a.state_joints)) != len(a.state_joints):
            p.error("--state-joints: one or more distinct joint names, comma-separated")
    return a


def _fail(msg: str, rc: int = 2) -> int:
    return fail("vla-edge-replay", msg, rc)


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
        except (ClipError, OSError) as e:
            return _fail(str(e))
        print(out)
        return 0

    try:
        source = open_clip(a.source, fps=a.fps, topic=a.bag_topic, frame_id=a.frame_id,
                           n_frames=int(60 * (a.fps or 60.0)))
    except ClipError as e:
        return _fail(str(e))
    except OSError as e:
        return _fail(f"{a.source}: {e.strerror or e}")
    states = None
    if a.state_topic:
        if not isinstance(source, BagClip):
            return _fail(f"{a.source}: --state-topic reads a bag's JointState topic; this source is not a bag")
        try:
            states = BagJointStates(source.path, a.state_topic)
        except ClipError as e:
            return _fail(str(e))
    a.states = states
    in_kind = _source_kind(source)
    out_kind = in_kind if a.format == "auto" else a.format
    bag_topic = getattr(source, "topic", None)
    topic = a.topic or (bag_topic if bag_topic and out_kind == in_kind else None)
    if topic is None:
        topic = DEFAULT_TOPIC + ("/compressed" if out_kind == "compressed" else "")
    return _publish(a, source, in_kind, out_kind, topic, ros_args)


class StateOut:
    """The robot state published with the frames (--state-topic / --state-joints, see the module docstring)."""

    def __init__(self, node, a, qos):
        from sensor_msgs.msg import JointState

        self.node, self.joints, self.keep_stamps = node, a.state_joints, a.clock
        self.states = getattr(a, "states", None)
        self.JointState = JointState
        self.pub = node.create_publisher(JointState, a.state_out, qos)
        self._last = None  # (pass, message index) last published
        self._rng = None
        self.published = 0

    def before(self, frame_stamp_ns: int, pass_index: int, t_s: float) -> None:
        msg = self.JointState()
        now_ns = self.node.get_clock().now().nanoseconds
        if self.states is None:
            import numpy as np

            from ..synthetic_bag import joint_values

            self._rng = self._rng or np.random.default_rng(0)
            order = self._rng.permutation(len(self.joints))
            vals = joint_values(self.joints, t_s)
            msg.name = [self.joints[i] for i in order]
            msg.position, msg.velocity = vals["position"][order].tolist(), vals["velocity"][order].tolist()
            stamp = now_ns
        else:
            j = self.states.at([frame_stamp_ns])[0]
            if j is None or (pass_index, j) == self._last:
                return
            self._last = (pass_index, j)
            names, arrays = self.states.messages[j]
            msg.name = list(names)
            msg.position, msg.velocity = arrays["position"].tolist(), arrays["velocity"].tolist()
            recorded = int(self.states.stamps[j])
            stamp = recorded if self.keep_stamps else now_ns - (frame_stamp_ns - recorded)
        msg.header.stamp.sec, msg.header.stamp.nanosec = stamp // 1_000_000_000, stamp % 1_000_000_000
        self.pub.publish(msg)
        self.published += 1


def _publish(a, source, in_kind: str, out_kind: str, topic: str, ros_args: list[str]) -> int:
    import rclpy
    from rclpy.duration import Duration
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
    from rclpy.signals import SignalHandlerOptions
    from sensor_msgs.msg import CompressedImage, Image
    from tqdm import tqdm

    from ..image_convert import ImageError

    stop = threading.Event()
    signalled = threading.Event()

    def _on_signal(signum, frame):
        signalled.set()
        stop.set()

    try:
        rclpy.init(args=["replay"] + ros_args, signal_handler_options=SignalHandlerOptions.NO)
    except Exception as e:  # noqa: BLE001 - bad --ros-args: rcl's message, one line
        return _fail(f"ROS arguments {' '.join(ros_args[1:])!r}: {str(e).splitlines()[0]}")
    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    node = rclpy.create_node("vla_edge_replay")
    reliable = not a.best_effort
    qos = QoSProfile(
        history=HistoryPolicy.KEEP_LAST, depth=a.depth,
        reliability=ReliabilityPolicy.RELIABLE if reliable else ReliabilityPolicy.BEST_EFFORT,
        durability=DurabilityPolicy.VOLATILE,
    )
    try:
        pub = node.create_publisher(Image if out_kind == "raw" else CompressedImage, topic, qos)
        clock_pub = None
        if a.clock:
            from rosgraph_msgs.msg import Clock

            clock_pub = node.create_publisher(Clock, "/clock", 10)
        state = StateOut(node, a, qos) if getattr(a, "states", None) is not None or a.state_joints else None
        if a.instruction is not None:
            from std_msgs.msg import String

            latched = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1, reliability=ReliabilityPolicy.RELIABLE,
                                 durability=DurabilityPolicy.TRANSIENT_LOCAL)
            instruction_pub = node.create_publisher(String, a.instruction_topic, latched)
            instruction_pub.publish(String(data=a.instruction))  # kept for late joiners while the replay runs
    except Exception as e:  # noqa: BLE001 - a name that expands to something invalid (e.g. with --ros-args)
        node.destroy_node()
        rclpy.try_shutdown()
        return _fail(f"topic {topic!r}: {' '.join(str(e).split())}")
    counters = Counters()
    log = (lambda *x: None) if a.quiet else (lambda *x: print("vla-edge-replay:", *x, file=sys.stderr, flush=True))
    expected = getattr(source, "expected", None)
    log(f"{a.source} ({type(source).__name__}, {in_kind}, {expected or '?'} frames) -> {topic} [{out_kind}, "
        f"{'reliable' if reliable else 'best_effort'}] rate x{a.rate:g}{' loop' if a.loop else ''}")
    if getattr(source, "not_files", None):
        log(f"{expected} images in {a.source}; {source.not_files_note()}")

    if a.wait_subscriber > 0:
        t_end = time.monotonic() + a.wait_subscriber
        while pub.get_subscription_count() == 0 and time.monotonic() < t_end and not stop.is_set():
            time.sleep(0.05)

    progress = tqdm(total=None if a.loop else expected, unit="frame", file=sys.stderr, disable=a.quiet,
                    mininterval=1.0, desc="vla-edge-replay", leave=False)
    t_begin = time.monotonic()
    deadline = t_begin + a.duration if a.duration > 0 else float("inf")
    wall_base = time.time_ns()
    rc = 0
    short_pass = None  # (published, declared) of a full pass that fell under --min-fraction
    try:
        while not stop.is_set():
            # Synthesized stamps keep increasing across loops; bags keep their recorded stamps.
            pass_counters = Counters()
            items = source.items(pass_counters, base_ns=0 if isinstance(source, BagClip) else wall_base)
            first_t = None
            t0 = time.monotonic()
            last_t = 0
            n_this = 0
            full_pass = True
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
                if not stop.is_set():
                    while not stop.is_set():
                        d = target - time.monotonic()
                        if d <= 0:
                            break
                        stop.wait(min(d, 0.1))
                if stop.is_set():
                    full_pass = False
                    break
                try:
                    msg = _make_msg(convert(item, out_kind, a.jpeg_quality))
                    if clock_pub is not None:  # the clock reaches the frame's time before the frame arrives
                        clock_pub.publish(Clock(clock=msg.header.stamp))
                    if state is not None:  # the state of the frame's time, just before it
                        state.before(item.stamp_ns, counters.loops, (item.t_ns - first_t) / 1e9)
                    pub.publish(msg)
                except (ImageError, ValueError, TypeError) as e:  # a payload that cannot be converted / published
                    pass_counters.skipped_corrupt += 1
                    log(f"skipped a message: {e}")
                    continue
                n_this += 1
                progress.update(1)
            counters.published += n_this
            counters.skipped_corrupt += pass_counters.skipped_corrupt
            counters.skipped_other += pass_counters.skipped_other
            counters.loops += 1
            if full_pass and expected and n_this < a.min_fraction * expected and short_pass is None:
                short_pass = (n_this, expected)
            if n_this == 0 or not a.loop or stop.is_set():
                break
            # keep the recorded spacing across the wrap-around
            frame_gap = last_t / max(1, n_this - 1) / 1e9 / a.rate if n_this > 1 else 0.033
            stop.wait(frame_gap)
            wall_base += int(last_t + frame_gap * 1e9 * a.rate)
    except ClipError as e:
        rc = _fail(str(e))
    finally:
        progress.close()
        if state is not None:
            log(f"published {state.published} robot states on {a.state_out}")
        log(f"published {counters.published} messages in {time.monotonic() - t_begin:.1f} s, "
            f"skipped {counters.skipped_corrupt} corrupt and {counters.skipped_other} of other topics/types, "
            f"loops {counters.loops}")
        if reliable and counters.published and a.ack_timeout > 0 and not signalled.is_set():
            # reliable means delivered: a message not yet acknowledged when the node goes is lost (the last
            # frames of a pass, on a busy machine); a signal still ends the replay at once
            if not pub.wait_for_all_acked(Duration(seconds=a.ack_timeout)):
                log(f"not every subscriber acknowledged the last messages within {a.ack_timeout:g} s")
        node.destroy_node()
        rclpy.try_shutdown()
    if rc == 0 and counters.published == 0:
        rc = _fail(f"{a.source}: published nothing ({counters.skipped_corrupt} damaged)", 1)
    elif rc == 0 and short_pass is not None:
        rc = _fail(f"{a.source}: a full pass published only {short_pass[0]} of {short_pass[1]} frames "
                   f"({counters.skipped_corrupt} damaged; --min-fraction {a.min_fraction:g})", 1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
