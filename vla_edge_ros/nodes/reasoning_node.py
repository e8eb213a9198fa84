# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""ReasoningNode: the deadline-bound control loop (DESIGN.md §4) as a managed (lifecycle) ROS node (§8).

The loop itself is ROS-free (``runtime.Runtime``: engine + admission + ``cycle.ReasoningCycle``, shared with
vla-edge-bench); this node reads parameters, owns the steady-clock timer, calls ``Runtime.step`` once per tick
and turns what it returns into messages:

* ``~/joint_states`` in (sensor_msgs/JointState, only for a model with a robot-state input: nodes/state_input.py);
* ``~/action`` (TwistStamped or Twist, ``action_type``), first, before any bookkeeping: stamped with this node's
  clock at publish (``action_stamp: now``, the default), or with the source frame's capture stamp
  (``action_stamp: frame``; "now" before the first frame and for a stamp too far from the clock);
* ``~/action_vector`` (Float32MultiArray, labels in layout.dim), ``~/cycle`` (DiagnosticStatus, every cycle:
  source, reason, frame seq/age, latency breakdown, tokens; OK model / WARN fallback / ERROR overrun,
  engine_error, internal_error, non_finite), ``/diagnostics`` (1 Hz roll-up, nodes/diagnostics_output.py),
  ``~/debug_image`` (only when subscribed, nodes/debug_image.py).

Lifecycle (rclpy.lifecycle; ``ros2 lifecycle set /vla_edge <transition>``): configure builds the runtime (model,
VRAM plan, warm-up, EMAs) on a helper thread at normal scheduling, which a shutdown request (``abort``) ends within
~50 ms; activate starts the timer and the camera; deactivate publishes one zero action (``inactive``) and stops the
motion topics while the engine stays warm; cleanup / shutdown close the engine. ``autostart`` (default true): the
bringup configures and activates the node itself. No exception leaves the timer callback.

Run-time parameters (``~/set_parameters``): the ``tunable`` ones of ``settings.REASONING_SPECS``; an impossible
value is refused with a reason and changes nothing. Test-only fault injection: ``VLA_EDGE_TEST_FAULT_FILE``
(``runtime.TEST_FAULT_ENV``) makes every chunk fail while the named file exists; never set it on a robot.
"""

from __future__ import annotations

import os
import threading
import time
import traceback

import numpy as np
from diagnostic_msgs.msg import DiagnosticStatus, KeyValue
from rclpy.clock import Clock, ClockType
from rclpy.lifecycle import LifecycleNode, LifecycleState, TransitionCallbackReturn
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rclpy.exceptions import ParameterException

from ..constants import ACTION_TOKENS
from ..diagnostics import cycle_level, cycle_values
from ..frame_buffer import FrameBuffer
from ..metrics import GcPauses
from ..realtime import normal_scheduling
from ..runtime import TEST_FAULT_ENV, Runtime, StartupError, WarmupInterrupted
from ..settings import REASONING_SPECS, ParamError, ReasoningSettings, validate_reasoning
from . import bond
from .action_output import ActionOutput, one_line
from .debug_image import DebugImageOutput, render_debug
from .diagnostics_output import LEVELS, DiagnosticsOutput
from .instruction_input import InstructionInput
from .params import declare_and_read, enable_runtime_updates
from .state_input import StateInput

SUCCESS, FAILURE = TransitionCallbackReturn.SUCCESS, TransitionCallbackReturn.FAILURE
STEADY = ClockType.STEADY_TIME


class ConfigureInterrupted(RuntimeError):
    """A shutdown request ended the configure transition."""


class ReasoningNode(LifecycleNode):
    def __init__(self, frame_buffer: FrameBuffer, camera=None, node_name: str = "vla_edge",
                 engine_factory=None, validate_only: bool = False, **kwargs):
        try:  # rclpy's own parameters (use_sim_time:=1, :=maybe) are checked here: one line, exit 2
            super().__init__(node_name, **kwargs)
        except ParameterException as e:
            raise ParamError(one_line(e)) from None
        self.fb, self.camera, self._engine_factory = frame_buffer, camera, engine_factory
        raw = declare_and_read(self, REASONING_SPECS)
        # With autostart the cross-checks and the model directory are checked now (one message, exit 2); a node
        # managed by a lifecycle manager checks them at configure, which then fails and leaves it unconfigured.
        self.p = p = ReasoningSettings.from_values(validate_reasoning(raw) if raw.get("autostart", True) else raw)
        self.runtime: Runtime | None = None
        self.timer = self.diag_timer = None
        self.lifecycle_state = "unconfigured"
        if validate_only:  # bringup collects every node's parameter problems before giving up
            return
        self.abort = threading.Event()  # set on SIGINT/SIGTERM: a configure in progress gives up
        self.startup_error: Exception | None = None  # why the last configure failed
        self.backend_name = p.backend
        self._cycle_index = 0
        self.on_finalized = None  # called after the shutdown transition (bringup: end the process)
        self._bond = None
        # /diagnostics status names carry the namespace: two robots on one aggregator do not collide
        self.status_prefix = self.get_fully_qualified_name().lstrip("/")
        self.gc_pauses = GcPauses().install()  # every collection's pause, in /diagnostics

        self.action = ActionOutput(self)  # ~/action, ~/action_vector, ~/action_chunk (silent unless active)
        self.pub_cycle = self.create_publisher(DiagnosticStatus, "~/cycle",
                                               QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE))
        self.diagnostics = DiagnosticsOutput(self)  # /diagnostics
        self.debug_image = DebugImageOutput(self)  # ~/debug_image
        self.diag_timer = self.create_timer(p.diagnostics_period_s, self.diagnostics.publish,
                                            clock=Clock(clock_type=STEADY))
        enable_runtime_updates(self, REASONING_SPECS, self.p, self._apply_params,
                               configured=lambda: self.lifecycle_state != "unconfigured")
        # ~/instruction (taken in the camera process when there is one) and the parameter's check
        self.instructions = InstructionInput(self, lambda: self.runtime, getattr(camera, "instruction_mailbox", None))
        self.add_on_set_parameters_callback(self._check_plan_params)  # chunk_execute against the model's K
        self.state_input = StateInput(self)  # ~/joint_states while a model with a state input is configured
        self._guard_change_state_service()

    # --- lifecycle ---------------------------------------------------------------------------------------

    def autostart(self) -> bool:
        """configure + activate when the ``autostart`` parameter is true (the one-command start). False when
        a transition failed: ``startup_error`` says why (None after an interruption)."""
        if not self.p.autostart:
            name = self.get_fully_qualified_name()
            self.get_logger().info(f"autostart is false: waiting in 'unconfigured' for lifecycle transitions "
                                   f"(ros2 lifecycle set {name} configure, then ros2 lifecycle set {name} activate)")
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
        # rclpy 7.1 (ROS 2 Jazzy) keeps the service in LifecycleNode._service_change_state and offers no public way to
        # wrap its callback (nor a hook for a refused transition): the one private attribute of rclpy the node uses
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
            self.runtime = self._in_helper_thread(self._build)
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
        rt, p = self.runtime, self.p
        self.backend_name = rt.backend_name
        self.diagnostics.rollup.reset()
        # run once now what the first cycles would run for the first time (the debug drawing)
        render_debug(np.zeros((8, 16, 3), np.uint8), [], np.zeros(ACTION_TOKENS, np.float32), p.action_low,
                     p.action_high, "warm", p.action_labels)
        self.lifecycle_state = "inactive"
        self.get_logger().info(f"configured in {time.monotonic() - t_start:.1f} s: {rt.describe()}")
        if rt.deadline_warning:
            self.get_logger().warn(rt.deadline_warning)
        self.instructions.configured()
        self.state_input.configure(rt)
        return SUCCESS

    def _build(self) -> Runtime:
        """The heavy part of configure (helper thread): Runtime.build checks the parameters again (they may have been
        changed while unconfigured), resolves the model, checks the capacity, builds the engine and warms it up."""
        if not self.p.model_path and self.p.make_tiny_model:
            self.get_logger().info("make_tiny_model: using the generated tiny model")
        return Runtime.build(None, self.p, self.fb, engine_factory=self._engine_factory, should_stop=self.abort.is_set,
                             fault_file=os.environ.get(TEST_FAULT_ENV) or None, warn=self.get_logger().warn)

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
        if isinstance(box.get("error"), WarmupInterrupted):
            raise ConfigureInterrupted(str(box["error"]))
        if "error" in box:
            raise box["error"]
        return box["value"]

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        ret = super().on_activate(state)  # enables the lifecycle publishers before the first tick
        self.runtime.resume()  # the time inactive is neither missed ticks nor an action gap; commands ramp from rest
        try:
            self.timer = self.create_timer(self.p.period_ms / 1000.0, self._on_tick, clock=Clock(clock_type=STEADY))
            if self.camera is not None:
                self.camera.start()
        except Exception as e:  # noqa: BLE001 - rclpy would swallow it silently; say why, then on_error releases
            self.startup_error = StartupError(f"activate failed: {type(e).__name__}: {e}")
            self.get_logger().error(str(self.startup_error))
            return TransitionCallbackReturn.ERROR
        self.lifecycle_state = "active"
        self._bond = bond.form(self)
        self.get_logger().info("active: control timer running, camera subscribed, publishing actions")
        return ret

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._bond = bond.release(self._bond)
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
        self._bond = bond.release(self._bond)
        if self.timer is not None:
            self._stop_motion()
        self._release()
        self.instructions.close()  # the topic's rendering thread
        self.lifecycle_state = "finalized"
        if self.on_finalized is not None:  # a finalized node does nothing more: its process ends (bringup)
            self.on_finalized()
        return SUCCESS

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        self._bond = bond.release(self._bond)
        self._release()
        self.lifecycle_state = "unconfigured"
        return SUCCESS

    def _stop_motion(self) -> None:
        """Stop the control timer and publish one zero action while the motion topics are still enabled."""
        self._destroy_timer("timer")
        if self.runtime is not None:
            self._publish(self.runtime.stop_outcome(self._latest_stamp()))

    def _destroy_timer(self, name: str) -> None:
        t = getattr(self, name, None)
        if t is not None:
            t.cancel()
            self.destroy_timer(t)
            setattr(self, name, None)

    def _release(self) -> None:
        """Close the runtime and drop every reference to it (cleanup, shutdown, error)."""
        self._destroy_timer("timer")
        self.state_input.release()
        if self.runtime is not None:
            self.runtime.close()
        self.runtime = None
        self.debug_image.clear()

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

    # --- run-time parameters -------------------------------------------------------------------------------

    def _check_plan_params(self, params):
        """Refuse a run-time plan setting the loaded model cannot take (chunk_execute > its vla_action_chunk)."""
        from rcl_interfaces.msg import SetParametersResult

        changes = {q.name: q.value for q in params if q.name in ("chunk_execute", "chunk_blend", "chunk_blend_weight")}
        why = self.runtime.check_plan_change(changes) if changes and self.runtime is not None else None
        if why:
            self.get_logger().warn(f"parameter change refused: {why}")
        return SetParametersResult(successful=why is None, reason=why or "")

    def _apply_params(self, changes: dict) -> None:
        """Apply validated run-time changes (params.enable_runtime_updates has updated ``self.p``); runs on the
        node's executor thread, so it never races a tick. Before configure only the stored values change."""
        if self.runtime is None:
            return
        self.runtime.apply(changes)
        if {"period_ms", "safety_margin_ms"} & set(changes) and self.runtime.deadline_warning:
            self.get_logger().warn(self.runtime.deadline_warning)
        if "period_ms" in changes and self.timer is not None:
            self.destroy_timer(self.timer)
            self.timer = self.create_timer(self.p.period_ms / 1000.0, self._on_tick, clock=Clock(clock_type=STEADY))

    # --- the cycle -------------------------------------------------------------------------------------------

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
            step = self.runtime.step(t0, self._scheduled_tick(t0), self.action.send)
        except Exception as e:  # noqa: BLE001 - never let an exception kill the timer
            self.get_logger().error(f"cycle failed: {type(e).__name__}: {e}\n{traceback.format_exc()}",
                                    throttle_duration_sec=5.0)
            try:
                self._publish(self.runtime.internal_error_outcome(t0, e, self._latest_stamp()))
            except Exception:  # noqa: BLE001
                pass
            return
        try:
            self._report(step)
        except Exception as e:  # noqa: BLE001
            self.get_logger().error(f"reporting failed: {type(e).__name__}: {e}\n{traceback.format_exc()}",
                                    throttle_duration_sec=5.0)

    def _publish(self, out) -> None:
        """Publish an outcome the node made itself (stop, internal error) like a cycle's."""
        self._report(self.runtime.publish_outcome(out, self.action.send))

    def _report(self, step) -> None:
        """~/cycle, the logs of a failed chunk, the debug image: everything after the control output."""
        out = step.outcome
        if out.late_error:
            self.get_logger().error(f"late chunk failed: {out.late_error}", throttle_duration_sec=5.0)
        if out.error:
            self.get_logger().error(f"{out.reason}: {out.error}", throttle_duration_sec=5.0)
        vals = cycle_values(out, self._cycle_index, step.t_publish, step.late, self.action.stamp_sent, step.twist)
        st = DiagnosticStatus(level=LEVELS[cycle_level(out)], name=f"{self.status_prefix}: cycle",
                              hardware_id=self.backend_name, message=f"{out.source}: {out.reason}")
        st.values = [KeyValue(key=k, value=(f"{v:.3f}" if isinstance(v, float) else str(v))) for k, v in vals.items()]
        self.pub_cycle.publish(st)
        self.diagnostics.after_cycle(out)
        self.debug_image.after_cycle(out)

    def _latest_stamp(self) -> int | None:
        latest = self.fb.latest()
        return latest.stamp_ns if latest is not None else None

    # --- diagnostics -------------------------------------------------------------------------------------------

    def diagnostics_values(self) -> tuple[dict, dict]:
        """(reasoning key-values, camera key-values) of the 1 Hz roll-up."""
        r, _, cam = self.diagnostics.records()
        return r, cam.values()
