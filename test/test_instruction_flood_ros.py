# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Instruction floods over real DDS never cost a deadline (issue 43, item 3): 1000 ~/instruction messages a second for
5 s (they used to cost a miss), and 10 MB messages as fast as they go (3 misses and a missed tick before): each
message is coalesced before any work (only the latest is rendered, off the executor thread), a message too long to be
an instruction is refused by its length before it is copied, and the loop publishes every tick on time meanwhile.
The topic is taken in the camera process (instruction_mailbox.py): rclpy's take of a 10 MB message in the control
process held its interpreter lock ~20 ms and cost 1-4 missed ticks in every run of this file."""
from __future__ import annotations

import time

import pytest

from cpu_waits import CpuWaits, check_misses
from ros_helpers import Listener, plumbing_period_ms, start_replay, start_vla_edge

pytestmark = [pytest.mark.ros, pytest.mark.slow, pytest.mark.exclusive]  # no late cycle: runs alone (conftest)

from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402
from std_msgs.msg import String  # noqa: E402

LATCHED = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
CHAT = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def chat_gguf(tmp_path_factory):
    """The micro preset as a GGUF with a chat template: every instruction renders in the template's child."""
    from vla_edge_ros.model.checkpoint import load_model
    from vla_edge_ros.model.generate import make_model
    from vla_edge_ros.model.gguf import save_gguf

    d = tmp_path_factory.mktemp("flood_gguf")
    make_model(str(d / "micro"), "micro", seed=0)
    return save_gguf(d / "micro.gguf", load_model(str(d / "micro")), "F32", "F32", chat_template=CHAT,
                     control_tokens=("<|im_start|>", "<|im_end|>"))


def _bag(tmp_path):
    from vla_edge_ros.synthetic_bag import make_test_bag

    return make_test_bag(tmp_path / "bag", frames=60, fps=30.0, storage="sqlite3")


def _active(lst):
    return [v for _, v, _ in lst.cycles if v["source"] == "model"]


def _flood(domain, tmp_path, procs, model, send, seconds: float, settled=None):
    """Run vla_edge, wait for model actions, call `send(pub, i)` in a loop for `seconds`; the cycles meanwhile and
    after, the last /diagnostics and the node's output, once every cycle is judged on time (`_on_time`)."""
    lst = Listener(domain)
    pub = lst.node.create_publisher(String, "/vla_edge/instruction", LATCHED)
    waits = None
    try:
        node = start_vla_edge(procs, domain, tmp_path, model, {"instruction": "go left", "realtime_priority": 10},
                              remaps=[("image", "/camera/image_raw")])
        waits = CpuWaits(node.p.pid).start()
        start_replay(procs, domain, tmp_path, _bag(tmp_path), "--loop")
        lst.wait_for(lambda: any(v.get("instruction") == "go left" for v in _active(lst)), 90,
                     "model actions under the start-up instruction")
        n0, i, t_end = len(lst.cycles), 0, time.monotonic() + seconds
        while time.monotonic() < t_end:
            send(pub, i)
            i += 1
        time.sleep(2.0)
        takers = {i.node_name for i in lst.node.get_subscriptions_info_by_topic("/vla_edge/instruction")}
        assert takers == {"vla_camera"}, takers  # taken in the camera process, never in the control process
        if settled is not None:  # the last message's change, once its render and prefill are done
            lst.wait_for(lambda: settled(lst, i), 30, "the last instruction of the flood in ~/cycle")
        every = list(lst.cycles)
        after = [v for _, v, _ in every[n0:]]
        d = lst.last_diag()
    finally:
        lst.close()
        if waits is not None:
            waits.stop()
    out = node.output()
    assert node.stop() == 0, out[-3000:]
    assert "Traceback" not in out
    _on_time(every, after, waits, d)
    return i, after, d, out


def _on_time(every, after, waits, d):
    """No tick late or skipped by the node's doing, through the flood and before it (a host that kept the node off
    the CPU owns its misses: cpu_waits)."""
    assert len(after) > 30, len(after)  # 7 s at the plumbing period (33 ms idle, up to ~90 ms under -f 3)
    misses = check_misses(every, waits, plumbing_period_ms(), int(d["deadline_misses"]))
    print(f"[flood ros] {len(after)} cycles in and after the flood, {len(misses)} misses (the host's)")


def test_1000_instructions_a_second_cost_no_deadline(domain, tmp_path, procs, chat_gguf):
    def send(pub, i):
        pub.publish(String(data=f"go to spot {i}"))
        time.sleep(0.001)

    def last_applied(lst, n):
        return any(v.get("instruction") == f"go to spot {n - 1}" for v in _active(lst)[-5:])

    n, after, d, out = _flood(domain, tmp_path, procs, chat_gguf, send, 5.0, settled=last_applied)
    print(f"[flood ros] {n} instructions in 5 s, {d['instruction_renders']} renders")
    assert n >= 500, n  # a flood: ~3000 in 5 s on this 2-core host idle, ~1250 under slow_host.sh -f 3
    assert after[-1].get("instruction") == f"go to spot {n - 1}"  # the latest won; the rest coalesced unrendered
    assert int(d["instruction_changes"]) < n // 10
    # coalesced before any work: at most one render a tick (the start-up probe and "go left" included), never one a
    # message (dev/mutants/node_instruction_flood_not_coalesced.patch renders ~3,600 here)
    assert int(d["instruction_renders"]) <= len(after) + 2, (d["instruction_renders"], len(after), n)


def test_10_mb_instructions_as_fast_as_they_go_cost_no_deadline(domain, tmp_path, procs, chat_gguf):
    big = "x" * (10 << 20)

    def send(pub, i):
        pub.publish(String(data=big))

    n, after, d, out = _flood(domain, tmp_path, procs, chat_gguf, send, 5.0)
    print(f"[flood ros] {n} messages of 10 MB in 5 s")
    assert d["instruction"] == "go left" and int(d["instruction_refused"]) >= 1
    assert "refused before it is copied" in d["instruction_last_refusal"]
