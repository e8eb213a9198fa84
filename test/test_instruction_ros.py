# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Instructions over real DDS (DESIGN.md §8): ~/instruction (reliable, transient local) and the `instruction`
parameter change the task of a running `vla_edge`; a change is visible in ~/cycle, costs only instruction_change
fallbacks and never a deadline; a node that starts after the task was published gets it; every bad input is one
warning, a count in /diagnostics, and the previous instruction stays."""
from __future__ import annotations

import time

import pytest

from cpu_waits import CpuWaits, check_misses
from ros_helpers import Listener, plumbing_period_ms, start_replay, start_vla_edge

pytestmark = [pytest.mark.ros, pytest.mark.slow]

from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402
from std_msgs.msg import String  # noqa: E402

LATCHED = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)


@pytest.fixture(scope="module")
def micro_gguf(tmp_path_factory):
    """The micro preset as a GGUF with a byte-level vocabulary: a fast model that has a tokenizer."""
    from vla_edge_ros.model.checkpoint import load_model
    from vla_edge_ros.model.gguf import save_gguf
    from vla_edge_ros.model.generate import make_model

    d = tmp_path_factory.mktemp("micro_gguf")
    make_model(str(d / "micro"), "micro", seed=0)
    return save_gguf(d / "micro.gguf", load_model(str(d / "micro")), "F32", "F32")


def _bag(tmp_path):
    from vla_edge_ros.synthetic_bag import make_test_bag

    return make_test_bag(tmp_path / "bag", frames=60, fps=30.0, storage="sqlite3")


def _active(lst):
    return [v for _, v, _ in lst.cycles if v["source"] == "model"]


@pytest.mark.exclusive  # asserts no late cycle: runs alone (conftest)
def test_a_latched_instruction_reaches_a_late_node_and_a_change_costs_no_deadline(domain, tmp_path, procs,
                                                                                  micro_gguf):
    lst = Listener(domain)
    pub = lst.node.create_publisher(String, "/vla_edge/instruction", LATCHED)
    pub.publish(String(data="pick up the red cup"))  # before the node exists: transient local keeps it
    waits = None
    try:
        # realtime_priority, as the other deadline tests: a fresh-clone CI run without it saw one cycle at 35.3 ms
        node = start_vla_edge(procs, domain, tmp_path, micro_gguf, {"realtime_priority": 10},
                              remaps=[("image", "/camera/image_raw")])
        waits = CpuWaits(node.p.pid).start()
        start_replay(procs, domain, tmp_path, _bag(tmp_path), "--loop")
        lst.wait_for(lambda: any(v.get("instruction") == "pick up the red cup" for v in _active(lst)), 90,
                     "model actions under the instruction published before the node started")
        v = _active(lst)[-1]
        assert int(v["instruction_tokens"]) == len("pick up the red cup")  # one token per byte in this vocabulary
        # The misses counted from here on are the change's. A miss before (the bag's player and this listener starting
        # next to the node on two cores; a fresh-clone run once saw a 33.35 ms start-up cycle) is printed, not judged:
        # test_frame_quality_ros and test_instruction_flood_ros judge their whole run's count, start-up included. The
        # count is the one published after n0, so no miss falls between the count taken and the window's first cycle.
        n0, k0 = len(lst.cycles), len(lst.diags)
        lst.wait_for(lambda: len(lst.diags) > k0, 10, "a /diagnostics status after the first instruction drove")
        misses0 = int(lst.last_diag()["deadline_misses"])
        pub.publish(String(data="follow the corridor"))
        lst.wait_for(lambda: any(v.get("instruction") == "follow the corridor" for v in _active(lst)), 30,
                     "model actions under the new instruction")
        time.sleep(1.0)
        after = [v for _, v, _ in lst.cycles[n0:]]
        reasons = [v["reason"] for v in after]
        changing = [v for v in after if v["reason"] == "instruction_change"]
        assert changing, reasons
        assert all(v["source"] == "fallback" and v["action"].startswith("0.0000,0.0000") for v in changing)
        first_new = next(i for i, v in enumerate(after) if v.get("instruction") == "follow the corridor"
                         and v["source"] == "model")
        assert all(v.get("instruction") != "pick up the red cup" for v in after[first_new:])  # never mixed
        d = lst.last_diag()
        assert d["instruction"] == "follow the corridor" and int(d["instruction_changes"]) >= 2
        print(f"[instruction ros] {len(lst.cycles)} cycles, {n0} before the change ({misses0} deadline misses)")
        # none the node owns from the change on (a host that kept the node off the CPU owns its misses: cpu_waits)
        with lst.lock:
            stream = list(lst.cycles)
        check_misses(stream[n0:], waits, plumbing_period_ms(), int(d["deadline_misses"]) - misses0,
                     before=stream[n0 - 1] if n0 else None)
        assert int(d["fallback_instruction_change"]) >= len(changing)
    finally:
        lst.close()
        if waits is not None:
            waits.stop()
    out = node.output()
    assert node.stop() == 0, out[-3000:]
    assert "instruction from topic" in out and "Traceback" not in out


def _cdr_string(payload: bytes) -> bytes:
    """A std_msgs/String serialized by hand (CDR little endian: header, length with the NUL, bytes, NUL)."""
    n = len(payload) + 1
    return b"\x00\x01\x00\x00" + n.to_bytes(4, "little") + payload + b"\x00" + b"\x00" * (-(8 + n) % 4)


def test_bad_instructions_are_one_warning_each_and_the_previous_stays(domain, tmp_path, procs, micro_gguf):
    from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
    from rcl_interfaces.srv import SetParameters

    lst = Listener(domain)
    pub = lst.node.create_publisher(String, "/vla_edge/instruction", LATCHED)
    try:
        node = start_vla_edge(procs, domain, tmp_path, micro_gguf, {"instruction": "go left"},
                              remaps=[("image", "/camera/image_raw")])
        start_replay(procs, domain, tmp_path, _bag(tmp_path), "--loop")
        lst.wait_for(lambda: any(v.get("instruction") == "go left" for v in _active(lst)), 90,
                     "model actions under the start-up instruction")
        bad = [("", "empty"), ("\x01\x02\x1b", "control characters only"), ("x" * (1 << 20), "longer than 4096"),
               (_cdr_string(b"go \xff\xfe right"), "not valid UTF-8")]
        for i, (data, why) in enumerate(bad):
            pub.publish(data if isinstance(data, bytes) else String(data=data))
            lst.wait_for(lambda: lst.diags and int(lst.diags[-1][1].get("instruction_refused", 0)) >= i + 1, 20,
                         f"the refusal of bad instruction {i} ({why}) in /diagnostics")
            assert why in lst.last_diag()["instruction_last_refusal"]
        # the parameter path: a refused value is refused to the caller, with the reason
        cli = lst.node.create_client(SetParameters, "/vla_edge/set_parameters")
        assert cli.wait_for_service(timeout_sec=10.0)

        def set_instruction(text):
            req = SetParameters.Request()
            req.parameters = [Parameter(name="instruction", value=ParameterValue(
                type=ParameterType.PARAMETER_STRING, string_value=text))]
            fut = cli.call_async(req)
            lst.wait_for(fut.done, 10, "set_parameters")
            return fut.result().results[0]

        r = set_instruction("\x07\x07")
        assert not r.successful and "control characters only" in r.reason
        time.sleep(1.5)
        d = lst.last_diag()
        assert d["instruction"] == "go left" and int(d["instruction_changes"]) == 0
        assert all(v.get("instruction") == "go left" for v in _active(lst))
        assert set_instruction("turn around").successful
        lst.wait_for(lambda: any(v.get("instruction") == "turn around" for v in _active(lst)), 30,
                     "model actions under the instruction set by parameter")
    finally:
        lst.close()
    out = node.output()
    assert node.stop() == 0, out[-3000:]
    assert out.count("refused") >= 5 and "Traceback" not in out


def test_a_model_without_a_tokenizer_says_so_and_keeps_its_prompt(domain, tmp_path, procs, micro_model):
    node = start_vla_edge(procs, domain, tmp_path, micro_model, {"instruction": "pick up the cup"})
    lst = Listener(domain)
    try:
        lst.wait_for(lambda: lst.diags and "instruction_last_refusal" in lst.diags[-1][1], 90, "/diagnostics")
        d = lst.last_diag()
        assert "no tokenizer" in d["instruction_last_refusal"] and d["instruction"] == ""
    finally:
        lst.close()
    out = node.output()
    assert node.stop() == 0, out[-3000:]
    assert "instruction refused at start-up" in out


def test_replay_publishes_an_instruction_with_the_bag(domain, tmp_path, procs, micro_gguf):
    node = start_vla_edge(procs, domain, tmp_path, micro_gguf, {}, remaps=[("image", "/camera/image_raw")])
    lst = Listener(domain)
    try:
        start_replay(procs, domain, tmp_path, _bag(tmp_path), "--loop", "--instruction", "go to the dock")
        lst.wait_for(lambda: any(v.get("instruction") == "go to the dock" for v in _active(lst)), 90,
                     "model actions under the instruction vla-edge-replay published")
    finally:
        lst.close()
    assert node.stop() == 0, node.output()[-3000:]


def test_the_demo_shows_its_instruction(domain, micro_gguf):
    import os
    import subprocess
    import sys

    from ros_helpers import ROOT

    r = subprocess.run([sys.executable, "-m", "vla_edge_ros.tools.demo", "--model", micro_gguf, "--seconds", "3",
                        "--kv-capacity", "512", "--period-ms", "100", "--instruction", "pick up the cup: it's red"],
                       capture_output=True, text=True, timeout=300, cwd=str(ROOT),
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("instruction"))
    assert "pick up the cup: it's red" in line and "(25 tokens" in line and "refused" not in line, line
