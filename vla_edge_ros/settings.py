# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Settings of the camera and the reasoning loop: the one table of names, defaults, ranges and descriptions, the
typed objects generated from it, and the start-up and run-time validation (ROS-free).

The node declares these as ROS parameters (nodes/params.py: ParameterDescriptor with FloatingPointRange /
IntegerRange, every rclpy complaint turned into one :class:`ParamError` naming the parameter); the bench and
the runtime take the same typed object (`ReasoningSettings`), so a name or a default exists once.

Parameters marked ``tunable`` may be changed while the node runs (``ros2 param set``, the
``~/set_parameters`` service): :func:`check_update` validates a change (ranges, choices, and the
cross-checks such as ``period_ms > safety_margin_ms``) and :func:`enable_runtime_updates` rejects an
impossible one with a reason (SetParametersResult(successful=False, reason=...)) before it is
applied.  All other parameters are read-only: they size the model, the cache or the subscriptions.
"""

from __future__ import annotations

import math
import dataclasses
from dataclasses import dataclass
from typing import Any

from .action_plan import BLEND_WEIGHT, BLENDS
from .actions import DEFAULT_DIM_NAMES
from .admission import budget_problem
from .constants import (ACTION_TOKENS, CAMERA_NO_FRAMES_RESTART_S, EMA_ALPHA, KV_CAPACITY_TOKENS, MAX_ACTION_CHUNK,
                        MAX_FRAME_AGE_MS, PERIOD_MS, SAFETY_MARGIN_MS, VRAM_CEILING_GB)
from .cycle import FALLBACK_MODES, HOLD_TIMEOUT_S, REPROBE_AFTER_S
from .engine import BACKENDS
from .eviction import POLICY_NAMES
from .frame_quality import CHECKS as QUALITY_CHECKS, QualitySettings
from .instruction import MAX_INSTRUCTION_CHARS, TEMPLATES
from .kv_cache import capacity_problem
from .model.config import MAX_JOINT_NAME
from .robot_state import MAX_STATE_AGE_MS


class ParamError(ValueError):
    """Impossible parameters: start-up stops with this one message."""


@dataclass(frozen=True)
class Spec:
    name: str
    default: Any
    description: str
    lo: float | int | None = None  # inclusive range (FloatingPointRange / IntegerRange); arrays: per entry
    hi: float | int | None = None
    choices: tuple[str, ...] | None = None
    length: int | None = None  # arrays: required length
    tunable: bool = False  # settable at run time, in every lifecycle state
    configure_time: bool = False  # settable while unconfigured (a lifecycle manager fixes it, configures again)
    max_chars: int | None = None  # strings: longest value accepted


TRANSPORTS = ("raw", "compressed")
ACTION_STAMPS = ("now", "frame")
ACTION_TYPES = ("twist_stamped", "twist")
CHUNK_FIELDS = ("positions", "velocities")  # where ~/action_chunk's JointTrajectoryPoint carries the actions
# Conservative REP-103 defaults for a base driven by a model nobody has tuned yet: m/s for linear x, y, z and rad/s for
# angular x, y, z (a TurtleBot3 tops out at 0.22 m/s, 2.84 rad/s; Nav2's velocity smoother defaults to 0.5, 2.0).
VELOCITY_LIMITS = [0.25, 0.25, 0.25, 0.5, 0.5, 0.5]
NAME_CHARS = 255  # a TF frame id, a label
RELIABILITIES = ("auto", "best_effort", "reliable")
DEFAULT_LABELS = list(DEFAULT_DIM_NAMES)  # linear_x .. angular_z, gripper, aux (actions.py)

# The camera's frame-quality checks (frame_quality.py, DESIGN.md §17), run in the camera process on every frame.
_FQ = QualitySettings()
FRAME_QUALITY_SPECS: tuple[Spec, ...] = (
    Spec("frame_quality", True, "Check every frame before the model sees it (dark, blocked, over-exposed, blur, "
         "frozen); a frame that fails is never admitted (fallback frame_quality). false: no check at all."),
    Spec("frame_quality_checks", list(QUALITY_CHECKS), "The checks switched on, of: " + ", ".join(QUALITY_CHECKS)
         + " (leave one out to switch it off).", max_chars=16),
    Spec("frame_quality_dark_mean", _FQ.dark_mean, "dark: a block (of 5 x 5) whose mean gray level is under this "
         "is dark (Autoware image_diagnostics: 10).", 0.0, 255.0),
    Spec("frame_quality_dark_blocks", _FQ.dark_blocks, "dark: dark blocks (of 25) that make the frame dark.", 1, 25),
    Spec("frame_quality_black_level", _FQ.black_level, "blocked: a pixel at or under this gray level is black.",
         0, 254),
    Spec("frame_quality_blocked_ratio", _FQ.blocked_ratio, "blocked: a block with a larger share of black pixels "
         "is blocked (a lens cap, a hand; Autoware: 0.9).", 0.0, 1.0),
    Spec("frame_quality_blocked_blocks", _FQ.blocked_blocks, "blocked: blocked blocks (of 25) that make the frame "
         "blocked (8: a third of the view).", 1, 25),
    Spec("frame_quality_overexposed_mean", _FQ.overexposed_mean, "overexposed: a block whose mean gray level is "
         "over this is over-exposed (Autoware backlight: 230).", 0.0, 255.0),
    Spec("frame_quality_overexposed_blocks", _FQ.overexposed_blocks, "overexposed: over-exposed blocks (of 25) that "
         "make the frame over-exposed.", 1, 25),
    Spec("frame_quality_blur_detail", _FQ.blur_detail, "blur: the view's edge sharpness (sum |Laplacian| / sum "
         "|gradient| over the exposed blocks with an edge; the real clips here: 0.39-0.96) under this is blur; a view "
         "without any edge fails too.", 0.0, 4.0),
    Spec("frame_quality_frozen_frames", _FQ.frozen_frames, "frozen: frames in a row identical to the previous one "
         "(bytes, or a non-zero header stamp) before a frame fails frozen (1: the first repeat).", 1, 100),
    Spec("frame_quality_trip_frames", _FQ.trip_frames, "Hysteresis: failing frames in a row that trip a check (the "
         "loop then publishes frame_quality fallbacks). A failing frame is never admitted, tripped or not.", 1, 100),
    Spec("frame_quality_clear_frames", _FQ.clear_frames, "Hysteresis: passing frames in a row that clear a tripped "
         "check.", 1, 100),
)


REASONING_SPECS: tuple[Spec, ...] = (
    Spec("period_ms", PERIOD_MS, "Control cycle and deadline (ms): one action is published per period.",
         1.0, 10000.0, tunable=True),
    Spec("safety_margin_ms", SAFETY_MARGIN_MS, "Time kept free at the end of every cycle (ms); must be < period_ms.",
         0.0, 1000.0, tunable=True),
    Spec("ema_alpha", EMA_ALPHA, "Weight of a new sample in the admission cost EMAs.", 0.001, 1.0, tunable=True),
    Spec("tail_k", 0.0, "Admission tail allowance: estimate += tail_k * EMA(|deviation|).", 0.0, 20.0, tunable=True),
    Spec("reprobe_after_s", REPROBE_AFTER_S, "While every chunk is refused, run one chunk in the background (its "
         "action unused, the refusal still published on time) so the cost EMAs can recover: the first after 3 "
         "refusals, each next after twice as many, at most this long apart; 0 disables.",
         0.0, 3600.0, tunable=True),
    Spec("kv_capacity_tokens", KV_CAPACITY_TOKENS,
         "KV-cache slots per layer: prompt + retained frames + 8 action tokens.",
         1, 1 << 20, configure_time=True),
    Spec("policy", "fifo", "Frame eviction policy: fifo | sliding_window | semantic.", choices=POLICY_NAMES,
         configure_time=True),
    Spec("window_frames", 8, "Frames kept by the sliding_window policy.", 1, 1 << 16, configure_time=True),
    Spec("max_frame_age_ms", MAX_FRAME_AGE_MS, "A frame older than this (since receive) is stale: fallback.",
         1.0, 60000.0,
         tunable=True),
    Spec("state_joints", [""], "A model with a robot-state input (config.json vla_state_dim): the joint names of "
         "its state in the model's order, as sensor_msgs/JointState on ~/joint_states names them; each message is "
         "matched by name, never by index. [''] (the default): the checkpoint's vla_state_joints; a checkpoint that "
         "names its joints must not be given other names. Which fields (position, velocity) is the checkpoint's "
         "vla_state_fields.", configure_time=True, max_chars=MAX_JOINT_NAME),
    Spec("max_state_age_ms", MAX_STATE_AGE_MS, "A model with a robot-state input never acts on a state older than "
         "this (its header stamp on this node's clock, sim time under use_sim_time): fallback stale_state.",
         1.0, 60000.0, tunable=True),
    Spec("backend", "auto", "Engine backend: auto (cuda if a GPU is usable, else numpy) | numpy | cuda.",
         choices=BACKENDS, configure_time=True),
    Spec("model_path", "", "HF-layout model directory (config.json + safetensors). Required unless make_tiny_model.",
         configure_time=True, max_chars=4096),
    Spec("make_tiny_model", False,
         "Demo only: generate a tiny random model into a cache dir when model_path is empty.", configure_time=True),
    Spec("vram_ceiling_gb", VRAM_CEILING_GB, "Modeled edge VRAM budget (GB): start-up refuses a plan over it.",
         0.01, 4096.0, configure_time=True),
    Spec("fallback", "zero", "Fallback action: zero (zero twist) | hold (repeat the last published action, for at "
         "most hold_timeout_s, then zero).", choices=FALLBACK_MODES, tunable=True),
    Spec("hold_timeout_s", HOLD_TIMEOUT_S, "fallback hold: the last action is repeated for at most this long (s) "
         "from the first fallback of a spell (a camera gone, refusals), then the fallback is zero until the model "
         "acts again (counted: holds_expired). Keep it well under the base's command timeout.", 0.0, 10.0,
         tunable=True),
    Spec("chunk_execute", 0, "Action chunks (a model with vla_action_chunk K > 1): how many of a chunk's K actions "
         "may run, one a tick from the tick of its frame, before the plan is stale; 0: all K. Must be <= K "
         "(checked at configure). A refused, busy or late tick publishes the plan's action for it (source plan); a "
         "chunk that lands d ticks late skips its first d actions.", 0, MAX_ACTION_CHUNK, tunable=True),
    Spec("chunk_blend", "latest", "Action chunks: on ticks the old plan still covers when a new chunk lands, "
         "latest (the new chunk's action) | weighted (chunk_blend_weight * new + (1 - chunk_blend_weight) * old).",
         choices=BLENDS, tunable=True),
    Spec("chunk_blend_weight", BLEND_WEIGHT, "Action chunks, chunk_blend weighted: the new chunk's weight on "
         "overlapping ticks.", 0.0, 1.0, tunable=True),
    Spec("action_chunk_field", "positions", "~/action_chunk (trajectory_msgs/JointTrajectory, the plan from this "
         "tick on, one point a period): the actions go in positions | velocities of each point.",
         choices=CHUNK_FIELDS),
    Spec("action_low", -1.0, "Value of the lowest action bin.", -1e6, 1e6, configure_time=True),
    Spec("action_high", 1.0, "Value of the highest action bin (must be > action_low).", -1e6, 1e6,
         configure_time=True),
    Spec("action_labels", list(DEFAULT_LABELS), "Labels of the 8 action dimensions (~/action_vector layout.dim).",
         length=ACTION_TOKENS, max_chars=NAME_CHARS),
    Spec("twist_map", [0, 1, 2, 3, 4, 5],
         "Action index feeding linear.x,y,z, angular.x,y,z of ~/action (-1: always 0).", length=6, tunable=True),
    Spec("twist_scale", [1.0, 1.0, 1.0, 1.0, 1.0, 1.0], "Scale applied per twist component (finite, each in "
         "[-1000, 1000]).", -1000.0, 1000.0, length=6, tunable=True),
    Spec("velocity_limits", list(VELOCITY_LIMITS), "Largest |value| of each ~/action component, after twist_map and "
         "twist_scale: linear x, y, z (m/s), angular x, y, z (rad/s) (REP-103); a larger command is clamped and "
         "counted (/diagnostics clamped_velocity). 0 on an axis: that axis is always 0.", 0.0, 100.0, length=6,
         tunable=True),
    Spec("acceleration_limits", [0.0] * 6, "Largest change per second of each ~/action component between "
         "consecutive commands: m/s^2 (linear x, y, z), rad/s^2 (angular x, y, z); a larger step is clamped and "
         "counted (clamped_acceleration). 0: no limit on that axis. Fallbacks ramp down at this rate too; the zero "
         "sent on deactivate / shutdown is never limited. A step is never larger than one period's (limit x "
         "period_ms), however long the gap since the previous command sent; the first command after activate or "
         "configure ramps from zero.", 0.0, 1000.0, length=6, tunable=True),
    Spec("base_command_timeout_s", 0.5, "The base's own command timeout (s; ros2_control diff_drive_controller's "
         "cmd_vel_timeout is 0.5): after a longer gap between commands sent (inactive, a stalled process) the base "
         "has stopped by itself, so acceleration_limits ramp the next command from zero (counted: "
         "limits_restarted_from_zero). 0: the base has no timeout; ramp from the last command sent.", 0.0, 60.0,
         tunable=True),
    Spec("action_type", "twist_stamped", "Message type of ~/action: twist_stamped (geometry_msgs/TwistStamped: "
         "ros2_control's diff_drive_controller) | twist (geometry_msgs/Twist: Nav2's default cmd_vel).",
         choices=ACTION_TYPES),
    Spec("action_stamp", "now", "header.stamp of ~/action (twist_stamped): now (this node's clock when it publishes; "
         "sim time under use_sim_time) | frame (the source frame's capture stamp: a replayed bag's commands are as "
         "old as the bag; play it with --clock and use_sim_time). A frame stamp further than "
         "action_stamp_max_offset_s from this node's clock is replaced by now (counted: stamps_replaced). The "
         "frame's age is in ~/cycle and /diagnostics either way.", choices=ACTION_STAMPS, tunable=True),
    Spec("action_stamp_max_offset_s", 1.0, "action_stamp frame: the largest distance (s) between a frame's capture "
         "stamp and this node's clock that is passed on; a stamp further away (a camera clock in 2038 or at epoch 0, "
         "which would defeat a base controller's command timeout) is replaced by now and counted.", 0.001, 3600.0,
         tunable=True),
    Spec("action_frame_id", "base_link", "header.frame_id of ~/action (twist_stamped).", tunable=True,
         max_chars=NAME_CHARS),
    Spec("camera_restart_no_frames_s", CAMERA_NO_FRAMES_RESTART_S, "Camera watchdog: a publisher is matched but no "
         "frame arrived for this long (s) -> the camera process is started again (counted in /diagnostics); 0: "
         "never.", 0.0, 3600.0),
    Spec("warmup_chunks", 3, "Dry chunks run before the node reports ready (compile, capture, EMAs).", 0, 1000,
         configure_time=True),
    Spec("instruction", "", "The task in words (e.g. 'pick up the red cup'), rendered with instruction_template and "
         "tokenized with the model's own tokenizer into the pinned prompt. Settable at run time, and by the "
         "~/instruction topic (the last one wins). A change drops the retained frames (they saw the old prompt) and "
         "costs instruction_change fallbacks, never a deadline; a refused one (empty, control characters only, too "
         "long, no tokenizer) is a warning and the previous instruction stays. Empty: the default system prompt.",
         tunable=True, max_chars=MAX_INSTRUCTION_CHARS),
    Spec("instruction_template", "auto", "How an instruction becomes the prompt: auto (the model's chat template "
         "when it has one, else raw) | chat (system + user turn of the chat template) | raw (the system prompt, a "
         "newline, the instruction).", choices=TEMPLATES, configure_time=True),
    Spec("max_instruction_tokens", 256, "Longest instruction accepted, in the model's tokens; the whole prompt + one "
         "frame + 8 action tokens must also fit kv_capacity_tokens.", 1, 1 << 16, configure_time=True),
    Spec("instruction_min_interval_cycles", 10, "At most one instruction change is applied per this many cycles; a "
         "newer request meanwhile replaces the waiting one (coalesced, counted in /diagnostics).", 1, 1 << 20,
         tunable=True),
    Spec("diagnostics_period_s", 1.0, "Period of the /diagnostics roll-up (s).", 0.05, 60.0),
    Spec("realtime_priority", 0, "SCHED_FIFO priority (1-99) of the reasoning executor thread, and this minus 1 "
         "of the engine worker, so the deadline guard wakes and gets the interpreter on time on a busy CPU; 0: "
         "normal scheduling. Needs CAP_SYS_NICE or an rtprio limit; refused -> a warning and normal scheduling.",
         0, 99),
    Spec("autostart", True, "Configure and activate the (lifecycle) node at start-up (impossible parameters or a "
         "bad model end the process); false: it waits in 'unconfigured' for lifecycle transitions (ros2 lifecycle "
         "set <node> configure, then activate), and configure fails on them, the process staying up."),
    Spec("debug_image_max_hz", 10.0, "Upper bound on ~/debug_image publishing (only when subscribed).", 0.1, 1000.0,
         tunable=True),
)

CAMERA_SPECS: tuple[Spec, ...] = (
    Spec("transport", "raw", "Input: raw (sensor_msgs/Image on 'image') | compressed (CompressedImage on "
         "'image/compressed').", choices=TRANSPORTS),
    Spec("qos_reliability", "auto", "Image subscription reliability: auto (reliable when every publisher of the "
         "topic offers reliable, else best effort; looked at again every second: a best-effort reader lost most "
         "1.5 MB frames of a reliable camera on the same host) | best_effort (sensor data) | reliable (bag replay).",
         choices=RELIABILITIES),
    Spec("qos_depth", 5, "Image subscription history depth (keep last).", 1, 1000),
    Spec("max_image_bytes", 32 * 1024 * 1024, "Largest image message accepted (bytes of data, raw or compressed), "
         "checked before any conversion; larger ones are dropped and counted (too_large). 32 MiB passes 4K rgb8, "
         "refuses 8K rgb8.", 1024, 1 << 30),
    Spec("max_image_pixels", 4096 * 4096, "Largest image accepted (width x height), read from the header before any "
         "conversion or decoding (PNG IHDR / JPEG SOF for compressed input: no decompression bombs).",
         1, 64 * 1024 * 1024),
    Spec("warn_throttle_s", 2.0, "Minimum interval between warnings about dropped frames (s).", 0.0, 3600.0,
         tunable=True),
    Spec("process_nice", 10, "Niceness added to the camera's own process (vla_edge runs the camera in a child "
         "process), so receiving and converting frames yields the CPU to the control loop; 0: same as vla_edge.",
         0, 19),
    *FRAME_QUALITY_SPECS,
)


def spec_table(specs) -> dict[str, Spec]:
    return {s.name: s for s in specs}


def defaults(specs) -> dict[str, Any]:
    return {s.name: (list(s.default) if isinstance(s.default, list) else s.default) for s in specs}


def _fmt(v) -> str:
    return repr(v) if isinstance(v, str) else str(v)


def check_specs(values: dict[str, Any], specs) -> list[str]:
    """Range, choice and length checks of the tables. Returns problems (empty = fine)."""
    problems = []
    for s in specs:
        if s.name not in values:
            continue
        v = values[s.name]
        if s.choices is not None and v not in s.choices:
            problems.append(f"{s.name}={_fmt(v)} is not one of {', '.join(s.choices)}")
        if s.lo is not None and isinstance(v, (int, float)) and not isinstance(v, bool):
            if not (math.isfinite(v) and s.lo <= v <= s.hi):
                problems.append(f"{s.name}={v} is outside [{s.lo}, {s.hi}]")
        elif s.lo is not None and isinstance(v, (list, tuple)):
            # rclpy's ranges apply to scalars only: array entries (NaN, inf, 1e300) are checked here
            bad = [x for x in v if isinstance(x, bool) or not isinstance(x, (int, float))
                   or not (math.isfinite(x) and s.lo <= x <= s.hi)]
            if bad:
                problems.append(f"{s.name} entries must be finite and in [{s.lo}, {s.hi}], got {bad}")
        if s.length is not None and len(v) != s.length:
            problems.append(f"{s.name} needs {s.length} entries, got {len(v)}")
        if s.max_chars is not None:
            items = v if isinstance(v, (list, tuple)) else [v]
            long = [x for x in items if isinstance(x, str) and len(x) > s.max_chars]
            if long:
                problems.append(f"{s.name} is longer than {s.max_chars} characters ({len(long[0])})")
    return problems


def check_capacity(capacity: int, prompt_tokens: int, action_tokens: int = ACTION_TOKENS,
                   state_tokens: int = 0) -> list[str]:
    """The capacity rule (kv_cache.capacity_problem) as a problem list; `action_tokens`: the model's (K x 8),
    `state_tokens` its state token (1 with a state input)."""
    problem = capacity_problem(capacity, prompt_tokens, action_tokens=action_tokens, state_tokens=state_tokens)
    return [problem] if problem else []


def validate_reasoning(values: dict[str, Any], prompt_tokens: int = 0,
                       action_tokens: int = ACTION_TOKENS, state_tokens: int = 0) -> dict[str, Any]:
    """All start-up checks of the reasoning node. Returns the values; raises ParamError (one message).
    `prompt_tokens` / `action_tokens` / `state_tokens`: the model's prompt and transient slots, for the capacity
    rule."""
    v = defaults(REASONING_SPECS)
    v.update(values)
    problems = check_specs(v, REASONING_SPECS)
    if not problems or all("period_ms" not in p and "safety_margin_ms" not in p for p in problems):
        problem = budget_problem(v["period_ms"], v["safety_margin_ms"])
        if problem:
            problems.append(problem)
    if not (v["action_high"] > v["action_low"]):
        problems.append(f"action_high={v['action_high']} must be greater than action_low={v['action_low']}")
    tm = list(v["twist_map"])
    bad = [i for i in tm if not (-1 <= int(i) < ACTION_TOKENS)]
    if bad:
        problems.append(f"twist_map entries must be -1 or an action index 0..{ACTION_TOKENS - 1}, got {bad}")
    if isinstance(v["kv_capacity_tokens"], int):
        problems += check_capacity(v["kv_capacity_tokens"], prompt_tokens, action_tokens, state_tokens)
    if not v["model_path"] and not v["make_tiny_model"]:
        problems.append(
            "model_path is empty: set model_path:=<model dir> (vla-edge-make-model --preset tiny --out DIR "
            "writes one) or make_tiny_model:=true for a demo"
        )
    from .model.checkpoint import model_path_problem

    reason = model_path_problem(v["model_path"]) if v["model_path"] else None  # the one rule: model.checkpoint
    if reason:
        problems.append(f"model_path={v['model_path']!r}: {reason}")
    if problems:
        raise ParamError("; ".join(problems))
    return v


def unknown_parameters_message(unknown, known) -> str | None:
    """One warning line for parameters given (params file, -p) that no node declares, with the closest known
    name for each (a typo such as ``perod_ms`` would otherwise run silently with the default)."""
    import difflib

    if not unknown:
        return None
    parts = []
    for name in sorted(set(unknown)):
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
        parts.append(f"{name} (did you mean {close[0]}?)" if close else name)
    return "unknown parameters, ignored: " + ", ".join(parts)


def tunable_names(specs) -> tuple[str, ...]:
    return tuple(s.name for s in specs if s.tunable)


def check_update(current: dict[str, Any], changes: dict[str, Any], specs, configured: bool = True) -> list[str]:
    """Validate a run-time change of parameters (``changes``) of a node whose values are ``current``.

    Returns the problems (empty = accept): read-only parameters (``configure_time`` ones only while the node is
    not ``configured``), wrong types, ranges and choices, and the cross-checks that involve a changed parameter
    (period_ms > safety_margin_ms, twist_map).
    """
    table = spec_table(specs)
    problems = []
    for name, v in changes.items():
        s = table.get(name)
        if s is None:
            problems.append(f"{name} is not a parameter of this node")
        elif s.configure_time and configured and not s.tunable:
            problems.append(f"{name} can only be changed while the node is unconfigured (lifecycle cleanup first)")
        elif not s.tunable and not s.configure_time:
            problems.append(f"{name} is read-only: it can only be set at start-up")
        elif isinstance(s.default, bool) != isinstance(v, bool) or (
                isinstance(s.default, (int, float)) and not isinstance(v, (int, float))) or (
                isinstance(s.default, str) and not isinstance(v, str)) or (
                isinstance(s.default, list) and not isinstance(v, (list, tuple))):
            problems.append(f"{name}: wrong type {type(v).__name__}, expected {type(s.default).__name__}")
    if problems:
        return problems
    problems += check_specs(changes, specs)
    merged = dict(current)
    merged.update(changes)
    if ("period_ms" in changes or "safety_margin_ms" in changes) and "period_ms" in merged \
            and "safety_margin_ms" in merged:
        problem = budget_problem(merged["period_ms"], merged["safety_margin_ms"])
        if problem:
            problems.append(problem)
    if "twist_map" in changes:
        bad = [i for i in changes["twist_map"] if not (-1 <= int(i) < ACTION_TOKENS)]
        if bad:
            problems.append(f"twist_map entries must be -1 or an action index 0..{ACTION_TOKENS - 1}, got {bad}")
    return problems


def validate_camera(values: dict[str, Any]) -> dict[str, Any]:
    v = defaults(CAMERA_SPECS)
    v.update(values)
    problems = check_specs(v, CAMERA_SPECS)
    bad = [c for c in v["frame_quality_checks"] if c not in QUALITY_CHECKS]
    if bad:
        problems.append(f"frame_quality_checks: {', '.join(map(str, bad))} not one of {', '.join(QUALITY_CHECKS)}")
    if problems:
        raise ParamError("; ".join(problems))
    return v


class Settings:
    """Base of the typed settings objects generated from a spec table (`settings_class`)."""

    SPECS: tuple[Spec, ...] = ()

    @classmethod
    def from_values(cls, values: dict[str, Any]):
        """The defaults, overridden by `values` (unknown names are an error)."""
        names = {s.name for s in cls.SPECS}
        unknown = set(values) - names
        if unknown:
            raise ParamError(f"not a setting: {', '.join(sorted(unknown))}")
        return cls(**{**defaults(cls.SPECS), **values})

    def as_dict(self) -> dict[str, Any]:
        return {s.name: getattr(self, s.name) for s in self.SPECS}

    def update(self, changes: dict[str, Any]) -> None:
        """Apply validated run-time changes (check_update) in place."""
        for name, value in changes.items():
            setattr(self, name, value)


def settings_class(name: str, specs) -> type:
    """A dataclass with one typed field per spec (default from the table; lists copied per instance)."""
    fields = []
    for s in specs:
        if isinstance(s.default, list):
            fields.append((s.name, list, dataclasses.field(default_factory=lambda d=s.default: list(d))))
        else:
            fields.append((s.name, type(s.default), dataclasses.field(default=s.default)))
    cls = dataclasses.make_dataclass(name, fields, bases=(Settings,))
    cls.SPECS = tuple(specs)
    return cls


ReasoningSettings = settings_class("ReasoningSettings", REASONING_SPECS)
CameraSettings = settings_class("CameraSettings", CAMERA_SPECS)
