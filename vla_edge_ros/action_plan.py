# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The plan: the actions a chunk planned for the ticks ahead (DESIGN.md §17), ROS-free.

A model with action chunks (`vla_action_chunk` K > 1) decodes K actions per chunk; action k is meant for tick
t0 + k, t0 being the grid slot of the tick whose frame the chunk ran on. `ActionPlan` holds those actions by grid
slot, so a tick that gets no fresh action (refused, busy, stale frame...) publishes the plan's action for its own
slot instead of a fallback.

- `land(actions, t0_slot, now_slot)`: a chunk that lands d = now_slot - t0_slot ticks after its frame skips its
  first d actions (d counted in grid slots that really passed, never estimated from a latency maximum: a warm-up
  spike would then throw most of the plan away). Only actions k < `execute` enter: past that the plan is stale.
  On slots the old plan still covers, `latest` takes the new action and `weighted` takes
  weight * new + (1 - weight) * old (LeRobot async inference's aggregate); slots only the old plan covers are
  dropped (the new chunk saw a newer frame).
- `take(slot)`: the action planned for this tick, or None; slots before it are dropped (a stalled process never
  publishes a plan action for a tick that has passed).
- `clear()`: the plan dies with the task (an applied instruction change), the lifecycle (deactivate), a new tick
  grid (a new period), a non-finite action.

A non-finite chunk never enters (ValueError). One thread uses it (the control timer's).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

BLENDS = ("latest", "weighted")
BLEND_WEIGHT = 0.7  # LeRobot async inference's weighted_average: 0.3 * old + 0.7 * new


@dataclass
class Landing:
    """What `ActionPlan.land` did with one chunk."""

    chunk: int  # the chunk's number in this plan (counted from 1)
    late_ticks: int  # d: ticks between its frame's tick and the tick it landed on
    kept: int  # actions that entered the plan (0: it landed too late, every action was stale)
    blended: int  # slots whose old action was blended (weighted) or replaced (latest)


@dataclass
class PlanStep:
    """The plan's action for one tick."""

    action: np.ndarray  # float32 [8]
    chunk: int  # Landing.chunk of the chunk it came from
    index: int  # k: its index in that chunk (its age in ticks since the chunk's frame)
    first: bool  # the first action of its chunk that is handed out
    replaced: np.ndarray | None  # the old plan's action for this slot before the chunk landed (None: it had none)


def check_plan_settings(execute, blend, weight, chunk: int) -> list[str]:
    """Problems of the plan's settings for a model of `chunk` actions (empty = fine)."""
    problems = []
    if isinstance(execute, bool) or not isinstance(execute, int) or not (0 <= execute <= chunk):
        problems.append(f"chunk_execute={execute!r} must be an integer in 0..{chunk} (0: all {chunk} actions of "
                        f"the model's chunk; the model plans vla_action_chunk={chunk})")
    if blend not in BLENDS:
        problems.append(f"chunk_blend={blend!r} is not one of {', '.join(BLENDS)}")
    number = isinstance(weight, (int, float)) and not isinstance(weight, bool)
    if not (number and math.isfinite(weight) and 0.0 <= weight <= 1.0):
        problems.append(f"chunk_blend_weight={weight!r} must be a number in [0, 1]")
    return problems


class ActionPlan:
    def __init__(self, chunk: int = 1, execute: int = 0, blend: str = "latest", weight: float = BLEND_WEIGHT):
        self.chunk = int(chunk)
        self._steps: dict[int, PlanStep] = {}
        self.configure(execute, blend, weight)
        self.chunks_landed = 0
        self.chunks_stale = 0  # landed after their last action's tick: nothing entered
        self.actions_skipped = 0  # actions of landed chunks whose tick had passed
        self.cleared = 0  # plans discarded (clear() with something in them)
        self._chunk_seq = 0
        self._first_pending: int | None = None  # the latest chunk, while none of its actions was handed out

    def configure(self, execute: int | None = None, blend: str | None = None, weight: float | None = None) -> None:
        """Change the settings (between ticks). Raises ValueError and changes nothing when they are impossible."""
        e = self.execute_setting if execute is None else execute
        b = self.blend if blend is None else blend
        w = self.weight if weight is None else weight
        problems = check_plan_settings(e, b, w, self.chunk)
        if problems:
            raise ValueError("; ".join(problems))
        self.execute_setting, self.blend, self.weight = int(e), b, float(w)

    @property
    def execute(self) -> int:
        """Actions of a chunk that may run (chunk_execute; 0 means the whole chunk)."""
        return self.execute_setting or self.chunk

    @property
    def enabled(self) -> bool:
        """A plan exists only for a model that plans more than one action."""
        return self.chunk > 1

    def horizon_ticks(self) -> int:
        """Ticks after its own during which a chunk started now still brings an action that is not stale: admission
        admits a chunk that lands within them (it need not fit the tick it starts in)."""
        return self.execute - 1 if self.enabled else 0

    def remaining(self, slot: int) -> int:
        """Ticks from `slot` on that the plan covers without a gap."""
        n = 0
        while slot + n in self._steps:
            n += 1
        return n

    def land(self, actions: np.ndarray, t0_slot: int, now_slot: int) -> Landing:
        """Put a chunk's actions (float32 [K, 8], action k for slot t0_slot + k) into the plan at `now_slot`."""
        a = np.asarray(actions, np.float32)
        if a.ndim != 2 or a.shape[0] != self.chunk:
            raise ValueError(f"a chunk of {self.chunk} actions expected, got shape {a.shape}")
        if not np.isfinite(a).all():
            raise ValueError("a non-finite chunk never enters the plan")
        d = max(0, int(now_slot) - int(t0_slot))
        self._chunk_seq += 1
        self.chunks_landed += 1
        ks = range(d, self.execute)
        self.actions_skipped += min(d, self.execute)
        if not ks:
            self.chunks_stale += 1
            return Landing(self._chunk_seq, d, 0, 0)
        old, self._steps = self._steps, {}
        blended = 0
        for k in ks:
            slot = int(t0_slot) + k
            prev = old.get(slot)
            value = a[k]
            if prev is not None:
                blended += 1
                if self.blend == "weighted":
                    value = (self.weight * a[k] + (1.0 - self.weight) * prev.action).astype(np.float32)
            self._steps[slot] = PlanStep(np.array(value, np.float32), self._chunk_seq, k, False,
                                         None if prev is None else prev.action)
        self._first_pending = self._chunk_seq
        return Landing(self._chunk_seq, d, len(ks), blended)

    def take(self, slot: int) -> PlanStep | None:
        """The plan's action for tick `slot` (removed from the plan), or None; earlier slots are dropped."""
        for s in [s for s in self._steps if s < slot]:
            del self._steps[s]
        step = self._steps.pop(int(slot), None)
        if step is not None and step.chunk == self._first_pending:
            step.first, self._first_pending = True, None
        return step

    def upcoming(self, slot: int) -> list[tuple[int, np.ndarray]]:
        """(ticks after `slot`, action) of every planned action from `slot` on, in order (the trajectory)."""
        return [(s - slot, st.action) for s, st in sorted(self._steps.items()) if s >= slot]

    def clear(self) -> bool:
        """Discard the plan; True when it held actions."""
        had = bool(self._steps)
        self._steps.clear()
        self._first_pending = None
        self.cleared += had
        return had

    def stats(self) -> dict:
        return {"chunks_landed": self.chunks_landed, "chunks_stale": self.chunks_stale,
                "plan_actions_skipped": self.actions_skipped, "plans_cleared": self.cleared}
