# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""A blind camera does not drive (issue 39), through the real bringup over Fast DDS: the real Udacity bag with six
blind spells written into it (dark, a lens cap, over-exposure, half the view covered, blur, a frozen sensor),
replayed at its own rate into vla_edge. Every tick on a blind frame (after the hysteresis) is a frame_quality
fallback naming the check, no blind frame is ever admitted, the good frames between drive again, the camera-quality
status on /diagnostics goes ERROR for each spell (naming it) and back to OK, and no tick is missed.
Helpers: ros_helpers.py, fixtures: conftest.py."""

from __future__ import annotations

import bisect
import time

import pytest

rclpy = pytest.importorskip("rclpy")

from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402

from cpu_waits import CpuWaits, check_misses  # noqa: E402
from ros_helpers import UDACITY, Listener, kv, plumbing_period_ms, start_replay, start_vla_edge  # noqa: E402
from vla_edge_ros import frame_quality as fq  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

SPELLS = list(zip(fq.DEGRADATIONS, [(30, 50), (65, 85), (100, 118), (133, 151), (166, 184), (199, 211)]))
DETECT = 3  # frames a spell may take to trip (the target), and to clear after it
# ... counted in frames the camera processed: the hysteresis counts those, and a loaded host's camera process skips
# frames (KEEP_LAST: under slow_host.sh -f 3 a blur spell still held on the 6th bag frame after it, 190, because few
# of 184..189 were processed). The frames the cycles name are processed ones, so a verdict is judged once DETECT of
# them came since the spell's start (or end): the same as counting bag frames when none is skipped.


def _diagnostics(lst):
    got = []

    def cb(m):
        for st in m.status:
            if st.name.endswith(": camera quality"):
                with lst.lock:
                    got.append((st.level[0] if isinstance(st.level, bytes) else st.level, st.message, kv(st)))

    lst.node.create_subscription(DiagnosticArray, "/diagnostics", cb, 50)
    return got


@pytest.mark.exclusive  # asserts no late cycle: runs alone (conftest)
@pytest.mark.skipif(not UDACITY.is_dir(), reason=f"{UDACITY} not present")
def test_a_degraded_bag_gives_frame_quality_fallbacks_and_diagnostics_levels(domain, tmp_path, procs, micro_model):
    from vla_edge_ros.clips import open_clip
    from vla_edge_ros.synthetic_bag import write_degraded_bag

    schedule = {k: kind for kind, (a, b) in SPELLS for k in range(a, b)}
    bag = write_degraded_bag(UDACITY, tmp_path / "blind_bag", schedule)
    index = {it.stamp_ns: i for i, it in enumerate(open_clip(str(bag)).items())}
    n_frames = len(index)
    node = start_vla_edge(procs, domain, tmp_path, micro_model,
                          {"transport": "compressed", "qos_reliability": "reliable", "realtime_priority": 10,
                           "diagnostics_period_s": 0.25},
                          remaps=[("image/compressed", "/camera/image_raw/compressed")])
    waits = CpuWaits(node.p.pid).start()
    lst = Listener(domain)
    diags = _diagnostics(lst)
    try:
        lst.wait_for(lambda: len(lst.actions) > 5 and diags, 60, "the first actions and /diagnostics of vla_edge")
        n0 = len(lst.cycles)
        replay = start_replay(procs, domain, tmp_path, bag, "--reliable", "--wait-subscriber", "30")
        replay.p.wait(60)
        assert replay.p.returncode == 0, replay.output()[-2000:]
        lst.wait_for(lambda: any(int(v["frame_stamp_ns"]) in index and index[int(v["frame_stamp_ns"])] >= n_frames - 3
                                 for _, v, _ in lst.cycles[n0:]), 20, "cycles on the bag's last frames")
        time.sleep(1.0)  # the last roll-ups
        with lst.lock:
            every_cycle = list(lst.cycles)
            cycles = [v for _, v, _ in every_cycle[n0:]]
            statuses = list(diags)
        d = lst.last_diag()
    finally:
        lst.close()
        waits.stop()
    assert node.stop() == 0, node.output()[-3000:]

    on_bag = [(index[int(v["frame_stamp_ns"])], v) for v in cycles if int(v["frame_stamp_ns"]) in index]
    assert on_bag, "no cycle on the bag's frames"  # how many: the host's speed (every spell is checked below)
    processed = sorted({k for k, _ in on_bag})  # bag frames the camera processed, as far as the cycles show

    def since(a, k):  # processed frames in [a, k)
        return bisect.bisect_left(processed, k) - bisect.bisect_left(processed, a)

    wrong = []
    for k, v in on_bag:
        kind = schedule.get(k)
        spell = next(((a, b) for c, (a, b) in SPELLS if a <= k < b), None)
        if kind is not None:
            check = fq.EXPECTED[kind]
            first_repeat = kind == "repeat" and k == spell[0]  # the same bytes once: not frozen yet, harmless
            if v["reason"] == "fresh" and not first_repeat:
                wrong.append((k, kind, "admitted", v["reason"]))
            named = check in v["frame_quality"].split(",")
            # stale_frame: the replay stalled past max_frame_age_ms on the frame (a loaded host: a fresh-clone run
            # had 5 such cycles on one frame), a fallback that is checked first and admits nothing either
            caught = v["reason"] == "stale_frame" or (v["reason"] == "frame_quality" and named)
            if since(spell[0], k) >= DETECT and not caught:
                wrong.append((k, kind, v["reason"], v["frame_quality"]))
            if v["reason"] == "frame_quality" and v["source"] != "fallback":
                wrong.append((k, kind, "not a fallback", v["source"]))
        else:
            after = max((b for _, (a, b) in SPELLS if b <= k), default=-100)
            if since(after, k) >= DETECT and v["reason"] == "frame_quality":
                wrong.append((k, "good", v["reason"], v["frame_quality"]))
    assert not wrong, wrong[:20]
    seen = {fq.EXPECTED[schedule[k]] for k, v in on_bag if k in schedule and v["reason"] == "frame_quality"}
    assert seen == {fq.EXPECTED[kind] for kind, _ in SPELLS}, seen

    # /diagnostics: the camera-quality status, collapsed into runs: OK, then ERROR naming each spell's check (in the
    # bag's order), OK between spells, OK at the end
    # (a WARN, failing frames not tripped yet, comes when a roll-up falls between a spell's first frame and its trip)
    levels = [(lvl, msg) for lvl, msg, _ in statuses if lvl != 1]
    runs = []
    for lvl, msg in levels:
        if not runs or runs[-1][0] != lvl:
            runs.append([lvl, []])
        runs[-1][1].append(msg)
    errors = [" ".join(msgs) for lvl, msgs in runs if lvl == 2]
    assert runs[0][0] == 0 and runs[-1][0] == 0, runs
    order = [fq.EXPECTED[kind] for kind, _ in SPELLS]
    assert len(errors) == len(order), (errors, runs)
    for text, check in zip(errors, order):
        assert check in text, (check, text)
    last = statuses[-1][2]
    for kind, (a, b) in SPELLS:
        assert int(last[f"quality_trips_{fq.EXPECTED[kind]}"]) >= 1, last
    assert last["quality_tripped"] == "none"

    # the loop: frame_quality fallbacks counted, no tick missed or late by the node's doing, nothing non-finite
    # /diagnostics counts every frame_quality fallback this listener saw on the bag (how many there are follows the
    # host's speed: 48 and more idle, 43 once under slow_host.sh -f 3), at least one a spell
    seen_fq = sum(v["reason"] == "frame_quality" for _, v in on_bag)
    assert int(d["fallback_frame_quality"]) >= max(seen_fq, len(SPELLS)), (d["fallback_frame_quality"], seen_fq)
    late = sum(v["late"] == "True" for v in cycles)
    missed = sum(int(v["missed_before"]) for v in cycles)
    print(f"blind bag: {len(cycles)} cycles, {len(on_bag)} on the bag, {late} late, {missed} missed ticks, "
          f"{d['fallback_frame_quality']} frame_quality fallbacks, camera-quality runs "
          f"{[(lvl, len(m)) for lvl, m in runs]}")
    # none the node owns (a host that kept the node off the CPU owns its misses: cpu_waits)
    check_misses(every_cycle, waits, plumbing_period_ms(), int(d["deadline_misses"]))
    assert int(d["non_finite_blocked"]) == 0
