# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Velocity and acceleration limits on the six twist components the node publishes (ROS-free).

`CommandLimiter.apply` runs after the last guard (`ReasoningCycle.finalize`), on every command the node or the bench
publishes: each component is clamped to ``[-velocity_limits[j], velocity_limits[j]]`` (REP-103 units: m/s for
linear x, y, z, rad/s for angular x, y, z), then, where ``acceleration_limits[j] > 0``, moved from the previous
command sent by at most ``acceleration_limits[j] * min(dt, max_step_s)``: dt is the time since that command, and
``max_step_s`` (the control period) bounds it, so a gap in commands (a node re-activated after a pause, a stalled
process) never buys a larger step than one period's. A gap longer than ``base_timeout_s`` (the base's own command
timeout: it has stopped by itself by then) starts from zero, and so does the first command ever or after `reset`
(activate, configure). The zero sent when the caller stops (``hard_stop``) bypasses the acceleration limit: a stop
is never delayed. Every clamped component is counted, so /diagnostics shows a model that keeps asking for more than
the robot may do; so is every restart from zero after a gap (``restarts_from_zero``).
"""
from __future__ import annotations

import math

AXES = 6
DEFAULT_MAX_STEP_S = 0.033  # one period of the design's 33 ms cycle
DEFAULT_BASE_TIMEOUT_S = 0.5  # ros2_control diff_drive_controller's cmd_vel_timeout


class CommandLimiter:
    def __init__(self, velocity_limits, acceleration_limits=(0.0,) * AXES, max_step_s: float = DEFAULT_MAX_STEP_S,
                 base_timeout_s: float = DEFAULT_BASE_TIMEOUT_S):
        self.velocity = self.acceleration = None
        self.max_step_s, self.base_timeout_s = DEFAULT_MAX_STEP_S, DEFAULT_BASE_TIMEOUT_S
        self.configure(velocity_limits, acceleration_limits, max_step_s, base_timeout_s)
        self._last: list[float] = [0.0] * AXES  # the previous command sent (at rest before the first)
        self._last_t: float | None = None  # when it was sent; None: none sent since start / reset
        self.clamped_velocity = 0  # components clamped by velocity_limits, since start
        self.clamped_acceleration = 0  # components clamped by acceleration_limits, since start
        self.restarts_from_zero = 0  # commands limited from zero after a gap longer than base_timeout_s

    def configure(self, velocity_limits, acceleration_limits, max_step_s: float | None = None,
                  base_timeout_s: float | None = None) -> None:
        v = [float(x) for x in velocity_limits]
        a = [float(x) for x in acceleration_limits]
        if len(v) != AXES or len(a) != AXES or not all(math.isfinite(x) and x >= 0.0 for x in v + a):
            raise ValueError(f"limits need {AXES} finite values >= 0, got velocity {v}, acceleration {a}")
        step = self.max_step_s if max_step_s is None else float(max_step_s)
        timeout = self.base_timeout_s if base_timeout_s is None else float(base_timeout_s)
        if not (math.isfinite(step) and step > 0.0) or not (math.isfinite(timeout) and timeout >= 0.0):
            raise ValueError(f"max_step_s must be > 0 and base_timeout_s >= 0, got {step}, {timeout}")
        self.velocity, self.acceleration, self.max_step_s, self.base_timeout_s = v, a, step, timeout

    def apply(self, comps: list[float], t: float) -> tuple[list[float], int]:
        """The command to send for the finite components `comps` at monotonic time `t` (s), and how many of its
        components were clamped."""
        out, clamped = [], 0
        prev = self._last
        if self._last_t is None:  # the first command (since start, activate, configure): from rest, one period
            dt = self.max_step_s
        else:
            dt = max(0.0, t - self._last_t)
            if self.base_timeout_s > 0.0 and dt > self.base_timeout_s:  # the base has stopped by itself
                prev = [0.0] * AXES
                if any(acc > 0.0 for acc in self.acceleration):
                    self.restarts_from_zero += 1
        dt = min(dt, self.max_step_s)
        for j, c in enumerate(comps):
            lim = self.velocity[j]
            x = min(max(float(c), -lim), lim)
            if x != c:
                self.clamped_velocity += 1
                clamped += 1
            acc = self.acceleration[j]
            if acc > 0.0:
                step = acc * dt
                y = min(max(x, prev[j] - step), prev[j] + step)
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
        """Start from rest: the next command is limited from zero by one period's step (a node activated again;
        its last command was a zero)."""
        self._last, self._last_t = [0.0] * AXES, None
