# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Issue 6 end-to-end: `vla_edge` keeps publishing and says why, whatever the camera, the model files or
the parameters do. Separate OS processes over real DDS (helpers: ros_helpers.py, fixtures: conftest.py)."""

from __future__ import annotations

import collections
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy")

from ros_helpers import (  # noqa: E402
    PERIOD_MS, ROBOT_DISCOVERY, ROOT, Listener, cadence, Proc, plumbing_period_ms, plumbing_rate, reasons, ros_env,
    start_replay, start_vla_edge)

pytestmark = [pytest.mark.ros, pytest.mark.slow]


# --------------------------------------------------------------------------------------------
# parameters at run time
# --------------------------------------------------------------------------------------------

def _set(client, node, **values):
    from rclpy.parameter import Parameter

    fut = client.set_parameters([Parameter(k, value=v) for k, v in values.items()])
    t_end = time.monotonic() + 10
    while not fut.done() and time.monotonic() < t_end:
        time.sleep(0.02)
    assert fut.done(), f"no answer from set_parameters({values})"
    return fut.result().results


def _get(client, *names):
    from rclpy.parameter import parameter_value_to_python

    fut = client.get_parameters(list(names))
    t_end = time.monotonic() + 10
    while not fut.done() and time.monotonic() < t_end:
        time.sleep(0.02)
    return [parameter_value_to_python(v) for v in fut.result().values]


def test_parameters_at_run_time_through_a_parameter_client(domain, tmp_path, procs, micro_model):
    from rclpy.parameter_client import AsyncParameterClient

    node = start_vla_edge(procs, domain, tmp_path, micro_model, {})
    lst = Listener(domain)
    client = AsyncParameterClient(lst.node, "/vla_edge")
    cam = AsyncParameterClient(lst.node, "/vla_camera")
    try:
        lst.wait_for(lambda: len(lst.actions) > 5, 60, "the first actions of vla_edge")
        assert client.wait_for_services(10) and cam.wait_for_services(10)

        # impossible values: refused with a reason, nothing changes
        refused = [
            # a margin over the period this host's plumbing runs at (33 ms, more on a slow host)
            ({"safety_margin_ms": float(int(plumbing_period_ms()) + 7)}, "must be greater than safety_margin_ms"),
            ({"period_ms": 1.5}, "must be greater than safety_margin_ms"),
            ({"ema_alpha": 3.0}, ""),  # rclpy's own range check (FloatingPointRange)
            ({"ema_alpha": float("nan")}, "ema_alpha"),
            ({"fallback": "brake"}, "not one of zero, hold"),
            ({"twist_map": [0, 1, 2, 3, 4, 99]}, "twist_map entries"),
            ({"twist_scale": [float("nan"), 1.0, 1.0, 1.0, 1.0, 1.0]}, "twist_scale entries must be finite"),
            ({"twist_scale": [1.0, 1.0, 1.0, 1.0, 1.0, float("inf")]}, "twist_scale entries must be finite"),
            ({"kv_capacity_tokens": 1024}, "only be changed while the node is unconfigured"),
            ({"policy": "semantic"}, "only be changed while the node is unconfigured"),
            ({"action_labels": ["a"] * 8}, "read-only"),
        ]
        for values, pattern in refused:
            (r,) = _set(client, lst.node, **values)
            assert not r.successful and r.reason, (values, r)
            assert pattern in r.reason, (values, r.reason)
        assert _get(client, "period_ms", "safety_margin_ms", "ema_alpha", "fallback", "kv_capacity_tokens") == \
            [plumbing_period_ms(), 2.0, 0.2, "zero", 512]
        (r,) = _set(cam, lst.node, qos_depth=50)
        assert not r.successful and "read-only" in r.reason

        # possible values: applied while running
        t0 = time.monotonic()
        time.sleep(2.0)
        ok, why = cadence(lst.actions_between(t0, time.monotonic()), cycles=lst.all_cycles())
        assert ok, why
        rs = _set(client, lst.node, period_ms=50.0, ema_alpha=0.5, tail_k=1.0, fallback="hold",
                  max_frame_age_ms=150.0)
        assert all(r.successful for r in rs), rs
        (r,) = _set(cam, lst.node, warn_throttle_s=5.0)
        assert r.successful
        assert _get(client, "period_ms", "ema_alpha", "fallback") == [50.0, 0.5, "hold"]
        time.sleep(1.5)
        t1 = time.monotonic()
        time.sleep(3.0)
        t2 = time.monotonic()
        ok, why = cadence(lst.actions_between(t1, t2), 50.0, cycles=lst.all_cycles())
        assert ok, f"period_ms 50: {why}"
        lst.wait_for(lambda: lst.diags and float(lst.diags[-1][1]["period_ms"]) == 50.0, 5, "period in /diagnostics")
        # margin and period together, checked against each other. The new period is one this host keeps (the plumbing
        # period or longer) and far from 50 ms: a faster one (20 ms) was kept on an idle 2-core box but not in a loaded
        # CI run (32.7 actions a second instead of 50), a verdict that depended on the host's speed
        p2 = max(plumbing_period_ms(), 70.0)
        rs = _set(client, lst.node, period_ms=p2, safety_margin_ms=5.0)
        assert all(r.successful for r in rs), rs
        time.sleep(1.0)
        t3 = time.monotonic()
        time.sleep(3.0)
        ok, why = cadence(lst.actions_between(t3, time.monotonic()), p2, cycles=lst.all_cycles())
        assert ok, f"period_ms {p2:g}: {why}"
        cyc = lst.cycles_between(t3, time.monotonic())
        assert cyc and all(float(v["cycle_ms"]) <= p2 + 3.0 for _, v, _ in cyc if v["late"] == "False")
        out = node.output()
        assert "parameter change refused" in out and "parameters set at run time" in out
    finally:
        lst.close()
    assert node.stop() == 0, node.output()[-3000:]


# --------------------------------------------------------------------------------------------
# the camera floods
# --------------------------------------------------------------------------------------------

FLOOD = r"""
import sys, time, numpy as np, rclpy
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import Image
hz, seconds = float(sys.argv[1]), float(sys.argv[2])
rclpy.init()
n = rclpy.create_node("flood")
pub = n.create_publisher(Image, "/image", qos_profile_sensor_data)
from vla_edge_ros.synthetic_bag import synthetic_frame
frames = []
for k in range(4):  # four different views with edges, so the camera's frame-quality checks pass them
    m = Image(height=480, width=640, encoding="rgb8", step=640 * 3)
    m.data = synthetic_frame(10 * k, 480, 640).tobytes()
    frames.append(m)
t_end = time.monotonic() + 20
while pub.get_subscription_count() == 0 and time.monotonic() < t_end:
    time.sleep(0.05)
t0 = time.monotonic()
i = 0
while time.monotonic() - t0 < seconds:
    m = frames[i % 4]
    m.header.stamp.sec, m.header.stamp.nanosec = divmod(1_000_000_000 + i * 4_166_667, 1_000_000_000)
    pub.publish(m)
    i += 1
    d = t0 + i / hz - time.monotonic()
    if d > 0:
        time.sleep(d)
print(f"flood: {i} frames in {time.monotonic() - t0:.2f} s = {i / (time.monotonic() - t0):.1f} Hz", flush=True)
n.destroy_node()
rclpy.shutdown()
"""


def test_camera_flood_at_240_hz(domain, tmp_path, procs, micro_model):
    """640x480 raw at 240 Hz for several seconds: actions at the cycle rate and on time, the rate and the drops
    reported."""
    shm = {"FASTRTPS_DEFAULT_PROFILES_FILE": str(ROOT / "config" / "fastdds_shm.xml")}
    node = start_vla_edge(procs, domain, tmp_path, micro_model, {}, extra_env=shm)
    lst = Listener(domain)
    try:
        lst.wait_for(lambda: len(lst.actions) > 5, 60, "the first actions of vla_edge")
        seconds = 8.0
        flood = Proc(["-c", FLOOD, "240", str(seconds)], ros_env(domain, shm), tmp_path / "flood.log")
        procs.append(flood)
        lst.wait_for(lambda: any(v["reason"] == "fresh" for _, v, _ in lst.cycles), 30, "model actions on the flood")
        lst.wait_for(lambda: lst.diags and "frames_received" in lst.diags[-1][1], 10, "camera counters in /diagnostics")
        # diagnostics times are their header stamps (publication), so a stall of this listener cannot skew the rates
        with lst.lock:
            d0, td0 = lst.diags[-1][1], lst.diag_stamps[-1]
        t0 = time.monotonic()
        time.sleep(5.0)
        t1 = time.monotonic()
        with lst.lock:
            d1, td1 = lst.diags[-1][1], lst.diag_stamps[-1]
            stamped = [(ts, d) for ts, (_, d) in zip(lst.diag_stamps, lst.diags) if "frames_received" in d]
        assert node.alive(), node.output()[-3000:]
        acts = lst.actions_between(t0, t1)
        ok, why = cadence(acts, cycles=lst.all_cycles())
        assert ok, f"under the flood: {why}"
        cyc = lst.cycles_between(t0, t1)
        r = reasons(cyc)
        assert r["fresh"] > 0, r
        late = sum(v["late"] == "True" for _, v, _ in cyc)
        assert late / len(cyc) <= 0.05, f"{late} of {len(cyc)} cycles late under the flood: {r}"
        cms = np.array([float(v["cycle_ms"]) for _, v, _ in cyc])
        assert float(np.percentile(cms, 99)) <= plumbing_period_ms() + 3.0
        # the reported rate is what the camera process really received (counted), whatever this host manages of
        # the 240 Hz flood (164 Hz measured under slow_host.sh -f 3), and that is far more than the cycle rate
        cam_rate = float(d1["camera_rate_hz"])
        received = (int(d1["frames_received"]) - int(d0["frames_received"])) / (td1 - td0)
        assert received >= 2.0 * plumbing_rate(), f"{received:.0f} Hz received: no flood on this host"
        # the reported rate covers the last 2 s (camera_node.RATE_WINDOW_S): compare with the count over them
        tdw, dw = min(stamped, key=lambda d: abs(td1 - 2.0 - d[0]))
        recent = (int(d1["frames_received"]) - int(dw["frames_received"])) / (td1 - tdw)
        assert 0.75 * recent <= cam_rate <= min(260.0, 1.25 * recent), \
            f"camera rate {cam_rate} Hz reported, {recent:.1f} Hz received in the last {td1 - tdw:.1f} s"
        dropped = int(d1["frames_dropped"]) - int(d0.get("frames_dropped", 0))
        published = int(d1["frames_published"]) - int(d0.get("frames_published", 0))
        # ~240 frames a second in, at most ~30 a second read: the rest are overwritten, and counted
        assert published > 0 and dropped >= 0.6 * published, (dropped, published)
        assert int(d1["frames_invalid"]) == 0
        flood.p.wait(20)
        assert "flood:" in flood.output()
    finally:
        lst.close()
    assert node.stop() == 0, node.output()[-3000:]


# --------------------------------------------------------------------------------------------
# the engine fails mid-chunk (test-only switch)
# --------------------------------------------------------------------------------------------

def test_engine_fault_injected_through_the_test_only_env_var(domain, tmp_path, procs, micro_model):
    from diagnostic_msgs.msg import DiagnosticStatus

    from vla_edge_ros.synthetic_bag import make_test_bag

    switch = tmp_path / "fail_now"
    bag = make_test_bag(tmp_path / "bag", frames=30, fps=30.0, width=160, height=120)
    node = start_vla_edge(procs, domain, tmp_path, micro_model, {}, remaps=[("image", "/camera/image_raw")],
                          extra_env={"VLA_EDGE_TEST_FAULT_FILE": str(switch)})
    lst = Listener(domain)
    try:
        lst.wait_for(lambda: len(lst.actions) > 5, 60, "the first actions of vla_edge")
        assert "TEST-ONLY fault injection enabled" in node.output()
        start_replay(procs, domain, tmp_path, bag, "--loop")
        lst.wait_for(lambda: any(v["reason"] == "fresh" for _, v, _ in lst.cycles), 30, "fresh model actions")
        switch.touch()
        n0 = len(lst.cycles)
        lst.wait_for(lambda: sum(v["reason"] == "engine_error" for _, v, _ in lst.cycles[n0:]) >= 5, 10,
                     "engine_error fallbacks")
        switch.unlink()
        with lst.lock:
            errs = [(v, lv) for _, v, lv in lst.cycles[n0:] if v["reason"] == "engine_error"]
        error_level = DiagnosticStatus.ERROR[0] if isinstance(DiagnosticStatus.ERROR, bytes) else DiagnosticStatus.ERROR
        assert all(lv == error_level and v["source"] == "fallback" and "injected fault" in v["error"]
                   for v, lv in errs), errs[:2]
        n1 = len(lst.cycles)
        lst.wait_for(lambda: any(v["reason"] == "fresh" for _, v, _ in lst.cycles[n1:]), 10, "recovery")
        with lst.lock:
            after = [v for _, v, _ in lst.cycles[n1:]]
        first_fresh = next(i for i, v in enumerate(after) if v["reason"] == "fresh")
        assert first_fresh <= 3, [v["reason"] for v in after[:6]]  # the next cycle with a new frame recovers
        lst.wait_for(lambda: lst.diags and int(lst.diags[-1][1]["engine_errors"]) >= 5, 5, "engine_errors counted")
        d = lst.last_diag()
        assert int(d["fallback_engine_error"]) >= 5
        assert node.alive()
    finally:
        lst.close()
    assert node.stop() == 0, node.output()[-3000:]


def test_no_parameter_switches_fault_injection_on():
    # the behaviour without the variable (no fault on a running node) is test_fault_switch.py
    from vla_edge_ros import settings as P

    assert not any("fault" in s.name for s in P.REASONING_SPECS + P.CAMERA_SPECS)


# --------------------------------------------------------------------------------------------
# broken model directories: exit 3, one message naming the file and the tensor
# --------------------------------------------------------------------------------------------

def _break(d: Path, how: str) -> str:
    from vla_edge_ros.model.safetensors_io import load_file, save_file

    f = d / "model.safetensors"
    if how == "truncated":
        with open(f, "r+b") as fh:
            fh.truncate(f.stat().st_size - 1000)
        return "truncated"
    t = {k: (dt, np.array(a)) for k, (dt, a) in load_file(str(f)).items()}
    name = "model.layers.0.self_attn.q_proj.weight"
    if how == "missing":
        del t[name]
        save_file(t, f)
        return "missing"
    if how == "shape":
        dt, a = t[name]
        t[name] = (dt, a[:-1])
        save_file(t, f)
        return "shape"
    if how == "nan":
        dt, a = t[name]
        a = a.copy()
        a.flat[7] = 0x7FC0  # bf16 NaN
        t[name] = (dt, a)
        save_file(t, f)
        return "nan or inf"
    raise ValueError(how)


@pytest.mark.parametrize("how", ["missing", "truncated", "shape", "nan"])
def test_broken_model_exits_3_with_one_message_naming_file_and_tensor(domain, tmp_path, micro_model, how):
    import shutil

    d = tmp_path / "model"
    shutil.copytree(micro_model, d)
    word = _break(d, how)
    r = subprocess.run([sys.executable, "-m", "vla_edge_ros.nodes.bringup", "--ros-args", "-p",
                        f"model_path:={d}", "-p", "kv_capacity_tokens:=512"], env=ros_env(domain),
                       capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert r.returncode == 3, (r.returncode, r.stderr[-2000:])
    msgs = [ln for ln in r.stderr.splitlines() if ln.startswith("vla_edge:")]
    assert len(msgs) == 1, r.stderr[-2000:]
    m = msgs[0]
    assert "model.safetensors" in m and word in m.lower(), m
    if how != "truncated":  # a truncated file names the first tensor past the end, whichever it is
        assert "model.layers.0.self_attn.q_proj.weight" in m, m
    else:
        assert "tensor '" in m, m
    assert "Traceback" not in r.stderr


# --------------------------------------------------------------------------------------------
# nothing is written outside the declared outputs
# --------------------------------------------------------------------------------------------

SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".hypothesis", "build", "install", "log"}


def _snapshot(root: Path) -> dict:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        for f in filenames:
            p = Path(dirpath) / f
            try:
                st = p.stat()
            except OSError:
                continue
            out[str(p)] = (st.st_size, st.st_mtime_ns)
    return out


def _changed(before: dict, after: dict) -> list[str]:
    return sorted(p for p in after if before.get(p) != after[p]) + sorted(p for p in before if p not in after)


def test_nothing_is_written_outside_the_declared_outputs(domain, tmp_path, micro_model):
    from vla_edge_ros.synthetic_bag import make_test_bag

    bag = make_test_bag(tmp_path / "bag", frames=20, fps=30.0, width=160, height=120)
    model_copy = tmp_path / "model"
    import shutil

    shutil.copytree(micro_model, model_copy)
    cwd, home, xdg, cache = (tmp_path / n for n in ("cwd", "home", "xdg", "cache"))
    for p in (cwd, home, xdg, cache):
        p.mkdir()
    env = ros_env(domain, {"HOME": str(home), "XDG_CACHE_HOME": str(xdg), "VLA_EDGE_CACHE": str(cache),
                           "PYTHONDONTWRITEBYTECODE": "1", "ROS_HOME": str(home / ".ros")})
    env.pop("ROS_LOG_DIR", None)
    roots = [ROOT, tmp_path]
    before = {r: _snapshot(r) for r in roots}
    started = []
    try:
        # the node twice: with a given model (writes nothing) and with make_tiny_model (writes the cache)
        for args in (["-p", f"model_path:={model_copy}"], ["-p", "make_tiny_model:=true"]):
            node = subprocess.Popen([sys.executable, "-m", "vla_edge_ros.nodes.bringup", "--ros-args", *args,
                                     "-p", "kv_capacity_tokens:=512", "-r", "image:=/camera/image_raw"],
                                    env=env, cwd=str(cwd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            replay = subprocess.Popen([sys.executable, "-m", "vla_edge_ros.tools.replay", str(bag), "--duration", "3"],
                                      env=env, cwd=str(cwd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            started += [node, replay]
            if "make_tiny_model:=true" in args:  # the node writes the model before it subscribes: on a slow host that
                # took longer than the 3 s replay (a slow_host.sh -f 3 pass stopped the node before config.json)
                t_end = time.monotonic() + 120
                while not (cache / "tiny-seed0" / "config.json").is_file() and time.monotonic() < t_end:
                    time.sleep(0.2)
            replay.wait(60)
            time.sleep(0.5)
            node.send_signal(2)
            node.wait(30)
            assert node.returncode == 0 and replay.returncode == 0, \
                (node.stdout.read()[-2000:], replay.stdout.read()[-2000:])
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
                p.wait(5)
    after = {r: _snapshot(r) for r in roots}
    repo_changes = _changed(before[ROOT], after[ROOT])
    # another developer may edit source files meanwhile: only files outside the package sources count
    repo_changes = [p for p in repo_changes if not p.endswith((".py", ".cu", ".cuh", ".md", ".sh"))]
    assert repo_changes == [], repo_changes
    allowed = (str(cache) + os.sep, str(home / ".ros" / "log") + os.sep)
    tmp_changes = [p for p in _changed(before[tmp_path], after[tmp_path]) if not p.startswith(allowed)]
    assert tmp_changes == [], tmp_changes
    assert (cache / "tiny-seed0" / "config.json").is_file()  # make_tiny_model wrote the declared cache
    assert not any(cwd.iterdir()) and not any(xdg.iterdir())


# --------------------------------------------------------------------------------------------
# soak (the CI version of vla-edge-soak)
# --------------------------------------------------------------------------------------------

MAX_CI_MISS_RATE = 0.003


@pytest.mark.exclusive  # asserts no late cycle: runs alone (conftest)
def test_soak_20_seconds(domain, tmp_path):
    """The CI version of vla-edge-soak (long soaks: the tool, BENCHMARKS.md): 20 s with a 30 Hz camera at the plumbing
    period, nothing leaks, the model acts in most cycles and no action is late after warm-up."""
    out = tmp_path / "soak"
    env = ros_env(domain, {"VLA_EDGE_CACHE": str(tmp_path / "cache")})
    period = plumbing_period_ms()
    seconds, warmup = 20.0, 5.0
    # realtime_priority: the reasoning thread at SCHED_FIFO, as BENCHMARKS.md's soaks show a busy 2-core box needs
    # (refused without the privilege, then a warning). The tool's own default verdict allows no miss at all; on CI's
    # 2 shared cores, with other tests' processes starting and stopping, one late cycle in ~1,400 was still seen
    # (37 ms, 2 of 4 full runs): this CI check allows up to 3 in 1,000 and still fails a stall or a systematic lag.
    # a 15 Hz camera: under slow_host.sh -f 3 a 60 Hz replay process fell to ~37 Hz, a 30 Hz one to 13.75 Hz (the
    # node at SCHED_FIFO beside it); the camera's rate is the replay's and the host's, what is judged here is the node
    fps = 15.0
    r = subprocess.run([sys.executable, "-m", "vla_edge_ros.tools.soak", "--seconds", str(seconds),
                        "--warmup", str(warmup), "--preset", "micro", "--fps", f"{fps:g}",
                        "-p", "realtime_priority:=10",
                        "-p", f"period_ms:={period}",
                        "--max-miss-rate", str(MAX_CI_MISS_RATE), "--out", str(out)],
                       env=env, capture_output=True, text=True, timeout=240, cwd=str(tmp_path))
    s = json.loads((out / "summary.json").read_text()) if (out / "summary.json").is_file() else {}
    assert r.returncode == 0 and s.get("verdict") == "pass", r.stdout[-3000:] + r.stderr[-2000:]
    assert s["rss_growth_pct"] < 2.0 and s["deadline_miss_rate_after_warmup"] <= MAX_CI_MISS_RATE
    cycles_expected = seconds * 1000.0 / period
    assert s["cycles"] > 0.8 * cycles_expected, (s["cycles"], cycles_expected)
    assert s["cycles_after_warmup"] > 0.6 * cycles_expected
    assert 0.6 * fps <= s["camera_rate_hz"] <= 1.2 * fps  # the replay's rate arrives, and is reported as such
    q = s["frame_quality"]  # the camera-quality counts at the end (cumulative): every frame received was checked
    assert q["checks"] == "on" and q["frames_checked"] >= 0.5 * fps * seconds, q
    assert "frame quality " in r.stdout and f"{int(q['frames_checked'])} frames checked" in r.stdout
    rows = (out / "samples.csv").read_text().splitlines()
    assert len(rows) >= seconds and rows[0].startswith("t_s,rss_mb,vram_mb")
    # The model keeps running after the warm-up (model actions in at least 2 % of those cycles: a refusal stuck from
    # the warm-up on gives none), with no engine error and no non-finite output. How often it runs is the admission
    # controller's call and depends on the host: on a loaded 2-core CI run it refused 423 of 637 cycles (chunk p50
    # 15 ms, tail estimate ~20.5 ms against what was left of a 33 ms cycle), correctly, and acted in 37 of the 485
    # after the warm-up; its admitted share is measured by test_admission.py and the slow-host runs, not here.
    acted = s["model_actions_after_warmup"]
    rs = s["reasons"]
    assert acted >= 0.02 * s["cycles_after_warmup"], (acted, s["cycles_after_warmup"], rs)
    assert not any(rs.get(k) for k in ("engine_error", "internal_error", "non_finite")), rs
    assert not math.isnan(s["cycle_ms_p99"]) and s["cycle_ms_p99"] <= period


def test_a_config_that_cannot_meet_the_deadline_warns_at_start_up(domain, tmp_path, procs, small_model):
    """The 'small' model at 4096 slots on this CPU costs far more than the 31 ms budget: WARN in the log and
    in /diagnostics, naming kv_capacity_tokens / period_ms / backend."""
    node = start_vla_edge(procs, domain, tmp_path, small_model,
                          {"period_ms": PERIOD_MS, "kv_capacity_tokens": 4096, "warmup_chunks": 2})
    lst = Listener(domain)
    try:
        lst.wait_for(lambda: lst.diags and "admission_warning" in lst.diags[-1][1], 90, "the admission warning")
        w = lst.last_diag()["admission_warning"]
        assert "exceeds the budget 31.00 ms" in w and "kv_capacity_tokens" in w and "period_ms" in w, w
        assert "backend cuda" in w
        out = node.output()
        assert "[WARN]" in out and "exceeds the budget" in out
    finally:
        lst.close()
    assert node.stop() == 0, node.output()[-3000:]


def test_unknown_keys_in_a_params_file_are_named(domain, tmp_path, procs, micro_model):
    cfg = tmp_path / "typo.yaml"
    cfg.write_text("/**/vla_edge:\n  ros__parameters:\n    perod_ms: 50.0\n"
                   "/**/vla_camera:\n  ros__parameters:\n    qos_dept: 3\n")
    node = Proc(["-m", "vla_edge_ros.nodes.bringup", "--ros-args", "--params-file", str(cfg), "-p",
                 f"model_path:={micro_model}", "-p", "kv_capacity_tokens:=512"], ros_env(domain), tmp_path / "typo.log")
    procs.append(node)
    t_end = time.monotonic() + 60
    while "unknown parameters" not in node.output() and time.monotonic() < t_end and node.alive():
        time.sleep(0.1)
    out = node.output()
    assert "[WARN]" in out and "unknown parameters, ignored: perod_ms (did you mean period_ms?), qos_dept (did you " \
        "mean qos_depth?)" in out, out[-2000:]
    # -p model_path (meant for vla_edge, also handed to vla_camera) is no unknown key
    assert "model_path" not in out.split("unknown parameters")[1].splitlines()[0]
    assert node.stop() == 0, out[-2000:]


# --------------------------------------------------------------------------------------------
# frames over the size caps (issue 13.4): dropped before conversion, counted, WARN
# --------------------------------------------------------------------------------------------

BIG = r"""
import sys, time, rclpy
from rclpy.qos import QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import Image
w, h, n, hz = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
rclpy.init()
node = rclpy.create_node("big_camera")
pub = node.create_publisher(Image, "/image", QoSProfile(depth=2, reliability=ReliabilityPolicy.RELIABLE))
m = Image(height=h, width=w, encoding="rgb8", step=w * 3)
m.data = bytes(w * h * 3)
t_end = time.monotonic() + 20
while pub.get_subscription_count() == 0 and time.monotonic() < t_end:
    time.sleep(0.05)
print(f"matched at {time.monotonic():.3f}", flush=True)
from rclpy.duration import Duration
for i in range(n):
    m.header.stamp.sec = 100 + i
    t = time.monotonic()
    pub.publish(m)
    print(f"published {i} at {t:.3f}", flush=True)
    # delivered before the next (keep-last 2 would replace a frame a slow host has not taken yet), at most 1/hz
    pub.wait_for_all_acked(Duration(seconds=30))
    time.sleep(max(0.0, t + 1.0 / hz - time.monotonic()))
time.sleep(2.0)
node.destroy_node()
rclpy.shutdown()
"""


def _publish_times(cycles, t0, t1):
    """(publish time, late, missed ticks before it) of each cycle published in [t0, t1), from ~/cycle: the node's
    own clock (CLOCK_MONOTONIC, shared by the processes), not this listener's receive times."""
    out = []
    for _, v, _ in cycles:
        t = float(v["tick_monotonic"]) + float(v["cycle_ms"]) / 1000.0
        if t0 <= t < t1:
            out.append((t, v["late"] == "True", int(v["missed_before"]), v["source"]))
    return sorted(out)


@pytest.mark.exclusive  # asserts no late cycle: runs alone (conftest)
@pytest.mark.parametrize("caps", ["default", "raised"])
def test_8k_frames_do_not_delay_actions(domain, tmp_path, procs, micro_model, caps):
    """8K rgb8 (99.5 MB a message) at 1 Hz over reliable QoS (issue 13.4). The camera runs in its own process,
    so receiving and converting such frames never touches the control loop: from the 8K publisher's start, every
    cycle publishes by its deadline, no tick is missed, and the longest gap between actions is
    at most two periods (a cycle published at its deadline after one published at its tick); the reasoning
    process's memory stays flat. That holds run alone; in full CI runs on a 2-core box hiccups up to ~100 ms
    were seen and 212.8 ms under slow_host.sh -f 3, so the assertion is "no freeze" (gap <= 250 ms, <= 6 missed
    ticks; an 8K message in the control process froze it 270-490 ms on a full-speed host). With the default caps every
    frame is dropped as too_large (camera WARN); with the caps raised they are converted and reach the model.
    Before the camera had its own process: 270-490 ms gaps and 400-700 MB.

    The window starts before the 8K publisher's participant joins: with a robot's discovery range the reasoning
    process has no shared-memory transport, so its discovery no longer stalls a publish (BENCHMARKS.md)."""
    # the 8K frames are black (bytes(...)): the frame-quality checks would refuse them; this test is the transport's
    params = {"qos_reliability": "reliable", "realtime_priority": 10, "frame_quality": False}
    if caps == "raised":
        # Converting one 8K frame takes ~150 ms on this 2-core host after its receive stamp (~450 ms under
        # slow_host.sh -f 3, where none of the four reached the model at the default 200 ms: 0 model actions in 113
        # cycles): frames count as fresh for 1 s here, so the converted frames reach the model on a slow host too
        params.update(max_image_bytes=128 * 1024 * 1024, max_image_pixels=64 * 1024 * 1024, max_frame_age_ms=1000.0)
    node = start_vla_edge(procs, domain, tmp_path, micro_model, params, extra_env=ROBOT_DISCOVERY)
    lst = Listener(domain)
    try:
        lst.wait_for(lambda: len(lst.actions) > 10 and lst.diags and "missed_ticks" in lst.diags[-1][1], 60,
                     "the first actions and /diagnostics of the active vla_edge")
        frames = 4
        cam = Proc(["-c", BIG, "7680", "4320", str(frames), "1.0"], ros_env(domain), tmp_path / "big.log")
        procs.append(cam)
        t0 = time.monotonic()
        cam.p.wait(60)
        time.sleep(1.5)
        t1 = time.monotonic()
        assert cam.p.returncode == 0, cam.output()[-2000:]
        t_match = float(cam.output().split("matched at ")[1].split()[0])
        time.sleep(0.5)  # the last cycles' ~/cycle messages arrive
        lst.wait_for(lambda: int(lst.diags[-1][1].get("frames_received", 0)) >= frames - 1, 10,
                     "the frames counted in /diagnostics")
        d = lst.last_diag()
        with lst.lock:
            cycles = list(lst.cycles)
            rx = [t for t, _, _ in lst.actions if t_match <= t < t1]
        during = _publish_times(cycles, t0, t1)  # the join and discovery included
        before = _publish_times(cycles, t0, t_match)
        times = [t for t, _, _, _ in during]
        gap_ms = max(b - a for a, b in zip(times, times[1:])) * 1000.0
        late = sum(1 for _, lt, _, _ in during if lt)
        missed = sum(m for _, _, m, _ in during[1:])
        before_gap_ms = max((b[0] - a[0] for a, b in zip(before, before[1:])), default=0.0) * 1000.0
        rx_gap_ms = max(b - a for a, b in zip(rx, rx[1:])) * 1000.0
        hwm_kb = int(next(ln for ln in open(f"/proc/{node.p.pid}/status") if ln.startswith("VmHWM")).split()[1])
        reasons = collections.Counter(v["reason"] for _, v, _ in cycles
                                      if t0 <= float(v["tick_monotonic"]) + float(v["cycle_ms"]) / 1000.0 < t1)
        print(f"8K rgb8, caps {caps}: {d['frames_received']} received, {d['invalid_too_large']} too_large, "
              f"{d['frames_valid']} valid; from the publisher's start ({t1 - t0:.1f} s, {len(during)} cycles, "
              f"{sum(src == 'model' for *_, src in during)} model actions): longest gap between action publishes "
              f"{gap_ms:.1f} ms, {late} late, {missed} missed ticks; of which discovery ({t_match - t0:.1f} s): "
              f"longest gap {before_gap_ms:.1f} ms; longest gap at this listener {rx_gap_ms:.0f} ms; reasoning "
              f"process VmHWM {hwm_kb / 1024:.0f} MB; reasons {dict(reasons)}")
        assert int(d["frames_received"]) >= frames - 1
        if caps == "default":
            assert int(d["invalid_too_large"]) == int(d["frames_received"]) and int(d["frames_valid"]) == 0
            assert "dropped a frame" in node.output() and "max_image_bytes" in node.output()
        else:
            assert int(d["invalid_too_large"]) == 0 and int(d["frames_valid"]) >= frames - 1
            assert any(src == "model" for *_, src in during)  # the converted 8K frames reached the model
        assert len(during) / (t1 - t0) > 0.9 * plumbing_rate()
        # An 8K message in the control process froze it 270-490 ms (24-47 missed ticks). Run alone: 0 late, 0
        # missed, gap <= 2 periods (BENCHMARKS.md). In full CI runs on 2 cores 2 of 10 executions had a hiccup
        # (83 ms / 1 missed tick; 103 ms / 1 late, 2 missed) with the frames dropped unread in the camera process,
        # i.e. load on the box, cause not established; 212.8 ms under slow_host.sh -f 3. The assertion separates a
        # freeze (>= 270 ms on a full-speed host, longer on a slower one) from that.
        assert late <= 2 and missed <= 6 and gap_ms <= 250.0, (late, missed, gap_ms)
        assert hwm_kb < 250 * 1024  # one 8K message in this process would be 100 MB more
        assert d["camera_process_state"] == "running" and int(d["camera_process_restarts"]) == 0
        assert node.alive()
    finally:
        lst.close()
    assert node.stop() == 0, node.output()[-3000:]


# --------------------------------------------------------------------------------------------
# the camera's own process dies (issue 13.4 design): watched, restarted, reported; never orphaned
# --------------------------------------------------------------------------------------------

def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


@pytest.mark.exclusive  # asserts no late cycle: runs alone (conftest)
def test_a_killed_camera_process_is_restarted_and_reported(domain, tmp_path, procs, micro_model):
    """SIGKILL the camera process while frames flow: the control loop keeps its rate and deadlines (stale-frame
    fallbacks until frames return), /diagnostics reports the camera process killed (ERROR) and restarted, fresh
    model actions come back. Then SIGKILL vla_edge itself: its camera process does not outlive it."""
    node = start_vla_edge(procs, domain, tmp_path, micro_model, {"realtime_priority": 10}, extra_env=ROBOT_DISCOVERY)
    lst = Listener(domain)
    try:
        flood = Proc(["-c", FLOOD, "60", "25"], ros_env(domain), tmp_path / "camera.log")
        procs.append(flood)
        lst.wait_for(lambda: any(v["reason"] == "fresh" for _, v, _ in lst.cycles) and lst.diags
                     and "camera_process_pid" in lst.diags[-1][1], 60, "model actions and /diagnostics")
        cam_pid = int(lst.last_diag()["camera_process_pid"])
        assert cam_pid in _children(node.p.pid)
        t_kill = time.monotonic()
        os.kill(cam_pid, signal.SIGKILL)
        lst.wait_for(lambda: lst.diags and lst.diags[-1][1].get("camera_process_restarts") == "1"
                     and lst.diags[-1][1].get("camera_process_state") == "running", 30, "the camera process restarted")
        t_back = time.monotonic()
        lst.wait_for(lambda: any(v["reason"] == "fresh" and float(v["tick_monotonic"]) > t_back
                                 for _, v, _ in lst.cycles), 30, "model actions after the restart")
        t_end = time.monotonic()
        with lst.lock:
            cycles = list(lst.cycles)
            diags = list(lst.diags)
        pubs = [(float(v["tick_monotonic"]) + float(v["cycle_ms"]) / 1000.0, v) for _, v, _ in cycles]
        pubs = sorted((t, v) for t, v in pubs if t_kill - 0.5 <= t < t_end)
        gap_ms = max(b[0] - a[0] for a, b in zip(pubs, pubs[1:])) * 1000.0
        missed = sum(int(v["missed_before"]) for _, v in pubs[1:])
        late = sum(v["late"] == "True" for _, v in pubs)
        stale = sum(v["reason"] == "stale_frame" for _, v in pubs)
        reported = [v.get("camera_process_last_exit", "") for t, v in diags if t >= t_kill]
        received = [int(v["frames_received"]) for _, v in diags if "frames_received" in v]
        new_pid = int(lst.last_diag()["camera_process_pid"])
        print(f"camera process killed: restarted in {t_back - t_kill:.1f} s, {stale} stale_frame fallbacks, longest "
              f"gap between actions {gap_ms:.1f} ms, {late} late, {missed} missed ticks; reported {set(reported)}")
        # The new camera process imports rclpy on the same 2 cores while the loop runs: a fresh-clone CI run saw one
        # cycle published after its deadline there (gap 63.2 ms, no tick missed). One is allowed; a freeze or a lag
        # still fails (missed ticks, the gap bound, a second late cycle).
        assert late <= 1 and missed == 0 and gap_ms <= 2 * plumbing_period_ms() + 3.0
        assert stale > 0  # the frames stopped and the loop said so
        assert any("killed by SIGKILL" in r for r in reported), reported
        assert all(b >= a for a, b in zip(received, received[1:])), received  # counts survive the restart
        assert new_pid != cam_pid and new_pid in _children(node.p.pid)
        out = node.output()
        assert "camera process killed by SIGKILL; starting it again (restart 1)" in out, out[-2000:]
    finally:
        lst.close()
    node.p.kill()  # no clean-up of any kind in vla_edge
    node.p.wait(5)
    t_end = time.monotonic() + 5.0
    while time.monotonic() < t_end and os.path.exists(f"/proc/{new_pid}"):
        time.sleep(0.05)
    stat = open(f"/proc/{new_pid}/stat").read().split() if os.path.exists(f"/proc/{new_pid}") else None
    assert stat is None or stat[2] == "Z", f"the camera process {new_pid} outlived vla_edge by 5 s"


# --------------------------------------------------------------------------------------------
# the discovery stall: no shared-memory transport in the control process (bringup.udp_only_transport)
# --------------------------------------------------------------------------------------------

def _thread_names(pid: int) -> list[str]:
    names = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            names.append(open(f"/proc/{pid}/task/{tid}/comm").read().strip())
        except OSError:  # the thread ended meanwhile
            pass
    return names


@pytest.mark.parametrize("discovery", ["subnet", "localhost"])
def test_the_control_process_has_no_shared_memory_transport(domain, tmp_path, procs, micro_model, discovery):
    """Fast DDS's shared-memory transport makes a publish wait while another participant joins (its port is
    opened under a lock every send needs; BENCHMARKS.md, the discovery stall). With the default discovery range,
    and with ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST (where rmw_fastrtps adds shared memory itself: the bringup
    runs a UDP-only localhost profile instead), the reasoning process runs UDPv4 only (no `dds.shm.*` threads),
    its camera process keeps shared memory (large frames from a local driver), and actions still reach a listener
    in another process."""
    node = start_vla_edge(procs, domain, tmp_path, micro_model, {},
                          extra_env=ROBOT_DISCOVERY if discovery == "subnet" else None)
    lst = Listener(domain)
    try:
        lst.wait_for(lambda: len(lst.cycles) >= 10 and lst.diags and "camera_process_pid" in lst.diags[-1][1], 60,
                     f"~/cycle and /diagnostics from a {discovery} node")
        cam_pid = int(lst.last_diag()["camera_process_pid"])
    finally:
        lst.close()
    control, camera = _thread_names(node.p.pid), _thread_names(cam_pid)
    print(f"control process DDS threads {sorted(n for n in control if n.startswith('dds.'))}; camera process "
          f"{sorted(n for n in camera if n.startswith('dds.'))}")
    assert any(n.startswith("dds.udp") for n in control), control
    assert not any(n.startswith("dds.shm") for n in control), control
    assert any(n.startswith("dds.shm") for n in camera), camera
    assert "DDS transports: UDPv4 in this process" in node.output()
