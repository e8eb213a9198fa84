# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""End-to-end: `vla_edge` and `vla-edge-replay` as separate OS processes over real DDS (helpers: ros_helpers.py,
fixtures: conftest.py)."""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")

from diagnostic_msgs.msg import DiagnosticStatus  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.qos import QoSProfile, ReliabilityPolicy  # noqa: E402
from sensor_msgs.msg import CompressedImage, Image  # noqa: E402
from ros_helpers import (  # noqa: E402
    PERIOD_MS, ROOT, Listener, bag_stamps, cadence, check_common, kv, plumbing_period_ms, reasons,
    ros_env, start_replay, start_vla_edge)

UDACITY = Path("/work/shared/data/bags/udacity_solidWhiteRight_jpeg")

pytestmark = [pytest.mark.ros, pytest.mark.slow]


# --------------------------------------------------------------------------------------------
# tests
# --------------------------------------------------------------------------------------------

@pytest.mark.skipif(not UDACITY.is_dir(), reason=f"{UDACITY} not present")
def test_udacity_compressed_bag(domain, tmp_path, procs, micro_model):
    stamps = bag_stamps(UDACITY)
    node = start_vla_edge(procs, domain, tmp_path, micro_model,
                          {"transport": "compressed", "qos_reliability": "reliable"},
                          remaps=[("image/compressed", "/camera/image_raw/compressed")],
                          extra_env={"FASTRTPS_DEFAULT_PROFILES_FILE": str(ROOT / "config" / "fastdds_shm.xml")})
    lst = Listener(domain)
    try:
        lst.wait_for(lambda: len(lst.actions) > 5, 60, "the first actions of vla_edge")
        start_replay(procs, domain, tmp_path, UDACITY, "--loop", "--reliable")
        lst.wait_for(lambda: any(v["reason"] in ("fresh", "repeat", "refused") for _, v, _ in lst.cycles), 30,
                     "cycles on camera frames")
        time.sleep(1.5)
        t0 = time.monotonic()
        time.sleep(5.0)
        t1 = time.monotonic()
        acts, cyc = check_common(lst, node, t0, t1, stamps)
        r = reasons(cyc)
        assert r["fresh"] + r["repeat"] > 0, f"no model action in the window: {r}"
        d = lst.last_diag()
        assert 20.0 <= float(d["camera_rate_hz"]) <= 30.0, d["camera_rate_hz"]  # the bag is 25 Hz
        assert d["transport"] == "compressed" and int(d["frames_invalid"]) == 0
    finally:
        lst.close()
    assert node.stop() == 0, node.output()[-3000:]


def test_raw_bag_camera_stop_and_resume(domain, tmp_path, procs, micro_model):
    from vla_edge_ros.synthetic_bag import make_test_bag

    bag = make_test_bag(tmp_path / "bag", frames=60, fps=30.0, storage="sqlite3")
    stamps = bag_stamps(bag)
    max_age = 100.0
    node = start_vla_edge(procs, domain, tmp_path, micro_model, {"max_frame_age_ms": max_age},
                          remaps=[("image", "/camera/image_raw")])
    lst = Listener(domain)
    try:
        lst.wait_for(lambda: len(lst.cycles) > 10, 60, "the first cycles of vla_edge")
        # no camera yet: fallbacks with no_frame at the cycle rate, stamped "now"
        time.sleep(1.0)
        t = time.monotonic()
        pre = lst.cycles_between(t - 1.0, t)
        assert reasons(pre).keys() == {"no_frame"} and all(lv == 1 for *_, lv in pre), reasons(pre)
        ok, why = cadence(lst.actions_between(t - 1.0, t), cycles=lst.all_cycles())
        assert ok, why

        replay = start_replay(procs, domain, tmp_path, bag, "--loop")
        lst.wait_for(lambda: any(v["reason"] == "fresh" for _, v, _ in lst.cycles), 30, "a fresh model action")
        dbg = lst.subscribe_debug()
        time.sleep(1.0)
        t0 = time.monotonic()
        time.sleep(4.0)
        t1 = time.monotonic()
        acts, cyc = check_common(lst, node, t0, t1, stamps)
        r = reasons(cyc)
        assert r["fresh"] > 0, r
        # best effort, ~0.4 MB a message over UDP: on a slow host the first complete one can take a while
        lst.wait_for(lambda: len(lst.debug) > 0, 30, "~/debug_image while subscribed")
        lst.node.destroy_subscription(dbg)
        assert lst.debug[-1].encoding == "rgb8" and lst.debug[-1].width == 256

        # the camera stops (SIGSTOP freezes the replay process)
        replay.signal(signal.SIGSTOP)
        t_stop = time.monotonic()
        # wait for the first stale cycle rather than assume it arrives within a fixed window: on a loaded 2-core host
        # this listener can be held off for seconds (a CI run saw no stale cycle within 2 s; its cause not recorded)
        lst.wait_for(lambda: any(c[0] >= t_stop and c[1]["reason"] in ("stale_frame", "no_frame") for c in lst.cycles),
                     30, "a stale_frame fallback after the camera stopped")
        time.sleep(max(0.0, t_stop + 2.0 - time.monotonic()))
        t2 = time.monotonic()
        stopped = lst.cycles_between(t_stop, t2)
        first_stale = next(i for i, (_, v, _) in enumerate(stopped) if v["reason"] in ("stale_frame", "no_frame"))
        # until the last frame is max_frame_age old the loop may still run on it; from then on every
        # cycle is stale_frame, the first one within 2 cycles of crossing the age limit
        age_first_stale = float(stopped[first_stale][1]["frame_age_ms"])
        assert max_age < age_first_stale <= max_age + 2 * plumbing_period_ms(), age_first_stale
        after = stopped[first_stale:]
        assert all(v["reason"] == "stale_frame" and v["source"] == "fallback" for _, v, _ in after), reasons(after)
        for _, v, _ in stopped:
            if float(v["frame_age_ms"]) > max_age:
                assert v["reason"] == "stale_frame", v
        ok, why = cadence(lst.actions_between(t_stop + 0.5, t2), cycles=lst.all_cycles())
        assert ok, f"fallbacks must keep the cycle rate: {why}"
        d = lst.last_diag()
        assert int(d["fallback_stale_frame"]) > 0 and float(d["fallback_rate_stale_frame"]) > 0

        # the camera comes back: model actions resume
        replay.signal(signal.SIGCONT)
        t_back = time.monotonic()
        lst.wait_for(lambda: any(c[0] > t_back and c[1]["reason"] == "fresh" for c in lst.cycles), 15,
                     "model actions after the camera came back")
        time.sleep(1.0)
        t3 = time.monotonic()
        r = reasons(lst.cycles_between(t3 - 1.0, t3))
        assert r["fresh"] + r["repeat"] > 0 and r["stale_frame"] == 0, r
    finally:
        lst.close()
    assert node.stop() == 0, node.output()[-3000:]


def test_four_bit_parallel_model_runs_in_the_node(domain, tmp_path, procs):
    """A 4-bit (compressed-tensors) parallel-decoding model dir runs in the node like any other: model actions
    from the camera's frames, /diagnostics names the weights and the decoding, and the admission counts its
    chunk as a 40-token prefill with no decode phase."""
    from vla_edge_ros.model.generate import make_model
    from vla_edge_ros.synthetic_bag import make_test_bag

    model = tmp_path / "micro-w4-parallel"
    make_model(str(model), preset="micro", seed=0, quant="compressed-tensors", action_decoding="parallel")
    bag = make_test_bag(tmp_path / "bag", frames=60, fps=30.0, storage="sqlite3")
    node = start_vla_edge(procs, domain, tmp_path, str(model), {"backend": "numpy"},
                          remaps=[("image", "/camera/image_raw")])
    lst = Listener(domain)
    try:
        lst.wait_for(lambda: len(lst.cycles) > 5, 60, "the first cycles of vla_edge")
        start_replay(procs, domain, tmp_path, bag, "--loop")
        lst.wait_for(lambda: sum(v["reason"] == "fresh" for _, v, _ in lst.cycles) >= 10, 30, "10 fresh actions")
        # (wait_for holds the listener's lock while it calls the predicate: read lst.diags directly)
        lst.wait_for(lambda: any("action_decoding" in d for _, d in lst.diags), 5, "a /diagnostics roll-up")
        d = lst.last_diag()
        assert d["weights"] == "w4" and d["action_decoding"] == "parallel", d
        assert float(d["ema_decode_per_token"]) == 0.0 and float(d["ema_prefill_per_token"]) > 0, d
        # the estimate counts 40 prefill tokens (32 vision + 8 action queries) and no decode tokens
        want = float(d["ema_vision"]) + 40 * float(d["ema_prefill_per_token"]) + float(d["ema_other"])  # tail_k 0
        assert float(d["ema_estimate"]) == pytest.approx(want, rel=2e-3), d
        with lst.lock:
            fresh = [v for _, v, _ in lst.cycles if v["reason"] == "fresh"]
        assert fresh and all(v["source"] == "model" for v in fresh)
    finally:
        lst.close()
    assert node.stop() == 0, node.output()[-3000:]


def test_slow_backend_keeps_the_deadline(domain, tmp_path, procs, small_model):
    from vla_edge_ros.synthetic_bag import make_test_bag

    bag = make_test_bag(tmp_path / "bag", frames=30, fps=30.0)
    stamps = bag_stamps(bag)
    # warmup_chunks 0: the admission EMAs start empty, so the first chunk is admitted and overruns;
    # after that the measured cost makes admission refuse.
    # the timing promise itself: at the design's period, whatever the host
    node = start_vla_edge(procs, domain, tmp_path, small_model,
                          {"period_ms": PERIOD_MS, "warmup_chunks": 0, "reprobe_after_s": 1.0},
                          remaps=[("image", "/camera/image_raw")])
    lst = Listener(domain)
    try:
        lst.wait_for(lambda: len(lst.cycles) > 5, 90, "the first cycles of vla_edge")
        start_replay(procs, domain, tmp_path, bag, "--loop")
        lst.wait_for(lambda: any(v["reason"] == "overrun" for _, v, _ in lst.cycles), 30, "an overrun")
        lst.wait_for(lambda: any(v["reason"] == "refused" for _, v, _ in lst.cycles), 30, "a refusal")
        t0 = time.monotonic()
        time.sleep(5.0)
        t1 = time.monotonic()
        acts, cyc = check_common(lst, node, t0, t1, stamps, period_ms=PERIOD_MS)
        r = reasons(cyc)
        assert all(v["source"] == "fallback" for _, v, _ in cyc), f"the slow model never makes the deadline: {r}"
        # "repeat" here is a fallback: no new frame since the last (background probe) chunk; "stale_frame" when the
        # replay process is starved for 200 ms on a loaded box (seen once in CI-like load), a fallback as well
        assert set(r) <= {"refused", "busy", "overrun", "repeat", "stale_frame"} and r["refused"] > 0, r
        with lst.lock:
            allc = [v for _, v, _ in lst.cycles]
        cms = np.array([float(v["cycle_ms"]) for v in allc])
        p99 = float(np.percentile(cms, 99))
        assert p99 <= PERIOD_MS + 3.0, f"publish - tick p99 {p99:.2f} ms"
        sched = np.array([float(v["since_scheduled_tick_ms"]) for v in allc])  # timer lateness included
        assert float(np.percentile(sched, 99)) <= PERIOD_MS + 3.0, f"publish - scheduled tick p99 {sched}"
        idx = [int(v["cycle"]) for v in allc]
        assert idx == list(range(idx[0], idx[0] + len(idx))), "a cycle published nothing"
        over = [float(v["cycle_ms"]) for v in allc if v["reason"] == "overrun"]
        # an overrun is published when the wait ends (deadline - margin); allow for a descheduled
        # thread on a loaded 2-core box, the p99 above is the requirement
        assert all(ms <= PERIOD_MS + 10.0 for ms in over), over
        d = lst.last_diag()
        assert int(d["overruns"]) >= 1 and int(d["fallback_refused"]) > 0
        # misses can only come from the overrun (the first chunk; probes run in the background) waking late
        assert float(d["deadline_miss_rate"]) <= 0.05, d["deadline_miss_rate"]
    finally:
        lst.close()
    assert node.stop() == 0, node.output()[-3000:]


def _bad_raw_images():
    """(kind, Image) pairs that must be dropped and counted."""
    def img(h=48, w=64, enc="rgb8", step=None, n=None):
        m = Image()
        m.height, m.width, m.encoding = h, w, enc
        m.step = w * 3 if step is None else step
        m.data = bytes((h * m.step) if n is None else n)
        return m
    return [("encoding", img(enc="rgb9")), ("data", img(n=100)), ("step", img(step=10)),
            ("size", img(h=0, w=0, n=0)), ("size", img(h=100000, w=100000, n=16))]


@pytest.mark.parametrize("transport", ["raw", "compressed"])
def test_malformed_images_are_survived_and_counted(domain, tmp_path, procs, micro_model, transport):
    from vla_edge_ros.image_convert import encode_jpeg
    from vla_edge_ros.synthetic_bag import synthetic_frame

    node = start_vla_edge(procs, domain, tmp_path, micro_model, {"transport": transport})
    lst = Listener(domain)
    n = lst.node
    if transport == "raw":
        pub = n.create_publisher(Image, "/image", 10)
        bad = _bad_raw_images()
    else:
        pub = n.create_publisher(CompressedImage, "/image/compressed", 10)
        bad = [("decode", CompressedImage(format="jpeg", data=b"\xff\xd8\xff\xe0 this is not a jpeg")),
               ("decode", CompressedImage(format="jpeg", data=bytes(range(256)) * 8)),
               ("data", CompressedImage(format="jpeg", data=b""))]
    try:
        lst.wait_for(lambda: len(lst.actions) > 5, 60, "the first actions of vla_edge")
        lst.wait_for(lambda: pub.get_subscription_count() > 0, 20, "the camera subscription")
        good_stamps = set()
        sent_bad = collections.Counter()
        t_end = time.monotonic() + 5.0
        i = 0
        while time.monotonic() < t_end:
            stamp = 1_000_000_000 + i * 33_000_000
            rgb = synthetic_frame(i, 120, 160)
            if transport == "raw":
                m = Image(height=120, width=160, encoding="rgb8", step=480, data=rgb.tobytes())
            else:
                m = CompressedImage(format="jpeg", data=encode_jpeg(rgb))
            m.header.stamp.sec, m.header.stamp.nanosec = divmod(stamp, 1_000_000_000)
            pub.publish(m)
            good_stamps.add(stamp)
            kind, b = bad[i % len(bad)]
            b.header.stamp.sec = 7  # never a good stamp
            pub.publish(b)
            sent_bad[kind] += 1
            i += 1
            time.sleep(1 / 30)
        lst.wait_for(lambda: lst.diags and lst.diags[-1][0] > t_end + 0.5, 10, "diagnostics after the burst")
        assert node.alive(), node.output()[-3000:]
        d = lst.last_diag()
        assert int(d["frames_invalid"]) >= 0.8 * sum(sent_bad.values()), (d["frames_invalid"], sent_bad)
        for kind in sent_bad:
            assert int(d[f"invalid_{kind}"]) > 0, (kind, d)
        assert int(d["frames_valid"]) > 0
        # actions kept flowing, from good frames only (or none before the first good one)
        acts = lst.actions_between(t_end - 3.0, t_end)
        ok, why = cadence(acts)
        assert ok, why
        assert all(int(v["frame_stamp_ns"]) in good_stamps | {-1} for _, v, _ in lst.cycles_between(t_end - 3.0, t_end))
        assert "dropped a frame" in node.output()
    finally:
        lst.close()
    assert node.stop() == 0, node.output()[-3000:]


def test_impossible_parameters_exit_with_one_message(domain, tmp_path, micro_model):
    env = ros_env(domain)
    base = [sys.executable, "-m", "vla_edge_ros.nodes.bringup", "--ros-args", "--params-file",
            str(ROOT / "config" / "vla_edge.yaml")]
    cases = [
        ([], "model_path is empty"),
        (["-p", f"model_path:={tmp_path / 'nope'}"], "no such directory"),
        (["-p", f"model_path:={micro_model}", "-p", "period_ms:=2.0"], "must be greater than safety_margin_ms"),
        (["-p", f"model_path:={micro_model}", "-p", "policy:=lru"], "policy='lru' is not one of"),
        (["-p", f"model_path:={micro_model}", "-p", "kv_capacity_tokens:=50"], "kv_capacity_tokens=50 is too small"),
        (["-p", f"model_path:={micro_model}", "-p", "ema_alpha:=3.0"], "ema_alpha"),
        (["-p", f"model_path:={micro_model}", "-p", "twist_scale:=[.nan,1.0,1.0,1.0,1.0,1.0]"],
         "twist_scale entries must be finite"),
        (["-p", f"model_path:={micro_model}", "-p", "twist_scale:=[1.0,1.0,1.0,1.0,1.0,1e300]"],
         "twist_scale entries must be finite"),
    ]
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("/**/vla_edge:\n  ros__parameters:\n    period_ms: [1, 2\n")
    cases += [  # arguments rcl itself refuses: one line, no traceback
        (["--params-file", str(tmp_path / "missing.yaml")], "Couldn't parse params file"),
        (["--params-file", str(bad_yaml)], "Couldn't parse params file"),
        (["-r", "image"], "Couldn't parse remap rule"),
        (["-p", "period_ms"], "Couldn't parse parameter override rule"),
    ]
    for extra, pattern in cases:
        r = subprocess.run(base + extra, env=env, capture_output=True, text=True, timeout=60, cwd=str(ROOT))
        assert r.returncode == 2, (extra, r.returncode, r.stderr[-2000:])
        msgs = [ln for ln in r.stderr.splitlines() if ln.startswith("vla_edge:")]
        assert len(msgs) == 1 and pattern in msgs[0], (extra, r.stderr[-2000:])
        assert "Traceback" not in r.stderr, (extra, r.stderr[-2000:])


def test_parameter_declarations_with_rclpy(domain, tmp_path):
    from rcl_interfaces.msg import ParameterType

    from vla_edge_ros import settings as P
    from vla_edge_ros.nodes.params import declare_and_read

    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=domain,
               args=["--ros-args", "-p", "period_ms:=40", "-p", "twist_scale:=[1,2,3,4,5,6]"])
    try:
        node = rclpy.create_node("p1", context=ctx)
        v = declare_and_read(node, P.REASONING_SPECS)
        assert v["period_ms"] == 40.0 and isinstance(v["period_ms"], float)  # int accepted for a double
        assert v["twist_scale"] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
        d = node.describe_parameter("ema_alpha")
        assert d.type == ParameterType.PARAMETER_DOUBLE and not d.read_only and d.description  # tunable
        assert not node.describe_parameter("kv_capacity_tokens").read_only  # settable while unconfigured
        assert node.describe_parameter("action_labels").read_only
        assert d.floating_point_range[0].from_value == 0.001 and d.floating_point_range[0].to_value == 1.0
        assert node.describe_parameter("kv_capacity_tokens").integer_range[0].from_value == 1
        node.destroy_node()
    finally:
        rclpy.shutdown(context=ctx)
    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=domain, args=["--ros-args", "-p", "ema_alpha:=7.0", "-p", "policy:=5"])
    try:
        node = rclpy.create_node("p2", context=ctx)
        with pytest.raises(P.ParamError) as e:
            declare_and_read(node, P.REASONING_SPECS)
        assert "ema_alpha=7.0 is outside" in str(e.value) and "policy" in str(e.value)
        node.destroy_node()
    finally:
        rclpy.shutdown(context=ctx)


class FakeEngine:
    """Engine stand-in (2 ms a chunk) that raises while ``armed`` is set."""

    def __init__(self, path, **kw):
        import concurrent.futures

        from vla_edge_ros.admission import PhaseTimings
        from vla_edge_ros.engine import ChunkResult

        self._PT, self._CR = PhaseTimings, ChunkResult
        self.armed = threading.Event()
        self.backend_name, self.weight_format, self.action_decoding = "fake", "bf16", "autoregressive"
        self.phase_tokens = (32, 8)
        self.fault_hook = None
        self._pool = concurrent.futures.ThreadPoolExecutor(1)
        self._busy = threading.Event()
        self.n = 0

    @property
    def busy(self):
        return self._busy.is_set()

    def run_chunk(self, frame):
        time.sleep(0.002)
        if self.armed.is_set():
            raise RuntimeError("injected fault")
        self.n += 1
        return self._CR(tokens=np.arange(8), action=np.full(8, 0.5, np.float32),
                        timings=self._PT(0.1, 0.5, 1.4, 2.0), frame_id=self.n, evicted=[], retained=[self.n],
                        cache_tokens=56)

    def submit(self, frame):
        self._busy.set()
        f = self._pool.submit(self.run_chunk, frame)
        f.add_done_callback(lambda _: self._busy.clear())
        return f

    def warmup(self, chunks=3):
        return [self.run_chunk(None).timings for _ in range(chunks)]

    def stats(self):
        return {"capacity": 512, "used_tokens": 56, "frames_retained": 1, "prompt_tokens": 16}

    def set_worker_priority(self, priority):
        return None

    def close(self):
        self._pool.shutdown()


def test_engine_error_becomes_an_error_fallback(domain, micro_model):
    """In-process: an engine that raises gives engine_error fallbacks (ERROR), never a dead timer."""
    from vla_edge_ros.frame_buffer import FrameBuffer
    from vla_edge_ros.nodes.reasoning_node import ReasoningNode

    engines = []

    def factory(path, **kw):
        engines.append(FakeEngine(path, **kw))
        return engines[-1]

    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=domain,
               args=["--ros-args", "-p", f"model_path:={micro_model}", "-p", "kv_capacity_tokens:=512"])
    fb = FrameBuffer()
    node = ReasoningNode(fb, engine_factory=factory, context=ctx)
    assert node.autostart(), node.startup_error  # configure + activate, as the bringup does
    got = []
    lst = rclpy.create_node("l", context=ctx)
    lst.create_subscription(DiagnosticStatus, "/vla_edge/cycle", lambda m: got.append((kv(m), m.level)),
                            QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
    ex = SingleThreadedExecutor(context=ctx)
    ex.add_node(node)
    ex.add_node(lst)
    stop = threading.Event()

    def camera():
        i = 0
        while not stop.is_set():
            fb.publish(np.full((64, 128, 3), i % 256, np.uint8), 1_000 + i)
            i += 1
            time.sleep(1 / 30)

    threads = [threading.Thread(target=camera, daemon=True),
               threading.Thread(target=lambda: [ex.spin_once(timeout_sec=0.05) for _ in iter(stop.is_set, True)],
                                daemon=True)]
    for t in threads:
        t.start()
    try:
        def wait(pred, timeout, what):
            t_end = time.monotonic() + timeout
            while time.monotonic() < t_end and not pred():
                time.sleep(0.05)
            assert pred(), what

        wait(lambda: any(v["reason"] == "fresh" for v, _ in got), 20, "fresh actions")
        armed = engines[0].armed
        armed.set()
        n0 = len(got)
        wait(lambda: sum(v["reason"] == "engine_error" for v, _ in got[n0:]) >= 3, 10, "engine_error fallbacks")
        errs = [(v, lv) for v, lv in got[n0:] if v["reason"] == "engine_error"]
        assert all(lv == DiagnosticStatus.ERROR and v["source"] == "fallback" and "injected fault" in v["error"]
                   for v, lv in errs)
        armed.clear()
        n1 = len(got)
        wait(lambda: any(v["reason"] == "fresh" for v, _ in got[n1:]), 10, "recovery after the fault")
        d = node.diagnostics_values()[0]
        assert d["engine_errors"] >= 3 and d["fallback_engine_error"] >= 3
    finally:
        stop.set()
        for t in threads:
            t.join(2)
        node.stop()
        ex.shutdown()
        node.destroy_node()
        lst.destroy_node()
        rclpy.shutdown(context=ctx)


def test_demo_runs_on_cpu(domain, tmp_path):
    env = ros_env(domain, {"VLA_EDGE_CACHE": str(tmp_path / "cache")})
    # the demo picks its model by timing the presets here (40 chunks, p90 within 60 % of the budget), and fails a
    # window with a deadline miss or under half model actions: twice the plumbing tests' period (33 ms unless the
    # micro chunk takes more than half of it on this host) leaves it room on a host 3x slower, whose timings jump
    period = 2 * plumbing_period_ms()
    r = subprocess.run([sys.executable, "-m", "vla_edge_ros.tools.demo", "--seconds", "3",
                        "--period-ms", str(period)],
                       env=env, capture_output=True, text=True, timeout=240, cwd=str(ROOT))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    out = r.stdout
    for needle in ("vla-edge-demo summary", "cycles", "model actions", "fallbacks", "action rate", "cycle latency"):
        assert needle in out, out
    assert "[demo] model " in out and "measured here" in out, out  # the one line saying what it chose and why
    rate = float(out.split("action rate")[1].split("Hz")[0])
    # +- 10 %, and one cycle more or fewer in the 3 s window (at the 320 ms period of a slow host, 8 cycles instead of
    # 9 are 11 % off by themselves)
    assert abs(rate - 1000.0 / period) <= 0.1 * 1000.0 / period + 1.0 / 3.0, out
    assert int(out.split("model actions")[1].split()[0]) > 0, out
