# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Frame quality: is the camera seeing anything?  Checked once per frame in the camera process (DESIGN.md §17).

ROS-free and model-free: the camera node, the bench and the tests call it.  A frame (uint8 RGB, any size) is
reduced once to a 160 x 120 gray image (gray, then an OpenCV bilinear resize), cut into 5 x 5 blocks, and each block
gets its mean, its share of black pixels (``<= black_level``), its mean |Laplacian| and |gradient|.  Like Autoware's
image_diagnostics, the frame checks count blocks:

* ``dark``: at least ``dark_blocks`` blocks whose mean is under ``dark_mean`` (a dim scene, a light gone out);
* ``blocked``: at least ``blocked_blocks`` blocks that are nearly all black pixels (share over ``blocked_ratio``):
  a lens cap, a hand, a part of the robot in front of the lens;
* ``overexposed``: at least ``overexposed_blocks`` blocks whose mean is over ``overexposed_mean`` (backlight, a
  blown-out sensor);
* ``blur``: over the exposed blocks (neither dark, blocked nor over-exposed) that hold an edge (mean |gradient| at
  least ``EDGE_GRADIENT``), the sum of |Laplacian| over the sum of |gradient| under ``blur_detail``.  The ratio is the
  inverse width of the view's edges: a defocused lens widens every edge, whatever the contrast or the light, so it
  falls (road clip 0.92-0.96, bikes clip 0.39-0.92 as recorded; a Gaussian blur of sigma 5 px at 640 x 480 gives
  at most 0.31).  Exposed blocks but no edge anywhere (fog, a painted-over lens, a uniform image) fail too; a frame
  with fewer than ``MIN_EXPOSED`` exposed blocks is left to the exposure checks;
* ``frozen``: the sensor repeating itself: the frame's bytes identical to the previous frame's (the small gray images
  are compared first; only when they are equal are the full frames), or a header stamp (non-zero) equal to the
  previous one, for ``frozen_frames`` frames in a row.  A still scene is not frozen: a live sensor's noise changes
  its bytes (a noiseless renderer, such as the synthetic clip here at 60 Hz, repeats a frame now and then: one
  repeat is not a frozen sensor).

Hysteresis (``QualityGate``): a check trips after ``trip_frames`` failing frames in a row and clears after
``clear_frames`` passing frames in a row, so a flicker does not toggle the robot.  A frame that fails a check that
has not tripped yet is still never admitted by the loop (it repeats the last model action instead): only the
fallback waits for the hysteresis.

What travels with the frame (``FrameBuffer.publish(..., quality=...)``): ``QualityResult.word()`` (tripped checks,
failing checks, a "checked" flag) and ``QualityResult.blocks`` (25 bytes, the failures of each block: ``BLOCK_*``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import cv2
import numpy as np

CHECKS = ("frozen", "blocked", "dark", "overexposed", "blur")  # the order names are reported in
CHECK_BIT = {c: 1 << i for i, c in enumerate(CHECKS)}
GRID = 5  # blocks per side
SMALL_W, SMALL_H = 160, 120  # the gray image the checks read (32 x 24 pixel blocks)
MIN_EXPOSED = 3  # blur is judged on a frame with at least this many exposed blocks (and edge blocks)
EDGE_GRADIENT = 2.0  # a block whose mean |gradient| (gray levels a pixel) is under this has no edge: flat
# a block's failures, one byte a block (the block map in /diagnostics and the debug image)
BLOCK_DARK, BLOCK_BLOCKED, BLOCK_OVEREXPOSED, BLOCK_FLAT = 1, 2, 4, 8
BLOCK_BITS = {"dark": BLOCK_DARK, "blocked": BLOCK_BLOCKED, "overexposed": BLOCK_OVEREXPOSED, "blur": BLOCK_FLAT}
CHECKED_BIT = 1 << 16  # in word(): the frame was checked (a frame without it was published with no result)


@dataclass(frozen=True)
class QualitySettings:
    """Thresholds of the checks (the camera node's ``frame_quality_*`` parameters; settings.py has the table)."""

    checks: tuple[str, ...] = CHECKS  # the checks switched on (empty: none)
    dark_mean: float = 10.0  # a block whose gray mean is under this is dark (Autoware: 10)
    dark_blocks: int = 15  # dark blocks (of 25) for the frame to be dark
    black_level: int = 10  # a pixel at or under this gray level is black
    blocked_ratio: float = 0.9  # a block with more black pixels than this share is blocked (Autoware: 0.9)
    blocked_blocks: int = 8  # blocked blocks for the frame to be blocked (a third of the view)
    overexposed_mean: float = 230.0  # a block whose mean is over this is over-exposed (Autoware backlight: 230)
    overexposed_blocks: int = 15  # over-exposed blocks for the frame to be over-exposed
    blur_detail: float = 0.34  # sum |Laplacian| / sum |gradient| over the exposed edge blocks under this: blur
    frozen_frames: int = 2  # frames in a row the same as their predecessor (bytes or stamp) for frozen to fail
    trip_frames: int = 2  # failing frames in a row that trip a check
    clear_frames: int = 2  # passing frames in a row that clear a tripped check

    @classmethod
    def from_values(cls, values: dict) -> "QualitySettings":
        """From the camera node's parameters (``frame_quality_<field>``; ``frame_quality_checks`` a list)."""
        kw = {}
        for f in dataclasses.fields(cls):
            key = f"frame_quality_{f.name}"
            if key in values:
                kw[f.name] = tuple(values[key]) if f.name == "checks" else values[key]
        return cls(**kw)


def check_settings(s: QualitySettings) -> list[str]:
    """Problems with a settings object (empty: fine); the ranges are the settings table's."""
    bad = [c for c in s.checks if c not in CHECKS]
    return [f"frame_quality_checks: {', '.join(bad)} not one of {', '.join(CHECKS)}"] if bad else []


def names(mask: int) -> str:
    """The checks of a bit mask, comma-separated in CHECKS order ("" for none)."""
    return ",".join(c for c in CHECKS if mask & CHECK_BIT[c])


def unpack_word(word: int) -> tuple[int, int, bool]:
    """(tripped mask, failing mask, checked) from a QualityResult.word()."""
    return int(word) & 0xFF, (int(word) >> 8) & 0xFF, bool(int(word) & CHECKED_BIT)


@dataclass
class QualityResult:
    """One frame's verdict.  ``failed``: the checks this frame fails; ``tripped``: the checks tripped after the
    hysteresis (what refuses frames until cleared); ``blocks``: 25 bytes of BLOCK_* bits, row-major."""

    failed: int = 0
    tripped: int = 0
    blocks: bytes = bytes(GRID * GRID)
    mean: float = float("nan")  # the gray image's mean
    detail: float = float("nan")  # the blur measure (nan: fewer than MIN_EXPOSED exposed blocks)
    block_counts: dict = field(default_factory=dict)  # failing blocks by kind

    def word(self) -> int:
        return self.tripped | (self.failed << 8) | CHECKED_BIT

    @property
    def ok(self) -> bool:
        return not (self.failed or self.tripped)


def small_gray(rgb: np.ndarray) -> np.ndarray:
    """uint8 RGB (H, W, 3) of any size -> uint8 gray (SMALL_H, SMALL_W): gray, then a bilinear resize (its cost
    does not grow with the frame as an area resize's does: 0.11 ms from 640 x 480 against 0.46 ms; gray first is
    0.03 ms cheaper than after, and differs by at most one gray level)."""
    gray = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
    if gray.shape[0] != SMALL_H or gray.shape[1] != SMALL_W:
        gray = cv2.resize(gray, (SMALL_W, SMALL_H), interpolation=cv2.INTER_LINEAR)
    return gray


def _blocks(a: np.ndarray) -> np.ndarray:
    """Block means (GRID x GRID) of a float32 (SMALL_H, SMALL_W) image: an area resize by whole blocks is exact."""
    return cv2.resize(a, (GRID, GRID), interpolation=cv2.INTER_AREA)


def block_stats(gray: np.ndarray, black_level: int) -> tuple[np.ndarray, ...]:
    """Per block (GRID x GRID): the mean, the share of pixels <= black_level, the mean |Laplacian| and the mean
    |gradient| (|d/dx| + |d/dy|, central differences)."""
    g = gray.astype(np.float32)
    black = cv2.threshold(g, float(black_level), 1.0, cv2.THRESH_BINARY_INV)[1]
    lap = np.abs(cv2.Laplacian(g, cv2.CV_32F, ksize=1))
    grad = cv2.add(np.abs(cv2.Sobel(g, cv2.CV_32F, 1, 0, ksize=1)), np.abs(cv2.Sobel(g, cv2.CV_32F, 0, 1, ksize=1)))
    return _blocks(g), _blocks(black), _blocks(lap), _blocks(grad)


def assess(gray: np.ndarray, s: QualitySettings) -> QualityResult:
    """The block checks of one small gray image (no history: frozen is QualityGate's).  Each block count is taken
    once: on 5 x 5 arrays every NumPy call costs more than its arithmetic."""
    means, black, lap, grad = block_stats(gray, s.black_level)
    dark = means < s.dark_mean
    blocked = black > s.blocked_ratio
    over = means > s.overexposed_mean
    exposed = ~(dark | blocked | over)
    edges = exposed & (grad >= EDGE_GRADIENT)
    flat = exposed & ~edges
    n_dark, n_blocked, n_over = int(np.count_nonzero(dark)), int(np.count_nonzero(blocked)), int(np.count_nonzero(over))
    n_exposed, n_edges = int(np.count_nonzero(exposed)), int(np.count_nonzero(edges))
    on = s.checks
    failed = 0
    if "dark" in on and n_dark >= s.dark_blocks:
        failed |= CHECK_BIT["dark"]
    if "blocked" in on and n_blocked >= s.blocked_blocks:
        failed |= CHECK_BIT["blocked"]
    if "overexposed" in on and n_over >= s.overexposed_blocks:
        failed |= CHECK_BIT["overexposed"]
    sharp = float("nan")  # fewer than MIN_EXPOSED exposed blocks: the exposure checks speak for the frame
    if n_exposed >= MIN_EXPOSED:
        sharp = float(lap[edges].sum() / grad[edges].sum()) if n_edges >= MIN_EXPOSED else 0.0
    if "blur" in on and sharp == sharp and sharp < s.blur_detail:
        failed |= CHECK_BIT["blur"]
    bits = (dark * BLOCK_DARK) | (blocked * BLOCK_BLOCKED) | (over * BLOCK_OVEREXPOSED) | (flat * BLOCK_FLAT)
    counts = {"dark": n_dark, "blocked": n_blocked, "overexposed": n_over, "blur": n_exposed - n_edges}
    return QualityResult(failed=failed, blocks=bits.astype(np.uint8).tobytes(), mean=float(means.mean()),
                         detail=sharp, block_counts=counts)


class QualityGate:
    """The checks of a stream of frames, with the frozen check's memory and the hysteresis.  One per camera.

    ``update(rgb, stamp_ns)`` returns the frame's QualityResult; ``failed_frames`` / ``trips`` count per check
    (cumulative), ``tripped`` is the current mask."""

    def __init__(self, settings: QualitySettings | None = None):
        self.settings = settings or QualitySettings()
        problems = check_settings(self.settings)
        if problems:
            raise ValueError("; ".join(problems))
        self._prev_rgb: np.ndarray | None = None
        self._prev_gray: np.ndarray | None = None
        self._prev_stamp = 0
        self._same_run = 0  # frames in a row the same as their predecessor
        self._bad_run = {c: 0 for c in CHECKS}
        self._good_run = {c: 0 for c in CHECKS}
        self.tripped = 0
        self.frames = 0
        self.failed_frames = {c: 0 for c in CHECKS}
        self.trips = {c: 0 for c in CHECKS}
        self.refused_frames = 0  # frames with a tripped check
        self.last: QualityResult | None = None

    def frozen(self, rgb: np.ndarray, gray: np.ndarray, stamp_ns: int) -> bool:
        same_stamp = stamp_ns != 0 and stamp_ns == self._prev_stamp
        same_bytes = (self._prev_gray is not None and np.array_equal(gray, self._prev_gray)
                      and self._prev_rgb.shape == rgb.shape and np.array_equal(rgb, self._prev_rgb))
        return same_stamp or same_bytes

    def update(self, rgb: np.ndarray, stamp_ns: int = 0) -> QualityResult:
        """Check one frame (uint8 RGB, any size; ``stamp_ns``: its header stamp, 0 when it has none).  The gate
        keeps a reference to ``rgb`` for the next frame's frozen check: pass a frame nobody writes into later."""
        s = self.settings
        gray = small_gray(rgb)
        res = assess(gray, s)
        if "frozen" in s.checks:
            self._same_run = self._same_run + 1 if self.frozen(rgb, gray, int(stamp_ns)) else 0
            if self._same_run >= s.frozen_frames:
                res.failed |= CHECK_BIT["frozen"]
        self._prev_rgb, self._prev_gray, self._prev_stamp = rgb, gray, int(stamp_ns)
        for c in CHECKS:
            bit = CHECK_BIT[c]
            if res.failed & bit:
                self.failed_frames[c] += 1
                self._bad_run[c] += 1
                self._good_run[c] = 0
                if not self.tripped & bit and self._bad_run[c] >= s.trip_frames:
                    self.tripped |= bit
                    self.trips[c] += 1
            else:
                self._good_run[c] += 1
                self._bad_run[c] = 0
                if self.tripped & bit and (self._good_run[c] >= s.clear_frames or c not in s.checks):
                    self.tripped &= ~bit
        self.frames += 1
        res.tripped = self.tripped
        self.refused_frames += bool(res.tripped)
        self.last = res
        return res

    def counts(self) -> dict:
        """Cumulative counts for the reports: frames, refused frames, failing frames and trips per check."""
        out = {"frames": self.frames, "refused_frames": self.refused_frames}
        for c in CHECKS:
            out[f"failed_{c}"] = self.failed_frames[c]
            out[f"trips_{c}"] = self.trips[c]
        return out


# --- degradations (the bench's and the tests' blind cameras, made from real frames) --------------------------------

DEGRADATIONS = ("dim", "lens_cap", "overexposed", "half_covered", "blur", "repeat")
EXPECTED = {"dim": "dark", "lens_cap": "blocked", "overexposed": "overexposed", "half_covered": "blocked",
            "blur": "blur", "repeat": "frozen"}  # the check each degradation must trip (others may trip too)
BLUR_SIGMA_640 = 5.0  # the blur degradation's Gaussian sigma at 640 pixels wide (scaled with the frame)


def _noise(shape, rng, mean: float = 4.0, sd: float = 3.0) -> np.ndarray:
    return np.clip(rng.normal(mean, sd, shape), 0, 255).astype(np.uint8)


def degrade(rgb: np.ndarray, kind: str, rng: np.random.Generator, previous: np.ndarray | None = None) -> np.ndarray:
    """A blind camera's frame made from a real one (uint8 RGB, any size; a new array): ``dim`` (brightness x 0.05),
    ``lens_cap`` (black with sensor noise), ``overexposed`` (gain x 8, clipped: three stops), ``half_covered`` (the
    left half a
    lens cap), ``blur`` (Gaussian, sigma BLUR_SIGMA_640 at 640 px wide), ``repeat`` (``previous``, the frame before
    the degradation began, again: a frozen sensor)."""
    if kind == "dim":
        return (rgb.astype(np.float32) * 0.05).astype(np.uint8)
    if kind == "lens_cap":
        return _noise(rgb.shape, rng)
    if kind == "overexposed":
        return np.clip(rgb.astype(np.uint16) * 8, 0, 255).astype(np.uint8)
    if kind == "half_covered":
        out = rgb.copy()
        out[:, :rgb.shape[1] // 2] = _noise(out[:, :rgb.shape[1] // 2].shape, rng)
        return out
    if kind == "blur":
        return cv2.GaussianBlur(rgb, (0, 0), BLUR_SIGMA_640 * rgb.shape[1] / 640.0)
    if kind == "repeat":
        if previous is None:
            raise ValueError("degrade repeat needs the previous frame")
        return previous.copy()
    raise ValueError(f"unknown degradation {kind!r}: one of {', '.join(DEGRADATIONS)}")
