# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Eviction + RoPE against an independent implementation (DESIGN.md §5, §13).

The engine (NumPy backend, tiny model, real KvCache) runs a stream much longer than its cache under each
policy, so frames are evicted, blocks are reused out of order (slot != position) and retained frames move to
new positions. After every chunk the test recomputes that chunk's 8 action logits with HF transformers'
Qwen2 on the same weights: it reads the retained tokens' stored un-rotated keys and values, applies RoPE
itself for the positions the design prescribes (prompt 0..P-1, retained frames oldest -> newest, the new
frame, the action tokens), fills a DynamicCache with them and runs the new frame and the engine's action
tokens through HF. The only thing taken from the code under test is the stored K/V of the retained tokens
(their content is the cache's semantics: a token's K/V are computed once, when it arrives); rotation,
positions, masking, attention and the new tokens' forward are HF's and the test's.

The correct code stays within ~2e-6 of HF (the bound is 2e-5). Keys never re-rotated after a move fail
from the first eviction on (|d| ~0.15-0.19); RoPE positions taken from slot ids fail from the first chunk
(the frame's slots sit after the 8 action slots; |d| ~0.23); `scripts/mutation_check.sh` runs both.
"""
import inspect
import json
import os

import numpy as np
import pytest

from vla_edge_ros.constants import ACTION_TOKENS, ACTION_VOCAB, FRAME_C, FRAME_H, FRAME_W, VISION_TOKENS
from vla_edge_ros.engine import Engine
from vla_edge_ros.model.generate import make_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPT = 16  # engine.DEFAULT_PROMPT_TOKENS for a generated model (asserted below)
FRAMES_IN_CACHE = 4
CAPACITY = PROMPT + ACTION_TOKENS + FRAMES_IN_CACHE * VISION_TOKENS
CHUNKS = 12
LOGITS_MAX_ABS = 2e-5  # the correct code reaches <= 2e-6 on the tiny model (float32 both sides)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_model(str(tmp_path_factory.mktemp("rope") / "tiny"), "tiny", seed=7)


@pytest.fixture(scope="module")
def hf_model(tiny_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()


def rope_theta(model_dir) -> float:
    with open(os.path.join(model_dir, "config.json")) as f:
        return float(json.load(f)["rope_theta"])


def rotate(k: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """HF Qwen2 RoPE (rotate_half form) of keys k [heads, T, D] for positions [T], in float64."""
    d = k.shape[-1]
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    angle = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    cos, sin = np.tile(np.cos(angle), 2), np.tile(np.sin(angle), 2)
    half = d // 2
    rotated_half = np.concatenate([-k[..., half:], k[..., :half]], axis=-1)
    return k * cos + rotated_half * sin


def scene_stream(n: int, seed: int = 3) -> list[np.ndarray]:
    """Frames from a few scenes with small noise, so that semantic eviction has near-duplicates to pick
    (and does not degrade to fifo) while fifo and sliding_window see an ordinary stream."""
    rng = np.random.default_rng(seed)
    scenes = [rng.integers(0, 256, (FRAME_H, FRAME_W, FRAME_C)) for _ in range(4)]
    pattern = [0, 1, 1, 2, 3, 3, 0, 2, 2, 1, 3, 0, 0, 1]
    out = []
    for i in range(n):
        noise = rng.integers(-6, 7, (FRAME_H, FRAME_W, FRAME_C))
        out.append(np.clip(scenes[pattern[i % len(pattern)]] + noise, 0, 255).astype(np.uint8))
    return out


def _cache_kwarg(model) -> str:
    # transformers 5.x renames past_key_values -> cache; accept either.
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def hf_action_logits(model, theta, k_raw, v, prefix_slots, vision_embeds, start_token, tokens) -> np.ndarray:
    """The chunk's 8 action logits by HF, from the stored K/V of `prefix_slots` (retention order)."""
    n = len(prefix_slots)
    positions = np.arange(n)
    cache = transformers.DynamicCache()
    for layer in range(k_raw.shape[0]):
        k = rotate(k_raw[layer][:, prefix_slots, :].astype(np.float64), positions, theta).astype(np.float32)
        values = np.ascontiguousarray(v[layer][:, prefix_slots, :])
        cache.update(torch.from_numpy(k)[None], torch.from_numpy(values)[None], layer)
    kw = {_cache_kwarg(model): cache, "use_cache": True}
    logits = []
    with torch.no_grad():
        frame_positions = torch.arange(n, n + VISION_TOKENS)[None]
        model(inputs_embeds=torch.from_numpy(vision_embeds)[None], position_ids=frame_positions, **kw)
        tok = int(start_token)
        for step in range(ACTION_TOKENS):
            pos = n + VISION_TOKENS + step
            out = model(input_ids=torch.tensor([[tok]]), position_ids=torch.tensor([[pos]]), **kw)
            logits.append(out.logits[0, -1, -ACTION_VOCAB:].float().numpy())
            tok = int(tokens[step])  # teacher-forced with the engine's choice: the next step's input
    return np.stack(logits)


@pytest.mark.parametrize("policy", ["fifo", "sliding_window", "semantic"])
def test_logits_after_evictions_match_hf_with_test_rotated_cache(tiny_dir, hf_model, policy):
    theta = rope_theta(tiny_dir)
    eng = Engine(tiny_dir, backend="numpy", kv_capacity_tokens=CAPACITY, policy=policy, window_frames=3)
    assert len(eng.prompt_ids) == PROMPT and eng.cache.frame_capacity == FRAMES_IN_CACHE
    backend = eng.backend
    inserted_at = {}  # frame id -> the position of its first token when its chunk ran
    moved_checked = non_identity_checked = non_oldest_evicted = 0
    worst = 0.0
    try:
        for chunk, frame in enumerate(scene_stream(CHUNKS)):
            # The stored state the new chunk reads: un-rotated keys and values per slot.
            k_raw, v = backend.k_raw.copy(), backend.v.copy()
            before = eng.cache.retained()
            r = eng.run_chunk(frame, collect_logits=True)
            kept = [f for f in before if f in r.retained]
            assert r.retained == kept + [r.frame_id]
            if r.evicted and before and r.evicted[0] != before[0]:
                non_oldest_evicted += 1

            prefix = np.concatenate([eng.cache.prompt_slots] + [eng.cache.frame_slots_of(f) for f in kept])
            prefix = prefix.astype(np.intp)
            for i, f in enumerate(kept):
                if inserted_at[f] != PROMPT + i * VISION_TOKENS:
                    moved_checked += 1  # this chunk reads a frame whose keys sit at a new position
            if not np.array_equal(prefix, np.arange(len(prefix))):
                non_identity_checked += 1
            inserted_at[r.frame_id] = len(prefix)

            ours = r.logits
            theirs = hf_action_logits(hf_model, theta, k_raw, v, prefix, backend.vision(frame), eng.start_token,
                                      r.tokens)
            delta = float(np.max(np.abs(ours - theirs)))
            worst = max(worst, delta)
            assert delta <= LOGITS_MAX_ABS, (
                f"{policy} chunk {chunk}: max |logits - HF| {delta:.3g} > {LOGITS_MAX_ABS:g} "
                f"(retained {r.retained}, prefix slots by frame {prefix[PROMPT::VISION_TOKENS].tolist()})")
            vocab0 = eng.cfg.vocab_size - ACTION_VOCAB
            for step in range(ACTION_TOKENS):
                top2 = np.sort(theirs[step])[-2:]
                # Same greedy choice unless HF's best two are within rounding of each other.
                assert r.tokens[step] == vocab0 + int(np.argmax(theirs[step])) or top2[1] - top2[0] < 1e-4
        eng.cache.check_invariants()
    finally:
        eng.close()

    # The stream must have exercised what the test is about, under every policy.
    assert moved_checked >= 5, f"{policy}: only {moved_checked} checks saw moved keys"
    assert non_identity_checked >= 5, f"{policy}: only {non_identity_checked} chunks had slot != position"
    if policy == "semantic":
        assert non_oldest_evicted >= 1, "semantic eviction never chose a frame other than the oldest"
    print(f"\n{policy}: {CHUNKS} chunks, max |logits - HF| {worst:.3g}, {moved_checked} moved-frame reads")
