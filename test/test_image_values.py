# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Pixel values, not only shapes: Bayer and YUV 4:2:2 decoding and the ~/debug_image picture, from inputs
whose right answer is known (image_convert.py, DESIGN.md §3/§8).

- Bayer: a mosaic sampled from a uniform colour in the ROS pattern's layout must demosaic to that colour
  everywhere; a pattern mapped to the wrong OpenCV code swaps red and blue (or mixes in green).
- YUV 4:2:2: ROS `uyvy`/`yuv422` (U Y0 V Y1) and `yuyv`/`yuv422_yuy2` (Y0 U Y1 V) bytes of known Y, U, V
  must give the BT.601 limited-range RGB (the convention of OpenCV's conversion, which ROS drivers use),
  per pixel: two pixels sharing U/V but with different Y differ only by luma.
- Debug image: the frame scaled x4 by nearest neighbour, the retained-frame thumbnails at their places,
  and the action bars (green up for positive, red down for negative, length by value / full scale).
"""
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("cv2")

from vla_edge_ros.constants import FRAME_H, FRAME_W  # noqa: E402
from vla_edge_ros.image_convert import image_msg_to_rgb  # noqa: E402
from vla_edge_ros.nodes.debug_image import render_debug  # noqa: E402

RGB = (200, 100, 30)
# Colour index (0 R, 1 G, 2 B) at [row % 2][col % 2] for each ROS Bayer pattern: the name reads row 0 then row 1.
BAYER = {"rggb": [[0, 1], [1, 2]], "bggr": [[2, 1], [1, 0]], "gbrg": [[1, 2], [0, 1]], "grbg": [[1, 0], [2, 1]]}


def image_msg(arr: np.ndarray, encoding: str):
    arr = np.ascontiguousarray(arr)
    return SimpleNamespace(height=arr.shape[0], width=arr.shape[1], encoding=encoding, is_bigendian=0,
                           step=arr.strides[0], data=arr.tobytes())


def bayer_mosaic(pattern: str, h: int, w: int, rgb=RGB) -> np.ndarray:
    layout = np.array(BAYER[pattern])
    channel = layout[np.arange(h)[:, None] % 2, np.arange(w)[None, :] % 2]
    return np.asarray(rgb, np.uint8)[channel]


@pytest.mark.parametrize("pattern", sorted(BAYER))
def test_bayer_uniform_colour_demosaics_to_that_colour(pattern):
    out = image_msg_to_rgb(image_msg(bayer_mosaic(pattern, 8, 12), f"bayer_{pattern}8"), resize=False)
    assert out.shape == (8, 12, 3)
    assert np.array_equal(np.unique(out.reshape(-1, 3), axis=0), [RGB]), np.unique(out.reshape(-1, 3), axis=0)


@pytest.mark.parametrize("pattern", sorted(BAYER))
def test_bayer_model_frame_keeps_the_colour(pattern):
    out = image_msg_to_rgb(image_msg(bayer_mosaic(pattern, 2 * FRAME_H, 2 * FRAME_W), f"bayer_{pattern}8"))
    assert out.shape == (FRAME_H, FRAME_W, 3)
    assert np.all(out == np.asarray(RGB, np.uint8))


def bt601_limited(y, u, v):
    """ITU-R BT.601, limited range (Y 16-235, chroma centred on 128) -> RGB, clipped to 0-255."""
    c, d, e = 1.164 * (y - 16.0), u - 128.0, v - 128.0
    rgb = np.array([c + 1.596 * e, c - 0.392 * d - 0.813 * e, c + 2.017 * d])
    return np.clip(rgb, 0, 255)


Y0, Y1, U, V = 70, 170, 100, 160


def yuv_pairs(order: str, h: int = 4, pairs: int = 4) -> np.ndarray:
    """h rows of `pairs` pixel pairs; every pair has luma Y0 (left) and Y1 (right), chroma U, V."""
    word = {"uyvy": [U, Y0, V, Y1], "yuyv": [Y0, U, Y1, V]}[order]
    return np.tile(np.asarray(word, np.uint8), (h, pairs)).reshape(h, 2 * pairs, 2)


@pytest.mark.parametrize("encoding, order", [("uyvy", "uyvy"), ("yuv422", "uyvy"), ("yuyv", "yuyv"),
                                             ("yuv422_yuy2", "yuyv")])
def test_yuv422_known_values(encoding, order):
    out = image_msg_to_rgb(image_msg(yuv_pairs(order), encoding), resize=False).astype(np.float64)
    assert out.shape == (4, 8, 3)
    left, right = bt601_limited(Y0, U, V), bt601_limited(Y1, U, V)
    assert np.abs(out[:, 0::2] - left).max() <= 2.0, (out[0, 0], left)
    assert np.abs(out[:, 1::2] - right).max() <= 2.0, (out[0, 1], right)
    assert np.all(out[:, 1::2] > out[:, 0::2] + 50)  # the brighter pixel of each pair is the right one


# --------------------------------------------------------------------------------------------
# debug image
# --------------------------------------------------------------------------------------------

SCALE = 4
W = FRAME_W * SCALE
TOP_H, STRIP_H, BAR_H = FRAME_H * SCALE, FRAME_H // 2 + 4, 60
TH_H, TH_W = FRAME_H // 2, FRAME_W // 2
GREEN, RED, BAR_BG, STRIP_BG = (60, 200, 80), (220, 60, 60), (15, 15, 15), (30, 30, 30)


def test_debug_image_frame_is_the_frame_scaled_by_nearest_neighbour():
    frame = np.random.default_rng(0).integers(0, 256, (FRAME_H, FRAME_W, 3), dtype=np.uint8)
    img = render_debug(frame, [], np.zeros(8, np.float32), -1.0, 1.0, scale=SCALE)
    assert img.shape == (TOP_H + STRIP_H + BAR_H, W, 3) and img.dtype == np.uint8
    assert np.array_equal(img[:TOP_H], np.repeat(np.repeat(frame, SCALE, axis=0), SCALE, axis=1))


def test_debug_image_without_frame_is_black_on_top():
    img = render_debug(None, [], np.zeros(8, np.float32), -1.0, 1.0, scale=SCALE)
    assert not img[:TOP_H].any()


def test_debug_image_retained_strip_shows_the_newest_thumbnails_in_order():
    n_fit = W // (TH_W + 2)  # 7 thumbnails of 64 px (+2 px gap) fit 512 px
    thumbs = [np.full((TH_H, TH_W, 3), 10 * (i + 1), np.uint8) for i in range(n_fit + 2)]
    img = render_debug(None, thumbs, np.zeros(8, np.float32), -1.0, 1.0, scale=SCALE)
    strip = img[TOP_H:TOP_H + STRIP_H]
    for slot, th in enumerate(thumbs[-n_fit:]):  # the two oldest do not fit
        x = 2 + slot * (TH_W + 2)
        assert np.array_equal(strip[2:2 + TH_H, x:x + TH_W], th), f"thumbnail {slot}"
    assert np.all(strip[0:2] == STRIP_BG) and np.all(strip[2:2 + TH_H, 0:2] == STRIP_BG)
    assert np.all(strip[2:2 + TH_H, 2 + TH_W:4 + TH_W] == STRIP_BG)  # the gap between thumbnails


def test_debug_image_action_bars_by_sign_and_size():
    low, high = -2.0, 2.0  # full scale 2: a value of 1 draws half the bar height
    action = np.array([2.0, 1.0, -1.0, -2.0, 0.0, 5.0, -5.0, 0.5], np.float32)
    img = render_debug(None, [], action, low, high, scale=SCALE)
    bar = img[TOP_H + STRIP_H:]
    mid, reach = BAR_H // 2, BAR_H // 2 - 12  # zero line, bar length at full scale
    bw = W // len(action)
    for i, v in enumerate(action):
        x = i * bw + bw // 2 + 10  # inside the bar, right of the value text
        length = int(round(np.clip(v / 2.0, -1, 1) * reach))
        column = bar[:, x]
        if length > 0:
            assert np.all(column[mid - length:mid] == GREEN), (i, v)
            assert np.all(column[mid - length - 2] == BAR_BG) and np.all(column[mid + 2] == BAR_BG), (i, v)
        elif length < 0:
            assert np.all(column[mid + 1:mid - length] == RED), (i, v)
            assert np.all(column[mid - 2] == BAR_BG) and np.all(column[mid - length + 2] == BAR_BG), (i, v)
        else:
            assert np.all(column[mid - 3] == BAR_BG) and np.all(column[mid + 3] == BAR_BG), (i, v)
    # Clipped at full scale: 5 draws what 2 draws.
    assert np.array_equal(bar[:, 5 * bw + bw // 2 + 10], bar[:, 0 * bw + bw // 2 + 10])
    assert np.array_equal(bar[:, 6 * bw + bw // 2 + 10], bar[:, 3 * bw + bw // 2 + 10])
