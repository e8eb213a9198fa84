# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Admission control: start a reasoning chunk only when it is expected to finish before the deadline.

Each cycle (DESIGN.md §4) the reasoning node asks ``decide(t0, busy)``:

    remaining = period - (clock() - t0) * 1000 - safety_margin                      (ms)
    estimate  = ema_vision + ema_prefill_per_token * prefill_tokens
              + ema_decode_per_token * decode_tokens + ema_other + tail_k * ema_abs_dev

and gets ``admit`` or a reason not to: ``busy`` (an earlier chunk still runs), ``cold`` (no
measurement yet, only with ``require_warm=True``) or ``refused`` (the estimate does not fit).

After every chunk ``update(PhaseTimings)`` folds the measured per-phase times into exponential
moving averages. Prefill and decode are tracked per token, so the estimate follows the token
counts. ``other`` is whatever the phases do not explain (upload, launch, read-back). The tail
allowance ``tail_k * ema_abs_dev`` - the EMA of |measured total - estimate| - makes a high
percentile, not the mean, fit the budget; with ``tail_k=0`` the controller admits on the mean.

A chunk far slower than predicted (a worker preempted on a busy CPU, a page fault) is learned as at most
``prediction + max(OUTLIER_REL * prediction, OUTLIER_DEVS * ema_abs_dev)``: one stall then raises the
estimate by a bounded step instead of keeping the model refused until many probes have pulled it back,
while a cost that really rose is still followed, by a bounded step per chunk (measured on a ~3x slower
host: BENCHMARKS.md, "Admission on a slow host"). Clipped samples are counted (``clipped``).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

from .constants import ACTION_TOKENS, EMA_ALPHA, PERIOD_MS, SAFETY_MARGIN_MS, VISION_TOKENS
from .contract import PhaseTimings  # noqa: F401 - re-exported: part of this module's API

REASONS = ("admit", "refused", "busy", "cold")
OUTLIER_REL = 0.5  # a sample counts as at most 1.5x the prediction...
OUTLIER_DEVS = 3.0  # ...or the prediction + 3 x EMA(|deviation|), whichever is larger


def budget_problem(period_ms, safety_margin_ms) -> str | None:
    """The one check of a cycle's budget (node parameters, run-time changes, the core, the tools): None when
    period_ms > safety_margin_ms >= 0, else what is wrong. Written as "not (ok)" so that NaN fails."""
    if not (safety_margin_ms >= 0.0):
        return f"safety_margin_ms must be >= 0, got {safety_margin_ms!r}"
    if not (period_ms > safety_margin_ms):
        return f"deadline period_ms={period_ms!r} must be greater than safety_margin_ms={safety_margin_ms!r}"
    return None


def check_budget(period_ms, safety_margin_ms) -> None:
    """Raise ValueError with `budget_problem`'s message when the budget is impossible."""
    problem = budget_problem(period_ms, safety_margin_ms)
    if problem:
        raise ValueError(problem)


@dataclass
class Decision:
    admit: bool
    reason: str  # "admit" | "refused" | "busy" | "cold"
    remaining_ms: float  # time left in the cycle after the safety margin
    estimate_ms: float  # predicted chunk cost, tail allowance included


def _check_timings(t: PhaseTimings) -> None:
    # One NaN or negative sample would poison the EMAs for good, so refuse it loudly.
    for name in ("vision_ms", "prefill_ms", "decode_ms", "total_ms"):
        value = getattr(t, name)
        if not (math.isfinite(value) and value >= 0.0):
            raise ValueError(f"PhaseTimings.{name} must be a finite number >= 0, got {value!r}")
    for name in ("prefill_tokens", "decode_tokens"):
        if getattr(t, name) < 0:
            raise ValueError(f"PhaseTimings.{name} must be >= 0, got {getattr(t, name)!r}")


class AdmissionController:
    """Per-phase cost EMAs and the admit/refuse decision. Thread-safe (timer and engine thread)."""

    def __init__(
        self,
        period_ms: float = PERIOD_MS,
        safety_margin_ms: float = SAFETY_MARGIN_MS,
        ema_alpha: float = EMA_ALPHA,
        prefill_tokens: int = VISION_TOKENS,
        decode_tokens: int = ACTION_TOKENS,
        tail_k: float = 0.0,
        clock=time.monotonic,
        require_warm: bool = False,
    ):
        check_budget(period_ms, safety_margin_ms)
        if not (0.0 < ema_alpha <= 1.0):
            raise ValueError(f"ema_alpha must be in (0, 1], got {ema_alpha!r}")
        if not (tail_k >= 0.0):
            raise ValueError(f"tail_k must be >= 0, got {tail_k!r}")
        if prefill_tokens < 0 or decode_tokens < 0:
            raise ValueError(
                f"token counts must be >= 0, got prefill_tokens={prefill_tokens!r}, decode_tokens={decode_tokens!r}"
            )
        self.period_ms = float(period_ms)
        self.safety_margin_ms = float(safety_margin_ms)
        self.ema_alpha = float(ema_alpha)
        self.prefill_tokens = int(prefill_tokens)
        self.decode_tokens = int(decode_tokens)
        self.tail_k = float(tail_k)
        self.require_warm = bool(require_warm)
        self._clock = clock
        self._lock = threading.Lock()

        self._vision = 0.0
        self._prefill_per_token = 0.0
        self._decode_per_token = 0.0
        self._other = 0.0
        self._abs_dev = 0.0
        self._prompt_per_token: float | None = None  # instruction prefills (update_prompt); None: none measured yet
        self._samples = 0
        self._clipped = 0
        self._decisions = {reason: 0 for reason in REASONS}

    # --- estimates -------------------------------------------------------------------------------

    def _mean_estimate(self, prefill_tokens: int, decode_tokens: int) -> float:
        return (
            self._vision
            + self._prefill_per_token * prefill_tokens
            + self._decode_per_token * decode_tokens
            + self._other
        )

    def _estimate(self) -> float:
        return self._mean_estimate(self.prefill_tokens, self.decode_tokens) + self.tail_k * self._abs_dev

    def estimate_ms(self) -> float:
        """Predicted cost of the next chunk (ms), tail allowance included; 0 before any sample."""
        with self._lock:
            return self._estimate()

    @property
    def samples(self) -> int:
        """Chunks measured so far (the controller is warm once this is > 0)."""
        with self._lock:
            return self._samples

    def configure(self, period_ms: float | None = None, safety_margin_ms: float | None = None,
                  ema_alpha: float | None = None, tail_k: float | None = None) -> None:
        """Change the budget or the EMA settings at run time (same checks as the constructor); the
        learned EMAs are kept. Raises ValueError and changes nothing when the new values are impossible."""
        period = self.period_ms if period_ms is None else float(period_ms)
        margin = self.safety_margin_ms if safety_margin_ms is None else float(safety_margin_ms)
        alpha = self.ema_alpha if ema_alpha is None else float(ema_alpha)
        k = self.tail_k if tail_k is None else float(tail_k)
        check_budget(period, margin)
        if not (0.0 < alpha <= 1.0):
            raise ValueError(f"ema_alpha must be in (0, 1], got {alpha!r}")
        if not (k >= 0.0):
            raise ValueError(f"tail_k must be >= 0, got {k!r}")
        with self._lock:
            self.period_ms, self.safety_margin_ms, self.ema_alpha, self.tail_k = period, margin, alpha, k

    # --- the decision ----------------------------------------------------------------------------

    def decide(self, t0: float, busy: bool = False, reserve_ms: float = 0.0, horizon_ms: float = 0.0) -> Decision:
        """Admit a chunk started now in the cycle that ticked at ``t0`` (monotonic seconds)?

        ``reserve_ms`` is time the caller keeps back on top of the safety margin (the cycle's measured
        wake-up slack), so the budget compared with the estimate is the one the chunk really gets.
        ``horizon_ms`` is time after this cycle in which the chunk's result is still used (action chunks: the
        ticks its plan covers, ActionPlan.horizon_ticks); 0: it must finish inside this cycle. ``remaining_ms``
        of the decision is this cycle's own budget either way."""
        now = self._clock()
        with self._lock:
            remaining = self.period_ms - (now - t0) * 1000.0 - self.safety_margin_ms - max(0.0, reserve_ms)
            estimate = self._estimate()
            if busy:
                reason = "busy"
            elif self._samples == 0 and self.require_warm:
                reason = "cold"
            elif estimate > remaining + max(0.0, horizon_ms):
                reason = "refused"
            else:
                reason = "admit"
            self._decisions[reason] += 1
        return Decision(admit=reason == "admit", reason=reason, remaining_ms=remaining, estimate_ms=estimate)

    def update(self, t: PhaseTimings) -> None:
        """Fold one measured chunk into the EMAs. The first sample sets them outright; later ones are
        clipped at the outlier bound (see the module docstring) before they are learned."""
        _check_timings(t)
        with self._lock:
            scale = 1.0
            if self._samples > 0:
                predicted = self._mean_estimate(t.prefill_tokens, t.decode_tokens)
                bound = predicted + max(OUTLIER_REL * predicted, OUTLIER_DEVS * self._abs_dev)
                if t.total_ms > bound > 0.0:
                    scale = bound / t.total_ms  # every phase shrinks alike: the split stays the measured one
                    self._clipped += 1
            vision, prefill, decode, total = (scale * x for x in (t.vision_ms, t.prefill_ms, t.decode_ms, t.total_ms))
            prefill_per_token = prefill / t.prefill_tokens if t.prefill_tokens else 0.0
            decode_per_token = decode / t.decode_tokens if t.decode_tokens else 0.0
            other = max(0.0, total - vision - prefill - decode)
            if self._samples == 0:
                self._vision = vision
                self._prefill_per_token = prefill_per_token
                self._decode_per_token = decode_per_token
                self._other = other
                # No prediction existed for the first chunk, so there is no deviation to measure yet.
                self._abs_dev = 0.0
            else:
                # Deviation of this chunk from what the EMAs predicted for it, before they learn from it.
                deviation = abs(total - self._mean_estimate(t.prefill_tokens, t.decode_tokens))
                a = self.ema_alpha
                self._vision += a * (vision - self._vision)
                self._prefill_per_token += a * (prefill_per_token - self._prefill_per_token)
                self._decode_per_token += a * (decode_per_token - self._decode_per_token)
                self._other += a * (other - self._other)
                if self._samples == 1:
                    self._abs_dev = deviation  # the first deviation initialises its EMA, like the others
                else:
                    self._abs_dev += a * (deviation - self._abs_dev)
            self._samples += 1

    # --- the instruction prefill (a phase of its own: it runs between chunks, never inside one) ---------------

    def update_prompt(self, ms: float, tokens: int) -> None:
        """Fold one measured prompt prefill (an instruction change) into its EMA."""
        if not (ms >= 0.0 and tokens > 0) or ms != ms or ms == float("inf"):
            raise ValueError(f"bad prompt timing: {ms!r} ms for {tokens!r} tokens")
        per = ms / tokens
        with self._lock:
            if self._prompt_per_token is None:
                self._prompt_per_token = per
            else:
                self._prompt_per_token += self.ema_alpha * (per - self._prompt_per_token)

    def prompt_estimate_ms(self, tokens: int) -> float:
        """Predicted prefill of a `tokens`-token prompt: its own EMA once one was measured, before that the chunk
        prefill's per-token EMA (the same kernels)."""
        with self._lock:
            per = self._prompt_per_token if self._prompt_per_token is not None else self._prefill_per_token
            return float(per) * int(tokens)

    # --- reporting -------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, float]:
        """EMAs in ms (per token for prefill/decode), the current estimate and the sample count."""
        with self._lock:
            return {
                "vision": float(self._vision),
                "prefill_per_token": float(self._prefill_per_token),
                "decode_per_token": float(self._decode_per_token),
                "other": float(self._other),
                "dev": float(self._abs_dev),
                "estimate": float(self._estimate()),
                "samples": float(self._samples),
                "clipped": float(self._clipped),
                "prompt_per_token": float("nan") if self._prompt_per_token is None else float(self._prompt_per_token),
            }

    def decisions(self) -> dict[str, int]:
        """How many decide() calls ended with each reason."""
        with self._lock:
            return dict(self._decisions)
