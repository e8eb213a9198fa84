# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The two launch files, checked without launch_ros (not on PyPI) and, where it is importable, with it.

The full check against the real Jazzy launch/launch_ros (start the bringup, read its parameters back)
is scripts/launch_check.sh; this test keeps what it verified from regressing in CI:

* every parameter argument defaults to '' and sets its parameter only when given, so a params file
  decides everything that is not given on the command line;
* the .py and the .yaml declare the same arguments with the same defaults and treat them alike
  (booleans normalised, the action remap conditional);
* namespace, use_sim_time, log_level, action_topic and trajectory_topic exist.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[1]
PY = ROOT / "launch" / "vla_edge.launch.py"
YAML = ROOT / "launch" / "vla_edge.launch.yaml"
PARAMS = ("model_path", "make_tiny_model", "policy", "backend", "transport", "qos_reliability", "use_sim_time",
          "action_type", "autostart")
BOOLS = ("make_tiny_model", "use_sim_time", "autostart")
OTHER_ARGS = ("params_file", "image_topic", "action_topic", "trajectory_topic", "joint_states_topic", "namespace",
              "log_level")
# topics a launch argument remaps
REMAPS = (("~/action", "action_topic"), ("~/action_chunk", "trajectory_topic"),
          ("~/joint_states", "joint_states_topic"))


def _yaml_entries():
    return yaml.safe_load(YAML.read_text())["launch"]


def yaml_args() -> dict[str, str]:
    return {e["arg"]["name"]: str(e["arg"].get("default")) for e in _yaml_entries() if "arg" in e}


def _yaml_group():
    groups = [e["group"] for e in _yaml_entries() if "group" in e]
    assert len(groups) == 1
    return groups[0]


def _py_module():
    return ast.parse(PY.read_text())


def py_param_args() -> dict[str, str]:
    for node in ast.walk(_py_module()):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "PARAM_ARGS":
            return ast.literal_eval(node.value)
    raise AssertionError("PARAM_ARGS not found in the .py launch file")


def py_declared_args() -> dict[str, str]:
    """Arguments declared literally (DeclareLaunchArgument("name", default_value="...")) plus PARAM_ARGS ('')."""
    out = {name: "" for name in py_param_args()}
    for node in ast.walk(_py_module()):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "DeclareLaunchArgument":
            if node.args and isinstance(node.args[0], ast.Constant):
                kw = {k.arg: k.value for k in node.keywords}
                default = kw.get("default_value")
                out[node.args[0].value] = default.value if isinstance(default, ast.Constant) else "<substitution>"
    return out


def _calls(name: str) -> list[ast.Call]:
    return [n for n in ast.walk(_py_module()) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == name]


def test_both_files_declare_the_same_arguments():
    y, p = yaml_args(), py_declared_args()
    assert set(y) == set(p) == set(PARAMS) | set(OTHER_ARGS)
    for name in PARAMS + ("action_topic", "trajectory_topic", "namespace"):
        assert y[name] == "" and p[name] == "", name
    assert y["log_level"] == p["log_level"] == "info"
    assert y["image_topic"] == p["image_topic"] == "/camera/image_raw"
    assert y["joint_states_topic"] == p["joint_states_topic"] == "/joint_states"
    assert "config/vla_edge.yaml" in y["params_file"]


def test_yaml_sets_a_parameter_only_when_its_argument_is_given():
    children = _yaml_group()["children"]
    assert _yaml_group().get("scoped", True) is True
    assert children[0] == {"set_parameters_from_file": {"filename": "$(var params_file)"}}
    sets = {c["set_parameter"]["name"]: c["set_parameter"] for c in children if "set_parameter" in c}
    assert set(sets) == set(PARAMS)
    unset = [e["let"] for e in _yaml_entries() if "let" in e and e["let"]["name"] == "unset"]
    assert unset and unset[0]["value"] == ""
    for name, entry in sets.items():
        assert entry["if"] == f"$(not-equals $(var {name}) $(var unset))", name
        want = f"$(if $(var {name}) true false)" if name in BOOLS else f"$(var {name})"
        assert entry["value"] == want, name
    remaps = [c["set_remap"] for c in children if "set_remap" in c]
    assert remaps == [{"from": topic, "to": f"$(var {arg})", "if": f"$(not-equals $(var {arg}) $(var unset))"}
                      for topic, arg in REMAPS]
    node = [c["node"] for c in children if "node" in c][0]
    assert "param" not in node, "a node-level param list would override the params file unconditionally"
    assert node["namespace"] == "$(var namespace)"
    assert node["ros_args"] == "--log-level $(var log_level)"


def test_py_sets_a_parameter_only_when_its_argument_is_given():
    assert set(py_param_args()) == set(PARAMS)
    src = PY.read_text()
    assert re.search(r"BOOL_PARAMS = \(\"make_tiny_model\", \"use_sim_time\", \"autostart\"\)", src)
    node = _calls("Node")
    assert len(node) == 1
    kwargs = {k.arg for k in node[0].keywords}
    assert "parameters" not in kwargs, "Node(parameters=...) would override the params file unconditionally"
    assert {"namespace", "ros_arguments", "remappings"} <= kwargs
    set_param = _calls("SetParameter")
    assert len(set_param) == 1 and any(k.arg == "condition" for k in set_param[0].keywords)
    remap = _calls("SetRemap")
    assert [r.args[0].value for r in remap] == [topic for topic, _ in REMAPS]
    assert all(any(k.arg == "condition" for k in r.keywords) for r in remap)
    assert _calls("SetParametersFromFile")
    groups = _calls("GroupAction")
    assert len(groups) == 1


def test_with_the_real_launch_packages():
    """Where launch + launch_ros import (a ROS install, or scripts/launch_check.sh's scratch folder)."""
    pytest.importorskip("launch_ros")
    pytest.importorskip("launch_yaml")
    import importlib.util

    from launch.frontend import Parser

    spec = importlib.util.spec_from_file_location("vla_edge_launch", PY)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    py_ld = mod.generate_launch_description()
    root, parser = Parser.load(str(YAML))
    yaml_ld = parser.parse_description(root)
    names = [{a.name for a in ld.get_launch_arguments()} for ld in (py_ld, yaml_ld)]
    assert names[0] == names[1] == set(PARAMS) | set(OTHER_ARGS)


def test_node_unnamed_and_fast_dds_profile():
    # A node name becomes __node:= and would rename both nodes of the process.
    node = [c["node"] for c in _yaml_group()["children"] if "node" in c][0]
    assert node["pkg"] == "vla_edge_ros" and node["exec"] == "vla_edge" and "name" not in node
    assert not any(k.arg == "name" for k in _calls("Node")[0].keywords)
    remaps = {r["from"]: r["to"] for r in node["remap"]}
    assert remaps == {"image": "$(var image_topic)", "image/compressed": "$(var image_topic)/compressed"}
    # the shared-memory profile goes to the camera process only (issue 20): never FASTRTPS_DEFAULT_PROFILES_FILE,
    # which the reasoning process would take as the user's own transport choice
    from vla_edge_ros.nodes.bringup import CAMERA_PROFILE_VAR, PROFILE_VARS

    env = [e["set_env"] for e in _yaml_entries() if "set_env" in e]
    assert [e["name"] for e in env] == [CAMERA_PROFILE_VAR]
    assert env[0]["value"].endswith("/config/fastdds_shm.xml")
    src = PY.read_text()
    assert f'"{CAMERA_PROFILE_VAR}"' in src and '"fastdds_shm.xml"' in src
    assert not any(v in src or v in YAML.read_text() for v in PROFILE_VARS)

    import xml.etree.ElementTree as ET

    x = ET.parse(ROOT / "config" / "fastdds_shm.xml").getroot()
    ns = {"d": "http://www.eprosima.com/XMLSchemas/fastRTPS_Profiles"}
    seg = x.find(".//d:transport_descriptor[d:type='SHM']/d:segment_size", ns)
    assert seg is not None and int(seg.text) == 8 * 1024 * 1024
    assert x.find(".//d:participant[@is_default_profile='true']", ns) is not None


def test_monitoring_configs_match_what_the_node_publishes():
    """config/diagnostics_analyzers.yaml expects the status names the node publishes on /diagnostics, and
    config/vla_edge.rviz shows the debug image with a QoS that matches its publisher (best effort)."""
    agg = yaml.safe_load((ROOT / "config" / "diagnostics_analyzers.yaml").read_text())
    params = agg["analyzers"]["ros__parameters"]
    nodes = ROOT / "vla_edge_ros" / "nodes"
    # the node and its outputs (the /diagnostics roll-up, the ~/cycle status, the debug image)
    node_src = "\n".join((nodes / f).read_text() for f in ("reasoning_node.py", "diagnostics_output.py",
                                                           "debug_image.py"))
    # status names are the node's full name without the leading slash (the namespace keeps robots apart)
    assert 'self.status_prefix = self.get_fully_qualified_name().lstrip("/")' in node_src
    for key, prefix in (("vla_edge", "vla_edge"), ("robot1_vla_edge", "robot1/vla_edge")):
        analyzer = params[key]
        assert analyzer["type"] == "diagnostic_aggregator/GenericAnalyzer"
        for name in analyzer["expected"]:
            node, what = name.split(": ")
            assert node == prefix and re.search(r'name=f"\{(self|n)\.status_prefix\}: ' + what + '"', node_src), name
            assert any(name.startswith(p) for p in analyzer["startswith"])
    rviz = yaml.safe_load((ROOT / "config" / "vla_edge.rviz").read_text())
    (image,) = [d for d in rviz["Visualization Manager"]["Displays"] if d["Class"] == "rviz_default_plugins/Image"]
    assert image["Topic"]["Value"] == "/vla_edge/debug_image"
    assert image["Topic"]["Reliability Policy"] == "Best Effort"
    assert '"~/debug_image", qos_profile_sensor_data' in node_src
    setup = (ROOT / "setup.py").read_text()
    assert 'glob("config/*.yaml")' in setup and 'glob("config/*.rviz")' in setup


def test_the_choices_named_in_both_files_are_the_cores():
    """The argument descriptions list the names the core owns (eviction.POLICY_NAMES, engine.BACKENDS, the camera's
    settings), in both files: a policy or backend added to the core and not to the launch files fails here."""
    from vla_edge_ros.engine import BACKENDS
    from vla_edge_ros.eviction import POLICY_NAMES
    from vla_edge_ros.settings import RELIABILITIES, TRANSPORTS

    owners = {"policy": POLICY_NAMES, "backend": BACKENDS, "transport": TRANSPORTS, "qos_reliability": RELIABILITIES}
    y = {e["arg"]["name"]: e["arg"].get("description", "") for e in _yaml_entries() if "arg" in e}
    p = py_param_args()
    for arg, names in owners.items():
        for text in (y[arg], p[arg]):
            assert all(re.search(rf"\b{n}\b", text) for n in names), (arg, names, text)
            assert text.count("|") == len(names) - 1, (arg, names, text)  # and no other choice
