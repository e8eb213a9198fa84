# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Camera message -> model frame: validation and conversion (uint8 RGB, 64x128, area resize).

ROS-free on purpose: the functions take any object with the fields of ``sensor_msgs/Image``
(``height, width, encoding, is_bigendian, step, data``) or ``sensor_msgs/CompressedImage``
(``format, data``), so they are unit-testable without rclpy.  cv_bridge is used when it is
importable (it is in a ROS install) for the conversions it does correctly; the step-aware,
byte-order-aware numpy path below handles what the PyPI port gets wrong (padded rows, big-endian
16-bit data under NumPy 2) and is the fallback when cv_bridge is absent.

Every malformed input raises :class:`ImageError` with a short, specific message and a ``kind``
(``encoding`` | ``size`` | ``step`` | ``data`` | ``decode`` | ``too_large``) so that the camera node can
count drops by cause; nothing else escapes :func:`image_msg_to_rgb` / :func:`compressed_msg_to_rgb`.

Size caps (``max_bytes``, ``max_pixels``; the camera node's ``max_image_bytes`` / ``max_image_pixels``)
are checked before any conversion or decoding: a raw image by its data length and header, a compressed
one by its length and by the dimensions read from its own header (PNG IHDR, JPEG SOF), so a
decompression bomb (a 30000x30000 PNG of under 1 MB) is refused without being decoded. Only JPEG and PNG
are accepted as compressed input (what image_transport's compressed plugin writes).

A decoder that returns pixels is not enough: libjpeg decodes an image with valid headers and random data into
a full-size array of noise, saying only "Corrupt JPEG data: ..." on stderr. :func:`decode_compressed` watches
what the decoder itself says (file descriptor 2 is captured around ``cv2.imdecode``, under a lock), and a
libjpeg warning or a libpng error makes the image ``decode`` invalid; anything else written meanwhile is passed
on to the real stderr.
"""

from __future__ import annotations

import os
import struct
import sys
import tempfile
import threading

import numpy as np

try:  # optional: the ROS 2 (or PyPI port) cv_bridge
    from cv_bridge import CvBridge as _CvBridge  # type: ignore
except Exception:  # noqa: BLE001 - any import problem means "no cv_bridge"
    _CvBridge = None

import cv2

from .constants import FRAME_H, FRAME_W

# Largest accepted side and pixel count: anything above is treated as a corrupt header, not a camera.
MAX_SIDE = 16384
MAX_PIXELS = 64 * 1024 * 1024
MAX_COMPRESSED_BYTES = 64 * 1024 * 1024
# Default caps of the camera node (max_image_bytes, max_image_pixels): a 4K rgb8 frame (3840x2160x3 = 24.9 MB,
# 8.3 Mpx) passes, an 8K one (99.5 MB, 33.2 Mpx) is refused before conversion.
DEFAULT_MAX_IMAGE_BYTES = 32 * 1024 * 1024
DEFAULT_MAX_IMAGE_PIXELS = 4096 * 4096

# encoding -> (numpy dtype, channels)
ENCODINGS: dict[str, tuple[np.dtype, int]] = {
    "rgb8": (np.dtype(np.uint8), 3),
    "bgr8": (np.dtype(np.uint8), 3),
    "rgba8": (np.dtype(np.uint8), 4),
    "bgra8": (np.dtype(np.uint8), 4),
    "mono8": (np.dtype(np.uint8), 1),
    "8UC1": (np.dtype(np.uint8), 1),
    "8UC3": (np.dtype(np.uint8), 3),  # OpenCV convention: BGR
    "8UC4": (np.dtype(np.uint8), 4),  # OpenCV convention: BGRA
    "rgb16": (np.dtype(np.uint16), 3),
    "bgr16": (np.dtype(np.uint16), 3),
    "rgba16": (np.dtype(np.uint16), 4),
    "bgra16": (np.dtype(np.uint16), 4),
    "mono16": (np.dtype(np.uint16), 1),
    "16UC1": (np.dtype(np.uint16), 1),
    "bayer_rggb8": (np.dtype(np.uint8), 1),
    "bayer_bggr8": (np.dtype(np.uint8), 1),
    "bayer_gbrg8": (np.dtype(np.uint8), 1),
    "bayer_grbg8": (np.dtype(np.uint8), 1),
    "yuv422": (np.dtype(np.uint8), 2),  # UYVY
    "uyvy": (np.dtype(np.uint8), 2),
    "yuv422_yuy2": (np.dtype(np.uint8), 2),  # YUYV
    "yuyv": (np.dtype(np.uint8), 2),
}

_TO_RGB = {
    "rgb8": None,
    "bgr8": cv2.COLOR_BGR2RGB,
    "8UC3": cv2.COLOR_BGR2RGB,
    "rgba8": cv2.COLOR_RGBA2RGB,
    "bgra8": cv2.COLOR_BGRA2RGB,
    "8UC4": cv2.COLOR_BGRA2RGB,
    "mono8": cv2.COLOR_GRAY2RGB,
    "8UC1": cv2.COLOR_GRAY2RGB,
    "rgb16": None,
    "bgr16": cv2.COLOR_BGR2RGB,
    "rgba16": cv2.COLOR_RGBA2RGB,
    "bgra16": cv2.COLOR_BGRA2RGB,
    "mono16": cv2.COLOR_GRAY2RGB,
    "16UC1": cv2.COLOR_GRAY2RGB,
    # OpenCV names Bayer patterns by the second row's first two pixels: ROS rggb == OpenCV BG.
    "bayer_rggb8": cv2.COLOR_BayerBG2RGB,
    "bayer_bggr8": cv2.COLOR_BayerRG2RGB,
    "bayer_gbrg8": cv2.COLOR_BayerGR2RGB,
    "bayer_grbg8": cv2.COLOR_BayerGB2RGB,
    "yuv422": cv2.COLOR_YUV2RGB_UYVY,
    "uyvy": cv2.COLOR_YUV2RGB_UYVY,
    "yuv422_yuy2": cv2.COLOR_YUV2RGB_YUY2,
    "yuyv": cv2.COLOR_YUV2RGB_YUY2,
}


# Why a camera message was dropped: the ImageError kinds, plus "other" for anything unexpected.
DROP_KINDS = ("encoding", "size", "step", "data", "decode", "too_large", "other")


class ImageError(ValueError):
    """A camera message that cannot become a frame.  ``kind`` (one of DROP_KINDS) names the cause for counting."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def _bytes_view(data) -> memoryview:
    """Zero-copy byte view of a message's ``data`` (bytes, bytearray, array.array('B'), list, ndarray)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        return memoryview(data).cast("B")
    if isinstance(data, np.ndarray):
        return memoryview(np.ascontiguousarray(data).view(np.uint8).reshape(-1))
    try:
        return memoryview(data).cast("B")  # array.array('B') as rclpy gives for uint8[]
    except TypeError:
        try:
            return memoryview(np.asarray(data, dtype=np.uint8))
        except (TypeError, ValueError, OverflowError) as e:
            raise ImageError("data", f"image data is not a byte sequence ({type(data).__name__})") from e


def check_size(height: int, width: int) -> None:
    """Zero or absurd dimensions: raise ImageError('size', ...)."""
    if height <= 0 or width <= 0:
        raise ImageError("size", f"empty image {width}x{height}")
    if height > MAX_SIDE or width > MAX_SIDE or height * width > MAX_PIXELS:
        raise ImageError("size", f"absurd image size {width}x{height} (max side {MAX_SIDE})")


def check_caps(what: str, n_bytes: int | None, width: int | None, height: int | None, max_bytes: int | None,
               max_pixels: int | None) -> None:
    """The configured caps: raise ImageError('too_large', ...) naming the parameter to raise."""
    if max_bytes is not None and n_bytes is not None and n_bytes > max_bytes:
        raise ImageError("too_large", f"{what} of {n_bytes} bytes is over max_image_bytes={max_bytes}")
    if max_pixels is not None and width is not None and height is not None and width * height > max_pixels:
        raise ImageError("too_large", f"{what} of {width}x{height} = {width * height} pixels is over "
                                      f"max_image_pixels={max_pixels}")


def validate_image(msg, max_bytes: int | None = None, max_pixels: int | None = None) -> tuple[np.dtype, int]:
    """Check a raw Image's header against its data and the caps.  Returns (dtype, channels).  Raises ImageError."""
    enc = str(msg.encoding)
    check_caps("image", len(_bytes_view(msg.data)), None, None, max_bytes, None)
    if enc not in ENCODINGS:
        raise ImageError("encoding", f"unsupported encoding '{enc}'")
    dtype, ch = ENCODINGS[enc]
    h, w, step = int(msg.height), int(msg.width), int(msg.step)
    check_size(h, w)
    check_caps(f"{enc} image", None, w, h, None, max_pixels)
    if enc in ("yuv422", "uyvy", "yuv422_yuy2", "yuyv") and w % 2:
        raise ImageError("size", f"{enc} needs an even width, got {w}")
    if enc.startswith("bayer_") and (w < 2 or h < 2):
        raise ImageError("size", f"{enc} needs at least 2x2 pixels, got {w}x{h}")
    row = w * ch * dtype.itemsize
    if step < row:
        raise ImageError("step", f"step {step} < width*channels*bytes = {row} for {enc} {w}x{h}")
    if step > row + 4096 and step > 2 * row:
        raise ImageError("step", f"step {step} is implausible for a {row}-byte row ({enc} {w}x{h})")
    if dtype.itemsize > 1 and step % dtype.itemsize:
        raise ImageError("step", f"step {step} is not a multiple of {dtype.itemsize} for {enc}")
    n = len(_bytes_view(msg.data))
    need = step * (h - 1) + row  # the last row's padding may be absent
    if n < need:
        raise ImageError("data", f"truncated data: {n} bytes, need {step * h} ({enc} {w}x{h}, step {step})")
    if n > step * h:
        raise ImageError("data", f"data length {n} != step*height = {step * h}")
    return dtype, ch


def _raw_array(msg, dtype: np.dtype, ch: int) -> np.ndarray:
    """Step-aware, byte-order-aware numpy view (H, W[, C]) of a validated Image."""
    h, w, step = int(msg.height), int(msg.width), int(msg.step)
    buf = _bytes_view(msg.data)
    dt = dtype.newbyteorder(">" if msg.is_bigendian else "<") if dtype.itemsize > 1 else dtype
    shape = (h, w, ch) if ch > 1 else (h, w)
    strides = (step, ch * dt.itemsize, dt.itemsize) if ch > 1 else (step, dt.itemsize)
    arr = np.ndarray(shape=shape, dtype=dt, buffer=buf, strides=strides)
    if dtype.itemsize > 1:
        arr = arr.astype(dtype.newbyteorder("="), copy=True)
    return arr


_bridge = None


def _cv_bridge():
    global _bridge
    if _bridge is None and _CvBridge is not None:
        _bridge = _CvBridge()
    return _bridge


def to_model_frame(img: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """RGB uint8 (H, W, 3) of any size -> (FRAME_H, FRAME_W, 3) with area interpolation (no crop)."""
    if img.shape[0] == FRAME_H and img.shape[1] == FRAME_W:
        res = np.ascontiguousarray(img)
    else:
        res = cv2.resize(img, (FRAME_W, FRAME_H), interpolation=cv2.INTER_AREA)
    if out is not None:
        np.copyto(out, res)
        return out
    return res


def _to_rgb8(img: np.ndarray, enc: str) -> np.ndarray:
    code = _TO_RGB[enc]
    if img.dtype == np.uint16:
        img = (img >> 8).astype(np.uint8)
    if code is not None:
        img = cv2.cvtColor(np.ascontiguousarray(img), code)
    return img


def image_msg_to_rgb(msg, resize: bool = True, max_bytes: int | None = None,
                     max_pixels: int | None = None) -> np.ndarray:
    """sensor_msgs/Image -> uint8 RGB (64, 128, 3) (or full size with resize=False).  Raises ImageError."""
    dtype, ch = validate_image(msg, max_bytes, max_pixels)
    enc = str(msg.encoding)
    try:
        packed = int(msg.step) == int(msg.width) * ch * dtype.itemsize
        bridge = _cv_bridge()
        # the PyPI cv_bridge port byte-swaps with ndarray.newbyteorder (gone in NumPy 2) whenever
        # is_bigendian differs from the host, even for 8-bit data: keep it to the plain case
        if (bridge is not None and packed and dtype.itemsize == 1 and not msg.is_bigendian
                and enc in ("rgb8", "bgr8", "rgba8", "bgra8", "mono8")):
            img = bridge.imgmsg_to_cv2(msg, desired_encoding="rgb8")
        else:
            img = _to_rgb8(_raw_array(msg, dtype, ch), enc)
        if img.ndim != 3 or img.shape[2] != 3 or img.dtype != np.uint8:
            raise ImageError("encoding", f"conversion of {enc} gave shape {img.shape} {img.dtype}")
        return to_model_frame(img) if resize else np.ascontiguousarray(img)
    except ImageError:
        raise
    except Exception as e:  # noqa: BLE001 - cv_bridge/OpenCV errors on hostile input
        raise ImageError("decode", f"cannot convert {enc} {msg.width}x{msg.height}: {e}") from e


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers (baseline, extended, progressive, lossless, arithmetic); C4/C8/CC are not frames
JPEG_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def compressed_dimensions(data) -> tuple[str, int, int]:
    """(format, width, height) from a compressed image's header without decoding it: PNG's IHDR chunk or the
    first JPEG start-of-frame segment (walking the marker segments by their lengths, no pixel data read).
    Raises ImageError('decode', ...) for anything else or a header that ends early."""
    buf = _bytes_view(data)
    n = len(buf)
    if bytes(buf[:8]) == PNG_SIGNATURE:
        if n < 24 or bytes(buf[12:16]) != b"IHDR":
            raise ImageError("decode", "PNG without an IHDR chunk")
        w, h = struct.unpack(">II", bytes(buf[16:24]))
        return "png", w, h
    if n >= 4 and buf[0] == 0xFF and buf[1] == 0xD8:
        i = 2
        while i + 4 <= n:
            if buf[i] != 0xFF:
                raise ImageError("decode", f"corrupt JPEG: no marker at byte {i}")
            marker = buf[i + 1]
            if marker == 0xFF:  # fill byte
                i += 1
                continue
            if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
                i += 2
                continue
            if marker in (0xD9, 0xDA):  # end of image / start of scan before any frame header
                break
            seg = (buf[i + 2] << 8) | buf[i + 3]
            if marker in JPEG_SOF:
                if i + 9 > n or seg < 7:
                    break
                h = (buf[i + 5] << 8) | buf[i + 6]
                w = (buf[i + 7] << 8) | buf[i + 8]
                return "jpeg", w, h
            i += 2 + seg
        raise ImageError("decode", "JPEG without a frame header (SOF) before its image data")
    raise ImageError("decode", f"not a JPEG or PNG image ({n} bytes)")


# What libjpeg and libpng say about image data they decoded anyway (libjpeg: warnings, JWRN_*; libpng: errors)
DECODER_COMPLAINTS = ("Corrupt JPEG data", "Premature end of JPEG", "Invalid JPEG", "Bogus", "Huffman",
                      "JPEG datastream", "Unsupported JPEG", "Warning: unknown JFIF", "libpng error")
_STDERR_LOCK = threading.Lock()


def _capture_file() -> int:
    if hasattr(os, "memfd_create"):
        return os.memfd_create("vla_edge_decode", 0)
    return os.dup(tempfile.TemporaryFile().fileno())


def imdecode_watched(arr: np.ndarray) -> tuple[np.ndarray | None, list[str]]:
    """``cv2.imdecode(arr, IMREAD_COLOR)`` and the decoder's complaints (lines of DECODER_COMPLAINTS it wrote to
    stderr while decoding). Other output of that moment goes on to the real stderr."""
    with _STDERR_LOCK:
        try:
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - a closed sys.stderr: fd 2 is what the decoder writes to anyway
            pass
        cap = _capture_file()
        saved = os.dup(2)
        try:
            os.dup2(cap, 2)
            try:
                img = cv2.imdecode(arr, cv2.IMREAD_COLOR)  # always 8-bit BGR, whatever the source channels
            finally:
                os.dup2(saved, 2)
            os.lseek(cap, 0, os.SEEK_SET)
            text = os.read(cap, 1 << 16).decode("utf-8", "replace")
        finally:
            os.close(saved)
            os.close(cap)
    complaints, other = [], []
    for line in text.splitlines():
        (complaints if any(c in line for c in DECODER_COMPLAINTS) else other).append(line)
    if other:
        try:
            os.write(2, ("\n".join(other) + "\n").encode())
        except OSError:
            pass
    return img, complaints


def decode_compressed(data, fmt: str = "", max_bytes: int | None = None,
                      max_pixels: int | None = None) -> np.ndarray:
    """JPEG/PNG bytes -> uint8 RGB (H, W, 3) full size.  Raises ImageError.  The length and the dimensions
    in the header are checked (absurd sizes, then the caps) before anything is decoded."""
    buf = _bytes_view(data)
    n = len(buf)
    if n == 0:
        raise ImageError("data", "empty compressed image")
    if n > MAX_COMPRESSED_BYTES:
        raise ImageError("size", f"absurd compressed image size {n} bytes")
    check_caps("compressed image", n, None, None, max_bytes, None)
    fmt_l = str(fmt).lower()
    if "compresseddepth" in fmt_l:
        raise ImageError("encoding", f"unsupported compressed format '{fmt}'")
    kind, w, h = compressed_dimensions(buf)
    check_caps(f"{kind} image", None, w, h, None, max_pixels)
    check_size(h, w)
    arr = np.frombuffer(buf, dtype=np.uint8)
    try:
        img, complaints = imdecode_watched(arr)
    except cv2.error as e:
        raise ImageError("decode", f"undecodable compressed image ({fmt or 'no format'}, {n} bytes): {e}") from e
    if complaints:  # pixels came back, but the decoder said the data was corrupt: noise, not a camera frame
        raise ImageError("decode", f"corrupt {kind} data ({fmt or 'no format'}, {n} bytes): {complaints[0].strip()}")
    if img is None or img.size == 0:
        raise ImageError("decode", f"undecodable compressed image ({fmt or 'no format'}, {n} bytes)")
    check_size(img.shape[0], img.shape[1])
    check_caps(f"decoded {kind} image", None, img.shape[1], img.shape[0], None, max_pixels)
    # image_transport writes "<enc>; jpeg compressed <bgr8|rgb8>"; OpenCV always returns BGR here.
    return cv2.cvtColor(img, cv2.COLOR_BGR2RGB)


def compressed_msg_to_rgb(msg, resize: bool = True, max_bytes: int | None = None,
                          max_pixels: int | None = None) -> np.ndarray:
    """sensor_msgs/CompressedImage -> uint8 RGB (64, 128, 3).  Raises ImageError."""
    img = decode_compressed(msg.data, getattr(msg, "format", ""), max_bytes, max_pixels)
    return to_model_frame(img) if resize else img


def rgb_to_image_fields(rgb: np.ndarray, encoding: str = "rgb8") -> dict:
    """Fields for a sensor_msgs/Image carrying ``rgb`` (uint8 H x W x 3) as rgb8 or bgr8."""
    if encoding == "bgr8":
        rgb = cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)
    elif encoding != "rgb8":
        raise ValueError(f"rgb_to_image_fields: encoding must be rgb8 or bgr8, not {encoding}")
    rgb = np.ascontiguousarray(rgb, dtype=np.uint8)
    h, w = rgb.shape[:2]
    return {"height": h, "width": w, "encoding": encoding, "is_bigendian": 0, "step": w * 3, "data": rgb.tobytes()}


def encode_jpeg(rgb: np.ndarray, quality: int = 90) -> bytes:
    ok, buf = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ImageError("decode", "JPEG encoding failed")
    return buf.tobytes()
