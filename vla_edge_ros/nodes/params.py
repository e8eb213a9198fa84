# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The ROS side of the settings (settings.py): declare them as parameters of a node, read them, and accept or refuse
run-time changes through the node's parameter services.

:func:`declare_and_read` declares every spec with a ParameterDescriptor (description, FloatingPointRange /
IntegerRange, read-only unless ``tunable``) and turns every rclpy complaint into one :class:`ParamError` naming
the parameter. Parameters marked ``tunable`` may be changed while the node runs (``ros2 param set``, the
``~/set_parameters`` service): :func:`enable_runtime_updates` validates a change with ``settings.check_update``
and refuses an impossible one with a reason before it is applied.
"""

from __future__ import annotations

from typing import Any

from ..settings import ParamError, Settings, Spec, _fmt, check_update


def parameter_overrides(node) -> dict:
    """The overrides ``node`` was started with (params file, -p, ``parameter_overrides=``): name -> rclpy Parameter.

    The one private attribute of rclpy read here: rclpy 7.1 (ROS 2 Jazzy) keeps them in ``Node._parameter_overrides``
    and offers no public accessor (``declare_parameter`` applies one without saying it was there, and an undeclared
    one is reachable in no other way)."""
    return dict(getattr(node, "_parameter_overrides", None) or {})


def declared_names(node) -> set[str]:
    """Every parameter ``node`` has declared (rclpy's own, ``qos_overrides.*`` included)."""
    return set(node.list_parameters([], 0).names)  # depth 0: ListParameters.DEPTH_RECURSIVE


def undeclared_overrides(node) -> set[str]:
    """Parameter overrides given to ``node`` (params file, -p) that it did not declare, ``qos_overrides.*`` keys
    included: rclpy declares one for each policy of each topic that takes overrides, so a key for another topic
    (a misspelt name) or another policy is one nobody reads."""
    return set(parameter_overrides(node)) - declared_names(node)


# --------------------------------------------------------------------------------------------
# rclpy part (imported lazily)
# --------------------------------------------------------------------------------------------

def _descriptor(s: Spec):
    from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor

    desc = s.description + (" Settable at run time." if s.tunable else
                            " Settable while the node is unconfigured." if s.configure_time else "")
    d = ParameterDescriptor(name=s.name, description=desc, read_only=not (s.tunable or s.configure_time))
    if s.choices is not None:
        d.additional_constraints = "one of: " + ", ".join(s.choices)
    if s.lo is not None and not isinstance(s.default, list):
        if isinstance(s.default, float):
            d.floating_point_range = [FloatingPointRange(from_value=float(s.lo), to_value=float(s.hi), step=0.0)]
        else:
            d.integer_range = [IntegerRange(from_value=int(s.lo), to_value=int(s.hi), step=1)]
    if s.length is not None:
        d.additional_constraints = f"exactly {s.length} entries"
    return d


def widen_integer(s: Spec | None, p):
    """``p`` (an rclpy Parameter) as a double (array) when ``s`` is a float (array) setting and ``p`` holds integers:
    a YAML ``33`` or ``ros2 param set ... period_ms 40`` for a double parameter is taken as that double."""
    from rclpy.parameter import Parameter

    if s is None:
        return p
    if isinstance(s.default, float) and p.type_ == Parameter.Type.INTEGER:
        return Parameter(p.name, Parameter.Type.DOUBLE, float(p.value))
    if isinstance(s.default, list) and s.default and isinstance(s.default[0], float) \
            and p.type_ == Parameter.Type.INTEGER_ARRAY:
        return Parameter(p.name, Parameter.Type.DOUBLE_ARRAY, [float(x) for x in p.value])
    return p


def declare_and_read(node, specs) -> dict[str, Any]:
    """Declare every parameter of ``specs`` on ``node`` and return their values.

    Integers given for float parameters are accepted (``period_ms: 33``); any other type or range
    problem becomes a ParamError naming the parameter.
    """
    from rclpy.exceptions import InvalidParameterTypeException, InvalidParameterValueException

    values = {}
    problems = []
    overrides = parameter_overrides(node)
    for s in specs:
        desc = _descriptor(s)
        override = overrides.get(s.name)
        widened = widen_integer(s, override) if override is not None else None
        try:
            if widened is not None and widened is not override:
                # a YAML '33' for a double parameter: declared as 33.0 (the range still checked) instead of a failed
                # start-up; ignore_override: rclpy would apply the integer override and refuse its type
                p = node.declare_parameter(s.name, widened.value, desc, ignore_override=True)
            else:
                p = node.declare_parameter(s.name, s.default, desc)
            val = p.value
        except InvalidParameterTypeException as e:
            problems.append(f"{s.name}: wrong type ({e}); expected {type(s.default).__name__}")
            continue
        except InvalidParameterValueException:
            got = override
            problems.append(f"{s.name}={got.value if got is not None else '?'} is outside [{s.lo}, {s.hi}]")
            continue
        except Exception as e:  # noqa: BLE001 - e.g. ParameterUninitializedException, bad array element types
            problems.append(f"{s.name}: {e}")
            continue
        if isinstance(val, (list, tuple)) or type(val).__name__ == "array":
            val = list(val)
        values[s.name] = val
    if problems:
        raise ParamError("; ".join(problems))
    return values


def _plain(v):
    if isinstance(v, (list, tuple)) or type(v).__name__ in ("array", "ndarray"):
        return [x.item() if hasattr(x, "item") else x for x in v]
    return v


def enable_runtime_updates(node, specs, values: dict[str, Any], apply=None, configured=lambda: True) -> None:
    """Let the ``tunable`` parameters of ``specs`` change while ``node`` runs (and the ``configure_time`` ones while
    ``configured()`` is false).

    A change is validated first (:func:`check_update` against ``values``, the node's current
    parameters): an impossible one is refused with SetParametersResult(successful=False, reason=...),
    and the node keeps its old values. An accepted one updates ``values`` and is handed to
    ``apply(changes)`` (called on the node's executor thread, like its timers). An integer for a double
    parameter is taken as that double (``ros2 param set /vla_edge period_ms 40``). Parameters rclpy itself
    declares (``use_sim_time``, ``qos_overrides.*``, ...) are left to rclpy.
    Register this after the parameters are declared (rclpy calls these callbacks on declaration too).
    """
    from rcl_interfaces.msg import SetParametersResult

    table = {s.name: s for s in specs}

    def widen_integers(params):
        return [widen_integer(table.get(p.name), p) for p in params]

    def ours(params) -> dict:
        return {p.name: _plain(p.value) for p in params if p.name in table}

    def on_set(params):
        changes = ours(params)
        if not changes:
            return SetParametersResult(successful=True)
        problems = check_update(values.as_dict() if isinstance(values, Settings) else values, changes, specs,
                                configured=configured())
        if problems:
            reason = "; ".join(problems)
            node.get_logger().warn(f"parameter change refused: {reason}")
            return SetParametersResult(successful=False, reason=reason)
        return SetParametersResult(successful=True)

    def post_set(params):
        changes = ours(params)
        if not changes:
            return
        values.update(changes)
        if apply is not None:
            apply(changes)
        node.get_logger().info("parameters set at run time: " + ", ".join(f"{k}={_fmt(v)}" for k, v in changes.items()))

    node.add_pre_set_parameters_callback(widen_integers)
    node.add_on_set_parameters_callback(on_set)
    node.add_post_set_parameters_callback(post_set)
