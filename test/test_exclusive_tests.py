# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""conftest's `exclusive` tests, and every `ros` test, run while no other test runs under the test command's two
xdist workers (scripts/test.sh, `-n 2 --dist loadfile`): a ROS test against the clock must not share the 2-core host
with another file's work."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))

RECORD = """
import os, time
import pytest

def rec(tag, seconds):
    t0 = time.monotonic()
    time.sleep(seconds)
    with open(os.environ["LOCK_LOG"], "a") as f:
        f.write(f"{tag} {t0} {time.monotonic()}\\n")
"""


def test_an_exclusive_test_runs_alone_and_the_other_worker_goes_on_after_it(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "conftest.py").write_text(textwrap.dedent(f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("vla_edge_tests_conftest", {os.path.join(HERE, "conftest.py")!r})
        suite = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(suite)
        pytest_configure = suite.pytest_configure
        pytest_runtest_protocol = suite.pytest_runtest_protocol
    """))
    (tmp_path / "tests" / "test_a_exclusive.py").write_text(RECORD + textwrap.dedent("""
        def test_warm():
            rec("S", 0.3)

        @pytest.mark.exclusive
        def test_alone():
            rec("X", 1.5)

        @pytest.mark.ros
        def test_a_ros_test_alone():
            rec("X", 1.0)
    """))
    (tmp_path / "tests" / "test_b_shared.py").write_text(RECORD + "".join(
        f"\ndef test_{i}():\n    rec('S', 0.25)\n" for i in range(12)))
    log = tmp_path / "log.txt"
    # a pytest of its own: none of this run's options (colcon passes them in PYTEST_ADDOPTS, its --basetemp among
    # them, which the inner run would empty under this one) and none of its xdist worker's variables
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS" and not k.startswith("PYTEST_XDIST")}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile",
                        "--rootdir", str(tmp_path), "-c", os.devnull, "--basetemp", str(tmp_path / "inner_tmp"),
                        str(tmp_path / "tests")],
                       env=dict(env, LOCK_LOG=str(log)), capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    spans = [(tag, float(a), float(b)) for tag, a, b in (line.split() for line in log.read_text().splitlines())]
    alone = [s for s in spans if s[0] == "X"]
    others = [s for s in spans if s[0] == "S"]
    assert len(alone) == 2 and len(others) == 13, spans
    overlapping = [(x, s) for x in alone for s in others if s[1] < x[2] and s[2] > x[1]]
    assert not overlapping, overlapping
    assert any(s[1] >= alone[0][2] for s in others), "the other worker never went on after the exclusive test"
