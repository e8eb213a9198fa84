# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Eviction policies on constructed embeddings, plus the configuration errors."""

import numpy as np
import pytest

from vla_edge_ros.eviction import FifoPolicy, SemanticPolicy, SlidingWindowPolicy, make_policy
from vla_edge_ros.kv_cache import KvCache

FRAME, ACTION = 32, 8


def unit(*components):
    v = np.array(components, dtype=np.float32)
    return v / np.linalg.norm(v)


A, B, B_NEAR, C = unit(1, 0, 0), unit(0, 1, 0), unit(0, 1, 0.02), unit(0, 0, 1)


def test_semantic_evicts_older_of_near_duplicate_pair():
    retained = [10, 11, 12, 13]
    embeddings = {10: A, 11: B, 12: B_NEAR, 13: C}
    assert SemanticPolicy().choose_victim(retained, embeddings) == 11


def test_semantic_scores_only_adjacent_pairs():
    # 10 and 12 are identical but not adjacent; the adjacent pairs are all orthogonal-ish except 12-13.
    retained = [10, 11, 12, 13]
    embeddings = {10: A, 11: B, 12: A, 13: unit(1, 0.5, 0)}
    assert SemanticPolicy().choose_victim(retained, embeddings) == 12


def test_semantic_skips_frames_without_embedding():
    # 13 is the newest frame whose chunk has not finished; 12 lost its report. 11 and 14 become adjacent.
    retained = [10, 11, 12, 13, 14]
    embeddings = {10: A, 11: B, 14: B_NEAR, 15: B}  # 15 is not retained: must be ignored
    assert SemanticPolicy().choose_victim(retained, embeddings) == 11


def test_semantic_ignores_embeddings_of_frames_not_retained():
    # Only 11 and 12 are retained with embeddings; 13 (the incoming frame) would match 12 exactly.
    retained = [11, 12]
    embeddings = {11: A, 12: B, 13: B}
    assert SemanticPolicy().choose_victim(retained, embeddings) == 11


def test_semantic_falls_back_to_fifo_with_fewer_than_two_embeddings():
    policy = SemanticPolicy()
    assert policy.choose_victim([4, 5, 6], {}) == 4
    assert policy.choose_victim([4, 5, 6], {6: A}) == 4
    assert policy.choose_victim([], {}) is None


def test_semantic_ties_evict_the_oldest_pair():
    assert SemanticPolicy().choose_victim([1, 2, 3, 4], {1: A, 2: A, 3: A, 4: A}) == 1


def test_semantic_handles_zero_embedding():
    zero = np.zeros(3, np.float32)
    assert SemanticPolicy().choose_victim([1, 2, 3], {1: zero, 2: A, 3: A}) == 2


def test_semantic_rescores_a_re_reported_embedding():
    policy = SemanticPolicy()
    retained = [1, 2, 3]
    assert policy.choose_victim(retained, {1: A, 2: A, 3: B}) == 1
    # Same ids, new embedding for frame 2: the memoised cosine of pair (1, 2) must not be reused.
    assert policy.choose_victim(retained, {1: A, 2: B, 3: B}) == 2


def test_semantic_keeps_one_frame_of_each_scene_across_a_cut():
    """Scene 1 for 4 frames, then a hard cut to scene 2 for 8: fifo forgets scene 1, semantic keeps it."""
    rng = np.random.default_rng(1)
    scene_1, scene_2 = rng.normal(size=64), rng.normal(size=64)
    stream = [scene_1 + 0.05 * rng.normal(size=64) for _ in range(4)]
    stream += [scene_2 + 0.05 * rng.normal(size=64) for _ in range(8)]
    scene_1_ids = set(range(4))

    retained = {}
    for name in ("fifo", "semantic"):
        cache = KvCache(5 + ACTION + FRAME * 4, 5, make_policy(name))
        for frame_id, pooled in enumerate(stream):
            cache.plan_frame(frame_id)
            cache.set_embedding(frame_id, pooled)  # the chunk finished before the next tick
            cache.check_invariants()
        retained[name] = cache.retained()

    assert retained["fifo"] == [8, 9, 10, 11]
    assert len(scene_1_ids & set(retained["semantic"])) == 1  # exactly one survivor of scene 1
    assert len(set(retained["semantic"]) - scene_1_ids) == 3
    assert retained["semantic"][-1] == 11  # the newest frame is always kept


def test_fifo_and_window_policies():
    assert FifoPolicy().choose_victim([3, 4, 5], {3: A}) == 3
    assert FifoPolicy().window_victims([3, 4, 5]) == []
    window = SlidingWindowPolicy(3)
    assert window.window_victims([1, 2]) == []
    assert window.window_victims([1, 2, 3]) == [1]
    assert window.window_victims([1, 2, 3, 4, 5]) == [1, 2, 3]
    assert window.choose_victim([7, 8], {}) == 7
    assert SlidingWindowPolicy(1).window_victims([1]) == [1]


def test_make_policy_names():
    assert isinstance(make_policy("fifo"), FifoPolicy)
    assert isinstance(make_policy("semantic"), SemanticPolicy)
    window = make_policy("sliding_window", window_frames=5)
    assert isinstance(window, SlidingWindowPolicy) and window.window_frames == 5 and window.name == "sliding_window"


def test_unknown_policy_lists_valid_names():
    with pytest.raises(ValueError, match="unknown eviction policy 'lru'.*fifo, sliding_window, semantic"):
        make_policy("lru")


def test_window_must_be_positive():
    with pytest.raises(ValueError, match="window_frames"):
        make_policy("sliding_window", window_frames=0)


def test_capacity_too_small_names_the_numbers():
    prompt = 20
    with pytest.raises(ValueError, match=r"capacity 59 .*prompt 20 .*action 8 .*frame 32 .*at least 60"):
        KvCache(prompt + ACTION + FRAME - 1, prompt, make_policy("fifo"))
    cache = KvCache(prompt + ACTION + FRAME, prompt, make_policy("fifo"))  # exactly one block fits
    assert cache.frame_capacity == 1
