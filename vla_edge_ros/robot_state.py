# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The robot's own state as the model takes it (DESIGN.md §17), ROS-free: a JointState's arrays matched by joint name
into the model's order (`StateMapper`), and the latest accepted state with its age (`StateBuffer`).

The vector is field by field, each field's values of the model's joints in order (model/config.py: dim = joints x
fields). A message is matched by name, never by index, and refused whole (StateRefused, one line) when it cannot give
every value: a needed joint missing, a needed value NaN/Inf, an array whose length differs from the names', more than
MAX_STATE_JOINTS joints, a name longer than MAX_JOINT_NAME or named twice. Nothing is ever zero-filled. A refused
message leaves the previous state in place, which then ages: the cycle never acts on a state older than
`max_state_age_ms` (fallback `stale_state`, cycle.py).

The age counts from the message's stamp on the receiver's clock (ROS time, so sim time under `use_sim_time`): the
receiver gives the stamp's age at receipt, the buffer adds the monotonic time since. A message with a zero stamp
(publishers that never set one) is aged from its receipt and counted (`unstamped`); one stamped further ahead of the
receiver's clock than FUTURE_TOLERANCE_S is refused (the two clocks disagree: its age cannot be known).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

from .constants import STATE_FIELDS
from .model.config import MAX_JOINT_NAME

MAX_STATE_JOINTS = 1024  # joints one message may carry (a humanoid has ~60; 10 000 is a broken publisher)
MAX_STATE_MESSAGE_BYTES = 1 << 18  # a serialized JointState larger than this is refused before it is decoded
FUTURE_TOLERANCE_S = 0.5  # a stamp at most this far ahead of the receiver's clock counts as age 0
MAX_STATE_AGE_MS = 100.0  # default max_state_age_ms: OpenVLA-OFT / LeRobot loops read the state every 20-50 ms


class StateRefused(ValueError):
    """A state message the model cannot take: one line saying why (never zero-filled)."""


def joint_count_from_cdr(raw: bytes) -> int | None:
    """The number of joint names in a serialized sensor_msgs/JointState (CDR: the 4-byte encapsulation, the header's
    stamp and frame_id, then the name sequence's length), read without decoding it; None when `raw` is too short to
    say (the decoder then refuses it)."""
    if len(raw) < 16 or raw[1] not in (0, 1):  # encapsulation: CDR big (0) / little (1) endian
        return None
    order = "little" if raw[1] == 1 else "big"
    frame_id_len = int.from_bytes(raw[12:16], order)  # after sec (int32) and nanosec (uint32), from offset 4
    at = 16 + frame_id_len
    at += (-(at - 4)) % 4  # the sequence length is 4-aligned from the start of the payload
    if at + 4 > len(raw):
        return None
    return int.from_bytes(raw[at:at + 4], order)


def _shown(name: str) -> str:
    return repr(name if len(name) <= 40 else name[:40] + "...")


class StateMapper:
    """Joint names and fields in the model's order -> the raw state vector (float32 [joints x fields])."""

    def __init__(self, joints, fields=("position",)):
        joints, fields = tuple(joints), tuple(fields)
        if not joints or len(set(joints)) != len(joints):
            raise ValueError(f"state joints must be one or more distinct names, got {list(joints)!r}")
        if not fields or len(set(fields)) != len(fields) or not set(fields) <= set(STATE_FIELDS):
            raise ValueError(f"state fields must name each of {', '.join(STATE_FIELDS)} at most once, got "
                             f"{list(fields)!r}")
        self.joints, self.fields = joints, fields
        self.dim = len(joints) * len(fields)

    def vector(self, names, arrays: dict) -> np.ndarray:
        """The state from one message: `names` (its joint names) and `arrays` (field -> its values, one per name or
        none at all, as sensor_msgs/JointState allows). Raises StateRefused."""
        n = len(names)
        if n > MAX_STATE_JOINTS:
            raise StateRefused(f"{n} joints in one message (at most {MAX_STATE_JOINTS})")
        index = {}
        for i, name in enumerate(names):
            if not isinstance(name, str) or len(name) > MAX_JOINT_NAME:
                raise StateRefused(f"joint name {i} is longer than {MAX_JOINT_NAME} characters")
            if name in index:
                raise StateRefused(f"joint {_shown(name)} is named twice")
            index[name] = i
        for field, values in arrays.items():
            if len(values) not in (0, n):
                raise StateRefused(f"{field} has {len(values)} values for {n} names")
        missing = [j for j in self.joints if j not in index]
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise StateRefused(f"joint(s) {', '.join(map(_shown, missing[:3]))}{more} missing (the model needs "
                               f"{len(self.joints)}: state_joints)")
        rows = [index[j] for j in self.joints]
        out = np.empty(self.dim, np.float32)
        for k, field in enumerate(self.fields):
            values = arrays.get(field, ())
            if len(values) == 0:
                raise StateRefused(f"no {field} values (the model reads {', '.join(self.fields)})")
            v = np.asarray(values, np.float64)[rows]
            bad = np.flatnonzero(~np.isfinite(v))
            if bad.size:
                raise StateRefused(f"{field} of joint {_shown(self.joints[bad[0]])} is {v[bad[0]]} (not finite)")
            out[k * len(rows):(k + 1) * len(rows)] = v
        if not np.isfinite(out).all():  # finite in float64, beyond float32's range
            raise StateRefused("a value overflows float32")
        return out


def model_mapper(state_dim: int, model_joints, model_fields, joints_param) -> StateMapper | None:
    """The mapper of a model's state input (None: the model takes no state): its joints are the checkpoint's
    (vla_state_joints) or, when it names none, `joints_param` (the node's state_joints; [''] / empty: unset). Raises
    ValueError (one line) when they cannot be known or do not make `state_dim` values."""
    given = [j for j in joints_param if j]
    if not state_dim:
        return None
    fields = tuple(model_fields) or ("position",)
    if model_joints and given and list(given) != list(model_joints):
        raise ValueError(f"state_joints {given!r} differ from the checkpoint's vla_state_joints {list(model_joints)!r}"
                         ": leave state_joints unset (the checkpoint names the joints it was trained on)")
    joints = tuple(model_joints) or tuple(given)
    per = state_dim // len(fields)
    if not joints:
        raise ValueError(f"the model takes a robot state of {state_dim} values ({per} joints x {', '.join(fields)}) "
                         f"but its checkpoint names no joints: set state_joints to its {per} joint names in the "
                         "model's order")
    if len(joints) * len(fields) != state_dim:
        raise ValueError(f"state_joints names {len(joints)} joints, the model takes {per} ({state_dim} values: "
                         f"{', '.join(fields)} of each)")
    return StateMapper(joints, fields)


@dataclass(frozen=True)
class StateSample:
    """An accepted state: the raw vector, when it was received (monotonic s) and its stamp's age then (s)."""

    vector: np.ndarray
    recv_time: float
    age_at_receipt_s: float
    stamp_ns: int

    def age_ms(self, t: float) -> float:
        """Its age at monotonic time `t` (ms)."""
        return (self.age_at_receipt_s + max(0.0, t - self.recv_time)) * 1000.0


class StateBuffer:
    """The latest accepted state and the counts of what came (thread-safe: one receiver thread, the cycle reads)."""

    def __init__(self, mapper: StateMapper, clock=time.monotonic):
        self.mapper, self.clock = mapper, clock
        self._lock = threading.Lock()
        self._latest: StateSample | None = None
        self.received = 0  # messages offered (accepted + refused)
        self.accepted = 0
        self.refused = 0
        self.unstamped = 0  # accepted with a zero stamp: aged from receipt
        self.last_refusal = ""  # the last refusal's line
        self.last_refusal_time: float | None = None

    @property
    def dim(self) -> int:
        return self.mapper.dim

    def offer(self, names, arrays: dict, stamp_ns: int, now_ns: int, recv_time: float | None = None) -> str | None:
        """Take one message: its names and arrays, its stamp and the receiver's clock at receipt (same time base, ns).
        Returns None when accepted, else the refusal line (also counted and kept as `last_refusal`)."""
        t = self.clock() if recv_time is None else recv_time
        try:
            vector = self.mapper.vector(names, arrays)
            age_s = self._age_at_receipt(int(stamp_ns), int(now_ns))
        except StateRefused as e:
            return self.refuse(str(e), t)
        with self._lock:
            self.received += 1
            self.accepted += 1
            self.unstamped += stamp_ns == 0
            self._latest = StateSample(vector, t, age_s, int(stamp_ns))
        return None

    def refuse(self, why: str, t: float | None = None) -> str:
        """Count a message refused before it could be offered (too large, undecodable) or by `offer`."""
        with self._lock:
            self.received += 1
            self.refused += 1
            self.last_refusal = why
            self.last_refusal_time = self.clock() if t is None else t
        return why

    @staticmethod
    def _age_at_receipt(stamp_ns: int, now_ns: int) -> float:
        if stamp_ns == 0:
            return 0.0
        age = (now_ns - stamp_ns) * 1e-9
        if age < -FUTURE_TOLERANCE_S:
            raise StateRefused(f"stamped {-age:.3f} s ahead of this node's clock (a clock mismatch: use_sim_time?)")
        return max(0.0, age)

    def latest(self) -> StateSample | None:
        with self._lock:
            return self._latest

    def clear(self) -> None:
        """Forget the state (a new activation: a state from before it is never used)."""
        with self._lock:
            self._latest = None

    def values(self, t: float | None = None) -> dict:
        """The counts, the latest state's age (ms, None before one) and the last refusal, for /diagnostics."""
        t = self.clock() if t is None else t
        s = self.latest()
        with self._lock:
            return {"state_received": self.received, "state_accepted": self.accepted, "state_refused": self.refused,
                    "state_unstamped": self.unstamped, "state_age_ms": None if s is None else s.age_ms(t),
                    "state_last_refusal": self.last_refusal}


def synthetic_state(dim: int, t: float, seed: int = 0) -> np.ndarray:
    """A smooth made-up state for clips without one (the bench, replay of a video): each value a slow sine of its
    own phase, in [-1, 1] (float32 [dim])."""
    phase = np.random.default_rng(seed).uniform(0.0, 2.0 * np.pi, dim)
    return np.sin(0.5 * t + phase).astype(np.float32)
