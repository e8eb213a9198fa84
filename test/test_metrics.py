# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""LatencyStats, CycleStats and VramSampler."""

import threading
import time

import numpy as np
import pytest

from vla_edge_ros.metrics import CycleStats, LatencyStats, VramSampler


def test_empty_percentiles_are_none():
    p = LatencyStats().percentiles()
    assert p == {"p50": None, "p95": None, "p99": None, "max": None, "mean": None, "count": 0}


def test_percentiles_match_numpy():
    rng = np.random.default_rng(0)
    values = rng.gamma(2.0, 5.0, size=1000)
    stats = LatencyStats()
    for v in values:
        stats.add(v)
    p = stats.percentiles()
    for key, q in (("p50", 50), ("p95", 95), ("p99", 99)):
        assert p[key] == pytest.approx(np.percentile(values, q))
    assert p["mean"] == pytest.approx(values.mean())
    assert p["max"] == pytest.approx(values.max())
    assert p["count"] == 1000


def test_rolling_window_is_bounded_but_count_and_max_are_all_time():
    stats = LatencyStats(window=10)
    stats.add(1000.0)  # an early outlier that falls out of the window
    for v in range(100):
        stats.add(float(v))
    assert len(stats) == 10
    p = stats.percentiles()
    assert p["count"] == 101
    assert p["max"] == 1000.0
    assert p["p50"] == pytest.approx(np.percentile(np.arange(90, 100), 50))
    assert p["mean"] == pytest.approx(94.5)


def test_window_validation():
    with pytest.raises(ValueError):
        LatencyStats(window=0)


def test_cycle_summary_rates():
    stats = CycleStats()
    for _ in range(6):
        stats.record("model", "admit", late=False, cycle_ms=20.0, chunk_ms=18.0, jitter_ms=0.1, frame_age_ms=5.0)
    stats.record("fallback", "refused", late=False, cycle_ms=1.0, jitter_ms=0.2, frame_age_ms=6.0)
    stats.record("fallback", "busy", late=False, cycle_ms=1.0)
    stats.record("fallback", "overrun", late=False, cycle_ms=31.0, chunk_ms=40.0)
    stats.record("fallback", "no_frame", late=True, cycle_ms=35.0)
    s = stats.summary()
    assert s["cycles"] == 10
    assert s["model_actions"] == 6
    assert s["fallbacks"] == {"refused": 1, "busy": 1, "overrun": 1, "no_frame": 1}
    assert s["fallback_rate"] == pytest.approx(0.4)
    assert s["overrun_rate"] == pytest.approx(0.1)
    assert s["deadline_miss_rate"] == pytest.approx(0.1)
    assert s["cycle_ms"]["count"] == 10
    assert s["chunk_ms"]["count"] == 7  # only cycles that ran a chunk
    assert s["chunk_ms"]["max"] == 40.0
    assert s["timer_jitter_ms"]["count"] == 7
    assert s["frame_age_ms"]["p50"] == pytest.approx(5.0)


def test_empty_summary():
    s = CycleStats().summary()
    assert s["cycles"] == 0
    assert s["fallback_rate"] == s["deadline_miss_rate"] == s["overrun_rate"] == 0.0
    assert s["cycle_ms"]["p99"] is None


def test_bad_source_raises():
    with pytest.raises(ValueError, match="source"):
        CycleStats().record("gpu", "admit", late=False, cycle_ms=1.0)


def test_concurrent_record_and_summary():
    stats = CycleStats(window=64)

    def writer():
        for i in range(2000):
            stats.record("model" if i % 2 else "fallback", "refused", late=False, cycle_ms=float(i))

    threads = [threading.Thread(target=writer) for _ in range(2)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        stats.summary()  # the diagnostics timer reading while the control timer writes
    for t in threads:
        t.join()
    s = stats.summary()
    assert s["cycles"] == 4000 and s["model_actions"] == 2000


def _gpu_present() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.skipif(_gpu_present(), reason="checks the no-GPU behaviour")
def test_vram_sampler_without_gpu():
    sampler = VramSampler(interval_s=0.01)
    assert not sampler.available
    assert sampler.start() is False
    assert not sampler.running
    assert sampler.peak_bytes is None
    assert sampler.sample_once() is None
    sampler.stop()  # harmless


def test_vram_sampler_with_process_bytes_fn_tracks_peak():
    readings = iter([100, 300, 200] + [150] * 10_000)
    sampler = VramSampler(interval_s=0.001, process_bytes_fn=lambda: next(readings))
    with sampler:
        assert sampler.running
        deadline = time.monotonic() + 2.0
        while sampler.last_bytes != 150 and time.monotonic() < deadline:
            time.sleep(0.001)
    assert not sampler.running
    assert sampler.peak_bytes == 300
    assert sampler.last_bytes == 150
    assert sampler.error is None


def test_vram_sampler_records_error_and_stops():
    def broken():
        raise RuntimeError("pool gone")

    sampler = VramSampler(interval_s=0.001, process_bytes_fn=broken)
    sampler.start()
    sampler._thread.join(timeout=2.0)
    assert isinstance(sampler.error, RuntimeError)
    assert sampler.peak_bytes is None
    sampler.stop()


@pytest.mark.gpu
def test_vram_sampler_on_gpu():
    sampler = VramSampler(interval_s=0.01)
    with sampler:
        time.sleep(0.05)
    assert sampler.peak_bytes is not None and sampler.peak_bytes > 0
    assert sampler.total_bytes >= sampler.peak_bytes


def test_gc_pauses_are_recorded_per_generation():
    import gc

    from vla_edge_ros.metrics import GcPauses

    g = GcPauses().install()
    try:
        gc.collect()  # a full collection
        gc.collect(0)
        s = g.summary()
        assert s["gc_full_collections"] >= 1 and s["gc_collections"] >= 2
        assert s["gc_full_pause_ms_max"] > 0.0 and s["gc_pause_ms_max"] >= s["gc_full_pause_ms_max"]
    finally:
        g.remove()
    n = g.summary()["gc_collections"]
    gc.collect()
    assert g.summary()["gc_collections"] == n  # removed: nothing more recorded


def test_settle_after_warmup_takes_what_exists_out_of_later_collections():
    """After settle_after_warmup the objects alive then are frozen, so a full collection during the run scans
    only what the run created; release_after_run makes them collectable again (an engine in a cycle)."""
    import gc

    from vla_edge_ros.runtime import release_after_run, settle_after_warmup

    class Engineish:
        pass

    e = Engineish()
    e.self_ref = e  # a reference cycle, as engines with callbacks have
    import weakref

    ref = weakref.ref(e)
    gc.collect()
    # CPython 3.12 keeps some immortal objects in the permanent generation after any full collection (375 with
    # 3.12.1, without any freeze): the baseline, not 0
    baseline = gc.get_freeze_count()
    try:
        settle_after_warmup()
        assert gc.get_freeze_count() > baseline + 1000
        del e
        gc.collect()
        assert ref() is not None  # frozen: the full collection did not even look at it
    finally:
        release_after_run()
    assert gc.get_freeze_count() == baseline and ref() is None


def test_vram_sampler_keeps_first_last_and_a_once_a_second_timeline(monkeypatch):
    import vla_edge_ros.metrics as metrics

    values = iter([100, 300, 200, 250, 260])
    clock = iter([10.0, 10.4, 11.1, 11.5, 12.2])
    monkeypatch.setattr(metrics.time, "monotonic", lambda: next(clock))
    s = metrics.VramSampler(process_bytes_fn=lambda: next(values))
    for _ in range(5):
        s.sample_once()
    assert (s.first_bytes, s.last_bytes, s.peak_bytes) == (100, 260, 300)
    assert [(round(t, 6), b) for t, b in s.timeline] == [(0.0, 100), (1.1, 200), (2.2, 260)]
