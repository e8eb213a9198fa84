# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The test-only fault injection of the reasoning node is off unless VLA_EDGE_TEST_FAULT_FILE is set.

Behaviour, not source text: the real `vla_edge` bringup runs as an OS process over real DDS WITHOUT the
variable, while files sit at the places a default fault path would most likely point to (the process's
TMPDIR, under the names the switch goes by). Frames arrive from a replayed bag; the node must produce
model actions, no `engine_error` cycle, no engine error in /diagnostics, and no fault-injection warning.
(test_reliability_ros.py shows the other half: with the variable set, the file switches faults on and off.)
Helpers: ros_helpers.py, fixtures: conftest.py.
"""
from __future__ import annotations

import pytest

rclpy = pytest.importorskip("rclpy")

from ros_helpers import Listener, start_replay, start_vla_edge  # noqa: E402

pytestmark = [pytest.mark.ros, pytest.mark.slow]

FAULT_ENV = "VLA_EDGE_TEST_FAULT_FILE"
DEFAULT_LOOKING_NAMES = ("vla_edge_test_fault", "vla_edge_fault", "VLA_EDGE_TEST_FAULT_FILE", "fault", "fail_now")


def test_no_fault_without_the_env_var_even_with_fault_files_present(domain, tmp_path, procs, micro_model,
                                                                    monkeypatch):
    from vla_edge_ros.synthetic_bag import make_test_bag

    monkeypatch.delenv(FAULT_ENV, raising=False)  # the node inherits this process's environment
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    for name in DEFAULT_LOOKING_NAMES:
        (tmpdir / name).write_text("fail\n")
        (tmp_path / name).write_text("fail\n")
    bag = make_test_bag(tmp_path / "bag", frames=30, fps=30.0, width=160, height=120)
    node = start_vla_edge(procs, domain, tmp_path, micro_model, {}, remaps=[("image", "/camera/image_raw")],
                          extra_env={"TMPDIR": str(tmpdir), "TMP": str(tmpdir), "TEMP": str(tmpdir)})
    lst = Listener(domain)
    try:
        lst.wait_for(lambda: len(lst.actions) > 5 or not node.alive(), 60, "the first actions of vla_edge")
        assert node.alive(), node.output()[-3000:]
        start_replay(procs, domain, tmp_path, bag, "--loop")

        def count(reason):
            return sum(v["reason"] == reason for _, v, _ in lst.cycles)

        # Either enough model actions, or enough engine errors to know a fault is on: fail fast on the latter.
        lst.wait_for(lambda: count("fresh") >= 10 or count("engine_error") >= 3, 60, "fresh model actions")
        lst.wait_for(lambda: len(lst.diags) >= 1, 10, "/diagnostics")
        with lst.lock:
            reasons = [v["reason"] for _, v, _ in lst.cycles]
            errors = [v.get("error", "") for _, v, _ in lst.cycles if v["reason"] == "engine_error"]
        assert "engine_error" not in reasons, f"{len(errors)} engine errors without {FAULT_ENV}: {errors[:2]}"
        assert reasons.count("fresh") >= 10
        diag = lst.last_diag()
        assert int(diag.get("engine_errors", 0)) == 0 and int(diag.get("fallback_engine_error", 0)) == 0, diag
        assert node.alive(), node.output()[-3000:]
    finally:
        lst.close()
    assert node.stop() == 0, node.output()[-3000:]
    out = node.output()
    assert "fault injection enabled" not in out and "injected fault" not in out, out[-3000:]
