# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The control loop assembled: start-up and the step, the one handle the node and the tools hold (ROS-free).

`Runtime.build` resolves the model (the settings' `model_path`, or the generated tiny model with
`make_tiny_model`), checks every start-up rule of the settings (the KV capacity against the model's prompt
included), loads the model into an Engine, warms it up (`warm_up`), seeds the admission EMAs from the
steady-state warm-up chunks and settles the garbage collector (`settle_after_warmup`), so the first control
cycles carry no one-time cost. `Runtime.step` is one control cycle for a caller that publishes: tick, the last
guard (`finalize`), the command limits (`CommandLimiter`), the caller's publish, the bookkeeping; the node's timer
and `vla-edge-bench` both call it. `Runtime.describe` says what was built, `Runtime.resume` restarts the tick
grid and the limits after a pause, `Runtime.record` is the loop's `diagnostics.LoopRecord`.
"""
from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .action_plan import ActionPlan, check_plan_settings
from .admission import AdmissionController
from .command_limits import CommandLimiter
from .contract import NonFiniteOutput
from .constants import ACTION_TOKENS, FRAME_C, FRAME_H, FRAME_W
from .cycle import CycleOutcome, ReasoningCycle, probe_after_cycles
from .diagnostics import LoopRecord, loop_record
from .frame_buffer import FrameBuffer
from .instruction import InstructionError, TransientRefusal, summary
from .metrics import VramSampler
from .model.checkpoint import Checkpoint
from .robot_state import StateBuffer, model_mapper, synthetic_state
from .kv_cache import min_capacity

TEST_FAULT_ENV = "VLA_EDGE_TEST_FAULT_FILE"  # test-only fault injection: chunks fail while the named file exists


class StartupError(RuntimeError):
    """The loop cannot start (model, engine, warm-up, VRAM plan): one clear message."""


def engine_error_message(e: BaseException, model, backend: str, capacity: int, ceiling_gb: float) -> str:
    """The one start-up message for an engine that cannot start (`model`: a Checkpoint or a model path). A device
    out-of-memory error gets the VRAM plan of the model and the ceiling appended, so the reader sees what was asked
    for."""
    msg = f"cannot start the engine ({model}, backend {backend}): {type(e).__name__}: {e}"
    if "outofmemory" in type(e).__name__.lower() or "out of memory" in str(e).lower():
        from .vram_plan import GIB, format_plan, plan_for_model

        plan = plan_for_model(model, capacity)
        if plan is not None:
            msg += (f"; VRAM plan at kv_capacity_tokens={capacity}: {format_plan(plan)} against the ceiling "
                    f"vram_ceiling_gb={ceiling_gb:g} ({ceiling_gb * GIB / 2**20:.0f} MiB): the device has less "
                    f"free memory than the plan; free the GPU or lower kv_capacity_tokens / vram_ceiling_gb")
    return msg


class WarmupInterrupted(RuntimeError):
    """`warm_up` stopped between chunks because the caller asked it to (a shutdown request)."""


def warm_up(engine, chunks: int, should_stop=lambda: False, seed: int = 0) -> list:
    """Run `chunks` dry chunks and return their PhaseTimings; then the engine forgets those frames.

    Chunk by chunk, so a shutdown request (`should_stop()` true) is seen between chunks instead of after
    all of them (WarmupInterrupted). The last chunk goes through `engine.submit`, i.e. the worker thread
    that runs the live chunks, so that thread's first chunk (thread-local CUDA state, first-call
    allocations) is not the first chunk of a control cycle. `engine` implements contract.EngineProtocol."""
    if chunks <= 0:
        return []
    rng = np.random.default_rng(seed)
    dim = int(getattr(engine, "state_dim", 0) or 0)  # a model with a state input gets a made-up state
    timings = []
    for i in range(chunks):
        if should_stop():
            raise WarmupInterrupted(f"interrupted after {i} of {chunks} warm-up chunks")
        frame = rng.integers(0, 256, (FRAME_H, FRAME_W, FRAME_C), dtype=np.uint8)
        kw = {"state": synthetic_state(dim, 0.1 * i, seed)} if dim else {}
        res = engine.submit(frame, **kw).result() if i == chunks - 1 else engine.run_chunk(frame, **kw)
        timings.append(res.timings)
    engine.warmup(0)  # no dry chunk: only the reset, so the live stream starts with an empty history
    return timings


def settle_after_warmup() -> None:
    """Call once after warm-up, before the first control cycle: one full garbage collection now, then
    everything alive is moved out of the collector's generations (gc.freeze). Loading a model and warming
    up allocate many long-lived objects; without this the first full (generation-2) collection over them
    is triggered by ordinary allocations some cycles later, inside a cycle's budget. Later collections
    only scan objects created after this point. Pair it with `release_after_run` when the engine goes."""
    gc.collect()
    gc.freeze()


def release_after_run() -> None:
    """Undo `settle_after_warmup` once the engine is dropped: frozen objects are never collected, so a
    reference cycle holding the old engine (and its device memory) would otherwise outlive it."""
    gc.unfreeze()
    gc.collect()


def deadline_warning(estimate_ms: float, period_ms: float, safety_margin_ms: float, kv_capacity_tokens: int,
                     backend: str) -> str | None:
    """None when the admission estimate fits the cycle's budget, else one line that says so and names the
    parameters that would fix it: such a configuration refuses (nearly) every cycle."""
    budget = period_ms - safety_margin_ms
    if not (estimate_ms > budget):
        return None
    fixes = [f"lower kv_capacity_tokens (now {kv_capacity_tokens}; attention cost grows with it)",
             f"raise period_ms above {estimate_ms + safety_margin_ms:.1f}"]
    if backend != "cuda":
        fixes.append(f"use backend cuda on a GPU (now {backend})")
    return (f"chunk estimate {estimate_ms:.2f} ms after warm-up exceeds the budget {budget:.2f} ms "
            f"(period_ms {period_ms:g} - safety_margin_ms {safety_margin_ms:g}): admission will refuse the "
            f"model; " + ", or ".join(fixes))


@dataclass
class Step:
    """One published control cycle: what the cycle decided, the twist sent, when, and whether it was late."""

    outcome: CycleOutcome
    twist: list[float]
    t_publish: float
    late: bool


class Runtime:
    def __init__(self, engine, admission: AdmissionController, cycle: ReasoningCycle, settings, warmup_timings,
                 vram_interval_s: float = 0.5, model_path: str = ""):
        self.engine, self.admission, self.cycle, self.settings = engine, admission, cycle, settings
        self.model_path = model_path
        self.backend_name = engine.backend_name
        self.limiter = CommandLimiter(settings.velocity_limits, settings.acceleration_limits,
                                      max_step_s=settings.period_ms / 1000.0,
                                      base_timeout_s=settings.base_command_timeout_s)
        self.warmup_timings = list(warmup_timings)
        self.vram = VramSampler(interval_s=vram_interval_s)  # whole-device memory when a GPU is present, else idle
        self.vram.start()
        self.deadline_warning = self._deadline_warning()
        self.instruction_refused = 0  # set_instruction calls refused (InstructionError)
        self.instruction_unchanged = 0  # requests for the instruction already active
        self.instruction_last_refusal = getattr(engine, "instruction_error", None) or ""

    @classmethod
    def build(cls, model_path: str | None, settings, frame_buffer: FrameBuffer, engine_factory=None,
              should_stop: Callable[[], bool] = lambda: False, admission_class=AdmissionController, weights=None,
              fault_file: str | None = None, warn: Callable[[str], None] = print, stats=None, seed: int = 0,
              vram_interval_s: float = 0.5) -> "Runtime":
        """Model, start-up checks, engine, warm-up, admission seeded from the warm-up, cycle.

        `model_path` None: the settings' `model_path`, or with `make_tiny_model` and an empty one the generated
        tiny model. Raises settings.ParamError (one line) when a start-up rule of the settings fails (the KV capacity
        against the model's prompt among them: checked before anything is allocated), StartupError (one line) when
        the model or the engine cannot start, WarmupInterrupted when `should_stop()` turns true between warm-up
        chunks."""
        checkpoint = resolve_model(model_path, settings)  # opened once: the engine reads what the checks read
        model_path = checkpoint.path
        s = settings
        engine = _make_engine(engine_factory, checkpoint, s, weights)
        try:
            if fault_file:
                _install_fault(engine, fault_file)
                warn(f"TEST-ONLY fault injection enabled: chunks fail while {fault_file} exists ({TEST_FAULT_ENV}); "
                     f"never set this on a robot")
            if s.realtime_priority > 0:
                # one level below the control thread: never preempted by other processes while it holds the GIL
                refused = engine.set_worker_priority(max(1, s.realtime_priority - 1))
                if refused:
                    warn(f"engine worker: {refused}")
            prefill_tokens, decode_tokens = engine.phase_tokens  # a parallel model: a 40-token prefill, no decode
            admission = admission_class(period_ms=s.period_ms, safety_margin_ms=s.safety_margin_ms,
                                        ema_alpha=s.ema_alpha, prefill_tokens=prefill_tokens,
                                        decode_tokens=decode_tokens, tail_k=s.tail_k)
            try:
                timings = warm_up(engine, s.warmup_chunks, should_stop=should_stop, seed=seed)
            except WarmupInterrupted:
                raise
            except NonFiniteOutput as e:  # finite weights whose arithmetic overflows: such a model never drives
                raise StartupError(f"model refused ({model_path}): its forward pass overflows during warm-up, in "
                                   f"the {e.phase}: {e}") from e
            except Exception as e:  # noqa: BLE001
                raise StartupError(f"engine warm-up failed: {type(e).__name__}: {e}") from e
            # the first chunk carries compile/first-touch costs: seed from the steady-state ones
            for t in timings[1:] if len(timings) > 1 else timings:
                admission.update(t)
            settle_after_warmup()
            plan = ActionPlan(engine_action_chunk(engine), s.chunk_execute, s.chunk_blend, s.chunk_blend_weight)
            state = state_buffer(engine, s, warn)
            cycle = ReasoningCycle(engine, frame_buffer, admission, period_ms=s.period_ms,
                                   safety_margin_ms=s.safety_margin_ms, max_frame_age_ms=s.max_frame_age_ms,
                                   fallback=s.fallback, probe_after=probe_after_cycles(s.reprobe_after_s, s.period_ms),
                                   stats=stats, hold_timeout_s=s.hold_timeout_s,
                                   instruction_min_cycles=s.instruction_min_interval_cycles, plan=plan,
                                   state=state, max_state_age_ms=s.max_state_age_ms)
            if getattr(engine, "instruction_error", None):
                warn(f"instruction refused at start-up, running with the default prompt: {engine.instruction_error}")
            cfg = getattr(engine, "cfg", None)
            fit = s.kv_capacity_tokens - min_capacity(len(getattr(engine, "prompt_ids", ())),
                                                      action_tokens=getattr(cfg, "action_tokens", ACTION_TOKENS),
                                                      state_tokens=getattr(cfg, "state_tokens", 0))
            if getattr(engine, "prompts", None) is not None and s.max_instruction_tokens > fit > 0:
                warn(f"max_instruction_tokens={s.max_instruction_tokens} does not fit kv_capacity_tokens="
                     f"{s.kv_capacity_tokens}: instructions of more than about {fit} tokens will be refused")
        except BaseException:
            engine.close()
            raise
        cycle.stats.summary()  # run once now what the first roll-up would run for the first time (percentiles)
        return cls(engine, admission, cycle, s, timings, vram_interval_s, model_path)

    def describe(self) -> str:
        """One line on what was built: backend, model, weights, the loop's numbers, the chunk estimate."""
        s, e = self.settings, self.engine
        return (f"backend {self.backend_name}, model {self.model_path} ({e.weight_format} weights, {e.action_decoding} "
                f"action decoding), period {s.period_ms} ms, margin {s.safety_margin_ms} ms, policy {s.policy}, "
                f"capacity {s.kv_capacity_tokens} tokens, fallback {s.fallback}; chunk estimate "
                f"{self.admission.estimate_ms():.2f} ms ({len(self.warmup_timings)} warm-up chunks)")

    def resume(self) -> None:
        """Before the first step after a pause (activate): the time in between is neither missed ticks nor an
        action gap (the tick grid restarts), and the first command ramps from rest (the limits start from zero)."""
        self.cycle.reset_schedule()  # also discards the plan: its ticks were on the old grid
        self.limiter.reset()

    # --- the cycle ---------------------------------------------------------------------------------------

    def step(self, t0: float, scheduled: float | None, publish: Callable[[list[float], CycleOutcome], float]) -> Step:
        """One control cycle: tick, then `publish(twist, outcome)` (returns the publish time), then bookkeeping."""
        return self.publish_outcome(self.cycle.tick(t0, scheduled), publish)

    def publish_outcome(self, out: CycleOutcome, publish) -> Step:
        """The last guard (a non-finite action becomes the zero `non_finite` fallback), the command limits, the
        caller's publish, the statistics. Also for the outcomes the caller makes itself (stop, internal error)."""
        twist = self.cycle.finalize(out, self.settings.twist_map, self.settings.twist_scale)
        now = out.t_command = self.cycle.clock()
        if out.reason == "inactive":
            twist = self.limiter.hard_stop(now)
        else:
            twist, out.clamped = self.limiter.apply(twist, now)
        t_pub = publish(twist, out)
        return Step(out, twist, t_pub, self.cycle.record_published(out, t_pub))

    def stop_outcome(self, stamp_ns: int | None) -> CycleOutcome:
        return self.cycle.stop_outcome(stamp_ns)

    def internal_error_outcome(self, t0: float, error: BaseException, stamp_ns: int | None) -> CycleOutcome:
        return self.cycle.internal_error_outcome(t0, error, stamp_ns)

    # --- instructions ------------------------------------------------------------------------------------

    def set_instruction(self, text, source: str = "parameter"):
        """Check and tokenize `text` and hand it to the cycle, which applies it between chunks (DESIGN.md §8).
        Returns the Instruction, or None when it is the one already active; raises InstructionError (one line,
        counted, kept as `instruction_last_refusal`) and changes nothing when it is refused."""
        try:
            instr = self.engine.prompts.build(text, source)
        except InstructionError as e:
            self.note_refusal(source, e)
            raise
        if not self.cycle.instruction_in_progress and instr.text == self.engine.instruction.text:
            self.instruction_unchanged += 1
            return None
        self.cycle.request_instruction(instr)
        return instr

    def note_refusal(self, source: str, e: Exception, count: int = 1) -> None:
        """Count `count` refused instructions, `e` the last (also ones refused before set_instruction: a malformed
        or oversized message)."""
        self.instruction_refused += count
        self.instruction_last_refusal = f"{source}: {e}"

    def instruction_values(self) -> dict:
        """The active instruction and the change counters (/diagnostics, the bench report)."""
        cyc, instr = self.cycle, self.engine.instruction
        since = cyc.instruction_since
        return {"instruction": summary(instr), "instruction_tokens": instr.instruction_tokens,
                "instruction_template": instr.template, "prompt_tokens": int(len(instr.ids)),
                "instruction_source": instr.source,
                "instruction_active_s": (cyc.clock() - since) if since is not None else "since start-up",
                "instruction_changes": cyc.instruction_changes, "instruction_coalesced": cyc.instruction_coalesced,
                "instruction_failures": cyc.instruction_failures, "instruction_refused": self.instruction_refused,
                "instruction_unchanged": self.instruction_unchanged,
                "instruction_renders": getattr(self.engine.prompts, "renders", 0),
                "instruction_pending": cyc.instruction_in_progress,
                "instruction_last_refusal": self.instruction_last_refusal or "none"}

    # --- run-time changes ----------------------------------------------------------------------------------

    def apply(self, changes: dict) -> None:
        """Apply validated run-time setting changes (the settings object is already updated)."""
        s = self.settings
        if {"period_ms", "safety_margin_ms", "ema_alpha", "tail_k"} & set(changes):
            self.admission.configure(period_ms=s.period_ms, safety_margin_ms=s.safety_margin_ms,
                                     ema_alpha=s.ema_alpha, tail_k=s.tail_k)
        # period_ms only when it changed: configure() restarts the tick grid on a new period
        self.cycle.configure(period_ms=s.period_ms if "period_ms" in changes else None,
                             safety_margin_ms=s.safety_margin_ms, max_frame_age_ms=s.max_frame_age_ms,
                             fallback=s.fallback, probe_after=probe_after_cycles(s.reprobe_after_s, s.period_ms),
                             hold_timeout_s=s.hold_timeout_s, instruction_min_cycles=s.instruction_min_interval_cycles,
                             max_state_age_ms=s.max_state_age_ms)
        if {"period_ms", "safety_margin_ms"} & set(changes):
            self.deadline_warning = self._deadline_warning()
        if {"velocity_limits", "acceleration_limits", "period_ms", "base_command_timeout_s"} & set(changes):
            self.limiter.configure(s.velocity_limits, s.acceleration_limits, max_step_s=s.period_ms / 1000.0,
                                   base_timeout_s=s.base_command_timeout_s)
        if {"chunk_execute", "chunk_blend", "chunk_blend_weight"} & set(changes):  # checked: check_plan_change
            self.cycle.plan.configure(s.chunk_execute, s.chunk_blend, s.chunk_blend_weight)
        if "instruction" in changes:  # checked by the caller before it accepted the value (check_instruction)
            try:
                self.set_instruction(s.instruction, "parameter")
            except InstructionError:
                pass  # counted and kept in instruction_last_refusal

    def check_plan_change(self, changes: dict) -> str | None:
        """Why a run-time change of the plan's settings is impossible for this model (chunk_execute > K), or None."""
        s, plan = self.settings, self.cycle.plan
        v = {k: changes.get(k, getattr(s, k)) for k in ("chunk_execute", "chunk_blend", "chunk_blend_weight")}
        problems = check_plan_settings(v["chunk_execute"], v["chunk_blend"], v["chunk_blend_weight"], plan.chunk)
        return "; ".join(problems) or None

    def plan_values(self) -> dict:
        """The plan's settings and counters (/diagnostics, the bench report)."""
        plan = self.cycle.plan
        return {"action_chunk": plan.chunk, "chunk_execute": plan.execute, "chunk_blend": plan.blend,
                "chunk_blend_weight": plan.weight, **plan.stats()}

    def check_instruction(self, text, budget_s: float | None = None) -> str | None:
        """Why `text` would be refused as the instruction (nothing changes), or None; `budget_s`: the render's."""
        try:
            self.engine.prompts.build(text, budget_s=budget_s)
        except InstructionError as e:
            return str(e) if e.lasting else TransientRefusal(str(e))
        return None

    def _deadline_warning(self) -> str | None:
        s = self.settings
        return deadline_warning(self.admission.estimate_ms(), s.period_ms, s.safety_margin_ms, s.kv_capacity_tokens,
                                self.engine.backend_name)

    # --- reporting ---------------------------------------------------------------------------------------

    def engine_stats(self) -> dict:
        try:
            return dict(self.engine.stats())
        except Exception:  # noqa: BLE001 - stats are best effort (they race with the worker)
            return {}

    def record(self) -> LoopRecord:
        """The loop's reported values now (diagnostics.LoopRecord): /diagnostics, the roll-up, the bench report."""
        es = self.engine_stats()
        peaks = [int(x) for x in (self.vram.peak_bytes, es.get("peak_vram_bytes")) if x is not None]
        return loop_record(self.cycle, self.limiter, self.admission, es, self.settings, self.backend_name,
                           max(peaks) if peaks else None, self.deadline_warning,
                           self.instruction_values() if getattr(self.engine, "prompts", None) is not None else None,
                           self.plan_values(), self.state_values())

    @property
    def state(self) -> StateBuffer | None:
        """The robot state's buffer (a model with a state input), which the node's ~/joint_states feeds; else None."""
        return self.cycle.state

    def state_values(self) -> dict | None:
        """The robot state's counts, age and last refusal, and the stale ticks (None: the model takes no state)."""
        buf = self.cycle.state
        if buf is None:
            return None
        return {**buf.values(self.cycle.clock()), "state_joints": ",".join(buf.mapper.joints),
                "state_fields": ",".join(buf.mapper.fields), "max_state_age_ms": self.cycle.max_state_age_ms}

    def state_warning(self) -> str | None:
        """Why the robot state cannot drive now (none yet, older than max_state_age_ms), else None."""
        buf = self.cycle.state
        if buf is None:
            return None
        sample, limit = buf.latest(), self.cycle.max_state_age_ms
        why = f"; last refused: {buf.last_refusal}" if buf.last_refusal else ""
        if sample is None:
            return f"no robot state yet (the model needs {buf.dim} values on ~/joint_states){why}"
        age = sample.age_ms(self.cycle.clock())
        return f"robot state stale: {age:.0f} ms old > max_state_age_ms {limit:g}{why}" if age > limit else None

    def retained_frame_ids(self) -> list[int]:
        """The frame ids the KV cache holds now, oldest first (the bench's history coverage)."""
        return list(self.engine.cache.retained())

    def instruction_log(self) -> list[dict]:
        """One record per instruction change (ReasoningCycle.instruction_log)."""
        return list(self.cycle.instruction_log)

    def vram_memory(self) -> dict:
        """Whole-device used memory: the first and the last sample, and one a second (seconds, bytes)."""
        v = self.vram
        return {"first_bytes": v.first_bytes, "last_bytes": v.last_bytes, "timeline": list(v.timeline)}

    # --- the end ---------------------------------------------------------------------------------------

    def finish(self, timeout: float = 30.0) -> CycleOutcome | None:
        """After the last step of a run that reads the cache afterwards (the bench): stop the VRAM sampler and let a
        late chunk land (harvested: returns its bookkeeping outcome, None when none ran)."""
        self.vram.stop()
        return self.cycle.drain(timeout=timeout)

    def close(self) -> None:
        """Let a late chunk land (bounded), close the engine, give its memory back."""
        self.vram.stop()
        self.cycle.drain(timeout=1.0)
        try:
            self.engine.close()
        except Exception:  # noqa: BLE001 - best effort at shutdown
            pass
        backend = self.engine.backend_name
        self.engine = self.cycle = self.admission = None
        release_after_run()
        if backend == "cuda":  # hand the freed blocks back to the device, not only to CuPy's pool
            try:
                import cupy

                cupy.get_default_memory_pool().free_all_blocks()
                cupy.get_default_pinned_memory_pool().free_all_blocks()
            except Exception:  # noqa: BLE001 - best effort
                pass


def resolve_model(model_path: str | None, settings) -> Checkpoint:
    """The model a runtime loads, opened (a Checkpoint), after every start-up check of `settings`
    (settings.validate_reasoning; ParamError, one line): `model_path`, else the settings' own, else (make_tiny_model)
    the generated tiny model; then the KV capacity against that model's prompt (settings.check_capacity), before any
    allocation."""
    from .cache import generated_model
    from .engine import prompt_length
    from .settings import validate_reasoning

    values = settings.as_dict()
    if model_path:
        values["model_path"] = model_path
    values = validate_reasoning(values)
    path = values["model_path"] or generated_model("tiny", 0)  # validate_reasoning: empty only with make_tiny_model
    checkpoint = Checkpoint(path)
    chunk, state_tokens = model_action_chunk(checkpoint), model_state_tokens(checkpoint)
    validate_reasoning(dict(values, model_path=path), prompt_tokens=prompt_length(checkpoint),
                       action_tokens=ACTION_TOKENS * chunk, state_tokens=state_tokens)
    problems = check_plan_settings(values["chunk_execute"], values["chunk_blend"], values["chunk_blend_weight"], chunk)
    if problems:
        from .settings import ParamError

        raise ParamError("; ".join(problems))
    return checkpoint


def model_action_chunk(model) -> int:
    """The actions a chunk of `model` (a Checkpoint or a model path) plans (its vla_action_chunk; 1 when its config
    cannot be read: loading reports that)."""
    try:
        return int(getattr(Checkpoint.of(model).config, "action_chunk", 1))
    except Exception:  # noqa: BLE001 - an unreadable model: the engine reports it with details
        return 1


def model_state_tokens(model) -> int:
    """The state token of `model` (a Checkpoint or a model path: 1 with a state input, else 0; 0 when its config
    cannot be read)."""
    try:
        return int(getattr(Checkpoint.of(model).config, "state_tokens", 0))
    except Exception:  # noqa: BLE001 - an unreadable model: the engine reports it with details
        return 0


def state_buffer(engine, s, warn=print) -> StateBuffer | None:
    """The StateBuffer of an engine whose model takes the robot's state (None: it takes none; a state_joints setting
    is then warned about). Raises ParamError when its joints cannot be known (robot_state.model_mapper)."""
    from .settings import ParamError

    cfg, dim = getattr(engine, "cfg", None), int(getattr(engine, "state_dim", 0) or 0)
    try:
        mapper = model_mapper(dim, getattr(cfg, "state_joints", ()), getattr(cfg, "state_fields", ()),
                              getattr(s, "state_joints", ()))
    except ValueError as e:
        raise ParamError(str(e)) from None
    if mapper is None:
        if any(getattr(s, "state_joints", ())):
            warn("state_joints is set but the model takes no robot state (no vla_state_dim): nothing is subscribed")
        return None
    return StateBuffer(mapper)


def engine_action_chunk(engine) -> int:
    """The actions one chunk of `engine` plans (1: the engine predates action chunks or the model plans one)."""
    return int(getattr(engine, "action_chunk", 1) or 1)


def _make_engine(factory, checkpoint: Checkpoint, s, weights):
    kwargs = dict(backend=s.backend, kv_capacity_tokens=s.kv_capacity_tokens, policy=s.policy,
                  window_frames=s.window_frames, action_low=s.action_low, action_high=s.action_high,
                  vram_ceiling_gb=s.vram_ceiling_gb, instruction=s.instruction,
                  instruction_template=s.instruction_template, max_instruction_tokens=s.max_instruction_tokens)
    if weights is not None:
        kwargs["weights"] = weights
    try:
        if factory is None:
            from .engine import Engine as factory
        return factory(checkpoint, **kwargs)
    except Exception as e:  # noqa: BLE001 - model load, plan over the VRAM ceiling, no GPU for cuda...
        raise StartupError(engine_error_message(e, checkpoint, s.backend, s.kv_capacity_tokens,
                                                s.vram_ceiling_gb)) from e


def _install_fault(engine, path: str) -> None:
    def fault(plan):
        if os.path.exists(path):
            raise RuntimeError(f"injected fault ({TEST_FAULT_ENV})")

    engine.fault_hook = fault
