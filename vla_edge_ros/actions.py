# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Action tokens -> bins -> values (ROS-free; cycle.twist_components maps values to twist components).

Decoding is constrained to the last 256 vocabulary ids (the OpenVLA convention): token
`V - 256 + b` is bin `b`, and bin `b` maps to the centre of the b-th of 256 equal intervals of the
dimension's [low, high] range.
"""
from __future__ import annotations

import numpy as np

from .constants import ACTION_TOKENS, ACTION_VOCAB

DEFAULT_DIM_NAMES = ("linear_x", "linear_y", "linear_z", "angular_x", "angular_y", "angular_z", "gripper", "aux")


class ActionDecoder:
    def __init__(self, vocab_size: int, low=-1.0, high=1.0, names=DEFAULT_DIM_NAMES):
        self.vocab_size = int(vocab_size)
        self.first_token = self.vocab_size - ACTION_VOCAB
        self.names = tuple(names)
        if len(self.names) != ACTION_TOKENS:
            raise ValueError(f"need {ACTION_TOKENS} action dimension names, got {len(self.names)}")
        self.low = np.broadcast_to(np.asarray(low, np.float32), (ACTION_TOKENS,)).copy()
        self.high = np.broadcast_to(np.asarray(high, np.float32), (ACTION_TOKENS,)).copy()
        if not (np.isfinite(self.low).all() and np.isfinite(self.high).all() and (self.high > self.low).all()):
            raise ValueError(f"action ranges need finite low < high per dimension, got low={self.low} high={self.high}")

    def bins(self, tokens: np.ndarray) -> np.ndarray:
        b = np.asarray(tokens, np.int64) - self.first_token
        if b.shape != (ACTION_TOKENS,) or (b < 0).any() or (b >= ACTION_VOCAB).any():
            raise ValueError(f"expected {ACTION_TOKENS} tokens in [{self.first_token}, {self.vocab_size}), "
                             f"got {tokens}")
        return b

    def decode(self, tokens: np.ndarray) -> np.ndarray:
        width = (self.high - self.low) / ACTION_VOCAB
        return (self.low + (self.bins(tokens) + 0.5) * width).astype(np.float32)
