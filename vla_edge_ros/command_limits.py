# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Velocity and acceleration limits on the six twist components the node publishes (ROS-free).

`CommandLimiter.apply` runs after the last guard (`ReasoningCycle.finalize`), on every command the node or the bench
publishes: each component is clamped to ``[-velocity_limits[j], velocity_limits[j]]`` (REP-103 units: m/s for
linear x, y, z, rad/s for angular x, y, z), then, where ``acceleration_limits[j] > 0``, moved from the previous
command by at most ``acceleration_limits[j] * dt`` (dt: the time since the previous command, measured). The zero
sent when the caller stops (``hard_stop``) bypasses the acceleration limit: a stop is never delayed. Every clamped
component is counted, so /diagnostics shows a model that keeps asking for more than the robot may do.
"""
from __future__ import annotations

import math

AXES = 6


class CommandLimiter:
    def __init__(self, velocity_limits, acceleration_limits=(0.0,) * AXES):
        self.velocity = self.acceleration = None
        self.configure(velocity_limits, acceleration_limits)
        self._last: list[float] | None = None  # the previous command sent
        self._last_t: float | None = None
        self.clamped_velocity = 0  # components clamped by velocity_limits, since start
        self.clamped_acceleration = 0  # components clamped by acceleration_limits, since start

    def configure(self, velocity_limits, acceleration_limits) -> None:
        v = [float(x) for x in velocity_limits]
        a = [float(x) for x in acceleration_limits]
        if len(v) != AXES or len(a) != AXES or not all(math.isfinite(x) and x >= 0.0 for x in v + a):
            raise ValueError(f"limits need {AXES} finite values >= 0, got velocity {v}, acceleration {a}")
        self.velocity, self.acceleration = v, a

    def apply(self, comps: list[float], t: float) -> tuple[list[float], int]:
        """The command to send for the finite components `comps` at monotonic time `t` (s), and how many of its
        components were clamped."""
        out, clamped = [], 0
        dt = None if self._last_t is None else max(0.0, t - self._last_t)
        for j, c in enumerate(comps):
            lim = self.velocity[j]
            x = min(max(float(c), -lim), lim)
            if x != c:
                self.clamped_velocity += 1
                clamped += 1
            acc = self.acceleration[j]
            if acc > 0.0 and self._last is not None and dt is not None:
                step = acc * dt
                prev = self._last[j]
                y = min(max(x, prev - step), prev + step)
                if y != x:
                    self.clamped_acceleration += 1
                    clamped += 1
                x = y
            out.append(x + 0.0)  # no -0.0 on the wire
        self._last, self._last_t = out, t
        return out, clamped

    def hard_stop(self, t: float) -> list[float]:
        """A zero command that ignores the acceleration limit (deactivate, shutdown); later commands ramp from it."""
        self._last, self._last_t = [0.0] * AXES, t
        return [0.0] * AXES

    def reset(self) -> None:
        """Forget the previous command (a node activated again starts from rest: its last command was a zero)."""
        self._last = self._last_t = None
