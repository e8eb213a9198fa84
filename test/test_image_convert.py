# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""image_convert: camera messages -> uint8 RGB 64x128, and every way a message can be malformed."""

import struct
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vla_edge_ros.constants import FRAME_H, FRAME_W
from vla_edge_ros.image_convert import (
    ENCODINGS,
    ImageError,
    compressed_msg_to_rgb,
    encode_jpeg,
    image_msg_to_rgb,
    rgb_to_image_fields,
    to_model_frame,
)
from vla_edge_ros.nodes.debug_image import DEBUG_SCALE, render_debug


def raw_msg(arr: np.ndarray, encoding: str, step: int | None = None, bigendian: bool = False, pad: int = 0):
    """An Image-like object for ``arr`` (H, W[, C]) with optional row padding."""
    h, w = arr.shape[:2]
    row = arr.reshape(h, -1)
    if bigendian and arr.dtype.itemsize > 1:
        row = row.astype(arr.dtype.newbyteorder(">"))
    rb = row.view(np.uint8).reshape(h, -1)
    if pad:
        rb = np.hstack([rb, np.full((h, pad), 0xAB, np.uint8)])
    return SimpleNamespace(height=h, width=w, encoding=encoding, is_bigendian=int(bigendian),
                           step=rb.shape[1] if step is None else step, data=rb.tobytes())


def gradient(h=48, w=96):
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([(x * 255 // max(1, w - 1)), (y * 255 // max(1, h - 1)), np.full_like(x, 77)], -1).astype(np.uint8)


def test_rgb8_resized_with_area_interpolation():
    rgb = gradient(480, 640)
    out = image_msg_to_rgb(raw_msg(rgb, "rgb8"))
    assert out.shape == (FRAME_H, FRAME_W, 3) and out.dtype == np.uint8 and out.flags.c_contiguous
    np.testing.assert_array_equal(out, cv2.resize(rgb, (FRAME_W, FRAME_H), interpolation=cv2.INTER_AREA))


@pytest.mark.parametrize("enc,conv", [("bgr8", cv2.COLOR_RGB2BGR), ("rgba8", cv2.COLOR_RGB2RGBA),
                                      ("bgra8", cv2.COLOR_RGB2BGRA), ("8UC3", cv2.COLOR_RGB2BGR)])
def test_color_orders_give_the_same_rgb(enc, conv):
    rgb = gradient()
    out = image_msg_to_rgb(raw_msg(cv2.cvtColor(rgb, conv), enc))
    np.testing.assert_array_equal(out, to_model_frame(rgb))


def test_mono8_and_mono16_big_endian():
    g = (np.arange(48 * 96) % 256).astype(np.uint8).reshape(48, 96)
    a = image_msg_to_rgb(raw_msg(g, "mono8"))
    assert (a[..., 0] == a[..., 1]).all() and (a[..., 1] == a[..., 2]).all()
    g16 = g.astype(np.uint16) << 8
    for be in (False, True):
        b = image_msg_to_rgb(raw_msg(g16, "mono16", bigendian=be))
        np.testing.assert_array_equal(a, b)


def test_rgb16_scaled_to_8_bit():
    rgb = gradient()
    out = image_msg_to_rgb(raw_msg(rgb.astype(np.uint16) * 257, "rgb16"))
    np.testing.assert_array_equal(out, to_model_frame(rgb))


def test_padded_rows_are_honoured():
    rgb = gradient(40, 90)
    out = image_msg_to_rgb(raw_msg(rgb, "rgb8", pad=6))
    np.testing.assert_array_equal(out, to_model_frame(rgb))


def test_bayer_and_yuv_decode():
    bayer = np.random.default_rng(0).integers(0, 256, (32, 64), dtype=np.uint8)
    assert image_msg_to_rgb(raw_msg(bayer, "bayer_rggb8")).shape == (FRAME_H, FRAME_W, 3)
    yuv = np.random.default_rng(1).integers(0, 256, (32, 64, 2), dtype=np.uint8)
    assert image_msg_to_rgb(raw_msg(yuv, "yuv422")).shape == (FRAME_H, FRAME_W, 3)


def test_unknown_encoding():
    with pytest.raises(ImageError) as e:
        image_msg_to_rgb(raw_msg(gradient(), "rgb9"))
    assert e.value.kind == "encoding" and "rgb9" in str(e.value)


@pytest.mark.parametrize("h,w", [(0, 10), (10, 0), (0, 0), (100000, 10), (10, 20000), (9000, 9000)])
def test_zero_or_absurd_size(h, w):
    m = SimpleNamespace(height=h, width=w, encoding="rgb8", is_bigendian=0, step=w * 3, data=b"\0" * 30)
    with pytest.raises(ImageError) as e:
        image_msg_to_rgb(m)
    assert e.value.kind == "size"


def test_wrong_step():
    m = raw_msg(gradient(), "rgb8")
    m.step = m.width * 3 - 1
    with pytest.raises(ImageError) as e:
        image_msg_to_rgb(m)
    assert e.value.kind == "step"
    m.step = m.width * 3 * 50  # implausibly large
    with pytest.raises(ImageError) as e:
        image_msg_to_rgb(m)
    assert e.value.kind == "step"


def test_truncated_and_oversized_data():
    m = raw_msg(gradient(), "rgb8")
    good = m.data
    m.data = good[:-100]
    with pytest.raises(ImageError) as e:
        image_msg_to_rgb(m)
    assert e.value.kind == "data" and "truncated" in str(e.value)
    m.data = good + b"x" * 10
    with pytest.raises(ImageError) as e:
        image_msg_to_rgb(m)
    assert e.value.kind == "data"
    m.data = b""
    with pytest.raises(ImageError):
        image_msg_to_rgb(m)


def test_compressed_jpeg_and_png():
    rgb = gradient(240, 320)
    out = compressed_msg_to_rgb(SimpleNamespace(format="jpeg", data=encode_jpeg(rgb, 95)))
    ref = to_model_frame(rgb)
    assert out.shape == (FRAME_H, FRAME_W, 3)
    assert np.abs(out.astype(int) - ref.astype(int)).mean() < 3.0  # JPEG loss only, channel order right
    ok, png = cv2.imencode(".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    np.testing.assert_array_equal(compressed_msg_to_rgb(SimpleNamespace(format="png", data=png.tobytes())), ref)


@pytest.mark.parametrize("payload", [b"", b"\xff\xd8\xff\xe0garbage", bytes(range(256)) * 4,
                                     b"\x89PNG\r\n\x1a\n" + b"\0" * 20])
def test_garbage_compressed(payload):
    with pytest.raises(ImageError) as e:
        compressed_msg_to_rgb(SimpleNamespace(format="jpeg", data=payload))
    assert e.value.kind in ("decode", "data")


def test_truncated_jpeg_is_error_or_valid_frame():
    # libjpeg may decode a truncated stream partially (grey tail): that is still a valid frame.
    blob = encode_jpeg(gradient(240, 320))
    for cut in (10, 100, len(blob) // 2):
        try:
            out = compressed_msg_to_rgb(SimpleNamespace(format="jpeg", data=blob[:cut]))
        except ImageError:
            continue
        assert out.shape == (FRAME_H, FRAME_W, 3)


def test_rclpy_style_array_data():
    import array

    rgb = gradient()
    m = raw_msg(rgb, "rgb8")
    m.data = array.array("B", m.data)
    np.testing.assert_array_equal(image_msg_to_rgb(m), to_model_frame(rgb))


def test_rgb_to_image_fields_roundtrip():
    rgb = gradient()
    for enc in ("rgb8", "bgr8"):
        f = rgb_to_image_fields(rgb, enc)
        np.testing.assert_array_equal(image_msg_to_rgb(SimpleNamespace(**f)), to_model_frame(rgb))


def test_render_debug_shape():
    frame = gradient(FRAME_H, FRAME_W)
    img = render_debug(frame, [frame[::2, ::2]] * 20, np.linspace(-1, 1, 8), -1.0, 1.0, "model:fresh",
                       ["a"] * 8)
    assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[1] == FRAME_W * DEBUG_SCALE
    assert render_debug(None, [], np.zeros(8), -1.0, 1.0).shape[1] == FRAME_W * DEBUG_SCALE
    assert img.nbytes <= 3 * 64 * 1024  # at most 3 UDP fragments: it goes out best effort


# --- property tests ------------------------------------------------------------------------------

ENC_LIST = sorted(ENCODINGS)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    h=st.integers(1, 70), w=st.integers(1, 150), enc=st.sampled_from(ENC_LIST), pad=st.integers(0, 9),
    be=st.booleans(), seed=st.integers(0, 2**31 - 1),
)
def test_valid_messages_always_give_a_model_frame(h, w, enc, pad, be, seed):
    dtype, ch = ENCODINGS[enc]
    if enc.startswith("bayer_"):
        h, w = max(h, 2), max(w, 2)
    if ch == 2:
        w += w % 2
    if dtype.itemsize > 1:
        pad -= pad % dtype.itemsize
    rng = np.random.default_rng(seed)
    shape = (h, w) if ch == 1 else (h, w, ch)
    arr = rng.integers(0, np.iinfo(dtype).max, shape, dtype=dtype, endpoint=True)
    out = image_msg_to_rgb(raw_msg(arr, enc, bigendian=be, pad=pad))
    assert out.shape == (FRAME_H, FRAME_W, 3) and out.dtype == np.uint8


@settings(max_examples=200, deadline=None)
@given(
    h=st.integers(-3, 40), w=st.integers(-3, 40), enc=st.one_of(st.sampled_from(ENC_LIST), st.text(max_size=8)),
    step=st.integers(-10, 400), n=st.integers(0, 6000), be=st.integers(0, 1),
)
def test_arbitrary_headers_never_raise_anything_but_image_error(h, w, enc, step, n, be):
    m = SimpleNamespace(height=h, width=w, encoding=enc, is_bigendian=be, step=step, data=bytes(n))
    try:
        out = image_msg_to_rgb(m)
    except ImageError as e:
        assert e.kind in ("encoding", "size", "step", "data", "decode", "too_large")
    else:
        assert out.shape == (FRAME_H, FRAME_W, 3) and out.dtype == np.uint8


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=2000), fmt=st.sampled_from(["jpeg", "png", "", "rgb8; jpeg compressed bgr8"]))
def test_arbitrary_compressed_bytes_never_raise_anything_but_image_error(data, fmt):
    try:
        out = compressed_msg_to_rgb(SimpleNamespace(format=fmt, data=data))
    except ImageError:
        pass
    else:
        assert out.shape == (FRAME_H, FRAME_W, 3)


# --- size caps before conversion, decompression bombs (issue 13.4, 13.5) ------------------------------------

def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    import zlib

    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def png_bomb(side: int = 30000) -> bytes:
    """A valid side x side 1-bit greyscale PNG of zeros, made by hand: ~100 KB that decodes (to 8-bit BGR, as
    cv2.IMREAD_COLOR does) into side * side * 3 bytes. The image is never allocated here."""
    import zlib

    row = b"\0" * (1 + (side + 7) // 8)  # filter byte + the packed bits
    comp = zlib.compressobj(9)
    idat = b"".join(comp.compress(row) for _ in range(side)) + comp.flush()
    ihdr = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat) + _png_chunk(b"IEND", b"")


def test_header_dimensions_of_png_and_jpeg():
    from vla_edge_ros.image_convert import compressed_dimensions

    rgb = gradient(240, 320)
    assert compressed_dimensions(encode_jpeg(rgb)) == ("jpeg", 320, 240)
    ok, png = cv2.imencode(".png", rgb)
    assert compressed_dimensions(png.tobytes()) == ("png", 320, 240)
    # a progressive JPEG behind a large APP segment (EXIF-like): the walk skips segments by their length
    ok, prog = cv2.imencode(".jpg", rgb, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])
    prog = prog.tobytes()
    app1 = b"\xff\xe1" + struct.pack(">H", 2 + 5000) + b"x" * 5000
    assert compressed_dimensions(prog[:2] + app1 + prog[2:]) == ("jpeg", 320, 240)
    for bad in (b"\xff\xd8\xff\xda\x00\x02", b"\xff\xd8\x00\x00\x00\x00", b"GIF89a" + b"\0" * 20):
        with pytest.raises(ImageError) as e:
            compressed_dimensions(bad)
        assert e.value.kind == "decode"


def test_decompression_bomb_is_refused_from_its_header_before_decoding():
    import time

    bomb = png_bomb()
    assert len(bomb) < 1_000_000
    t = time.monotonic()
    with pytest.raises(ImageError) as e:
        compressed_msg_to_rgb(SimpleNamespace(format="png", data=bomb), max_pixels=4096 * 4096)
    took = time.monotonic() - t
    assert e.value.kind == "too_large" and "30000x30000" in str(e.value) and "max_image_pixels" in str(e.value)
    assert took < 0.05, took  # decoding would allocate 2.7 GB and take seconds


def test_decompression_bomb_is_refused_with_the_default_caps():
    """Without explicit caps the absurd-size limits still refuse it before decoding."""
    import time

    bomb = png_bomb(20000)
    t = time.monotonic()
    with pytest.raises(ImageError) as e:
        compressed_msg_to_rgb(SimpleNamespace(format="png", data=bomb))
    assert e.value.kind == "size" and time.monotonic() - t < 0.05  # 20000 > MAX_SIDE, seen in the header


def test_the_pixel_cap_admits_what_fits():
    ok, png = cv2.imencode(".png", gradient(240, 320))
    msg = SimpleNamespace(format="png", data=png.tobytes())
    assert compressed_msg_to_rgb(msg, max_pixels=320 * 240).shape == (FRAME_H, FRAME_W, 3)
    with pytest.raises(ImageError) as e:
        compressed_msg_to_rgb(msg, max_pixels=320 * 240 - 1)
    assert e.value.kind == "too_large"
    with pytest.raises(ImageError) as e:
        compressed_msg_to_rgb(msg, max_bytes=len(png) - 1)
    assert e.value.kind == "too_large" and "max_image_bytes" in str(e.value)


def test_raw_caps_are_checked_before_conversion():
    m = raw_msg(gradient(240, 320), "rgb8")
    assert image_msg_to_rgb(m, max_bytes=240 * 320 * 3, max_pixels=240 * 320).shape == (FRAME_H, FRAME_W, 3)
    with pytest.raises(ImageError) as e:
        image_msg_to_rgb(m, max_bytes=240 * 320 * 3 - 1)
    assert e.value.kind == "too_large" and "max_image_bytes" in str(e.value)
    with pytest.raises(ImageError) as e:
        image_msg_to_rgb(m, max_pixels=240 * 320 - 1)
    assert e.value.kind == "too_large" and "max_image_pixels" in str(e.value)


def test_an_8k_rgb8_frame_is_refused_by_the_default_caps_without_converting_it():
    from vla_edge_ros import settings as P
    from vla_edge_ros.image_convert import DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_IMAGE_PIXELS

    d = P.defaults(P.CAMERA_SPECS)
    assert (d["max_image_bytes"], d["max_image_pixels"]) == (DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_IMAGE_PIXELS)
    big = SimpleNamespace(height=4320, width=7680, encoding="rgb8", is_bigendian=0, step=7680 * 3,
                          data=memoryview(bytearray(7680 * 4320 * 3)))
    with pytest.raises(ImageError) as e:
        image_msg_to_rgb(big, max_bytes=d["max_image_bytes"], max_pixels=d["max_image_pixels"])
    assert e.value.kind == "too_large"
    uhd = SimpleNamespace(height=2160, width=3840, encoding="rgb8", is_bigendian=0, step=3840 * 3,
                          data=bytes(3840 * 2160 * 3))
    assert image_msg_to_rgb(uhd, max_bytes=d["max_image_bytes"], max_pixels=d["max_image_pixels"]).shape == \
        (FRAME_H, FRAME_W, 3)


# --- issue 30.4: valid headers, garbage data -------------------------------------------------------------------

def garbage_jpeg(h=540, w=960, no_ff=False, seed=0) -> bytes:
    """A real JPEG's headers (SOI .. SOS) followed by random entropy-coded data and EOI."""
    rng = np.random.default_rng(seed)
    blob = bytearray(encode_jpeg(gradient(h, w), 90))
    i = blob.index(b"\xff\xda")
    start = i + 2 + ((blob[i + 2] << 8) | blob[i + 3])
    body = rng.integers(0, 256, len(blob) - start - 2, dtype=np.uint8)
    if no_ff:  # no byte that could read as a marker: only the Huffman decoding can tell
        body[body == 0xFF] = 0x12
    return bytes(blob[:start]) + body.tobytes() + b"\xff\xd9"


def garbage_png(h=240, w=320, zlib_valid=False, seed=0) -> bytes:
    import zlib

    rng = np.random.default_rng(seed)
    ok, png = cv2.imencode(".png", gradient(h, w))
    png = png.tobytes()
    ihdr_end = png.index(b"IHDR") + 4 + 13 + 4
    raw = rng.integers(0, 256, h * (w * 3 + 1), dtype=np.uint8).tobytes()
    data = zlib.compress(raw) if zlib_valid else raw[:len(raw) // 4]
    chunk = struct.pack(">I", len(data)) + b"IDAT" + data + struct.pack(">I", zlib.crc32(b"IDAT" + data) & 0xFFFFFFFF)
    return png[:ihdr_end] + chunk + png[-12:]


@pytest.mark.parametrize("make", [lambda: garbage_jpeg(), lambda: garbage_jpeg(no_ff=True),
                                  lambda: garbage_jpeg(64, 128, seed=3), lambda: garbage_png(),
                                  lambda: garbage_png(zlib_valid=True)],
                         ids=["jpeg", "jpeg_no_ff", "jpeg_small", "png", "png_zlib_valid"])
def test_valid_headers_with_garbage_data_are_invalid_decode(make, capfd):
    """cv2.imdecode returns a full-size array for a JPEG whose data is noise; the decoder's own complaint makes it
    invalid (kind decode), and what it said does not leak to stderr."""
    with pytest.raises(ImageError) as e:
        compressed_msg_to_rgb(SimpleNamespace(format="jpeg", data=make()))
    assert e.value.kind == "decode", e.value
    assert "Corrupt JPEG" not in capfd.readouterr().err


def test_good_images_decode_without_complaints_and_other_stderr_passes_through(capfd):
    from vla_edge_ros.image_convert import imdecode_watched

    for blob in (encode_jpeg(gradient(540, 960), 90), encode_jpeg(gradient(64, 128), 50),
                 cv2.imencode(".png", gradient(240, 320))[1].tobytes()):
        img, complaints = imdecode_watched(np.frombuffer(blob, np.uint8))
        assert img is not None and complaints == []
    if UDACITY_JPEGS:
        for blob in UDACITY_JPEGS:
            compressed_msg_to_rgb(SimpleNamespace(format="jpeg", data=blob))


def _udacity_jpegs(n=20):
    from pathlib import Path

    bag = Path("/work/shared/data/bags/udacity_solidWhiteRight_jpeg")
    if not bag.exists():
        return []
    try:
        from rosbags.highlevel import AnyReader
        from rosbags.typesys import Stores, get_typestore
    except ImportError:
        return []
    out = []
    with AnyReader([bag], default_typestore=get_typestore(Stores.ROS2_JAZZY)) as r:
        for c, _, raw in r.messages():
            out.append(bytes(r.deserialize(raw, c.msgtype).data))
            if len(out) >= n:
                break
    return out


UDACITY_JPEGS = _udacity_jpegs()
