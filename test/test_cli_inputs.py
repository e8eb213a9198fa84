# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The tools' inputs (issue 20, item 5): every bad input is one line and a non-zero exit, never a traceback.

An image folder with a folder named like an image, numbers that overflow later (huge or tiny), Ctrl-C on
vla-edge-quantize, and the temporary folder a kill -9 leaves (removed by the next run, never while its creator lives).
Each runs the tool in a real process.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from vla_edge_ros import output_dir as OD
from vla_edge_ros.clips import ImageFolderClip, is_bag, load_model_frames, open_clip

ROOT = str(Path(__file__).resolve().parents[1])


def _tool(name: str, *args, timeout=120, env=None):
    return subprocess.run([sys.executable, "-m", f"vla_edge_ros.tools.{name}", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=env)


def _one_line(r, prog: str, rc: int = 2) -> str:
    assert r.returncode == rc, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: "), r.stderr
    return lines[0]


def _image_folder(d: Path, n: int = 3) -> Path:
    d.mkdir()
    for i in range(n):
        cv2.imwrite(str(d / f"{i:03d}.png"), np.full((24, 32, 3), 40 * i, np.uint8))
    return d


# --- an image folder holding a folder named like an image ----------------------------------------------------------

def test_a_folder_named_like_an_image_is_skipped_by_the_source(tmp_path):
    d = _image_folder(tmp_path / "frames")
    (d / "zzz.png").mkdir()  # sorts last: the old reader listed it and failed reading it
    (d / "bag.mcap").mkdir()  # not a bag storage file: the folder is still an image folder
    assert not is_bag(d)
    src = open_clip(str(d))
    assert isinstance(src, ImageFolderClip) and src.expected == 3 and src.not_files == ["zzz.png"]
    frames, _ = load_model_frames(open_clip(str(d)))  # what vla-edge-bench reads
    assert len(frames) == 3


def test_a_folder_of_only_folders_named_like_images_is_one_line(tmp_path):
    d = tmp_path / "frames"
    d.mkdir()
    (d / "a.png").mkdir()
    line = _one_line(_tool("replay", d), "vla-edge-replay")
    assert "no images" in line and "a.png" in line


@pytest.mark.ros
def test_replay_plays_a_folder_with_a_folder_named_like_an_image(tmp_path, domain):
    pytest.importorskip("rclpy")
    d = _image_folder(tmp_path / "frames")
    (d / "sub.png").mkdir()
    r = _tool("replay", d, "--fps", 100, "--ack-timeout", 0, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "3 images in" in r.stderr and "skipped 1 entry named like an image but not a file (sub.png)" in r.stderr
    assert "published 3 messages" in r.stderr


# --- numbers that overflow later: bounded when parsed ------------------------------------------------------------

@pytest.mark.parametrize("tool,args,needle", [
    ("replay", ["synthetic", "--duration", "0.2", "--ack-timeout", "1e308"], "--ack-timeout"),
    ("replay", ["synthetic", "--ack-timeout", "3601"], "--ack-timeout"),
    ("replay", ["synthetic", "--rate", "1e-320"], "--rate"),
    ("replay", ["synthetic", "--fps", "1e308"], "--fps"),
    ("replay", ["synthetic", "--min-fraction", "nan"], "--min-fraction"),
    ("replay", ["synthetic", "--wait-subscriber", "1e308"], "--wait-subscriber"),
    ("quantize", ["--model", "m", "--format", "awq", "--out", "o", "--calib-frames", "9" * 30], "--calib-frames"),
    ("quantize", ["--model", "m", "--format", "awq", "--out", "o", "--calib-tokens", "0"], "--calib-tokens"),
    ("plan", ["--model", "m", "--efficiency", "1e-300"], "--efficiency"),
    ("plan", ["--model", "m", "--period-ms", "1e308"], "--period-ms"),
    ("plan", ["--model", "m", "--margin-ms", "1e300"], "--margin-ms"),
    ("plan", ["--model", "m", "--prompt-tokens", "9" * 400], "--prompt-tokens"),
    ("bench", ["--clip", "synthetic", "--out", "o", "--seconds", "1e308"], "--seconds"),
    ("bench", ["--clip", "synthetic", "--out", "o", "--camera-hz", "1e308"], "--camera-hz"),
    ("bench", ["--clip", "synthetic", "--out", "o", "--kv-capacity", "9" * 30], "--kv-capacity"),
])
def test_huge_or_tiny_numbers_are_refused_in_one_line(tmp_path, tool, args, needle):
    r = _tool(tool, *[str(tmp_path / a) if a in ("m", "o") else a for a in args], timeout=180)
    line = _one_line(r, f"vla-edge-{tool}")
    assert needle in line and len(line) < 300, line


def test_plan_accepts_the_ends_of_its_ranges(tmp_path):
    from vla_edge_ros.model.generate import make_model

    model = make_model(str(tmp_path / "m"), "micro", seed=0)
    r = _tool("plan", "--model", model, "--board", "orin-nano", "--efficiency", "0.01", "--period-ms", "10000",
              "--margin-ms", "1000", "--capacity", "2048")
    assert r.returncode == 0, r.stderr
    assert not re.search(r"\d{16}", r.stdout), r.stdout  # no number with hundreds of digits


# --- vla-edge-quantize: Ctrl-C, SIGTERM and kill -9 ------------------------------------------------------------

# Runs vla-edge-quantize's main with one step made to stop (a file says it got there) so that a signal lands at a
# known stage: "write" = after model.safetensors is in the temporary folder, "math" = before anything is written.
PAUSED_QUANTIZE = r"""
import os, sys, time
from vla_edge_ros.tools import quantize as q
stage, marker = os.environ["PAUSE_AT"], os.environ["PAUSE_MARKER"]
def paused(real):
    def step(*a, **k):
        r = real(*a, **k)
        open(marker, "w").close()
        time.sleep(300)
        return r
    return step
if stage == "write":
    q.save_file = paused(q.save_file)
else:
    q.quantize_rtn = paused(q.quantize_rtn)
sys.exit(q.main(sys.argv[1:]))
"""


@pytest.fixture
def bf16_model(tmp_path):
    from vla_edge_ros.model.generate import make_model

    return make_model(str(tmp_path / "bf16"), "micro", seed=3)


def _start_paused(model: str, out: Path, stage: str, marker: Path) -> subprocess.Popen:
    env = dict(os.environ, PAUSE_AT=stage, PAUSE_MARKER=str(marker))
    p = subprocess.Popen([sys.executable, "-c", PAUSED_QUANTIZE, "--model", model, "--format", "compressed-tensors",
                          "--out", str(out)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    t_end = time.monotonic() + 120
    while not marker.exists():
        assert p.poll() is None, p.communicate()
        assert time.monotonic() < t_end, "the paused quantize never reached its stage"
        time.sleep(0.02)
    return p


def _temp_entries(parent: Path) -> list[str]:
    return sorted(n for n in os.listdir(parent) if n.startswith(".") and ("tmp" in n or n.endswith(".old")))


@pytest.mark.parametrize("stage", ["write", "math"])
@pytest.mark.parametrize("sig,rc", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_quantize_interrupted_is_one_line_and_leaves_nothing(tmp_path, bf16_model, stage, sig, rc):
    parent = tmp_path / "models"
    parent.mkdir()
    out = parent / "q"
    p = _start_paused(bf16_model, out, stage, tmp_path / "paused")
    if stage == "write":
        assert _temp_entries(parent), "the run should be writing its temporary folder"
    p.send_signal(sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == rc, (p.returncode, err)
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("vla-edge-quantize: interrupted"), err
    assert not out.exists() and _temp_entries(parent) == []


def test_a_killed_quantize_is_cleaned_by_the_next_run_but_a_live_one_is_not(tmp_path, bf16_model):
    parent = tmp_path / "models"
    parent.mkdir()
    killed = _start_paused(bf16_model, parent / "q1", "write", tmp_path / "paused1")
    killed.kill()  # SIGKILL: no cleanup can run
    killed.communicate(timeout=60)
    left = _temp_entries(parent)
    assert left, "a kill -9 mid-write leaves its temporary folder"
    assert any((parent / n / "model.safetensors").is_file() for n in left)

    live = _start_paused(bf16_model, parent / "q2", "write", tmp_path / "paused2")
    try:
        live_entries = set(_temp_entries(parent)) - set(left)
        assert live_entries
        # the next run of another tool writing into the same folder: the dead one goes, the live one stays
        r = _tool("make_model", "--preset", "micro", "--out", parent / "m2")
        assert r.returncode == 0, r.stderr
        assert set(_temp_entries(parent)) == live_entries
        assert (parent / "m2" / "model.safetensors").is_file()
    finally:
        live.send_signal(signal.SIGINT)
        live.communicate(timeout=60)
    assert live.returncode == 130 and _temp_entries(parent) == []


def test_cleanup_leaves_a_locked_folder_and_restores_contents_a_dead_swap_moved_aside(tmp_path):
    stem = tmp_path / f".m.{'ab' * 8}{OD.TMP_MARKER}"
    stem.mkdir()
    (stem / "model.safetensors").write_text("new, unfinished")
    old = Path(str(stem) + OD.OLD_SUFFIX)
    old.mkdir()
    (old / "config.json").write_text("old, complete")
    lock = Path(str(stem) + OD.LOCK_SUFFIX)
    lock.write_text("")
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys; f = open(sys.argv[1]); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); sys.stdin.read()",
                               str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert OD.clean_dead_temp_dirs(tmp_path) == [] and stem.is_dir() and old.is_dir()
    finally:
        holder.communicate("", timeout=30)
    with open(lock) as f:  # and a lock this process can take is free: the cleanup may take it too
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    OD.clean_dead_temp_dirs(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["m"] and (tmp_path / "m" / "config.json").read_text() == "old, complete"
