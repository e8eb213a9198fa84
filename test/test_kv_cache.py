# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""KvCache slot bookkeeping: property-based invariants for every policy, long-run bounds, policy models."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vla_edge_ros.eviction import POLICY_NAMES, make_policy
from vla_edge_ros.kv_cache import KvCache

FRAME, ACTION = 32, 8


def semantic_acceptable_victims(retained, embeddings, tolerance=1e-5):
    """Independent restatement of the semantic rule: the older frame of any adjacent pair whose
    cosine is the maximum (within float32 noise, where the policy's tie-break is not observable)."""
    known = [f for f in retained if f in embeddings]
    if len(known) < 2:
        return {retained[0]}
    cosines = []
    for older, newer in zip(known, known[1:]):
        a, b = embeddings[older].astype(np.float64), embeddings[newer].astype(np.float64)
        norms = np.linalg.norm(a) * np.linalg.norm(b)
        cosines.append(a @ b / norms if norms > 0 else 0.0)
    best = max(cosines)
    return {older for older, cosine in zip(known, cosines) if cosine >= best - tolerance}


def check_plan(cache, plan, before, frame_id):
    """Everything a plan must satisfy, given the retained frames before it was made."""
    order = plan.order
    assert order.dtype == np.int32
    assert len(order) == plan.n_prefix + FRAME + ACTION <= cache.capacity
    assert order.max() < cache.capacity and len(order) - 1 < cache.capacity  # slots and positions
    assert np.array_equal(order[: cache.prompt_tokens], np.arange(cache.prompt_tokens))
    assert np.array_equal(plan.frame_slots, order[plan.n_prefix:plan.n_prefix + FRAME])
    assert np.array_equal(plan.action_slots, order[-ACTION:])
    assert plan.frame_id == frame_id
    assert set(plan.evicted) <= set(before) and len(set(plan.evicted)) == len(plan.evicted)
    survivors = [f for f in before if f not in plan.evicted]
    assert cache.retained() == survivors + [frame_id]
    assert plan.n_prefix == cache.prompt_tokens + FRAME * len(survivors)
    # Older frames keep their slots: only the new frame's block is written this chunk.
    for position, f in enumerate(survivors):
        start = cache.prompt_tokens + FRAME * position
        assert np.array_equal(order[start:start + FRAME], cache.frame_slots_of(f))


cache_configs = st.fixed_dictionaries(
    {
        "prompt": st.integers(0, 40),
        "frames": st.integers(1, 10),  # frame capacity the capacity is built for
        "tail": st.integers(0, FRAME - 1),  # leftover slots that cannot form a block
        "window": st.integers(1, 12),
        "dim": st.integers(2, 8),
    }
)


@settings(max_examples=300, deadline=None)
@given(policy_name=st.sampled_from(POLICY_NAMES), config=cache_configs, data=st.data())
def test_invariants_hold_after_every_step(policy_name, config, data):
    capacity = config["prompt"] + ACTION + FRAME * config["frames"] + config["tail"]
    policy = make_policy(policy_name, window_frames=config["window"])
    cache = KvCache(capacity, config["prompt"], policy)
    assert cache.frame_capacity == config["frames"]
    cache.check_invariants()

    # Few distinct directions so near-duplicates and exact ties occur often.
    directions = st.sampled_from([(1, 0), (0, 1), (1, 1), (-1, 0), (1, 0.01), (0, 0)])
    frame_id, seen, discarded = -1, [], set()
    for _ in range(data.draw(st.integers(1, 40), label="steps")):
        frame_id += data.draw(st.integers(1, 3), label="id step")
        before = cache.retained()
        embeddings = {f: cache.embedding(f) for f in before if cache.embedding(f) is not None}
        plan = cache.plan_frame(frame_id)
        seen.append(frame_id)
        check_plan(cache, plan, before, frame_id)
        cache.check_invariants()

        full = len(before) >= cache.frame_capacity
        # The fifo/window models assume no frame left early; after a discard only their bounds hold.
        if policy_name == "fifo":
            if discarded:
                assert plan.evicted == (before[:1] if full else [])
            else:
                assert cache.retained() == seen[-cache.frame_capacity:]
        elif policy_name == "sliding_window":
            newest = min(config["window"], cache.frame_capacity)
            if discarded:
                assert len(cache.retained()) <= newest and set(plan.evicted) == set(before) - set(cache.retained())
            else:
                assert cache.retained() == seen[-newest:]
        elif full:  # semantic: exactly one eviction, chosen from retained embeddings only
            assert len(plan.evicted) == 1
            assert plan.evicted[0] in semantic_acceptable_victims(before, embeddings)
        else:
            assert plan.evicted == []

        # The chunk usually finishes and reports its embedding; sometimes it is lost or late.
        if data.draw(st.booleans(), label="report embedding"):
            direction = np.array(data.draw(directions, label="direction"), dtype=np.float32)
            pooled = np.zeros(config["dim"], np.float32)
            pooled[:2] = direction
            late_frame = data.draw(st.sampled_from(seen[-3:]), label="frame reported")
            stored = cache.set_embedding(late_frame, pooled)
            assert stored == (late_frame in cache.retained())
            cache.check_invariants()

        # Rarely the chunk fails and the engine forgets the half-written frame.
        if data.draw(st.integers(0, 9), label="chunk fails") == 0:
            assert cache.discard(frame_id) is True and frame_id not in cache.retained()
            assert cache.discard(frame_id) is False
            discarded.add(frame_id)
            cache.check_invariants()

    stats = cache.stats()
    assert stats["frames_retained"] == len(cache.retained())
    assert stats["used_tokens"] == config["prompt"] + ACTION + FRAME * len(cache.retained()) <= capacity
    assert stats["policy"] == policy_name
    assert stats["discards_total"] == len(discarded)


@pytest.mark.parametrize("policy_name", POLICY_NAMES)
def test_long_run_stays_bounded(policy_name):
    """10,000 frames through a small cache: positions and slots never pass the capacity."""
    capacity, prompt = 7 + ACTION + FRAME * 6 + 5, 7
    cache = KvCache(capacity, prompt, make_policy(policy_name, window_frames=4))
    rng = np.random.default_rng(0)
    scenes = rng.normal(size=(5, 16)).astype(np.float32)
    for frame_id in range(10_000):
        plan = cache.plan_frame(frame_id)
        assert len(plan.order) <= capacity and plan.order.max() < capacity
        assert len(plan.evicted) <= 1 or policy_name == "sliding_window"
        pooled = scenes[(frame_id // 50) % 5] + 0.1 * rng.normal(size=16).astype(np.float32)
        cache.set_embedding(frame_id, pooled)
        if frame_id % 100 == 0:
            cache.check_invariants()
    cache.check_invariants()
    stats = cache.stats()
    assert stats["used_tokens"] <= capacity
    expected_frames = 4 if policy_name == "sliding_window" else 6
    assert stats["frames_retained"] == expected_frames
    assert stats["evictions_total"] == 10_000 - expected_frames


def test_fifo_evicts_oldest():
    cache = KvCache(10 + ACTION + FRAME * 3, 10, make_policy("fifo"))
    for frame_id in range(3):
        assert cache.plan_frame(frame_id).evicted == []
    assert cache.plan_frame(3).evicted == [0]
    assert cache.plan_frame(4).evicted == [1]
    assert cache.retained() == [2, 3, 4]


def test_fifo_reuses_the_evicted_block():
    cache = KvCache(ACTION + FRAME * 2, 0, make_policy("fifo"))
    slots_of_0 = cache.plan_frame(0).frame_slots.copy()
    cache.plan_frame(1)
    plan = cache.plan_frame(2)
    assert np.array_equal(plan.frame_slots, slots_of_0)
    assert np.array_equal(plan.order, np.concatenate([cache.frame_slots_of(1), slots_of_0, cache.action_slots]))


@pytest.mark.parametrize("window", [1, 3, 8])
def test_sliding_window_retains_newest_window(window):
    cache = KvCache(4 + ACTION + FRAME * 10, 4, make_policy("sliding_window", window_frames=window))
    for frame_id in range(20):
        plan = cache.plan_frame(frame_id)
        seen = frame_id + 1
        assert cache.retained() == list(range(seen - min(window, seen), seen))
        assert plan.evicted == ([frame_id - window] if frame_id >= window else [])
        assert plan.n_prefix == 4 + FRAME * (min(window, seen) - 1)


def test_sliding_window_larger_than_capacity_falls_back_to_capacity():
    cache = KvCache(ACTION + FRAME * 3, 0, make_policy("sliding_window", window_frames=8))
    for frame_id in range(10):
        cache.plan_frame(frame_id)
    assert cache.retained() == [7, 8, 9]
    cache.check_invariants()


def test_single_block_cache_keeps_only_the_new_frame():
    cache = KvCache(3 + ACTION + FRAME, 3, make_policy("semantic"))
    for frame_id in range(5):
        if frame_id:
            cache.set_embedding(frame_id - 1, np.ones(4))
        plan = cache.plan_frame(frame_id)
        assert plan.n_prefix == 3 and cache.retained() == [frame_id]
        cache.check_invariants()


def test_frame_ids_must_increase():
    cache = KvCache(ACTION + FRAME * 2, 0, make_policy("fifo"))
    cache.plan_frame(5)
    with pytest.raises(ValueError, match="increase"):
        cache.plan_frame(5)
    with pytest.raises(ValueError, match="increase"):
        cache.plan_frame(3)
    cache.plan_frame(9)  # gaps are fine
    assert cache.retained() == [5, 9]


def test_set_embedding_copies_and_ignores_evicted_frames():
    cache = KvCache(ACTION + FRAME, 0, make_policy("fifo"))
    cache.plan_frame(0)
    pooled = np.array([1.0, 2.0], dtype=np.float64)
    assert cache.set_embedding(0, pooled) is True
    pooled[0] = 99.0
    assert cache.embedding(0).dtype == np.float32 and cache.embedding(0).tolist() == [1.0, 2.0]
    cache.plan_frame(1)  # evicts frame 0
    assert cache.set_embedding(0, np.ones(2)) is False and cache.embedding(0) is None
    with pytest.raises(ValueError, match="never planned"):
        cache.set_embedding(2, np.ones(2))
    cache.check_invariants()


def test_discard_frees_the_block_without_counting_an_eviction():
    cache = KvCache(ACTION + FRAME * 2, 0, make_policy("fifo"))
    cache.plan_frame(0)
    cache.set_embedding(0, np.ones(3))
    cache.plan_frame(1)
    assert cache.discard(1) is True  # chunk 1 failed
    cache.check_invariants()
    assert cache.retained() == [0] and cache.discard(1) is False
    assert cache.set_embedding(1, np.ones(3)) is False
    with pytest.raises(ValueError, match="increase"):
        cache.plan_frame(1)  # its id is spent
    plan = cache.plan_frame(2)
    assert plan.evicted == [] and cache.retained() == [0, 2]
    assert cache.stats()["evictions_total"] == 0 and cache.stats()["discards_total"] == 1
    cache.check_invariants()
