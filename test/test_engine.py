# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Engine (numpy backend): a whole chunk end to end on a real generated model and the real KvCache."""
import time

import numpy as np
import pytest

from vla_edge_ros.actions import ActionDecoder
from vla_edge_ros.constants import ACTION_TOKENS, ACTION_VOCAB
from vla_edge_ros.engine import Engine, EngineError
from vla_edge_ros.model.generate import make_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_model(str(tmp_path_factory.mktemp("e") / "tiny"), "tiny", seed=11)


def frames(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (64, 128, 3), dtype=np.uint8) for _ in range(n)]


def test_chunk_produces_actions_in_range_and_timings(tiny):
    eng = Engine(tiny, backend="numpy", kv_capacity_tokens=512)
    try:
        r = eng.run_chunk(frames(1)[0])
        V = eng.cfg.vocab_size
        assert r.tokens.shape == (ACTION_TOKENS,) and ((r.tokens >= V - ACTION_VOCAB) & (r.tokens < V)).all()
        assert r.action.shape == (ACTION_TOKENS,) and (np.abs(r.action) <= 1.0).all()
        t = r.timings
        assert t.vision_ms > 0 and t.prefill_ms > 0 and t.decode_ms > 0
        assert t.total_ms >= t.vision_ms + t.prefill_ms + t.decode_ms - 1e-6
        assert r.frame_id == 0 and r.retained == [0] and r.backend == "numpy"
    finally:
        eng.close()


def test_engine_is_deterministic_and_survives_eviction(tiny):
    """Over a stream longer than the cache, the engine keeps positions bounded and evicts; a fresh engine
    decodes the first chunk identically (determinism, not correctness: the logits after evictions are
    checked against HF transformers in test_eviction_rope.py)."""
    eng = Engine(tiny, backend="numpy", kv_capacity_tokens=16 + 8 + 4 * 32, policy="fifo")
    try:
        fs = frames(10, seed=2)
        results = [eng.run_chunk(f) for f in fs]
        assert [len(r.retained) for r in results] == [1, 2, 3, 4, 4, 4, 4, 4, 4, 4]
        assert results[4].evicted == [0] and results[-1].retained == [6, 7, 8, 9]
        assert max(r.cache_tokens for r in results) <= eng.capacity
        eng.cache.check_invariants()
        fresh = Engine(tiny, backend="numpy", kv_capacity_tokens=eng.capacity, weights=eng.weights)
        assert np.array_equal(fresh.run_chunk(fs[0]).tokens, results[0].tokens)
        fresh.close()
    finally:
        eng.close()


def test_submit_runs_on_worker_and_reports_busy(tiny):
    eng = Engine(tiny, backend="numpy", kv_capacity_tokens=512)
    try:
        gate = []
        eng.fault_hook = lambda plan: time.sleep(0.2) or gate.append(plan.frame_id)
        fut = eng.submit(frames(1)[0])
        assert eng.busy
        with pytest.raises(EngineError, match="busy"):
            eng.submit(frames(1)[0])
        r = fut.result(timeout=10)
        # busy is cleared on the worker before the future completes: whoever the result wakes sees the engine free
        # (the next tick must not read a stale `busy`)
        assert not eng.busy and gate == [r.frame_id]
        eng.fault_hook = None
        for _ in range(50):
            eng.submit(frames(1)[0]).result(timeout=10)
            assert not eng.busy
    finally:
        eng.close()


def test_fault_mid_chunk_forgets_the_frame_and_recovers(tiny):
    eng = Engine(tiny, backend="numpy", kv_capacity_tokens=512)
    try:
        eng.run_chunk(frames(1)[0])

        def boom(plan):
            raise RuntimeError("injected fault")

        eng.fault_hook = boom
        with pytest.raises(RuntimeError, match="injected"):
            eng.run_chunk(frames(1)[0])
        assert eng.cache.retained() == [0]  # the half-written frame is not attended to later
        eng.fault_hook = None
        r = eng.run_chunk(frames(1)[0])
        assert r.retained == [0, 2]
        eng.cache.check_invariants()
    finally:
        eng.close()


def test_warmup_leaves_an_empty_history(tiny):
    eng = Engine(tiny, backend="numpy", kv_capacity_tokens=512)
    try:
        t = eng.warmup(2)
        assert len(t) == 2 and eng.cache.retained() == []
        assert eng.run_chunk(frames(1)[0]).retained != []
    finally:
        eng.close()


def test_bad_frame_and_bad_backend(tiny):
    eng = Engine(tiny, backend="numpy", kv_capacity_tokens=512)
    try:
        with pytest.raises(ValueError, match="uint8"):
            eng.run_chunk(np.zeros((64, 128, 3), np.float32))
        with pytest.raises(ValueError):
            eng.run_chunk(np.zeros((480, 640, 3), np.uint8))
    finally:
        eng.close()
    with pytest.raises(EngineError, match="unknown backend"):
        Engine(tiny, backend="tpu")


def test_capacity_too_small_is_refused(tiny):
    with pytest.raises(ValueError):
        Engine(tiny, backend="numpy", kv_capacity_tokens=40)


def test_action_decoder():
    d = ActionDecoder(vocab_size=1000, low=-2.0, high=2.0)
    tokens = np.array([744, 999, 872, 871, 744, 744, 744, 744])
    v = d.decode(tokens)
    assert v[0] == pytest.approx(-2 + 0.5 * 4 / 256) and v[1] == pytest.approx(2 - 0.5 * 4 / 256)
    assert v[2] == pytest.approx(-v[3])
    with pytest.raises(ValueError):
        d.decode(np.array([743] + [744] * 7))
    with pytest.raises(ValueError):
        ActionDecoder(1000, low=1.0, high=1.0)


def test_engine_worker_does_not_inherit_a_realtime_submitter(tiny):
    """The bringup may run the reasoning thread at SCHED_FIFO (realtime_priority); the engine worker does not
    inherit it: it gets its own, lower priority explicitly (set_worker_priority) or none."""
    import os
    import threading

    eng = Engine(tiny, backend="numpy", kv_capacity_tokens=512)
    seen = {}

    def realtime_submitter():
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except (PermissionError, OSError) as e:
            seen["skip"] = str(e)
            return
        seen["submitter"] = os.sched_getscheduler(0)
        tid = eng._worker.submit(threading.get_native_id).result(timeout=10)
        seen["worker"] = os.sched_getscheduler(tid)

    try:
        t = threading.Thread(target=realtime_submitter)
        t.start()
        t.join(10)
        if "skip" in seen:
            pytest.skip(f"no permission for SCHED_FIFO here: {seen['skip']}")
        assert seen["submitter"] == os.SCHED_FIFO
        assert seen["worker"] == os.SCHED_OTHER
    finally:
        eng.close()


def test_the_worker_runs_at_the_priority_it_is_given(tiny):
    """set_worker_priority(p): the worker thread runs SCHED_FIFO p (the runtime gives it realtime_priority - 1, so
    other processes cannot preempt it while it holds the GIL the deadline guard needs); 0 leaves it alone."""
    import os
    import threading

    eng = Engine(tiny, backend="numpy", kv_capacity_tokens=512)
    try:
        assert eng.set_worker_priority(0) is None
        tid = eng._worker.submit(threading.get_native_id).result(timeout=10)
        assert os.sched_getscheduler(tid) == os.SCHED_OTHER
        refused = eng.set_worker_priority(3)
        if refused:
            pytest.skip(f"no permission for SCHED_FIFO here: {refused}")
        assert os.sched_getscheduler(tid) == os.SCHED_FIFO and os.sched_getparam(tid).sched_priority == 3
        assert eng.submit(np.zeros((64, 128, 3), np.uint8)).result(timeout=30).action.shape == (8,)
    finally:
        eng.close()
