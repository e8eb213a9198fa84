"""ReasoningNode: the deadline-bound reasoning cycle (DESIGN.md §4) and its ROS outputs (§8), as a managed
(lifecycle) node.

The cycle itself is ``vla_edge_ros.cycle.ReasoningCycle`` (ROS-free, shared with vla-edge-bench);
this node owns the steady-clock timer (own executor thread) and translates each CycleOutcome into
messages:

* ``~/action`` (TwistStamped): the action first, before any bookkeeping; stamp = capture stamp of
  the source frame, for a fallback the latest frame's stamp, "now" before the first frame;
* ``~/action_vector`` (Float32MultiArray, labels in layout.dim), ``~/cycle`` (DiagnosticStatus:
  source, reason, frame seq/age, latency breakdown, tokens; OK model / WARN fallback / ERROR
  overrun, engine_error, non_finite), ``/diagnostics`` (1 Hz roll-up), ``~/debug_image`` (only when subscribed).

Lifecycle (rclpy.lifecycle; ``ros2 lifecycle set /vla_edge <transition>``):

* configure: resolve and check the model (capacity against its prompt), build the engine (VRAM plan),
  warm up, seed the admission EMAs. The heavy part runs on a helper thread at normal scheduling; a
  shutdown request (``abort``) ends the transition within ~50 ms, between warm-up chunks at the latest.
* activate: the control timer starts, the camera subscribes, ``~/action`` and ``~/action_vector``
  (lifecycle publishers) publish.
* deactivate: one zero action (reason ``inactive``) is published, then the timer stops and the motion
  topics are disabled; the engine stays warm.
* cleanup / shutdown: the engine is closed and dropped (GPU memory returned to the device).

``autostart`` (default true): the bringup configures and activates the node itself, as one command.
``~/cycle``, ``/diagnostics`` (with ``lifecycle_state``) and ``~/debug_image`` are plain publishers.

Reasons: fresh, repeat (model); no_frame, stale_frame, repeat (no model action yet), refused, busy,
overrun, engine_error, non_finite, inactive (fallback).  No exception leaves the timer callback.

Run-time parameters: period_ms, safety_margin_ms, ema_alpha, tail_k, reprobe_after_s,
max_frame_age_ms, fallback, twist_map, twist_scale, action_frame_id and debug_image_max_hz may be set
while the node runs (``~/set_parameters``); an impossible value is refused with a reason and changes
nothing (params.py ``check_update``). The others are read-only.

Test-only fault injection: when the environment variable ``VLA_EDGE_TEST_FAULT_FILE`` names a path,
every chunk raises ``RuntimeError("injected fault (VLA_EDGE_TEST_FAULT_FILE)")`` inside the engine
(after its cache plan, before the backend runs) while that file exists; the node logs a warning at
configure. Never set it on a robot: it exists so that tests can make a real engine fail mid-chunk.

Re-probing: EMAs that only ever refuse never learn that the engine got faster again (CPU contention
gone, a one-off outlier).  After ``reprobe_after_s`` of refusals in a row one chunk runs in the
background (ReasoningCycle ``probe_after``): its cycle publishes the ``refused`` fallback at once,
nothing waits for the probe, its action is never used, and later ticks say ``busy`` until it ends.
"""

from __future__ import annotations

import os
import threading
import time
import traceback

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from geometry_msgs.msg import TwistStamped
from rclpy.clock import Clock, ClockType
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy, qos_profile_sensor_data
from sensor_msgs.msg import Image
from std_msgs.msg import Float32MultiArray, MultiArrayDimension

from ..admission import AdmissionController
from ..cache import generated_model
from ..constants import ACTION_TOKENS, VISION_TOKENS
from ..cycle import (ReasoningCycle, WarmupInterrupted, deadline_warning, probe_after_cycles, release_after_run,
                     settle_after_warmup,
                     warm_up)
from ..frame_buffer import FrameBuffer
from ..metrics import GcPauses, VramSampler
from ..realtime import normal_scheduling
from ..image_convert import DROP_KINDS
from .debug_image import render_debug
from .params import REASONING_SPECS, ParamError, declare_and_read, enable_runtime_updates, validate_reasoning

OK, WARN, ERROR = DiagnosticStatus.OK, DiagnosticStatus.WARN, DiagnosticStatus.ERROR
# fallback reasons whose cycle status is ERROR (the rest are WARN)
ERROR_REASONS = ("overrun", "engine_error", "internal_error", "non_finite")
TEST_FAULT_ENV = "VLA_EDGE_TEST_FAULT_FILE"  # test-only fault injection, see the module docstring
FALLBACK_REASONS = ("no_frame", "stale_frame", "repeat", "refused", "busy", "cold", "overrun", "engine_error",
                    "internal_error", "non_finite", "inactive")
SUCCESS, FAILURE = TransitionCallbackReturn.SUCCESS, TransitionCallbackReturn.FAILURE


class StartupError(RuntimeError):
    """The node cannot start (model, engine, plan): one clear message."""


class ConfigureInterrupted(RuntimeError):
    """A shutdown request ended the configure transition."""


def engine_error_message(e: BaseException, model_path: str, backend: str, capacity: int, ceiling_gb: float) -> str:
    """The one start-up message for an engine that cannot start. A device out-of-memory error gets the
    VRAM plan of the model and the ceiling appended, so the reader sees what was asked for."""
    msg = f"cannot start the engine ({model_path}, backend {backend}): {type(e).__name__}: {e}"
    if "outofmemory" in type(e).__name__.lower() or "out of memory" in str(e).lower():
        from ..vram_plan import GIB, format_plan, plan_for_model_dir

        plan = plan_for_model_dir(model_path, capacity)
        if plan is not None:
            msg += (f"; VRAM plan at kv_capacity_tokens={capacity}: {format_plan(plan)} against the ceiling "
                    f"vram_ceiling_gb={ceiling_gb:g} ({ceiling_gb * GIB / 2**20:.0f} MiB): the device has less "
                    f"free memory than the plan; free the GPU or lower kv_capacity_tokens / vram_ceiling_gb")
    return msg


class ReasoningNode(LifecycleNode):
    def __init__(self, frame_buffer: FrameBuffer, camera=None, node_name: str = "vla_edge",
                 engine_factory=None, validate_only: bool = False, **kwargs):
        super().__init__(node_name, **kwargs)
        self.fb = frame_buffer
        self.camera = camera
        self._engine_factory = engine_factory
        self._raw = raw = declare_and_read(self, REASONING_SPECS)
        self.p = p = validate_reasoning(raw)
        self.engine = self.cycle = self.admission = self.stats = self.vram = None
        self.timer = self.diag_timer = None
        self.lifecycle_state = "unconfigured"
        if validate_only:  # bringup collects every node's parameter problems before giving up
            return
        self.abort = threading.Event()  # set on SIGINT/SIGTERM: a configure in progress gives up
        self.startup_error: Exception | None = None  # why the last configure failed
        self.backend_name = p["backend"]
        self.model_path = p["model_path"]
        self.period_s = p["period_ms"] / 1000.0
        self._cycle_index = 0
        self._thumbs: dict[int, np.ndarray] = {}
        self._last_debug = 0.0
        self._frame_age_last: float | None = None
        self._prev_counts: dict[str, int] = {}
        self._prev_too_large = 0
        self.gc_pauses = GcPauses().install()  # every collection's pause, in /diagnostics
        self._admission_warning: str | None = None
        self._labels = [str(x) for x in p["action_labels"]]  # read-only: the vector layout is built once
        self._vector_dims = [MultiArrayDimension(label=lab, size=1, stride=1) for lab in self._labels]
        self._twist_map = [int(i) for i in p["twist_map"]]
        self._twist_scale = [float(s) for s in p["twist_scale"]]

        # --- interface: the motion topics are lifecycle publishers (silent unless active) ---
        reliable = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=10, reliability=ReliabilityPolicy.RELIABLE)
        self.pub_action = self.create_lifecycle_publisher(TwistStamped, "~/action", reliable)
        self.pub_vector = self.create_lifecycle_publisher(Float32MultiArray, "~/action_vector", reliable)
        self.pub_cycle = self.create_publisher(DiagnosticStatus, "~/cycle",
                                               QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE))
        self.pub_diag = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.pub_debug = self.create_publisher(Image, "~/debug_image", qos_profile_sensor_data)
        self.diag_timer = self.create_timer(p["diagnostics_period_s"], self._on_diagnostics,
                                            clock=Clock(clock_type=ClockType.STEADY_TIME))
        enable_runtime_updates(self, REASONING_SPECS, self.p, self._apply_params)
        self._guard_change_state_service()

    # --- lifecycle ---------------------------------------------------------------------------------------

    def autostart(self) -> bool:
        """configure + activate when the ``autostart`` parameter is true (the one-command start). False when
        a transition failed: ``startup_error`` says why (None after an interruption)."""
        if not self.p["autostart"]:
            self.get_logger().info("autostart is false: waiting in 'unconfigured' for lifecycle transitions "
                                   "(ros2 lifecycle set /vla_edge configure, then activate)")
            return True
        if self.trigger_configure() != SUCCESS:
            return False
        if self.trigger_activate() != SUCCESS:
            self.startup_error = self.startup_error or StartupError("activate failed (see the log)")
            return False
        return True

    def _guard_change_state_service(self) -> None:
        """rclpy's ~/change_state handler raises on a transition the current state does not have (e.g. activate
        while unconfigured), and the exception would end the executor's spin: answer success=false instead."""
        svc = getattr(self, "_service_change_state", None)
        if svc is None:
            return
        inner = svc.callback

        def guarded(req, resp):
            try:
                return inner(req, resp)
            except Exception as e:  # noqa: BLE001 - rclpy's RCLError: not a transition of this state
                self.get_logger().warn(f"lifecycle transition {req.transition.id} '{req.transition.label}' refused "
                                       f"in state '{self.lifecycle_state}': {e}")
                resp.success = False
                return resp

        svc.callback = guarded

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.startup_error = None
        t_start = time.monotonic()
        try:
            model_path, engine, admission, timings = self._in_helper_thread(self._build)
        except ConfigureInterrupted:
            self.get_logger().warn("configure interrupted by a shutdown request")
            return FAILURE
        except (ParamError, StartupError) as e:
            self.startup_error = e
        except Exception as e:  # noqa: BLE001 - anything else is a start-up error too, in one line
            self.startup_error = StartupError(f"configure failed: {type(e).__name__}: {e}")
        if self.startup_error is not None:
            self.get_logger().error(f"configure failed: {self.startup_error}")
            return FAILURE
        self.model_path, self.engine, self.admission = model_path, engine, admission
        self.backend_name = self._backend_name(engine)
        self.vram = VramSampler(interval_s=0.5)  # whole-device peak when a GPU is present, else idle
        self.vram.start()
        p = self.p
        self.cycle = ReasoningCycle(
            engine, self.fb, admission, period_ms=p["period_ms"], safety_margin_ms=p["safety_margin_ms"],
            max_frame_age_ms=p["max_frame_age_ms"], fallback=p["fallback"], probe_after=self._probe_after(),
        )
        self.stats = self.cycle.stats
        self._prev_counts = {}
        self._touch_output_paths()
        self.lifecycle_state = "inactive"
        self.get_logger().info(
            f"configured in {time.monotonic() - t_start:.1f} s: backend {self.backend_name}, model {model_path} "
            f"({getattr(engine, 'weight_format', '?')} weights, {getattr(engine, 'action_decoding', '?')} action "
            f"decoding), "
            f"period {p['period_ms']} ms, margin {p['safety_margin_ms']} ms, policy {p['policy']}, "
            f"capacity {p['kv_capacity_tokens']} tokens, fallback {p['fallback']}; "
            f"chunk estimate {admission.estimate_ms():.2f} ms ({len(timings)} warm-up chunks)"
        )
        self._check_deadline()
        return SUCCESS

    def _touch_output_paths(self) -> None:
        """Run once, at configure, the code the first cycles would otherwise run for the first time (percentiles
        of the statistics, the debug-image drawing), so no one-time cost lands in an early cycle."""
        self.stats.summary()
        render_debug(np.zeros((8, 16, 3), np.uint8), [], np.zeros(ACTION_TOKENS, np.float32), self.p["action_low"],
                     self.p["action_high"], "warm", self._labels)

    def _check_deadline(self) -> None:
        """WARN (log and /diagnostics) when the warmed-up estimate can never fit the budget."""
        p = self.p
        self._admission_warning = deadline_warning(self.admission.estimate_ms(), p["period_ms"], p["safety_margin_ms"],
                                                   p["kv_capacity_tokens"], self.backend_name)
        if self._admission_warning:
            self.get_logger().warn(self._admission_warning)

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        ret = super().on_activate(state)  # enables the lifecycle publishers before the first tick
        self.cycle.reset_schedule()  # the time spent inactive is neither missed ticks nor an action gap
        self.period_s = self.p["period_ms"] / 1000.0
        try:
            self.timer = self.create_timer(self.period_s, self._on_tick,
                                           clock=Clock(clock_type=ClockType.STEADY_TIME))
            if self.camera is not None:
                self.camera.start()
        except Exception as e:  # noqa: BLE001 - rclpy would swallow it silently; say why, then on_error releases
            self.startup_error = StartupError(f"activate failed: {type(e).__name__}: {e}")
            self.get_logger().error(str(self.startup_error))
            return TransitionCallbackReturn.ERROR
        self.lifecycle_state = "active"
        self.get_logger().info("active: control timer running, camera subscribed, publishing actions")
        return ret

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._stop_motion()
        self.lifecycle_state = "inactive"
        self.get_logger().info("inactive: one zero action published, motion output stopped; the engine stays warm")
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._release()
        self.lifecycle_state = "unconfigured"
        self.get_logger().info("cleaned up: engine closed and released")
        return SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        if self.timer is not None:
            self._stop_motion()
        self._release()
        self.lifecycle_state = "finalized"
        return SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._release()
        self.lifecycle_state = "unconfigured"
        return SUCCESS

    def _stop_motion(self) -> None:
        """Stop the control timer and publish one zero action while the motion topics are still enabled."""
        self._destroy_timer("timer")
        if self.cycle is not None:
            latest = self.fb.latest()
            self._publish(self.cycle.stop_outcome(latest.stamp_ns if latest is not None else None))

    def _destroy_timer(self, name: str) -> None:
        t = getattr(self, name, None)
        if t is not None:
            t.cancel()
            self.destroy_timer(t)
            setattr(self, name, None)

    def _release(self) -> None:
        """Close the engine and drop every reference to it (cleanup, shutdown, error)."""
        self._destroy_timer("timer")
        if self.vram is not None:
            self.vram.stop()
        if self.cycle is not None:
            self.cycle.drain(timeout=1.0)  # a late chunk still running: let it land (bounded)
        self.engine_shutdown()
        self.engine = self.cycle = self.admission = None
        self._thumbs.clear()
        release_after_run()
        if self.backend_name == "cuda":  # hand the freed blocks back to the device, not only to CuPy's pool
            try:
                import cupy

                cupy.get_default_memory_pool().free_all_blocks()
                cupy.get_default_pinned_memory_pool().free_all_blocks()
            except Exception:  # noqa: BLE001 - best effort
                pass

    def _in_helper_thread(self, fn):
        """Run fn() on a helper thread at normal scheduling and wait for it, giving up (ConfigureInterrupted)
        within ~50 ms of ``abort``; an abandoned helper stops at its next warm-up chunk."""
        box: dict = {}

        def run():
            normal_scheduling()
            try:
                box["value"] = fn()
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                box["error"] = e

        t = threading.Thread(target=run, name="vla-configure", daemon=True)
        t.start()
        while t.is_alive():
            t.join(0.05)
            if self.abort.is_set():
                raise ConfigureInterrupted("shutdown requested")
        if "error" in box:
            if isinstance(box["error"], WarmupInterrupted):
                raise ConfigureInterrupted(str(box["error"]))
            raise box["error"]
        return box["value"]

    def _build(self):
        """The heavy part of configure (helper thread): model, capacity check, engine, warm-up."""
        p = self.p
        model_path = p["model_path"]
        if not model_path:  # validate_reasoning guarantees make_tiny_model here
            model_path = generated_model("tiny", 0)
            self.get_logger().info(f"make_tiny_model: using the generated tiny model in {model_path}")
        # capacity check before any allocation: it needs the prompt length, which the model dir fixes
        validate_reasoning(dict(self._raw, model_path=model_path), prompt_tokens=self._prompt_tokens(model_path))
        engine = self._make_engine(self._engine_factory, model_path)
        try:
            self._install_test_fault(engine)
            if p["realtime_priority"] > 0 and hasattr(engine, "set_worker_priority"):
                # one level below the executor thread: never preempted by other processes while it holds the GIL
                refused = engine.set_worker_priority(max(1, p["realtime_priority"] - 1))
                if refused:
                    self.get_logger().warn(f"engine worker: {refused}")
            # a parallel-decoding model's chunk is one 40-token prefill and no decode phase
            prefill_tokens, decode_tokens = getattr(engine, "phase_tokens", (VISION_TOKENS, ACTION_TOKENS))
            admission = AdmissionController(
                period_ms=p["period_ms"], safety_margin_ms=p["safety_margin_ms"], ema_alpha=p["ema_alpha"],
                prefill_tokens=prefill_tokens, decode_tokens=decode_tokens, tail_k=p["tail_k"],
            )
            try:
                timings = warm_up(engine, p["warmup_chunks"], should_stop=self.abort.is_set)
            except WarmupInterrupted:
                raise
            except Exception as e:  # noqa: BLE001
                raise StartupError(f"engine warm-up failed: {type(e).__name__}: {e}") from e
            # the first chunk carries compile/first-touch costs: seed from the steady-state ones
            for t in timings[1:] if len(timings) > 1 else timings:
                admission.update(t)
            settle_after_warmup()
        except BaseException:
            _close(engine)
            raise
        return model_path, engine, admission, timings

    # --- run-time parameters --------------------------------------------------------------------------

    def _probe_after(self) -> int:
        p = self.p
        return probe_after_cycles(p["reprobe_after_s"], p["period_ms"])

    def _apply_params(self, changes: dict) -> None:
        """Apply validated run-time changes (params.enable_runtime_updates); runs on the node's executor
        thread, so it never races a tick. Before configure only the stored values change."""
        p = self.p
        self._twist_map = [int(i) for i in p["twist_map"]]
        self._twist_scale = [float(x) for x in p["twist_scale"]]
        if self.cycle is None:
            return
        if {"period_ms", "safety_margin_ms", "ema_alpha", "tail_k"} & set(changes):
            self.admission.configure(period_ms=p["period_ms"], safety_margin_ms=p["safety_margin_ms"],
                                     ema_alpha=p["ema_alpha"], tail_k=p["tail_k"])
        # period_ms only when it changed: configure() restarts the tick grid on a new period
        self.cycle.configure(period_ms=p["period_ms"] if "period_ms" in changes else None,
                             safety_margin_ms=p["safety_margin_ms"],
                             max_frame_age_ms=p["max_frame_age_ms"], fallback=p["fallback"],
                             probe_after=self._probe_after())
        if {"period_ms", "safety_margin_ms"} & set(changes):
            self._check_deadline()
        if "period_ms" in changes and self.timer is not None and p["period_ms"] / 1000.0 != self.period_s:
            self.period_s = p["period_ms"] / 1000.0
            self.destroy_timer(self.timer)
            self.timer = self.create_timer(self.period_s, self._on_tick,
                                           clock=Clock(clock_type=ClockType.STEADY_TIME))

    # --- start-up ------------------------------------------------------------------------------------

    def _install_test_fault(self, engine) -> None:
        path = os.environ.get(TEST_FAULT_ENV)
        if not path or not hasattr(engine, "fault_hook"):
            return

        def fault(plan):
            if os.path.exists(path):
                raise RuntimeError(f"injected fault ({TEST_FAULT_ENV})")

        engine.fault_hook = fault
        self.get_logger().warn(f"TEST-ONLY fault injection enabled: chunks fail while {path} exists "
                               f"({TEST_FAULT_ENV}); never set this on a robot")

    def _make_engine(self, factory, model_path: str):
        p = self.p
        kwargs = dict(backend=p["backend"], kv_capacity_tokens=p["kv_capacity_tokens"], policy=p["policy"],
                      window_frames=p["window_frames"], action_low=p["action_low"], action_high=p["action_high"],
                      vram_ceiling_gb=p["vram_ceiling_gb"])
        try:
            if factory is None:
                from ..engine import Engine as factory
            return factory(model_path, **kwargs)
        except ParamError:
            raise
        except Exception as e:  # noqa: BLE001 - model load, plan over the VRAM ceiling, no GPU for cuda...
            raise StartupError(engine_error_message(e, model_path, p["backend"], p["kv_capacity_tokens"],
                                                    p["vram_ceiling_gb"])) from e

    def _backend_name(self, engine) -> str:
        return str(getattr(engine, "backend_name", None) or getattr(
            getattr(engine, "backend", None), "name", None) or self.p["backend"])

    def _prompt_tokens(self, model_path: str) -> int:
        try:
            from ..engine import system_prompt_ids
            from ..model.config import ModelConfig

            return int(len(system_prompt_ids(model_path, ModelConfig.from_dir(model_path).vocab_size)))
        except Exception:  # noqa: BLE001 - unreadable model: the engine reports it with details
            return 0

    def engine_shutdown(self) -> None:
        _close(self.engine)

    def stop_timers(self) -> None:
        """No new ticks (bringup calls this before it stops the executors)."""
        for t in (self.timer, self.diag_timer):
            if t is not None:
                t.cancel()

    def stop(self) -> None:
        """The shutdown transition from whatever state (bringup: after the executors stopped): one zero action
        if active, then the engine is released. Safe to call twice."""
        if self.lifecycle_state in ("unconfigured", "inactive", "active"):
            try:
                self.trigger_shutdown()
            except Exception:  # noqa: BLE001 - a transition in progress elsewhere: release directly
                self._release()
        self.stop_timers()
        if getattr(self, "gc_pauses", None) is not None:
            self.gc_pauses.remove()
        self.lifecycle_state = "finalized"

    # --- the cycle -----------------------------------------------------------------------------------

    def _scheduled_tick(self, t0: float) -> float | None:
        """When this timer callback was due: rcl moves the timer's next call time forward on its grid before
        the callback runs (by whole periods after a stall), so the due time is next call - period."""
        timer = self.timer
        until_ns = timer.time_until_next_call() if timer is not None else None
        if until_ns is None:
            return None
        return t0 + until_ns * 1e-9 - timer.timer_period_ns * 1e-9

    def _on_tick(self) -> None:
        t0 = time.monotonic()
        self._cycle_index += 1
        try:
            out = self.cycle.tick(t0, self._scheduled_tick(t0))
        except Exception as e:  # noqa: BLE001 - never let an exception kill the timer
            self.get_logger().error(f"cycle failed: {type(e).__name__}: {e}\n{traceback.format_exc()}",
                                    throttle_duration_sec=5.0)
            try:
                self._publish_internal_error(t0, e)
            except Exception:  # noqa: BLE001
                pass
            return
        try:
            self._publish(out)
        except Exception as e:  # noqa: BLE001
            self.get_logger().error(f"publishing failed: {type(e).__name__}: {e}\n{traceback.format_exc()}",
                                    throttle_duration_sec=5.0)

    def _publish_internal_error(self, t0: float, e: Exception) -> None:
        """Last resort when the cycle itself failed: a zero action, ERROR status."""
        from ..cycle import CycleOutcome

        latest = self.fb.latest()
        out = CycleOutcome("fallback", "internal_error", np.zeros(ACTION_TOKENS, np.float32),
                           latest.stamp_ns if latest is not None else None, -1, None, 0.0, t0, t0 + self.period_s,
                           error=f"{type(e).__name__}: {e}")
        self._publish(out)

    # --- publishing ----------------------------------------------------------------------------------

    def _twist(self, c: list[float], stamp_ns: int | None) -> TwistStamped:
        tw = TwistStamped()
        if stamp_ns is None:  # no frame yet: stamp with "now"
            tw.header.stamp = self.get_clock().now().to_msg()
        else:
            tw.header.stamp.sec, tw.header.stamp.nanosec = divmod(int(stamp_ns), 1_000_000_000)
        tw.header.frame_id = self.p["action_frame_id"]
        tw.twist.linear.x, tw.twist.linear.y, tw.twist.linear.z = c[0], c[1], c[2]
        tw.twist.angular.x, tw.twist.angular.y, tw.twist.angular.z = c[3], c[4], c[5]
        return tw

    def _publish(self, out) -> None:
        # the last guard: a non-finite action or twist becomes the non_finite fallback (zeros), ERROR status
        comps = self.cycle.finalize(out, self._twist_map, self._twist_scale)
        action = np.asarray(out.action, np.float32)
        tw = self._twist(comps, out.stamp_ns)
        self.pub_action.publish(tw)  # the control output first: everything else is bookkeeping
        t_pub = time.monotonic()
        late = self.cycle.record_published(out, t_pub)

        vec = Float32MultiArray()
        vec.layout.dim = self._vector_dims
        vec.data = [float(x) for x in action]
        self.pub_vector.publish(vec)

        if out.late_error:
            self.get_logger().error(f"late chunk failed: {out.late_error}", throttle_duration_sec=5.0)
        if out.error:
            self.get_logger().error(f"{out.reason}: {out.error}", throttle_duration_sec=5.0)

        level = OK if out.source == "model" else (ERROR if out.reason in ERROR_REASONS else WARN)
        cycle_ms = (t_pub - out.t0) * 1000.0
        vals = {
            "source": out.source, "reason": out.reason, "cycle": self._cycle_index, "cycle_ms": cycle_ms,
            "since_scheduled_tick_ms": (t_pub - (out.scheduled if out.scheduled is not None else out.t0)) * 1000.0,
            "jitter_ms": out.jitter_ms, "missed_before": out.missed_before,
            "tick_monotonic": f"{out.t0:.6f}", "late": late,
            "stamp_ns": int(tw.header.stamp.sec) * 1_000_000_000 + int(tw.header.stamp.nanosec),
            "frame_seq": out.frame_seq,
            "frame_age_ms": out.frame_age_ms if out.frame_age_ms is not None else float("nan"),
            "remaining_ms": out.remaining_ms if out.remaining_ms is not None else float("nan"),
            "estimate_ms": out.estimate_ms if out.estimate_ms is not None else float("nan"),
            "probe": out.probe,
        }
        t = out.timings
        vals.update(vision_ms=t.vision_ms if t else float("nan"), prefill_ms=t.prefill_ms if t else float("nan"),
                    decode_ms=t.decode_ms if t else float("nan"), chunk_ms=t.total_ms if t else float("nan"))
        res = out.chunk
        if res is not None:
            vals.update(tokens=",".join(str(int(x)) for x in np.asarray(res.tokens).ravel()),
                        cache_tokens=res.cache_tokens, retained_frames=len(res.retained), evicted=len(res.evicted),
                        frame_id=res.frame_id)
        else:
            vals["tokens"] = ""
        if out.source_seq is not None:
            vals["source_seq"] = out.source_seq
        if out.error:
            vals["error"] = out.error
        vals["action"] = ",".join(f"{x:.4f}" for x in action)
        st = DiagnosticStatus(level=level, name=f"{self.get_name()}: cycle", hardware_id=self.backend_name,
                              message=f"{out.source}: {out.reason}")
        st.values = [KeyValue(key=k, value=(f"{v:.3f}" if isinstance(v, float) else str(v))) for k, v in vals.items()]
        self.pub_cycle.publish(st)
        self._frame_age_last = out.frame_age_ms

        if self.pub_debug.get_subscription_count() > 0:  # thumbnails only matter to a debug-image viewer
            if res is not None and out.image is not None:
                self._remember_thumb(res, out.image)
            self._publish_debug(action, out.source, out.reason, out.image)

    # --- debug image ---------------------------------------------------------------------------------

    def _remember_thumb(self, res, image: np.ndarray) -> None:
        self._thumbs[res.frame_id] = image[::2, ::2].copy()
        keep = set(int(i) for i in res.retained)
        for fid in [f for f in self._thumbs if f not in keep]:
            del self._thumbs[fid]

    def _publish_debug(self, action, source, reason, image) -> None:
        now = time.monotonic()
        if now - self._last_debug < 1.0 / self.p["debug_image_max_hz"]:
            return
        self._last_debug = now
        frame = image
        if frame is None:
            latest = self.fb.latest()
            frame = None if latest is None else latest.image
        retained = [self._thumbs[f] for f in sorted(self._thumbs)]
        rgb = render_debug(frame, retained, np.asarray(action), self.p["action_low"], self.p["action_high"],
                           f"{source}:{reason}", self._labels)
        msg = Image()
        msg.header.stamp = self.get_clock().now().to_msg()
        msg.header.frame_id = "vla_edge_debug"
        msg.height, msg.width = rgb.shape[:2]
        msg.encoding, msg.is_bigendian, msg.step = "rgb8", 0, rgb.shape[1] * 3
        msg.data = rgb.tobytes()
        self.pub_debug.publish(msg)

    # --- diagnostics ---------------------------------------------------------------------------------

    def diagnostics_values(self) -> tuple[dict, dict]:
        c = self._camera_values()
        if self.cycle is None:  # unconfigured: no engine, no cycle
            return {"lifecycle_state": self.lifecycle_state, "policy": self.p["policy"], "backend": self.backend_name,
                    "period_ms": self.p["period_ms"]}, c
        s = self.stats.summary()
        r: dict = {
            "lifecycle_state": self.lifecycle_state, "cycles": s["cycles"], "model_actions": s["model_actions"],
            "deadline_miss_rate": s["deadline_miss_rate"], "deadline_misses": s["deadline_misses"],
            "missed_ticks": s["missed_ticks"], "late_publishes": s["late_publishes"],
            "overruns": s["reasons"].get("overrun", 0), "overrun_rate": s["overrun_rate"],
            "fallback_rate": s["fallback_rate"], "late_results_discarded": self.cycle.late_results,
            "probes": self.cycle.probes, "bad_timings": self.cycle.bad_timings,
            "non_finite_blocked": self.cycle.non_finite,
            "wake_slack_ms": self.cycle.wake_slack_s * 1000.0,
            "engine_errors": self.cycle.engine_errors,
        }
        cycles = max(1, s["cycles"])
        for reason in FALLBACK_REASONS:
            n = s["fallbacks"].get(reason, 0)
            r[f"fallback_{reason}"] = n
            r[f"fallback_rate_{reason}"] = n / cycles
        r["repeats"] = s["repeats"]
        for name in ("cycle_ms", "chunk_ms", "timer_jitter_ms", "frame_age_ms", "action_gap_ms"):
            for q in ("p50", "p95", "p99", "max"):
                r[f"{name}_{q}"] = s[name][q]
        for k, v in self.admission.snapshot().items():
            r[f"ema_{k}"] = v
        for k, v in self.admission.decisions().items():
            r[f"admission_{k}"] = v
        es = self._engine_stats()
        cap = int(es.get("capacity", self.p["kv_capacity_tokens"]))
        used = int(es.get("used_tokens", 0))
        r["kv_capacity_tokens"] = cap
        r["cache_tokens"] = used
        r["cache_fill"] = used / cap if cap else 0.0
        r["retained_frames"] = es.get("frames_retained", 0)
        r["frame_capacity"] = es.get("frame_capacity", "n/a")
        r["evictions"] = es.get("evictions_total", 0)
        r["prompt_tokens"] = es.get("prompt_tokens", "n/a")
        r["policy"] = self.p["policy"]
        r["backend"] = self.backend_name
        r["weights"] = es.get("weights", "n/a")  # bf16 or w4 (4-bit): what the model dir holds
        r["action_decoding"] = es.get("action_decoding", "n/a")
        peaks = [self.vram.peak_bytes, es.get("peak_vram_bytes")]
        peaks = [int(x) for x in peaks if x is not None]
        r["vram_peak_mb"] = max(peaks) / 2**20 if peaks else "n/a"
        r["vram_ceiling_gb"] = self.p["vram_ceiling_gb"]
        r["period_ms"] = self.p["period_ms"]
        if self._admission_warning:
            r["admission_warning"] = self._admission_warning
        r.update(self.gc_pauses.summary())
        return r, c

    def _camera_values(self) -> dict:
        c: dict = {"frame_age_ms": self._frame_age_last if self._frame_age_last is not None else "n/a",
                   "frames_published": self.fb.published, "frames_dropped": self.fb.dropped}
        if self.camera is not None:
            cs = self.camera.stats()
            c.update(camera_rate_hz=cs["rate_hz"], frames_received=cs["received"], frames_valid=cs["valid"],
                     frames_invalid=cs["invalid"], transport=cs["transport"], topic=cs["topic"])
            for kind in DROP_KINDS:
                c[f"invalid_{kind}"] = cs["invalid_by_kind"].get(kind, 0)
            c["max_image_bytes"], c["max_image_pixels"] = cs["max_image_bytes"], cs["max_image_pixels"]
            for key in ("process_pid", "process_state", "process_restarts", "process_last_exit"):
                if key in cs:  # the camera in its own process (the bringup): its pid, state and restarts
                    c[f"camera_{key}"] = cs[key]
        else:
            c.update(camera_rate_hz="n/a", frames_invalid="n/a")
        return c

    def _engine_stats(self) -> dict:
        fn = getattr(self.engine, "stats", None)
        try:
            return dict(fn()) if callable(fn) else {}
        except Exception:  # noqa: BLE001 - stats are best effort (they race with the worker)
            return {}

    def _on_diagnostics(self) -> None:
        try:
            r, c = self.diagnostics_values()
        except Exception as e:  # noqa: BLE001
            self.get_logger().error(f"diagnostics failed: {e}", throttle_duration_sec=10.0)
            return
        if "cycles" not in r or self.lifecycle_state != "active":
            self._publish_diagnostics(WARN, f"{self.lifecycle_state}: no control output (lifecycle transitions: "
                                      f"configure, activate)", r, c)
            return
        # level from what happened since the last roll-up
        counts = {"cycles": r["cycles"], "overruns": r["overruns"], "engine_errors": r["engine_errors"],
                  "non_finite": r["non_finite_blocked"], "misses": r["deadline_misses"], "missed": r["missed_ticks"],
                  "fallbacks": sum(r[f"fallback_{x}"] for x in FALLBACK_REASONS)}
        d = {k: v - self._prev_counts.get(k, 0) for k, v in counts.items()}
        self._prev_counts = counts
        if d["overruns"] or d["engine_errors"] or d["non_finite"] or d["misses"]:
            lvl, msg = ERROR, (f"{d['misses']} deadline misses ({d['missed']} ticks never ran), {d['overruns']} "
                               f"overruns, {d['engine_errors']} engine errors, {d['non_finite']} non-finite actions "
                               f"blocked in the last period; longest gap between actions "
                               f"{r['action_gap_ms_max'] or 0.0:.0f} ms")
        elif d["fallbacks"]:
            lvl, msg = WARN, f"{d['fallbacks']} fallbacks of {d['cycles']} cycles in the last period"
        elif d["cycles"] == 0:
            lvl, msg = ERROR, "no cycles"
        else:
            lvl, msg = OK, f"{d['cycles']} cycles, all from the model"
        if self._admission_warning and lvl == OK:
            lvl = WARN
        if self._admission_warning:
            msg += "; " + self._admission_warning
        self._publish_diagnostics(lvl, msg, r, c)

    def _publish_diagnostics(self, lvl, msg: str, r: dict, c: dict) -> None:
        cam_rate = c.get("camera_rate_hz")
        clvl = OK if isinstance(cam_rate, float) and cam_rate > 0 else WARN
        cmsg = f"{cam_rate:.1f} Hz" if isinstance(cam_rate, float) else "no camera stats"
        state = c.get("camera_process_state", "running")
        if state != "running":
            clvl = ERROR if state != "starting" else WARN
            last_exit = c.get("camera_process_last_exit")
            cmsg = f"camera process {state}" + (f" ({last_exit})" if last_exit else "")
            if c.get("camera_process_restarts"):
                cmsg += f", {c['camera_process_restarts']} restarts"
        too_large = c.get("invalid_too_large", 0)
        new_too_large = too_large - self._prev_too_large if isinstance(too_large, int) else 0
        self._prev_too_large = too_large if isinstance(too_large, int) else 0
        if new_too_large > 0:
            clvl = WARN
            cmsg += (f"; {new_too_large} frames over max_image_bytes={c['max_image_bytes']} / "
                     f"max_image_pixels={c['max_image_pixels']} dropped")

        def kv(dct):
            return [KeyValue(key=k, value=("n/a" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)))
                    for k, v in dct.items()]

        arr = DiagnosticArray()
        arr.header.stamp = self.get_clock().now().to_msg()
        arr.status = [
            DiagnosticStatus(level=lvl, name=f"{self.get_name()}: reasoning", message=msg,
                             hardware_id=self.backend_name, values=kv(r)),
            DiagnosticStatus(level=clvl, name=f"{self.get_name()}: camera", message=cmsg,
                             hardware_id="camera", values=kv(c)),
        ]
        self.pub_diag.publish(arr)


def _close(engine) -> None:
    shut = getattr(engine, "close", None) or getattr(engine, "shutdown", None)
    if callable(shut):
        try:
            shut()
        except Exception:  # noqa: BLE001
            pass
