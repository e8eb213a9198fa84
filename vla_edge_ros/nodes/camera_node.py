# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""CameraNode: camera topic -> FrameBuffer (DESIGN.md §3).

Subscribes ``image`` (sensor_msgs/Image, ``transport: raw``) or ``image/compressed``
(sensor_msgs/CompressedImage, ``transport: compressed``), converts to uint8 RGB 64x128 (area
resize) and publishes into the shared FrameBuffer with the header stamp and the monotonic receive
time.  It never waits for the reasoning side.  A malformed message is dropped, counted by cause
and reported in a throttled warning; the node never dies on input.

``max_image_bytes`` / ``max_image_pixels`` bound what a frame can cost here: a larger message is dropped
(kind ``too_large``) before any conversion or decoding, so conversion time and memory are bounded.  The
subscription takes the serialised message (``raw=True``) and compares its length with the byte cap before
deserialising it, so an oversized message is never turned into Python objects; what remains is the copy of
the serialised bytes into the process (and DDS's own reassembly of the fragments), which no cap here can
bound.

The image subscription takes the standard ``qos_overrides`` parameters (history, depth, reliability), named after
the topic as resolved: ``-p qos_overrides./camera/image.subscription.reliability:=reliable``.  They apply on top of
``qos_reliability`` / ``qos_depth`` and are read and checked when the node is built (a bad value is a
``ParamError``, like any other parameter), not only when it subscribes.

``qos_reliability: auto`` (the default, issue 30.5) subscribes reliable when every publisher on the topic offers
reliable, else best effort, and looks again every ``QOS_RECHECK_S`` (a driver that starts later, or a best-effort
one that joins): a best-effort reader of a reliable publisher on this host lost most 1.5 MB frames (7.7 of 25 Hz
measured, over UDP fragments: a publisher's own 512 KiB shared-memory segment cannot hold such a frame), a reliable
one received 24.9 Hz. A reliability override (``qos_overrides.<topic>.subscription.reliability``) turns auto off.
``stats()`` also says how many publishers the topic has (graph) and how many matched, and the publisher's rate as
the header stamps show it (the 10th percentile of the gaps between consecutive frames' stamps: frames lost in
between widen some gaps, not all), so /diagnostics can warn about a camera that delivers too little of it.
"""

from __future__ import annotations

import copy
import sys
import threading
import time
from collections import deque

import rclpy
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.qos_overriding_options import QoSOverridingOptions, _declare_qos_parameters
from rclpy.subscription import Subscription
from rclpy.serialization import deserialize_message
from sensor_msgs.msg import CompressedImage, Image

from ..frame_buffer import FrameBuffer
from ..frame_quality import QualityGate, QualitySettings
from ..image_convert import ImageError, check_caps, compressed_msg_to_rgb, image_msg_to_rgb, to_model_frame
from ..settings import CAMERA_SPECS, ParamError, validate_camera
from .params import declare_and_read, enable_runtime_updates, parameter_overrides

RATE_WINDOW_S = 2.0
STALL_S = 0.5  # no frame for this long: the camera rate reads 0
# Serialised bytes of an image message besides its data (CDR header, stamp, frame_id, encoding/format, lengths):
# a serialised message longer than max_image_bytes + this is refused before it is deserialised.
SERIALIZED_OVERHEAD = 4096
QOS_RECHECK_S = 1.0  # qos_reliability auto: how often the publishers' reliability is looked at again
SOURCE_WINDOW_S = 4.0  # frames whose header stamps tell the publisher's rate


def stamp_to_ns(stamp) -> int:
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


def image_qos(reliability: str, depth: int) -> QoSProfile:
    """Sensor-data QoS (best effort, keep last, volatile) or its reliable variant for bag replay."""
    return QoSProfile(
        history=HistoryPolicy.KEEP_LAST,
        depth=int(depth),
        reliability=ReliabilityPolicy.RELIABLE if reliability == "reliable" else ReliabilityPolicy.BEST_EFFORT,
        durability=DurabilityPolicy.VOLATILE,
    )


class CameraNode(Node):
    def __init__(self, frame_buffer: FrameBuffer, node_name: str = "vla_camera", **kwargs):
        self._auto = False  # qos_reliability auto (set in _image_qos)
        self._last_qos_check = 0.0
        self._stamps: deque[tuple[float, int]] = deque(maxlen=256)  # (receive time, header stamp) of recent frames
        super().__init__(node_name, **kwargs)
        self.fb = frame_buffer
        self.p = validate_camera(declare_and_read(self, CAMERA_SPECS))
        enable_runtime_updates(self, CAMERA_SPECS, self.p)  # warn_throttle_s; the rest is read-only
        self._lock = threading.Lock()
        self.received = 0
        self.valid = 0
        self.invalid = 0
        self.invalid_by_kind: dict[str, int] = {}
        self.convert_ms_last = 0.0
        self._recv_times: deque[float] = deque(maxlen=1024)
        self.last_recv_time = 0.0  # time.monotonic() of the last message, whatever became of it; 0 = none yet
        self._last_warn = -1e9
        self._suppressed = 0
        self.sub = None
        self.topic = "image/compressed" if self.p["transport"] == "compressed" else "image"
        self.qos = self._image_qos()
        # frame quality (frame_quality.py): checked here, once per frame, on the full-size image; the verdict
        # travels with the frame in its FrameBuffer slot
        self.quality = QualityGate(QualitySettings.from_values(self.p)) if self.p["frame_quality"] else None
        self.quality_ms_last = 0.0

    def _image_qos(self) -> QoSProfile:
        """The subscription's QoS: the parameters, then the standard qos_overrides.<topic>.subscription.* (declared
        here, so they are checked now; create_subscription finds them declared and applies the same values)."""
        qos = image_qos(self.p["qos_reliability"], self.p["qos_depth"])
        topic = self.resolve_topic_name(self.topic)
        self._auto = self.p["qos_reliability"] == "auto" and \
            f"qos_overrides.{topic}.subscription.reliability" not in parameter_overrides(self)
        try:
            # rclpy 7.1 (ROS 2 Jazzy) declares the qos_overrides.* parameters only inside create_subscription, with no
            # public way to declare (and so check) them before: its private helper does exactly that
            _declare_qos_parameters(Subscription, self, self.resolve_topic_name(self.topic), qos,
                                    QoSOverridingOptions.with_default_policies())
            qos.get_c_qos_profile()  # a profile rmw refuses (depth 0 with keep_last, ...) is refused here
        except Exception as e:  # noqa: BLE001 - a bad type or value of an override
            raise ParamError(f"qos_overrides for {self.resolve_topic_name(self.topic)}: {e}") from None
        return qos

    def start(self) -> None:
        """Subscribe to the camera (the reasoning node calls this when it activates, i.e. once warmed up)."""
        if self.sub is not None:
            return
        qos, options = self.qos, QoSOverridingOptions.with_default_policies()
        if self._auto:  # the overrides of history and depth are in self.qos already; reliability from the graph
            qos = copy.copy(self.qos)
            qos.reliability = self._auto_reliability() or ReliabilityPolicy.BEST_EFFORT
            options = None
            self._last_qos_check = time.monotonic()
        if self.p["transport"] == "compressed":
            self.sub = self.create_subscription(CompressedImage, self.topic, self._on_compressed_serialized,
                                                qos, raw=True, qos_overriding_options=options)
        else:
            self.sub = self.create_subscription(Image, self.topic, self._on_raw_serialized, qos, raw=True,
                                                qos_overriding_options=options)
        self.sub_qos = qos
        depth = f"depth {qos.depth}" if qos.history == HistoryPolicy.KEEP_LAST else qos.history.name.lower()
        self.get_logger().info(
            f"subscribed {self.sub.topic_name} [{self.p['transport']}, {qos.reliability.name.lower()}"
            f"{' (auto)' if self._auto else ''}, {depth}] -> FrameBuffer {self.fb.shape}"
        )

    def _auto_reliability(self):
        """RELIABLE when the topic has publishers and every one offers reliable, BEST_EFFORT when one does not,
        None when there is none (nothing to decide on)."""
        try:
            pubs = self.get_publishers_info_by_topic(self.resolve_topic_name(self.topic))
        except Exception:  # noqa: BLE001 - the graph is best effort
            return None
        if not pubs:
            return None
        if all(p.qos_profile.reliability == ReliabilityPolicy.RELIABLE for p in pubs):
            return ReliabilityPolicy.RELIABLE
        return ReliabilityPolicy.BEST_EFFORT

    def recheck_qos(self, now: float | None = None) -> None:
        """qos_reliability auto: subscribe again when the publishers call for the other reliability (every
        QOS_RECHECK_S; the camera process's loop calls this)."""
        now = time.monotonic() if now is None else now
        if not self._auto or self.sub is None or now - self._last_qos_check < QOS_RECHECK_S:
            return
        self._last_qos_check = now
        want = self._auto_reliability()
        if want is None or want == self.sub_qos.reliability:
            return
        self.get_logger().info(f"qos_reliability auto: the publishers of {self.sub.topic_name} call for "
                               f"{want.name.lower()}: subscribing again")
        self.destroy_subscription(self.sub)
        self.sub = None
        self.start()

    # --- callbacks ---------------------------------------------------------------------------------

    def _on_raw_serialized(self, data: bytes) -> None:
        self._handle_serialized(data, Image, image_msg_to_rgb)

    def _on_compressed_serialized(self, data: bytes) -> None:
        self._handle_serialized(data, CompressedImage, compressed_msg_to_rgb)

    def _handle_serialized(self, data: bytes, msg_type, convert) -> None:
        """The byte cap on the serialised message first, then deserialise and convert."""
        self.last_recv_time = time.monotonic()
        try:
            check_caps("serialised image message", len(data), None, None,
                       self.p["max_image_bytes"] + SERIALIZED_OVERHEAD, None)
            msg = deserialize_message(data, msg_type)
        except ImageError as e:
            with self._lock:
                self.received += 1
                self._recv_times.append(time.monotonic())
            self._drop(e.kind, str(e))
            return
        except Exception as e:  # noqa: BLE001 - a message that does not deserialise
            with self._lock:
                self.received += 1
            self._drop("data", f"cannot deserialise: {type(e).__name__}: {e}")
            return
        self._handle(msg, convert)

    def _convert_caps(self) -> dict:
        return {"max_bytes": self.p["max_image_bytes"], "max_pixels": self.p["max_image_pixels"]}

    def _handle(self, msg, convert) -> None:
        recv = time.monotonic()
        with self._lock:
            self.received += 1
            self._recv_times.append(recv)
        stamp = stamp_to_ns(msg.header.stamp)
        with self._lock:
            self._stamps.append((recv, stamp))
        try:
            if self.quality is None:
                self.fb.publish(convert(msg, **self._convert_caps()), stamp, recv)
            else:
                full = convert(msg, resize=False, **self._convert_caps())
                t_q = time.monotonic()
                q = self.quality.update(full, stamp)
                self.quality_ms_last = (time.monotonic() - t_q) * 1000.0
                self.fb.publish(to_model_frame(full), stamp, recv, quality=q.word(), blocks=q.blocks)
        except ImageError as e:
            self._drop(e.kind, str(e))
            return
        except Exception as e:  # noqa: BLE001 - the camera callback must survive anything the input does
            self._drop("other", f"{type(e).__name__}: {e}")
            return
        done = time.monotonic()
        with self._lock:
            self.valid += 1
            self.convert_ms_last = (done - recv) * 1000.0

    def _drop(self, kind: str, why: str) -> None:
        with self._lock:
            self.invalid += 1
            self.invalid_by_kind[kind] = self.invalid_by_kind.get(kind, 0) + 1
            now = time.monotonic()
            if now - self._last_warn < self.p["warn_throttle_s"]:
                self._suppressed += 1
                return
            suppressed, self._suppressed = self._suppressed, 0
            self._last_warn = now
            total = self.invalid
        more = f" (+{suppressed} more since the last warning)" if suppressed else ""
        self.get_logger().warning(f"dropped a frame: {why}{more}; {total} invalid so far")

    # --- statistics (read from the diagnostics thread) ----------------------------------------------

    def rate_hz(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        with self._lock:
            ts = [t for t in self._recv_times if now - t <= RATE_WINDOW_S]
        if len(ts) < 2 or now - ts[-1] > STALL_S:
            return 0.0
        return (len(ts) - 1) / max(1e-6, ts[-1] - ts[0])

    def source_rate_hz(self, now: float | None = None) -> float:
        """The publisher's rate as the frames' header stamps show it (0.0: not enough frames to tell): 1 / the 10th
        percentile of the positive gaps between consecutive stamps received in the last SOURCE_WINDOW_S."""
        now = time.monotonic() if now is None else now
        with self._lock:
            st = [s for t, s in self._stamps if now - t <= SOURCE_WINDOW_S]
        gaps = sorted(b - a for a, b in zip(st, st[1:]) if b > a)
        if len(gaps) < 5:
            return 0.0
        return 1e9 / gaps[len(gaps) // 10]

    def stats(self) -> dict:
        rate = self.rate_hz()
        source_rate = self.source_rate_hz()
        try:
            topic_publishers = self.count_publishers(self.resolve_topic_name(self.topic))
        except Exception:  # noqa: BLE001
            topic_publishers = -1
        with self._lock:
            return {
                "transport": self.p["transport"],
                "topic": self.sub.topic_name if self.sub is not None else "",
                "received": self.received,
                "valid": self.valid,
                "invalid": self.invalid,
                "invalid_by_kind": dict(self.invalid_by_kind),
                "rate_hz": rate,
                "convert_ms_last": self.convert_ms_last,
                "max_image_bytes": self.p["max_image_bytes"],
                "max_image_pixels": self.p["max_image_pixels"],
                "last_recv_time": self.last_recv_time,
                "source_rate_hz": source_rate,
                "topic_publishers": topic_publishers,
                "reliable": self.sub is not None and self.sub_qos.reliability == ReliabilityPolicy.RELIABLE,
                "quality": self.quality_stats(),
            }

    def quality_stats(self) -> dict:
        """The frame-quality gate's counts (frame_quality.QualityGate.counts) plus the current tripped mask and
        the last frame's check cost; {} when frame_quality is off."""
        g = self.quality
        if g is None:
            return {}
        out = g.counts()
        out["tripped"] = g.tripped
        out["failed_last"] = g.last.failed if g.last is not None else 0
        out["detail_last"] = g.last.detail if g.last is not None else float("nan")
        out["mean_last"] = g.last.mean if g.last is not None else float("nan")
        out["check_ms_last"] = self.quality_ms_last
        return out


def main(argv=None) -> int:
    """Run the camera node alone (no reasoning): useful to check a camera topic and its rate."""
    from rclpy.executors import ExternalShutdownException

    from ..settings import ParamError

    rclpy.init(args=sys.argv if argv is None else argv)
    fb = FrameBuffer()
    try:
        node = CameraNode(fb)
    except ParamError as e:
        print(f"camera_node: invalid parameters: {e}", file=sys.stderr)
        rclpy.try_shutdown()
        return 2

    def report():
        s = node.stats()
        node.get_logger().info(
            f"{s['rate_hz']:.1f} Hz, {s['valid']} valid, {s['invalid']} invalid {s['invalid_by_kind']}"
        )

    node.start()
    node.create_timer(2.0, report)
    try:
        rclpy.spin(node)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
