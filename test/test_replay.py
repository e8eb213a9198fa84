# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""vla-edge-replay: sources (bags, video, image folders), generated test bags, and publishing at rate."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
from rosbags.typesys import Stores, get_typestore

from vla_edge_ros.clips import (IMAGE_T, BagClip, ClipError, Counters, ImageFolderClip, VideoClip, is_bag,
                                load_model_frames, open_clip)
from vla_edge_ros.synthetic_bag import make_test_bag, synthetic_frame
from vla_edge_ros.tools import replay as R

UDACITY = Path("/work/shared/data/bags/udacity_solidWhiteRight_jpeg")
CLIP = Path("/work/shared/data/clips/udacity_solidWhiteRight.mp4")


@pytest.mark.parametrize("storage,fmt", [("mcap", "raw"), ("sqlite3", "raw"), ("mcap", "compressed")])
def test_make_and_read_test_bag(tmp_path, storage, fmt):
    bag = make_test_bag(tmp_path / "b", frames=12, fps=30.0, width=64, height=48, fmt=fmt, storage=storage)
    assert (bag / "metadata.yaml").is_file()
    assert is_bag(bag)
    c = Counters()
    items = list(R.bag_items(bag, c))
    assert len(items) == 12 and c.skipped_corrupt == 0
    assert all(it.kind == fmt for it in items)
    dt = np.diff([it.stamp_ns for it in items])
    assert np.allclose(dt, 1e9 / 30, atol=2)
    assert items[0].stamp_ns == 1_700_000_000_000_000_000 and items[0].t_ns == items[0].stamp_ns
    if fmt == "raw":
        r = items[3].raw
        assert (r["height"], r["width"], r["encoding"], r["step"]) == (48, 64, "rgb8", 192)
        got = np.frombuffer(r["data"], np.uint8).reshape(48, 64, 3)
        np.testing.assert_array_equal(got, synthetic_frame(3, 48, 64))
    storage_file = next(bag.glob("*.mcap" if storage == "mcap" else "*.db3"))
    assert len(list(R.bag_items(storage_file, Counters()))) == 12  # the storage file works as SOURCE too


def test_corrupt_messages_are_skipped_and_counted(tmp_path):
    bag = make_test_bag(tmp_path / "b", frames=10, width=32, height=16, corrupt=(2, 5))
    c = Counters()
    items = list(R.bag_items(bag, c))
    assert len(items) == 8 and c.skipped_corrupt == 2


def test_bag_without_images(tmp_path):
    from rosbags.rosbag2 import Writer
    from rosbags.typesys import Stores, get_typestore

    ts = get_typestore(Stores.ROS2_JAZZY)
    with Writer(tmp_path / "b", version=9) as w:
        conn = w.add_connection("/chatter", "std_msgs/msg/String", typestore=ts)
        w.write(conn, 1, ts.serialize_cdr(ts.types["std_msgs/msg/String"](data="hi"), "std_msgs/msg/String"))
    with pytest.raises(ClipError, match="no sensor_msgs/Image"):
        list(R.bag_items(tmp_path / "b", Counters()))


def test_make_bag_refuses_existing_dir(tmp_path):
    with pytest.raises(ClipError, match="exists"):
        make_test_bag(tmp_path)


def test_convert_raw_compressed_roundtrip(tmp_path):
    bag = make_test_bag(tmp_path / "b", frames=2, width=64, height=48)
    raw = next(iter(R.bag_items(bag, Counters())))
    comp = R.convert(raw, "compressed")
    assert comp.kind == "compressed" and comp.data[:2] == b"\xff\xd8" and comp.stamp_ns == raw.stamp_ns
    back = R.convert(comp, "raw")
    a = np.frombuffer(back.raw["data"], np.uint8).reshape(48, 64, 3).astype(int)
    b = np.frombuffer(raw.raw["data"], np.uint8).reshape(48, 64, 3).astype(int)
    assert np.abs(a - b).mean() < 6


def test_folder_source(tmp_path):
    for i in range(3):
        cv2.imwrite(str(tmp_path / f"{i:03d}.png"), synthetic_frame(i, 24, 32))
    cv2.imwrite(str(tmp_path / "003.jpg"), synthetic_frame(3, 24, 32))
    (tmp_path / "004.png").write_bytes(b"not a png")
    (tmp_path / "notes.txt").write_text("ignored")
    c = Counters()
    clip = open_clip(str(tmp_path), fps=10.0)
    assert isinstance(clip, ImageFolderClip) and clip.expected == 5
    items = list(clip.items(c, base_ns=5))
    assert [it.kind for it in items] == ["raw", "raw", "raw", "compressed"] and c.skipped_corrupt == 1
    assert [it.stamp_ns for it in items] == [5, 5 + 100_000_000, 5 + 200_000_000, 5 + 300_000_000]
    assert all(it.frame_id == "camera" for it in items)


def _write_video(path, n=10, fps=20.0):
    w = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, (64, 48))
    if not w.isOpened():
        pytest.skip("no video writer in this OpenCV build")
    for i in range(n):
        w.write(cv2.cvtColor(synthetic_frame(i, 48, 64), cv2.COLOR_RGB2BGR))
    w.release()


def test_video_source(tmp_path):
    path = tmp_path / "clip.avi"
    _write_video(path)
    clip = VideoClip(str(path), frame_id="front")
    items = list(clip.items(Counters(), base_ns=1000))
    assert len(items) == 10 and items[0].raw["width"] == 64 and items[0].frame_id == "front"
    assert items[1].stamp_ns - items[0].stamp_ns == 50_000_000  # synthesized from the frame time (20 fps)


@pytest.mark.skipif(not CLIP.is_file(), reason=f"{CLIP} not present")
def test_real_clip_first_frames():
    it = VideoClip(str(CLIP)).items()
    first = [next(it) for _ in range(3)]
    assert first[0].raw["encoding"] == "rgb8" and first[0].raw["height"] > 0


@pytest.mark.skipif(not UDACITY.is_dir(), reason=f"{UDACITY} not present")
def test_udacity_bag_reads():
    c = Counters()
    items = list(R.bag_items(UDACITY, c))
    assert len(items) == 221 and c.skipped_corrupt == 0
    assert items[0].kind == "compressed" and items[0].data[:2] == b"\xff\xd8"
    clip = BagClip(str(UDACITY))
    assert (clip.kind, clip.topic, clip.expected) == ("compressed", "/camera/image_raw/compressed", 221)


def damaged_copy(tmp_path, at: float = 1 / 3, nbytes: int = 200_000, name: str = "damaged.mp4") -> Path:
    """Copy the real clip with ``nbytes`` overwritten (deterministic noise) at fraction ``at``."""
    out = tmp_path / name
    data = bytearray(CLIP.read_bytes())
    start = int(len(data) * at)
    noise = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8).tobytes()
    data[start:start + nbytes] = noise[: len(data) - start]
    out.write_bytes(bytes(data))
    return out


@pytest.mark.skipif(not CLIP.is_file(), reason=f"{CLIP} not present")
def test_damaged_video_is_read_past_the_damage(tmp_path):
    clip = VideoClip(str(damaged_copy(tmp_path)))
    c = Counters()
    items = list(clip.items(c))
    # Stopping at the damage gives 74 of 221; reading on gives ~190, and every frame is accounted for.
    assert clip.expected == 221
    assert 150 <= len(items) < 221 and c.skipped_corrupt == 221 - len(items) > 0, (len(items), c.skipped_corrupt)
    t = np.array([it.t_ns for it in items])
    assert np.all(np.diff(t) > 0) and np.diff(t).max() >= 2 * 40_000_000  # the gap of the damage is kept
    # the bench's reader: the same frames, the damage counted
    frames, stamps = load_model_frames(clip)
    assert frames.shape == (len(items), 64, 128, 3) and clip.counters.skipped_corrupt == c.skipped_corrupt


@pytest.mark.skipif(not CLIP.is_file(), reason=f"{CLIP} not present")
def test_mostly_damaged_video_is_refused_by_the_bench_reader(tmp_path):
    clip = VideoClip(str(damaged_copy(tmp_path, at=0.05, nbytes=10**8)))
    with pytest.raises(ClipError, match="damaged"):
        load_model_frames(clip)


def test_bench_decodes_bag_encodings_with_the_node_converter(tmp_path):
    """mono16 / bayer / yuv422 bags: the bench's reader gives what the node's converter gives."""
    from rosbags.rosbag2 import Writer

    from vla_edge_ros import image_convert as ic

    ts = get_typestore(Stores.ROS2_JAZZY)
    h, w = 32, 64
    rng = np.random.default_rng(1)
    msgs = {
        "mono16": (rng.integers(0, 65535, (h, w), dtype=np.uint16).tobytes(), w * 2),
        "bayer_rggb8": (rng.integers(0, 255, (h, w), dtype=np.uint8).tobytes(), w),
        "yuv422": (rng.integers(0, 255, (h, w * 2), dtype=np.uint8).tobytes(), w * 2),
    }
    for enc, (data, step) in msgs.items():
        bag = tmp_path / enc
        with Writer(bag, version=9) as writer:
            conn = writer.add_connection("/cam", IMAGE_T, typestore=ts)
            header = ts.types["std_msgs/msg/Header"](
                stamp=ts.types["builtin_interfaces/msg/Time"](sec=1, nanosec=0), frame_id="cam")
            msg = ts.types[IMAGE_T](header=header, height=h, width=w, encoding=enc, is_bigendian=0, step=step,
                                    data=np.frombuffer(data, np.uint8).copy())
            writer.write(conn, 1, ts.serialize_cdr(msg, IMAGE_T))
        frames, _ = load_model_frames(open_clip(str(bag)))
        want = ic.image_msg_to_rgb(SimpleNamespace(height=h, width=w, encoding=enc, is_bigendian=0, step=step,
                                                   data=data))
        np.testing.assert_array_equal(frames[0], want)


def _run(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "vla_edge_ros.tools.replay", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def _one_line_error(r, rc=2):
    assert r.returncode == rc, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert lines and lines[-1].startswith("vla-edge-replay: "), r.stderr
    return lines


@pytest.mark.parametrize("args, needle", [
    (["synthetic", "--rate", "inf"], "--rate"),
    (["synthetic", "--rate", "nan"], "--rate"),
    (["synthetic", "--rate", "0"], "--rate"),
    (["synthetic", "--fps", "-5"], "--fps"),
    (["synthetic", "--duration", "-1"], "--duration"),
    (["synthetic", "--topic", "bad topic!"], "--topic"),
    (["synthetic", "--topic", "/camera//image"], "--topic"),
    (["/no/such/clip.mp4"], "no such file"),
    ([], "SOURCE is required"),
])
def test_bad_options_give_one_line(args, needle):
    lines = _one_line_error(_run(*args))
    assert len(lines) == 1 and needle in lines[0], lines


def test_unreadable_inputs_give_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    assert len(_one_line_error(_run(tmp_path / "empty"))) == 1
    (tmp_path / "x.mp4").write_bytes(b"not a video at all")
    assert len(_one_line_error(_run(tmp_path / "x.mp4"))) == 1
    (tmp_path / "x.mcap").write_bytes(b"not a bag")
    assert len(_one_line_error(_run(tmp_path / "x.mcap"))) == 1


def options_without_default(parser) -> list[str]:
    """Options whose help text does not state the default (positional arguments and -h excepted)."""
    return [a.option_strings[-1] for a in parser._actions
            if a.option_strings and a.dest != "help" and "default" not in (a.help or "")]


def test_help_shows_defaults_and_an_example():
    assert options_without_default(R.build_parser()) == []
    r = _run("--help")
    assert r.returncode == 0 and "vla-edge-replay " in r.stdout.split("examples:")[1]


def test_cli_make_bag_and_errors(tmp_path):
    out = tmp_path / "cli_bag"
    r = _run("--make-bag", out, "--frames", "5", "--width", "32", "--height", "16")
    assert r.returncode == 0 and is_bag(out), r.stderr
    _one_line_error(_run(tmp_path / "missing.mcap"))


@pytest.mark.ros
def test_folder_of_damaged_images_publishes_nothing_and_fails(tmp_path):
    pytest.importorskip("rclpy")
    for i in range(3):
        (tmp_path / f"{i}.png").write_bytes(b"\x89PNG broken")
    lines = _one_line_error(_run(tmp_path, "--quiet"), rc=1)
    assert "published nothing" in lines[-1]


@pytest.mark.ros
@pytest.mark.skipif(not CLIP.is_file(), reason=f"{CLIP} not present")
def test_replay_of_a_damaged_video_reports_and_judges(tmp_path):
    pytest.importorskip("rclpy")
    bad = damaged_copy(tmp_path)
    r = _run(bad, "--rate", "20")  # 221 frames at 25 fps, 20x: ~0.5 s
    assert r.returncode == 0, r.stderr
    published = int(r.stderr.split("published ")[1].split()[0])
    skipped = int(r.stderr.split("skipped ")[1].split()[0])
    assert 150 <= published < 221 and published + skipped == 221, r.stderr
    # The same file, demanding nearly every frame: exit 1 with one line saying what is missing.
    lines = _one_line_error(_run(bad, "--rate", "20", "--min-fraction", "0.95", "--quiet"), rc=1)
    assert f"only {published} of 221" in lines[-1], lines
    worse = damaged_copy(tmp_path, at=0.05, nbytes=10**8, name="worse.mp4")
    _one_line_error(_run(worse, "--rate", "20", "--quiet"), rc=1)


@pytest.mark.ros
def test_reliable_by_default_and_frame_id_passed_through(tmp_path):
    """A RELIABLE subscriber (it never matches a BEST_EFFORT publisher) gets every frame, with the bag's frame_id."""
    rclpy = pytest.importorskip("rclpy")
    import threading

    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import Image
    from ros_helpers import own_domain, ros_env

    domain = own_domain()
    bag = make_test_bag(tmp_path / "b", frames=20, fps=30.0, width=32, height=16, frame_id="front_cam")
    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=domain)
    node = rclpy.create_node("replay_probe", context=ctx)
    got = []
    node.create_subscription(Image, "/camera/image_raw", lambda m: got.append(m.header.frame_id),
                             QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE))
    ex = rclpy.executors.SingleThreadedExecutor(context=ctx)
    ex.add_node(node)
    t = threading.Thread(target=ex.spin, daemon=True)
    t.start()
    try:
        r = subprocess.run([sys.executable, "-m", "vla_edge_ros.tools.replay", str(bag), "--wait-subscriber", "20"],
                           env=ros_env(domain), capture_output=True, text=True, timeout=90)
        assert r.returncode == 0, r.stderr
        end = time.monotonic() + 5
        while len(got) < 20 and time.monotonic() < end:
            time.sleep(0.05)
        assert len(got) >= 18 and set(got) == {"front_cam"}, (len(got), set(got), r.stderr)
    finally:
        ex.shutdown()
        node.destroy_node()
        rclpy.try_shutdown(context=ctx)


@pytest.mark.ros
@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["auto", "compressed"])
def test_publishes_at_the_recorded_rate_with_bag_stamps(tmp_path, fmt, monkeypatch):
    pytest.importorskip("rclpy")
    from ros_helpers import Listener, Proc, own_domain, ros_env

    domain = own_domain()
    monkeypatch.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    bag = make_test_bag(tmp_path / "b", frames=45, fps=30.0, width=160, height=120)
    stamps = [1_700_000_000_000_000_000 + int(round(i * 1e9 / 30)) for i in range(45)]
    lst = Listener(domain)
    compressed = fmt == "compressed"
    topic = "/camera/image_raw" + ("/compressed" if compressed else "")
    lst.subscribe_images(topic, compressed=compressed, reliable=True)
    p = Proc(["-m", "vla_edge_ros.tools.replay", str(bag), "--reliable", "--format", fmt, "--duration", "20",
              "--wait-subscriber", "20"], ros_env(domain), tmp_path / "replay.log")
    try:
        p.p.wait(60)  # waits for the subscriber, one pass, then exits by itself
        assert p.p.returncode == 0, p.output()
        # the replay exits once every message is acknowledged, i.e. in this process's reader: the last one
        # arrives (this process's executor may still be behind on a busy machine)
        lst.wait_for(lambda: lst.images and lst.images[-1][1] == stamps[-1], 5, "the last frame")
        with lst.lock:
            got = list(lst.images)
        # reliable and in order, header stamps kept; the first one or two may go out before this reader
        # has matched the writer (volatile durability), so compare with the tail of the bag
        assert len(got) >= 40, (len(got), p.output())
        assert [s for _, s in got] == stamps[len(stamps) - len(got):]
        t = np.array([x for x, _ in got])
        # the median interval: one delivery held up in this process (a DDS stall on 2 busy cores, then a burst)
        # must not read as a replay that publishes too fast; a replay without pacing still gives ~0
        rate = 1.0 / float(np.median(np.diff(t)))
        assert 27.0 <= rate <= 33.0, (rate, (len(t) - 1) / (t[-1] - t[0]))
        assert "published 45 messages" in p.output()
    finally:
        p.stop()
        lst.close()


@pytest.mark.ros
@pytest.mark.slow
def test_duration_and_rate_options(tmp_path, monkeypatch):
    pytest.importorskip("rclpy")
    from ros_helpers import Proc, own_domain, ros_env

    domain = own_domain()
    bag = make_test_bag(tmp_path / "b", frames=30, fps=30.0, width=32, height=16)
    t0 = time.monotonic()
    p = Proc(["-m", "vla_edge_ros.tools.replay", str(bag), "--loop", "--rate", "2.0", "--duration", "2"],
             ros_env(domain), tmp_path / "replay.log")
    assert p.p.wait(30) == 0
    took = time.monotonic() - t0
    p.stop()
    out = p.output()
    n = int(out.split("published ")[1].split()[0])
    assert 100 <= n <= 125, out  # 60 Hz for 2 s, looping
    assert took < 15


# --- vla-edge-demo / vla-edge-soak: the same command-line rules ------------------------------------------

@pytest.mark.parametrize("tool", ["demo", "soak"])
def test_demo_and_soak_fail_politely(tmp_path, tool):
    (tmp_path / "afile").write_text("x")

    def run(*args):
        return subprocess.run([sys.executable, "-m", f"vla_edge_ros.tools.{tool}", *map(str, args)],
                              capture_output=True, text=True, timeout=60)

    prog = f"vla-edge-{tool}: "
    cases = [["--source", tmp_path / "missing.bag"], ["--model", tmp_path / "nomodel"], ["--seconds", "inf"],
             ["--policy", "lru"]]
    if tool == "soak":
        cases += [["--out", tmp_path / "afile"], ["-p", "period_ms"]]
    for args in cases:
        r = run(*args)
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert r.returncode == 2 and "Traceback" not in r.stderr and len(lines) == 1, (args, r.stderr)
        assert lines[0].startswith(prog), (args, lines)
    r = run("--help")
    assert r.returncode == 0 and f"vla-edge-{tool} " in r.stdout.split("examples:")[1]
    import importlib

    mod = importlib.import_module(f"vla_edge_ros.tools.{tool}")
    parser = mod.build_parser()
    assert options_without_default(parser) == []


def test_soak_plot_shows_rss_vram_and_latency(tmp_path):
    from vla_edge_ros.tools import soak

    rows = [{"t_s": float(t), "rss_mb": 100.0 + 0.01 * t, "vram_mb": None, "cycle_ms_p50": 5.0,
             "cycle_ms_p99": 9.0 if t != 7 else 40.0, "chunk_ms_p50": 4.0, "late": int(t == 7)} for t in range(1, 21)]
    summary = {"rss_growth_pct": 0.1, "vram_growth_pct": None, "deadline_misses": 1, "verdict": "fail",
               "backend": "numpy", "duration_s": 20.0}
    soak.write_plot(rows, tmp_path / "samples.png", 5.0, 33.0, summary)
    png = (tmp_path / "samples.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


SLOW_READER = """
import sys, rclpy
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import Image
rclpy.init()
n = rclpy.create_node("slow_reader")
n.create_subscription(Image, "/camera/image_raw", lambda m: print(m.header.stamp.sec * 10**9 + m.header.stamp.nanosec,
                      flush=True), QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
rclpy.spin(n)
"""


@pytest.mark.ros
@pytest.mark.slow
def test_a_reliable_replay_waits_for_its_subscribers_before_exiting(tmp_path):
    """Reliable means delivered: a subscriber stopped (SIGSTOP) through the end of the bag holds the replay's exit
    until it runs again and acknowledges (the repair waits for the writer's next heartbeat, up to 3 s); then it
    has the last frame. Exiting at once could lose the last frames."""
    pytest.importorskip("rclpy")
    import os
    import signal

    from ros_helpers import ROBOT_DISCOVERY, Proc, own_domain, ros_env

    # UDP only (a robot's discovery range, static peer for unicast discovery): over Fast DDS's shared-memory
    # transport a reader stopped ~2.5 s while 57 KB frames arrived at 30 Hz got nothing more from this writer
    # after it ran again (6 of 8 runs; never acknowledged within 10 s); over UDP it is repaired (6 of 6)
    env = ros_env(own_domain(101, 200), {**ROBOT_DISCOVERY, "FASTDDS_BUILTIN_TRANSPORTS": "UDPv4"})
    bag = make_test_bag(tmp_path / "b", frames=30, fps=30.0, width=160, height=120)
    last = 1_700_000_000_000_000_000 + int(round(29 * 1e9 / 30))
    reader = Proc(["-c", SLOW_READER], env, tmp_path / "reader.log")
    replay = None
    try:
        replay = Proc(["-m", "vla_edge_ros.tools.replay", str(bag), "--wait-subscriber", "30"], env,
                      tmp_path / "replay.log")
        t_end = time.monotonic() + 30
        while time.monotonic() < t_end and len(reader.output().split()) < 3:
            time.sleep(0.01)
        assert len(reader.output().split()) >= 3, (reader.output(), replay.output())
        os.kill(reader.p.pid, signal.SIGSTOP)
        t_end = time.monotonic() + 10
        while time.monotonic() < t_end and "published 30 messages" not in replay.output():
            time.sleep(0.05)
        assert "published 30 messages" in replay.output(), replay.output()
        time.sleep(1.5)
        waited = replay.p.poll() is None  # still waiting for the stopped reader's acknowledgements
        os.kill(reader.p.pid, signal.SIGCONT)
        rc = replay.p.wait(15)
        assert waited, "the replay exited while its reliable subscriber had not acknowledged the last frames"
        assert rc == 0, replay.output()
        assert "not every subscriber acknowledged" not in replay.output(), replay.output()
        t_end = time.monotonic() + 5
        while time.monotonic() < t_end and str(last) not in reader.output().split():
            time.sleep(0.05)
        assert str(last) in reader.output().split(), reader.output()[-500:]
    finally:
        if reader.alive():
            os.kill(reader.p.pid, signal.SIGCONT)
        reader.stop()
        if replay is not None:
            replay.stop()
