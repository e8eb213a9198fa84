# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""One tick of the reasoning cycle of DESIGN.md §4, as a plain, ROS-free class.

`runtime.Runtime.step` wraps each tick with the last guard (`finalize`), the command limits, the caller's publish
and `record_published`; the ReasoningNode and `vla-edge-bench` both call that step, so they run one loop. Start-up
(warm-up, the collector settling) is the runtime's too. One `tick(t0)` is one control cycle:

1. where `t0` sits on the tick grid: its scheduled time (given by the caller's timer, else inferred from
   the grid of the first tick), its jitter, and the grid slots since the previous tick that never ran
   (a stalled process, a callback held up for more than a period): each is a missed deadline, counted
   in CycleStats; a chunk that missed an earlier deadline and has finished since is harvested (its
   timings feed the EMAs, its action is discarded);
2. freshest frame: none -> fallback `no_frame`; received more than `max_frame_age_ms` before `t0`
   -> fallback `stale_frame`; a frame-quality check tripped on it (its verdict came with it from the camera,
   frame_quality.py) -> fallback `frame_quality`; a frame failing a check not tripped yet is never admitted either:
   the tick is a `repeat`; a model with a state input and no accepted robot state, or one older than
   `max_state_age_ms` at `t0` (robot_state.py) -> fallback `stale_state` (never a zero-filled state); no new
   frame since the last submitted one -> the last model action again (`repeat`, no engine work; a fallback
   `repeat` if the model never produced one);
3. admission: `busy` (a late chunk still runs), `cold`, `refused` (estimate does not fit) -> fallback;
   optional (`probe_after` > 0; off by default here, the node turns it on through `reprobe_after_s`): while
   refusing, one chunk runs in the background (its action unused, nothing waits for it), because the EMAs
   only learn from chunks that run and a slow spell would otherwise keep the estimate above the budget, and
   the model off, for good. The first probe comes after PROBE_FIRST_AFTER refusals in a row. A probe that
   fitted the budget it was refused with is followed by another at the next refusal; one that did not fit
   doubles the wait, up to `probe_after`. Probing often while the model fits matters on a busy CPU: a chunk
   run after a long idle gap was measured 2-5x slower than one run every cycle (BENCHMARKS.md, "Admission
   on a slow host"), so rare probes would keep the estimate above the budget. A model that really does not
   fit costs one background chunk per `probe_after` cycles;
4. admitted: `engine.submit(frame)` (with the state: `engine.submit(frame, state)`), wait until
   `t0 + period - margin`: done -> model action (`fresh`); not done -> fallback `overrun`, returned right at that
   wait deadline; the forward pass overflowed (NaN/inf logits) -> fallback `non_finite`; the engine raised ->
   fallback `engine_error`;
5. EMAs updated from the chunk's measured per-phase timings.

`Runtime.step` publishes `outcome.action` (after `finalize`, the last guard, and the command limits) and then
calls `record_published(outcome, t_publish)`, which feeds CycleStats (cycle latency from the scheduled tick,
deadline-miss flag, chunk time, jitter, frame age, the gap since the previous published action).

Deadlines count from the scheduled tick when the caller passes it (the node reads it from its timer,
the bench from its schedule): a tick that starts late has that much less budget, and its action is late
if it is published after scheduled + period. Without it (tests, callers without a timer) the tick's own
start stands in for its scheduled time.

One thread calls tick/record_published (the timer thread); the engine runs chunks on its own worker.
"""
from __future__ import annotations

import collections
import concurrent.futures
import math
import time
from dataclasses import dataclass, field

import numpy as np

from .action_plan import ActionPlan
from .admission import AdmissionController, PhaseTimings, check_budget
from .contract import NonFiniteOutput
from .constants import ACTION_TOKENS, MAX_FRAME_AGE_MS, PERIOD_MS, SAFETY_MARGIN_MS
from .frame_buffer import FrameBuffer
from .frame_quality import names as quality_names, unpack_word
from .metrics import CycleStats
from .robot_state import MAX_STATE_AGE_MS

FALLBACK_MODES = ("zero", "hold")
# Every reason a cycle can end with. "repeat" is a model action when one exists, else a fallback.
# "non_finite": the chunk's forward pass overflowed (NonFiniteOutput: NaN/inf logits or vision embedding), or the
# last guard before publishing found NaN/inf in the action or its twist (see `finalize`);
# "inactive": the one zero action published when the caller stops (see `stop_outcome`).
# "internal_error": the caller's last resort when the cycle itself raised (see `internal_error_outcome`).
# "instruction_change": a new instruction is being prefilled into the pinned prompt (see `request_instruction`).
# "frame_quality": the camera's frame-quality checks (frame_quality.py) tripped: the frame is not admitted.
# "stale_state": the model takes the robot's state and has none newer than max_state_age_ms (robot_state.py).
REASONS = ("fresh", "repeat", "no_frame", "stale_frame", "refused", "busy", "cold", "overrun", "engine_error",
           "internal_error", "non_finite", "inactive", "instruction_change", "frame_quality", "stale_state")
FALLBACK_REASONS = tuple(r for r in REASONS if r != "fresh")  # "repeat" is a fallback until a model action exists
SOURCES = ("model", "plan", "fallback")
# Reasons whose tick may publish the plan's action for it (action chunks, action_plan.py): the model had no fresh
# action, but one it planned earlier is for this tick. An instruction change (the old task's plan), a stop and the
# cycle's own failure never do; a stale or missing frame (or state) lets the plan run out and never extends it.
PLAN_REASONS = ("repeat", "no_frame", "stale_frame", "refused", "busy", "cold", "overrun", "engine_error",
                "non_finite", "frame_quality", "stale_state")
ERROR_REASONS = ("overrun", "engine_error", "internal_error", "non_finite")  # the rest of the fallbacks are warnings
TWIST_COMPONENTS = 6


def twist_components(action: np.ndarray, twist_map, twist_scale) -> list[float]:
    """The six twist components: action[twist_map[j]] * twist_scale[j] (index -1 or out of range: 0.0)."""
    n = len(action)
    return [float(action[i]) * float(k) if 0 <= int(i) < n else 0.0 for i, k in zip(twist_map, twist_scale)]


@dataclass
class CycleOutcome:
    source: str  # "model" | "plan" (an action an earlier chunk planned for this tick) | "fallback"
    reason: str  # one of REASONS
    action: np.ndarray  # float32 [8]: what the caller publishes
    stamp_ns: int | None  # capture stamp of the source frame (None before any frame)
    frame_seq: int  # FrameBuffer seq of the frame this cycle looked at, -1 if none
    frame_age_ms: float | None  # t0 - frame receive time
    jitter_ms: float  # |t0 - scheduled tick| (never wrapped: a tick 0.7 periods late reads 0.7 periods)
    t0: float  # monotonic seconds at the tick
    deadline: float  # scheduled tick (or t0) + period: the action must be published before this
    chunk: object | None = None  # ChunkResult of a fresh model action
    timings: PhaseTimings | None = None  # the chunk's measured phases (fresh only)
    remaining_ms: float | None = None  # admission: time left after the margin when deciding
    estimate_ms: float | None = None  # admission: predicted chunk cost
    error: str | None = None  # engine_error: "Type: message"
    source_seq: int | None = None  # repeat: frame seq the repeated model action came from
    image: np.ndarray | None = field(default=None, repr=False)  # copy of the frame sent to the engine
    # A chunk that missed an earlier deadline and finished before this tick (its action was discarded):
    late_chunk: object | None = None  # its ChunkResult
    late_frame_seq: int | None = None  # the FrameBuffer seq of the frame it ran on
    late_error: str | None = None  # or why it failed
    probe: bool = False  # a refused cycle that started a background probe chunk (ReasoningCycle.probe_after)
    wait_until: float | None = None  # when the deadline guard stopped waiting for the chunk
    scheduled: float | None = None  # the grid time this tick was due (see ReasoningCycle.tick)
    missed_before: int = 0  # grid slots between the previous tick and this one that never ran
    clamped: int = 0  # twist components the command limits clamped (runtime.Runtime.publish_outcome)
    t_command: float | None = None  # when the limits were applied, just before publishing (their time base)
    instruction: object | None = None  # the instruction.Instruction active in this cycle
    instruction_since: float | None = None  # when it took effect (monotonic s; None: since start-up)
    hold_expired: bool = False  # fallback hold: the hold ran out (hold_timeout_s), this fallback is a zero
    # Action chunks (action_plan.py): the grid slot of this tick; for a model or plan action its index in its chunk
    # (its age in ticks since the chunk's frame); for the first action of a newly landed chunk the ticks it landed
    # late and its jump from the action it replaces (max |delta| over the dimensions; `boundary_replaced_plan`: the
    # replaced action was the old plan's, not a fallback's); `plan_remaining` ticks the plan covers after this one;
    # `plan_changed`: a chunk landed or the plan was cleared this tick (the trajectory output re-sends).
    slot: int = 0
    plan_age: int | None = None
    chunk_late_ticks: int | None = None
    boundary_jump: float | None = None
    boundary_replaced_plan: bool = False
    plan_remaining: int = 0
    plan_changed: bool = False
    # when plan_changed: the plan from this tick on, one action a tick (float32 [n, 8]; row 0 is this tick's action;
    # empty: the plan was discarded): what ~/action_chunk sends
    trajectory: np.ndarray | None = field(default=None, repr=False)
    # the frame's quality (frame_quality.py): the checks it fails or that are tripped ("" when it passes or came
    # unchecked; a failing frame is never admitted: tripped -> fallback frame_quality, else the last model action
    # repeated), whether a check is tripped, and its block map (bytes, BLOCK_* bits a block)
    frame_quality: str = ""
    quality_tripped: bool = False
    quality_blocks: bytes = b""
    # the robot state's age at t0 (ms; a model with a state input: None before any accepted state)
    state_age_ms: float | None = None


HOLD_TIMEOUT_S = 0.2  # fallback hold: the last action is repeated for at most this long, then zero (a base: 0.5 s)
REPROBE_AFTER_S = 2.0  # default longest wait between background probes while refusing (the node's reprobe_after_s)
PROBE_FIRST_AFTER = 3  # refusals in a row before the first probe of a refusing spell
WAKE_LAG_WINDOW = 64  # overruns remembered for the wake-up slack...
WAKE_LAG_MEMORY_S = 60.0  # ...for at most this long, so one bad spell does not shrink the budget for good


def probe_after_cycles(reprobe_after_s: float, period_ms: float) -> int:
    """`ReasoningCycle.probe_after` for a probe at most every `reprobe_after_s` seconds (0: never)."""
    return max(1, int(round(reprobe_after_s * 1000.0 / period_ms))) if reprobe_after_s > 0 else 0


class ReasoningCycle:
    def __init__(self, engine, frame_buffer: FrameBuffer, admission: AdmissionController,
                 period_ms: float = PERIOD_MS, safety_margin_ms: float = SAFETY_MARGIN_MS,
                 max_frame_age_ms: float = MAX_FRAME_AGE_MS,
                 fallback: str = "zero", clock=time.monotonic, stats: CycleStats | None = None,
                 probe_after: int = 0, hold_timeout_s: float = HOLD_TIMEOUT_S, instruction_min_cycles: int = 1,
                 plan: ActionPlan | None = None, state=None, max_state_age_ms: float = MAX_STATE_AGE_MS):
        if fallback not in FALLBACK_MODES:
            raise ValueError(f"fallback must be one of {FALLBACK_MODES}, got {fallback!r}")
        check_budget(period_ms, safety_margin_ms)
        self.engine = engine
        self.fb = frame_buffer
        self.admission = admission
        self.period_s = period_ms / 1000.0
        self.margin_s = safety_margin_ms / 1000.0
        self.max_frame_age_ms = float(max_frame_age_ms)
        self.fallback = fallback
        self.hold_timeout_s = _check_hold_timeout(hold_timeout_s)
        self.clock = clock
        self.probe_after = int(probe_after)
        self.stats = stats if stats is not None else CycleStats()
        self.plan = plan if plan is not None else ActionPlan(1)  # one action a chunk: no plan, today's loop
        self.state = state  # robot_state.StateBuffer of a model with a state input, else None
        self.max_state_age_ms = _check_state_age(max_state_age_ms)
        self.stale_states = 0  # ticks without a state fresh enough (fallback stale_state)
        self._pending_slot = 0  # grid slot of the tick whose frame the pending chunk runs on

        self._last_seq = -1  # seq of the last frame submitted to the engine
        self._last_model: tuple[np.ndarray, int, int] | None = None  # (action, stamp_ns, frame seq)
        self._last_action = np.zeros(ACTION_TOKENS, np.float32)  # last action handed out ("hold")
        self._pending: concurrent.futures.Future | None = None  # a chunk that missed its deadline
        self._pending_seq = -1
        self._probe_budget_ms: float | None = None  # the pending chunk is a probe refused with this budget
        self._grid_origin: float | None = None  # the tick grid: origin + k * period
        self._last_slot: int | None = None  # grid slot of the latest tick
        self._last_publish: float | None = None  # when the previous action was published (gap statistics)
        self._refusals_in_row = 0
        self._probe_gap = self._first_probe_gap()  # refusals in a row before the next probe
        self._hold_since: float | None = None  # fallback hold: tick of the first fallback of this spell
        self.holds_expired = 0  # fallback spells whose hold ran out (hold_timeout_s): zero from then on
        self.cycles = 0
        self.late_results = 0  # late chunks harvested (action discarded, timings learned)
        self.engine_errors = 0  # chunks that raised, on time or late
        self.quality_refused = 0  # ticks whose frame had a tripped quality check (fallback frame_quality)
        self.quality_held = 0  # ticks whose frame failed a check not tripped yet (not admitted: repeat)
        self.bad_timings = 0  # chunk timings the admission controller rejected
        self.probes = 0  # refused chunks admitted anyway to re-measure the cost (probe_after)
        self.non_finite = 0  # chunks whose forward pass overflowed (NonFiniteOutput) + actions stopped by `finalize`
        # How long after the guard's wait ended the fallback was actually published, for recent overruns.
        # On a loaded CPU the waiting thread wakes milliseconds late (scheduler, GIL); the guard learns
        # that lag and stops waiting earlier by the part the safety margin does not cover.
        self._publish_lags: collections.deque[tuple[float, float]] = collections.deque(maxlen=WAKE_LAG_WINDOW)
        # Instruction changes (request_instruction): at most one applied per `instruction_min_cycles` cycles; a
        # newer request replaces one still waiting (coalesced); `instruction_log` has one record per change.
        self.instruction_min_cycles = max(1, int(instruction_min_cycles))
        self._instr_pending = None  # (Instruction, its record) waiting to start
        self._instr_running = None  # (Instruction, future, its record) being prefilled on the engine worker
        self._cycles_since_change = self.instruction_min_cycles
        self.instruction_since: float | None = None
        self.instruction_changes = 0  # applied
        self.instruction_coalesced = 0  # replaced by a newer request before they started
        self.instruction_failures = 0  # prefills that raised (the previous instruction stayed)
        self.instruction_log: list[dict] = []

    def configure(self, period_ms: float | None = None, safety_margin_ms: float | None = None,
                  max_frame_age_ms: float | None = None, fallback: str | None = None,
                  probe_after: int | None = None, hold_timeout_s: float | None = None,
                  instruction_min_cycles: int | None = None, max_state_age_ms: float | None = None) -> None:
        """Change settings between ticks (the caller's thread, e.g. a parameter callback on the timer's
        executor). Raises ValueError and changes nothing when the new values are impossible."""
        period_s = self.period_s if period_ms is None else float(period_ms) / 1000.0
        margin_s = self.margin_s if safety_margin_ms is None else float(safety_margin_ms) / 1000.0
        fb = self.fallback if fallback is None else fallback
        if fb not in FALLBACK_MODES:
            raise ValueError(f"fallback must be one of {FALLBACK_MODES}, got {fb!r}")
        check_budget(period_s * 1e3, margin_s * 1e3)
        if max_frame_age_ms is not None and not (float(max_frame_age_ms) > 0.0):
            raise ValueError(f"max_frame_age_ms must be > 0, got {max_frame_age_ms!r}")
        hold = self.hold_timeout_s if hold_timeout_s is None else _check_hold_timeout(hold_timeout_s)
        state_age = self.max_state_age_ms if max_state_age_ms is None else _check_state_age(max_state_age_ms)
        self.period_s, self.margin_s, self.fallback, self.hold_timeout_s = period_s, margin_s, fb, hold
        self.max_state_age_ms = state_age
        if max_frame_age_ms is not None:
            self.max_frame_age_ms = float(max_frame_age_ms)
        if probe_after is not None:
            self.probe_after = int(probe_after)
            self._probe_gap = self._first_probe_gap()
        if instruction_min_cycles is not None:
            self.instruction_min_cycles = max(1, int(instruction_min_cycles))
        if period_ms is not None:
            self.reset_schedule()  # the tick grid restarts with the new period (a new timer)

    def reset_schedule(self) -> None:
        """Forget the tick grid and the last publish time: the caller's timer starts anew (a new period, a
        node re-activated after a pause), so the time in between is neither missed ticks nor an action gap."""
        self._grid_origin = self._last_slot = self._last_publish = None
        self.plan.clear()  # its actions were meant for slots of the old grid

    # --- state the caller may look at ----------------------------------------------------------------

    @property
    def wake_slack_s(self) -> float:
        """Time kept back before `deadline - margin` so that the slowest overrun publish of the last minute,
        had it started there, would still land by the deadline. Capped at half the usable budget; a stall of more
        than a period is not a wake-up lag and is not learned (`record_published`)."""
        now = self.clock()
        while self._publish_lags and now - self._publish_lags[0][0] > WAKE_LAG_MEMORY_S:
            self._publish_lags.popleft()
        if not self._publish_lags:
            return 0.0
        need = max(lag for _, lag in self._publish_lags) - self.margin_s
        return min(max(0.0, need), 0.5 * (self.period_s - self.margin_s))

    @property
    def pending(self) -> bool:
        """A chunk that missed its deadline is still running (or finished but not harvested yet)."""
        return self._pending is not None

    def drain(self, timeout: float | None = None) -> CycleOutcome | None:
        """Wait for a late chunk (e.g. at shutdown) and harvest it; returns the bookkeeping outcome."""
        if self._pending is None:
            return None
        concurrent.futures.wait([self._pending], timeout=timeout)
        bookkeeping = CycleOutcome("fallback", "overrun", self._last_action, None, -1, None, 0.0, self.clock(), 0.0)
        self._harvest_late(bookkeeping)
        return bookkeeping

    # --- one cycle ------------------------------------------------------------------------------------

    def tick(self, t0: float | None = None, scheduled: float | None = None) -> CycleOutcome:
        """Run one control cycle that ticked at `t0` (monotonic s; default now). `scheduled` is when the
        tick was due on the caller's timer grid: the budget (admission, the guard's wait) and the deadline
        count from it. Without it the tick is placed on the grid of the first tick for jitter and missed
        slots, and its budget counts from `t0`."""
        out = self._tick(t0, scheduled)
        if out.plan_changed:
            self._set_trajectory(out)
        return out

    def _set_trajectory(self, out: CycleOutcome) -> None:
        """The plan from this tick on (row 0: this tick's action when it came from the plan), or empty."""
        ahead = [a for _, a in self.plan.upcoming(out.slot + 1)]
        rows = ([np.asarray(out.action, np.float32)] if out.plan_age is not None else []) + ahead
        out.trajectory = np.stack(rows).astype(np.float32) if rows else np.zeros((0, ACTION_TOKENS), np.float32)

    def _tick(self, t0: float | None, scheduled: float | None) -> CycleOutcome:
        if t0 is None:
            t0 = self.clock()
        self.cycles += 1
        grid_time, missed = self._place_on_grid(t0, scheduled)
        start = t0 if scheduled is None else scheduled  # where this cycle's budget starts
        out = CycleOutcome("fallback", "no_frame", self._last_action, None, -1, None, abs(t0 - grid_time) * 1000.0,
                           t0, start + self.period_s, scheduled=start, missed_before=missed, slot=self._last_slot)
        if missed:
            self.stats.record_missed(missed)
        self._harvest_late(out)
        if self._instruction_step(out):
            return out

        frame = self.fb.latest()
        if frame is None:
            return self._fallback(out, "no_frame")
        out.frame_seq, out.stamp_ns = frame.seq, frame.stamp_ns
        out.frame_age_ms = (t0 - frame.recv_time) * 1000.0
        if out.frame_age_ms > self.max_frame_age_ms:
            return self._fallback(out, "stale_frame")
        if frame.quality and self._quality_step(out, frame):
            return out
        state = None
        if self.state is not None:
            sample = self.state.latest()
            out.state_age_ms = None if sample is None else sample.age_ms(t0)
            if sample is None or out.state_age_ms > self.max_state_age_ms:
                self.stale_states += 1
                return self._fallback(out, "stale_state")
            state = sample.vector
        if frame.seq <= self._last_seq:
            if self._last_model is None or self.plan.enabled:  # a plan is never extended by repeating its end
                return self._fallback(out, "repeat")
            action, out.stamp_ns, out.source_seq = self._last_model
            return self._model(out, "repeat", action)

        slack_s = self.wake_slack_s
        # With a plan (action chunks) a chunk need not land inside this tick: it is admitted when it lands while some
        # of its actions are still ahead (ActionPlan.horizon_ticks); the ticks until then publish the plan.
        horizon_ms = self.plan.horizon_ticks() * self.period_s * 1000.0
        d = self.admission.decide(start, busy=self._pending is not None or bool(self.engine.busy),
                                  reserve_ms=slack_s * 1000.0, horizon_ms=horizon_ms)
        out.remaining_ms, out.estimate_ms = d.remaining_ms, d.estimate_ms
        if d.reason == "refused" and self.probe_after > 0 and self._refusals_in_row >= self._probe_gap:
            return self._probe(out, frame, state)
        if not d.admit:
            self._refusals_in_row += d.reason == "refused"
            return self._fallback(out, d.reason)
        self._refusals_in_row = 0
        self._probe_gap = self._first_probe_gap()

        image = np.array(frame.image, copy=True)  # the FrameBuffer view is reused after the next latest()
        self._last_seq = frame.seq
        out.wait_until = start + self.period_s - self.margin_s - slack_s
        # admitted by the plan's horizon alone (expected to land on a later tick): nothing to wait for, the tick
        # publishes its plan action now instead of at the guard's wait end (one wake-up fewer to be late for)
        expected_later = d.estimate_ms > d.remaining_ms
        try:
            fut = self.engine.submit(image) if state is None else self.engine.submit(image, state)
            res = fut.result(timeout=0.0 if expected_later else max(0.0, out.wait_until - self.clock()))
        except concurrent.futures.TimeoutError:
            # Walk away: the late result is harvested by a later tick (with a plan its actions still ahead are used,
            # else it is discarded). A chunk admitted to land on a later tick is not an overrun: it is running.
            self._pending, self._pending_seq, self._pending_slot = fut, frame.seq, out.slot
            if expected_later:
                out.wait_until = None
            return self._fallback(out, "busy" if expected_later else "overrun")
        except NonFiniteOutput as e:  # the model overflowed on this frame: never an action
            self.non_finite += 1
            out.error = f"{type(e).__name__} ({e.phase}): {e}"
            if e.timings is not None:
                self._learn(e.timings)
            return self._fallback(out, "non_finite")
        except Exception as e:  # noqa: BLE001 - any engine failure becomes a fallback, never a crash
            self.engine_errors += 1
            out.error = f"{type(e).__name__}: {e}"
            return self._fallback(out, "engine_error")

        out.chunk, out.timings, out.image = res, res.timings, image
        self._learn(res.timings)
        if self.plan.enabled:
            self._land(out, res, out.slot)
            step = self.plan.take(out.slot)
            self._plan_step(out, step)
            self._last_model = (step.action, frame.stamp_ns, frame.seq)
            return self._model(out, "fresh", step.action)
        action = np.asarray(res.action, np.float32)
        self._last_model = (action, frame.stamp_ns, frame.seq)
        return self._model(out, "fresh", action)

    # --- frame quality ---------------------------------------------------------------------------------------

    def _quality_step(self, out: CycleOutcome, frame) -> bool:
        """A frame that fails its quality checks is never admitted (so never retained by the cache either): a
        tripped check -> fallback frame_quality (a plan may run out, never longer); failing but not tripped yet
        (the hysteresis) -> the last model action again, as if no new frame had come.  True: `out` is final."""
        tripped, failed, _ = unpack_word(frame.quality)
        if not (tripped or failed):
            return False
        out.frame_quality, out.quality_tripped, out.quality_blocks = quality_names(tripped or failed), bool(tripped), \
            frame.blocks
        if tripped:
            self.quality_refused += 1
            self._fallback(out, "frame_quality")
            return True
        self.quality_held += 1
        if self._last_model is None or self.plan.enabled:
            self._fallback(out, "repeat")
        else:
            action, out.stamp_ns, out.source_seq = self._last_model
            self._model(out, "repeat", action)
        return True

    # --- the plan (action chunks) ---------------------------------------------------------------------------

    def _land(self, out: CycleOutcome, res, t0_slot: int) -> None:
        """A chunk's actions into the plan (its frame was taken on tick `t0_slot`)."""
        actions = getattr(res, "actions", None)
        if actions is None:
            actions = np.asarray(res.action, np.float32)[None, :]
        landing = self.plan.land(actions, t0_slot, out.slot)
        out.chunk_late_ticks = landing.late_ticks
        out.plan_changed = True

    def _plan_step(self, out: CycleOutcome, step) -> None:
        """Record where the published plan action came from; a chunk's first one also its boundary jump."""
        out.plan_age = step.index
        out.plan_remaining = self.plan.remaining(out.slot + 1)
        if step.first:
            replaced = step.replaced if step.replaced is not None else self._last_action
            out.boundary_replaced_plan = step.replaced is not None
            out.boundary_jump = float(np.max(np.abs(np.asarray(step.action, np.float64)
                                                    - np.asarray(replaced, np.float64))))

    def clear_plan(self, out: CycleOutcome | None = None) -> None:
        """Discard the plan (an applied instruction change, deactivate, a blocked non-finite action)."""
        if self.plan.clear() and out is not None:
            out.plan_changed = True
            out.trajectory = np.zeros((0, ACTION_TOKENS), np.float32)  # an empty trajectory: the controller stops

    # --- instructions -------------------------------------------------------------------------------------

    def request_instruction(self, instruction) -> None:
        """Make `instruction` (instruction.Instruction, already checked and tokenized) the task, as soon as the
        rules allow: not within `instruction_min_cycles` cycles of the previous change, not while a chunk still
        runs. A request still waiting when a newer one comes is replaced (counted in `instruction_coalesced`)."""
        rec = {"text": instruction.text, "source": instruction.source, "prompt_tokens": int(len(instruction.ids)),
               "instruction_tokens": int(instruction.instruction_tokens), "requested": self.clock(),
               "started": None, "applied": None, "cycles": 0, "prefill_ms": None, "ok": None, "error": None}
        if self._instr_pending is not None:
            self.instruction_coalesced += 1
            self._instr_pending[1]["ok"], self._instr_pending[1]["error"] = False, "coalesced: a newer one came"
        self._instr_pending = (instruction, rec)
        self.instruction_log.append(rec)
        del self.instruction_log[:-64]  # the latest 64 changes

    @property
    def instruction_in_progress(self) -> bool:
        return self._instr_running is not None or self._instr_pending is not None

    def _instruction_step(self, out: CycleOutcome) -> bool:
        """The instruction part of a tick. True: this cycle is an `instruction_change` fallback (a change runs or
        waits to start); False: the cycle goes on (no change, or one just finished: the new prompt is in place).

        The prefill of the new prompt runs on the engine worker like a chunk, and nothing waits for it: each cycle
        until it is done publishes the zero fallback `instruction_change` on time (a change costs cycles, never a
        deadline). Zero, whatever the fallback mode: holding the old task's command would carry it on under the new
        one. When it is done, the last model action is forgotten (no `repeat` of the old task's action)."""
        self._cycles_since_change += 1
        out.instruction, out.instruction_since = getattr(self.engine, "instruction", None), self.instruction_since
        if self._instr_running is not None:
            instr, fut, rec = self._instr_running
            if not fut.done():
                rec["cycles"] += 1
                return self._instruction_fallback(out)
            self._instr_running = None
            try:
                ms = fut.result()
            except Exception as e:  # noqa: BLE001 - the engine put the previous prompt back
                self.instruction_failures += 1
                rec["ok"], rec["error"] = False, f"{type(e).__name__}: {e}"
                out.error = f"instruction change failed, the previous instruction stays: {rec['error']}"
            else:
                self.instruction_changes += 1
                self._cycles_since_change = 0
                rec.update(ok=True, applied=self.clock(), prefill_ms=ms)
                self.instruction_since = rec["applied"]
                self._last_model, self._last_seq = None, -1  # (the plan went at the change's first tick)
                try:
                    self.admission.update_prompt(ms, len(instr.ids))
                except ValueError:
                    self.bad_timings += 1
                out.instruction, out.instruction_since = self.engine.instruction, self.instruction_since
        if self._instr_pending is None or self._cycles_since_change < self.instruction_min_cycles:
            return False
        instr, rec = self._instr_pending
        rec["cycles"] += 1
        if self._pending is not None or self.engine.busy:  # a late chunk of the old task: wait for it
            return self._instruction_fallback(out)
        self._instr_pending = None
        rec["started"] = self.clock()
        try:
            self._instr_running = (instr, self.engine.submit_instruction(instr), rec)
        except Exception as e:  # noqa: BLE001 - cannot start: the previous instruction stays
            self.instruction_failures += 1
            rec["ok"], rec["error"] = False, f"{type(e).__name__}: {e}"
            out.error = f"instruction change failed, the previous instruction stays: {rec['error']}"
        return self._instruction_fallback(out)

    def _instruction_fallback(self, out: CycleOutcome) -> bool:
        self._fallback(out, "instruction_change")
        out.action = self._last_action = np.zeros(ACTION_TOKENS, np.float32)
        self.clear_plan(out)  # zero while a change waits or runs: the old task's plan is not carried on
        return True

    def finalize(self, outcome: CycleOutcome, twist_map=range(TWIST_COMPONENTS),
                 twist_scale=(1.0,) * TWIST_COMPONENTS) -> list[float]:
        """The last guard before publishing: returns the twist components to send for `outcome`.

        A non-finite action or twist (a NaN from the model, a NaN/inf scale that slipped past validation,
        0 x inf) never leaves: the outcome becomes the fallback `non_finite` with a zero action and a zero
        twist (literal zeros, not zero x scale), `error` says what was found, and neither `hold` nor
        `repeat` can hand the bad action out again."""
        action = np.asarray(outcome.action, np.float32)
        comps = twist_components(action, twist_map, twist_scale)
        if np.isfinite(action).all() and all(np.isfinite(comps)):
            return comps
        self.non_finite += 1
        outcome.error = (f"non-finite output blocked: action {np.array2string(action, precision=4)}, "
                         f"twist {[round(c, 4) for c in comps]}, twist_scale {list(twist_scale)}")
        outcome.source, outcome.reason = "fallback", "non_finite"
        outcome.action = np.zeros(ACTION_TOKENS, np.float32)
        self._last_action = outcome.action
        self.clear_plan(outcome)
        if self._last_model is not None and not np.isfinite(self._last_model[0]).all():
            self._last_model = None
        return [0.0] * TWIST_COMPONENTS

    def stop_outcome(self, stamp_ns: int | None = None, t0: float | None = None) -> CycleOutcome:
        """The one action to publish when the caller stops its cycle (e.g. a node deactivated): a zero
        action (fallback `inactive`, whatever the fallback mode), and `hold` starts from zero afterwards."""
        t0 = self.clock() if t0 is None else t0
        self._last_action = np.zeros(ACTION_TOKENS, np.float32)
        out = CycleOutcome("fallback", "inactive", self._last_action, stamp_ns, -1, None, 0.0, t0, t0 + self.period_s,
                           scheduled=t0)
        self.clear_plan(out)  # the plan dies with the lifecycle: activate starts without one
        return out

    def internal_error_outcome(self, t0: float, error: BaseException, stamp_ns: int | None = None) -> CycleOutcome:
        """The caller's last resort when `tick` itself raised: a zero action, reason `internal_error`, no plan."""
        self._last_action = np.zeros(ACTION_TOKENS, np.float32)
        out = CycleOutcome("fallback", "internal_error", self._last_action, stamp_ns, -1, None, 0.0, t0,
                           t0 + self.period_s, scheduled=t0, error=f"{type(error).__name__}: {error}")
        self.clear_plan(out)
        return out

    def record_published(self, outcome: CycleOutcome, t_publish: float | None = None) -> bool:
        """Record a published outcome in `stats`; returns True if it was late (after the deadline)."""
        if t_publish is None:
            t_publish = self.clock()
        late = t_publish > outcome.deadline
        if self._last_publish is not None:
            self.stats.action_gap_ms.add((t_publish - self._last_publish) * 1000.0)
        self._last_publish = t_publish
        start = outcome.scheduled if outcome.scheduled is not None else outcome.t0
        # Overruns measure the wake-up lag directly; a chunk result published late teaches the same. A lag of more
        # than a period is a stall of the process (SIGSTOP, a VM pause: counted as missed ticks), not a wake-up lag:
        # kept back for a minute it would shrink the budget after a 2 s stall until no chunk fit (test_round4_ros).
        lag = t_publish - outcome.wait_until if outcome.wait_until is not None else None
        if lag is not None and (outcome.reason == "overrun" or late) and lag <= self.period_s:
            self._publish_lags.append((t_publish, lag))
        self.stats.record(outcome.source, outcome.reason, late, (t_publish - start) * 1000.0,
                          chunk_ms=outcome.timings.total_ms if outcome.timings is not None else None,
                          jitter_ms=outcome.jitter_ms, frame_age_ms=outcome.frame_age_ms, plan_age=outcome.plan_age,
                          boundary_jump=outcome.boundary_jump if outcome.boundary_replaced_plan else None)
        return late

    # --- helpers --------------------------------------------------------------------------------------

    def _place_on_grid(self, t0: float, scheduled: float | None) -> tuple[float, int]:
        """(grid time of this tick, grid slots skipped since the previous tick). A given `scheduled` is on the caller's
        grid, so rounding finds its slot exactly. An inferred slot is the latest grid time at or before t0
        (floor, not round: a tick 0.7 periods late is 0.7 periods late, not 0.3 early), with 1 % of a
        period of tolerance for a timer that fires a hair early."""
        ref = scheduled if scheduled is not None else t0
        if self._grid_origin is None:
            self._grid_origin, self._last_slot = ref, 0
            return ref, 0
        x = (ref - self._grid_origin) / self.period_s
        slot = int(round(x)) if scheduled is not None else int(np.floor(x + 0.01))
        missed = max(0, slot - self._last_slot - 1)
        self._last_slot = max(self._last_slot, slot)  # the tick's slot (the plan's clock): never backwards
        return (ref if scheduled is not None else self._grid_origin + slot * self.period_s), missed

    def _harvest_late(self, out: CycleOutcome) -> None:
        fut = self._pending
        if fut is None or not fut.done():
            return
        self._pending = None
        out.late_frame_seq = self._pending_seq
        probe_budget, self._probe_budget_ms = self._probe_budget_ms, None
        try:
            res = fut.result()
        except Exception as e:  # noqa: BLE001
            # a non-finite chunk ran to its end (the check is on its output): its timings are a measurement, so a
            # model that overflows on every frame still teaches its cost (else one slow chunk kept the estimate over
            # the budget for good: every probe failed, taught nothing and backed off)
            timings = None
            if isinstance(e, NonFiniteOutput):
                self.non_finite += 1
                timings = e.timings
            else:
                self.engine_errors += 1
            out.late_error = f"{type(e).__name__}: {e}"
            if timings is not None:
                self._learn(timings)
            if probe_budget is not None:
                self._next_probe_gap(fitted=timings is not None and timings.total_ms <= probe_budget)
            return
        if probe_budget is not None:
            self._next_probe_gap(fitted=res.timings.total_ms <= probe_budget)
        elif self.plan.enabled:  # its actions still ahead become the plan (a probe's are never used)
            self._land(out, res, self._pending_slot)
        self.late_results += 1
        out.late_chunk = res
        self._learn(res.timings)
        self.stats.chunk_ms.add(res.timings.total_ms)  # a late chunk's cost is part of the chunk distribution

    def _probe(self, out: CycleOutcome, frame, state=None) -> CycleOutcome:
        """Re-measure the chunk cost in the background: the refusal fallback goes out now, the probe chunk
        runs on the engine worker like a late chunk (later ticks say `busy`, the harvest learns its
        timings) and its action is never used. Nothing waits for it, so it cannot make a publish late."""
        self._refusals_in_row = 0
        self.probes += 1
        out.probe = True
        try:
            image = np.array(frame.image, copy=True)
            self._pending = self.engine.submit(image) if state is None else self.engine.submit(image, state)
            self._pending_seq = frame.seq
            self._probe_budget_ms = out.remaining_ms
        except Exception as e:  # noqa: BLE001 - a probe that cannot start is an engine error, not a crash
            self.engine_errors += 1
            out.error = f"{type(e).__name__}: {e}"
            self._next_probe_gap(fitted=False)
        return self._fallback(out, "refused")

    def _first_probe_gap(self) -> int:
        return min(PROBE_FIRST_AFTER, self.probe_after) if self.probe_after > 0 else 0

    def _next_probe_gap(self, fitted: bool) -> None:
        """After a probe: the next at the very next refusal if it fitted its budget, else after twice as many."""
        if self.probe_after > 0:
            self._probe_gap = 0 if fitted else min(max(2 * self._probe_gap, PROBE_FIRST_AFTER), self.probe_after)

    def _learn(self, timings: PhaseTimings) -> None:
        try:
            self.admission.update(timings)
        except ValueError:  # a NaN/negative sample must not poison the EMAs; counted, not fatal
            self.bad_timings += 1

    def _model(self, out: CycleOutcome, reason: str, action: np.ndarray) -> CycleOutcome:
        out.source, out.reason, out.action = "model", reason, action
        self._last_action = action
        self._hold_since = None
        return out

    def _fallback(self, out: CycleOutcome, reason: str) -> CycleOutcome:
        """A fallback: zero, or (``hold``) the last action again for at most ``hold_timeout_s`` from the first
        fallback of the spell, then zero (``hold_expired``, counted once a spell): a camera that is gone never
        keeps the robot driving blind for longer than that.

        With a plan (action chunks) a tick of a PLAN_REASONS reason publishes the plan's action for it instead
        (source `plan`, the reason kept); the first action of a chunk that landed late this tick is the model's
        (`fresh`)."""
        if self.plan.enabled and reason in PLAN_REASONS:
            step = self.plan.take(out.slot)
            if step is not None:
                self._plan_step(out, step)
                if step.first:  # out.late_chunk is that chunk
                    return self._model(out, "fresh", step.action)
                out.source, out.reason, out.action = "plan", reason, step.action
                self._last_action, self._hold_since = step.action, None
                return out
        out.source, out.reason = "fallback", reason
        if self.fallback != "hold":
            out.action = np.zeros(ACTION_TOKENS, np.float32)
        else:
            if self._hold_since is None:
                self._hold_since = out.t0
            if out.t0 - self._hold_since <= self.hold_timeout_s:
                out.action = self._last_action
            else:
                if np.any(self._last_action != 0.0):
                    self.holds_expired += 1
                out.action = np.zeros(ACTION_TOKENS, np.float32)
                out.hold_expired = True
        self._last_action = out.action
        return out


def _check_state_age(v) -> float:
    v = float(v)
    if not (math.isfinite(v) and v > 0.0):
        raise ValueError(f"max_state_age_ms must be finite and > 0, got {v!r}")
    return v


def _check_hold_timeout(v) -> float:
    v = float(v)
    if not (math.isfinite(v) and v >= 0.0):
        raise ValueError(f"hold_timeout_s must be finite and >= 0, got {v!r}")
    return v
