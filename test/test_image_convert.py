"""image_convert: camera messages -> uint8 RGB 64x128, and every way a message can be malformed."""

from types import SimpleNamespace

import cv2
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vla_edge_ros.constants import FRAME_H, FRAME_W
from vla_edge_ros.nodes.image_convert import (
    ENCODINGS,
    ImageError,
    compressed_msg_to_rgb,
    encode_jpeg,
    image_msg_to_rgb,
    render_debug,
    rgb_to_image_fields,
    to_model_frame,
)


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
    assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[1] == FRAME_W * 4
    assert render_debug(None, [], np.zeros(8), -1.0, 1.0).shape[1] == FRAME_W * 4


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
        assert e.kind in ("encoding", "size", "step", "data", "decode")
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
