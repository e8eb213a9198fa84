# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""A hostile chat template never stops a running `vla_edge` (issue 43, item 1), over real DDS: the model's template
runs away (10^10 iterations, 100 MB of output, range(10**9)) for some instructions; each such instruction, by topic
and by parameter, is one refusal while the loop publishes every tick on time, the previous instruction drives on,
and SIGINT still stops the node at once."""
from __future__ import annotations

import re
import signal
import time

import pytest

from ros_helpers import Listener, start_replay, start_vla_edge

pytestmark = [pytest.mark.ros, pytest.mark.slow]

from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402
from std_msgs.msg import String  # noqa: E402

from test_robot_output_ros import set_params  # noqa: E402

LATCHED = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
CHAT = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
HOSTILE = ("{% set c = messages[-1].content %}"
           "{% if 'spin' in c %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
           "{% endif %}"
           "{% if 'burst' in c %}{{ 'x' * (messages | length * 50000000) }}{% endif %}"
           "{% if 'flood' in c %}{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}{% endif %}"
           "{% if 'range' in c %}{{ range(10**9) | list }}{% endif %}" + CHAT)
CASES = [("spin in place", "render budget"), ("burst forward", "memory cap"),
         ("flood the floor", "character cap"), ("range over the room", "OverflowError")]


@pytest.fixture(scope="module")
def hostile_gguf(tmp_path_factory):
    """The micro preset as a GGUF whose chat template runs away for some words (it renders the others)."""
    from vla_edge_ros.model.checkpoint import load_model
    from vla_edge_ros.model.generate import make_model
    from vla_edge_ros.model.gguf import save_gguf

    d = tmp_path_factory.mktemp("hostile_gguf")
    make_model(str(d / "micro"), "micro", seed=0)
    return save_gguf(d / "micro.gguf", load_model(str(d / "micro")), "F32", "F32", chat_template=HOSTILE,
                     control_tokens=("<|im_start|>", "<|im_end|>"))


def _bag(tmp_path):
    from vla_edge_ros.synthetic_bag import make_test_bag

    return make_test_bag(tmp_path / "bag", frames=60, fps=30.0, storage="sqlite3")


def _active(lst):
    return [v for _, v, _ in lst.cycles if v["source"] == "model"]


def _after(events, t):
    e = [(te, what) for te, what in events if te <= t]
    return f"{t - e[-1][0]:.2f} s after {e[-1][1]}" if e else "before the first"


@pytest.mark.exclusive  # asserts no late cycle: runs alone (conftest)
def test_hostile_instructions_cost_no_tick_and_sigint_still_stops_at_once(domain, tmp_path, procs, hostile_gguf):
    lst = Listener(domain)
    pub = lst.node.create_publisher(String, "/vla_edge/instruction", LATCHED)
    try:
        params = {"instruction": "go left", "realtime_priority": 10}  # as the other deadline tests
        node = start_vla_edge(procs, domain, tmp_path, hostile_gguf, params, remaps=[("image", "/camera/image_raw")])
        start_replay(procs, domain, tmp_path, _bag(tmp_path), "--loop")
        lst.wait_for(lambda: any(v.get("instruction") == "go left" for v in _active(lst)), 90,
                     "model actions under the start-up instruction")
        n0, refused, events = len(lst.cycles), 0, []  # (time, what was sent): a late cycle names what preceded it
        for text, why in CASES:
            events.append((time.monotonic(), f"topic {text!r}"))
            pub.publish(String(data=text))
            refused += 1
            lst.wait_for(lambda: lst.diags and int(lst.diags[-1][1].get("instruction_refused", 0)) >= refused, 20,
                         f"the refusal of {text!r} in /diagnostics")
            d = lst.last_diag()
            assert re.search(why, d["instruction_last_refusal"]), d["instruction_last_refusal"]
            time.sleep(1.0)  # a killed render child is replaced (~0.25 s)
            events.append((time.monotonic(), f"parameter {text!r}"))
            ok, reason = set_params(lst, "/vla_edge", instruction=text + " again")[0]
            assert not ok and "refused" in reason, reason
            time.sleep(1.0)
        events.append((time.monotonic(), "the flood"))
        for i in range(50):  # a flood of runaway renders: the latest waiting one is rendered, the rest dropped
            pub.publish(String(data=f"spin {i}"))
            time.sleep(0.01)
        time.sleep(2.0)
        after = [v for _, v, _ in lst.cycles[n0:]]
        assert len(after) > 100, len(after)
        # At most one late cycle, no tick missed: a fresh-clone run saw one (26.9 ms after a late tick start) while
        # a killed render child was replaced on the same 2 cores (BENCHMARKS.md, "Reliability round 5"); a render on
        # the control path freezes the loop for many cycles and misses ticks
        late = [f'{v["cycle_ms"]} ms (chunk {v.get("chunk_ms")} ms), {_after(events, t)}'
                for t, v, _ in lst.cycles[n0:] if v["late"] != "False"]
        missed = [f'{v["missed_before"]} tick(s) missed before a {v["cycle_ms"]} ms cycle, {_after(events, t)}'
                  for t, v, _ in lst.cycles[n0:] if int(v.get("missed_before", 0))]
        print(f"[template ros] {len(after)} cycles while hostile templates arrived; late: {late}; missed: {missed}")
        assert len(late) <= 1, late
        assert not missed, missed
        assert all(v.get("instruction") == "go left" for v in after if v["source"] == "model")
        d = lst.last_diag()
        assert d["instruction"] == "go left" and int(d["instruction_changes"]) == 0
        assert int(d["deadline_misses"]) <= 1 and int(d["missed_ticks"]) == 0, d
        pub.publish(String(data="spin once more"))  # SIGINT while a render runs away
        time.sleep(0.01)
        t = time.monotonic()
        node.signal(signal.SIGINT)
        node.p.wait(15)
        took = time.monotonic() - t
    finally:
        lst.close()
    out = node.output()
    assert node.p.returncode == 0, out[-3000:]
    print(f"[template ros] SIGINT to exit during a runaway render: {took:.2f} s")
    assert took < 1.0, f"{took:.2f} s to stop"
    assert "Traceback" not in out and "executor failed" not in out
    assert "render budget" in out and "character cap" in out and "OverflowError" in out
