# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Nothing non-finite becomes a command, and commands respect their limits (issue 19), below ROS: the twins, the
engine, the runtime's start-up refusal, the cycle's per-frame fallback, the bench, and CommandLimiter. The same
through the real node over DDS: test_robot_output_ros.py."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from overflow_models import KINDS, PHASE, make_overflow_model
from vla_edge_ros.admission import AdmissionController
from vla_edge_ros.command_limits import CommandLimiter
from vla_edge_ros.contract import NonFiniteOutput
from vla_edge_ros.cycle import ReasoningCycle
from vla_edge_ros.engine import Engine
from vla_edge_ros.frame_buffer import FrameBuffer
from vla_edge_ros.model import ops
from vla_edge_ros.runtime import Runtime, StartupError
from vla_edge_ros.settings import ReasoningSettings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def overflow(tmp_path_factory):
    base = tmp_path_factory.mktemp("overflow")
    return {k: make_overflow_model(str(base / k), k) for k in KINDS}


def test_argmax_twin_marks_a_non_finite_row():
    rng = np.random.default_rng()
    x = rng.standard_normal((4, 256)).astype(np.float32)
    x[1, rng.integers(256)] = np.nan
    x[2, rng.integers(256)] = np.inf
    x[3, :] = np.nan  # np.argmax alone says 0 here: bin 0, a real command
    got = ops.argmax_rows(x)
    assert got[0] == np.argmax(x[0]) and list(got[1:]) == [-1, -1, -1]


def test_rms_norm_of_an_overflowing_row_is_nan_not_zero():
    x = np.full((2, 64), 1.0, np.float32)
    x[1] *= np.float32(3e19)  # mean square 9e38 > float32 max: 1/sqrt(inf) would make the row all zeros
    y = ops.rms_norm(x, np.ones(64, np.float32), 1e-6)
    assert np.allclose(y[0], 1.0, atol=1e-5) and np.isnan(y[1]).all()


@pytest.mark.parametrize("backend", ["numpy", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("kind", KINDS)
def test_engine_raises_non_finite_with_the_phase(overflow, kind, backend):
    """Both backends: the CUDA head's argmax kernel marks the rows, its norms give NaN on overflow, as the twins."""
    eng = Engine(overflow[kind], backend=backend, kv_capacity_tokens=512)
    try:
        with pytest.raises(NonFiniteOutput) as e:
            eng.run_chunk(np.full((64, 128, 3), 100, np.uint8))
        assert e.value.phase == PHASE[kind] and e.value.timings is not None
        assert eng.cache.retained() == []  # the frame whose KV holds NaN is forgotten
    finally:
        eng.close()


@pytest.mark.parametrize("kind", KINDS)
def test_runtime_refuses_an_overflowing_model_at_start_up(overflow, kind):
    s = ReasoningSettings.from_values({"backend": "numpy", "kv_capacity_tokens": 512, "warmup_chunks": 2})
    with pytest.raises(StartupError) as e:
        Runtime.build(overflow[kind], s, FrameBuffer())
    msg = str(e.value)
    assert "\n" not in msg and "overflows during warm-up" in msg and f"in the {PHASE[kind]}" in msg, msg


def test_a_frame_that_overflows_is_a_non_finite_fallback(overflow):
    """A model that passed warm-up (warmup_chunks 0 here) and overflows later: fallback non_finite, counted, and
    never a model action, with `hold` too."""
    eng = Engine(overflow["final_norm"], backend="numpy", kv_capacity_tokens=512)
    fb = FrameBuffer()
    adm = AdmissionController(period_ms=10_000.0, safety_margin_ms=1.0)
    cyc = ReasoningCycle(eng, fb, adm, period_ms=10_000.0, safety_margin_ms=1.0, fallback="hold")
    try:
        for i in range(3):
            t_end = time.monotonic() + 10.0  # the worker clears `busy` just after the waiting thread wakes
            while eng.busy and time.monotonic() < t_end:
                time.sleep(0.01)
            fb.publish(np.full((64, 128, 3), 10 * i, np.uint8), stamp_ns=i)
            out = cyc.tick()
            assert (out.source, out.reason) == ("fallback", "non_finite"), (out.reason, out.error)
            assert "action logits" in out.error and np.all(np.asarray(out.action) == 0.0)
        assert cyc.non_finite == 3 and cyc.engine_errors == 0
    finally:
        eng.close()


def test_bench_refuses_an_overflowing_model_with_one_line(overflow, tmp_path):
    r = subprocess.run([sys.executable, "-m", "vla_edge_ros.tools.bench", "--clip", "synthetic", "--seconds", "1",
                        "--model", overflow["vision"], "--backend", "numpy", "--out", str(tmp_path / "o"), "--quiet"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 3, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and "Warning" not in ln and not ln.startswith("  ")]
    assert len(lines) == 1 and "overflows during warm-up, in the vision" in lines[0], r.stderr[-2000:]
    assert not (tmp_path / "o").exists()


# --- CommandLimiter ----------------------------------------------------------------------------------------------

def test_velocity_limits_clamp_each_axis_and_count():
    lim = CommandLimiter([0.25, 0.25, 0.0, 0.5, 0.5, 0.5])
    out, n = lim.apply([1.0, -0.1, 0.3, -0.9, 0.5, 0.2], t=0.0)
    assert out == [0.25, -0.1, 0.0, -0.5, 0.5, 0.2] and n == 3
    assert lim.clamped_velocity == 3 and lim.clamped_acceleration == 0


def test_acceleration_limit_uses_the_time_between_commands():
    lim = CommandLimiter([10.0] * 6, [1.0, 0.0, 0.0, 2.0, 0.0, 0.0], max_step_s=0.1, base_timeout_s=0.5)
    lim.apply([0.0] * 6, t=0.0)
    out, n = lim.apply([1.0, 1.0, 0.0, -1.0, 0.0, 0.0], t=0.1)
    assert out[0] == pytest.approx(0.1) and out[1] == 1.0 and out[3] == pytest.approx(-0.2) and n == 2
    out, _ = lim.apply([1.0, 1.0, 0.0, -1.0, 0.0, 0.0], t=0.15)
    assert out[0] == pytest.approx(0.15) and out[3] == pytest.approx(-0.3)
    # a stop ramps down at the same rate ...
    out, _ = lim.apply([0.0] * 6, t=0.2)
    assert out[0] == pytest.approx(0.1)
    # ... except the hard stop of a deactivate / shutdown
    assert lim.hard_stop(t=0.21) == [0.0] * 6
    out, _ = lim.apply([1.0] * 6, t=0.31)
    assert out[0] == pytest.approx(0.1)


def test_a_gap_in_commands_never_buys_a_larger_step():
    """Issue 30.1: the step is the limit x at most one period, however long the gap; after a gap longer than the
    base's command timeout, and for the first command ever or after reset (activate, configure), from zero."""
    acc, period = 0.2, 0.033
    lim = CommandLimiter([0.25] * 6, [acc] * 6, max_step_s=period, base_timeout_s=0.5)
    # the first command ever: from rest, one period's step
    out, _ = lim.apply([1.0] * 6, t=100.0)
    assert out == pytest.approx([acc * period] * 6)
    # a gap shorter than the base's timeout (the base held the last command): one period's step from it
    prev = out
    out, _ = lim.apply([1.0] * 6, t=100.4)
    assert out == pytest.approx([p + acc * period for p in prev])
    # a 2 s stall: the base stopped by itself, so from zero
    out, _ = lim.apply([-1.0] * 6, t=102.4)
    assert out == pytest.approx([-acc * period] * 6) and lim.restarts_from_zero == 1
    # re-activated 5 s after the hard stop of a deactivate
    lim.hard_stop(t=103.0)
    lim.reset()
    out, _ = lim.apply([1.0] * 6, t=108.0)
    assert out == pytest.approx([acc * period] * 6)
    # base_command_timeout 0 (a base without a timeout): a gap ramps from the last command sent, one period's step
    lim = CommandLimiter([0.25] * 6, [acc] * 6, max_step_s=period, base_timeout_s=0.0)
    lim.apply([0.0] * 6, t=0.0)
    a, _ = lim.apply([1.0] * 6, t=0.033)
    b, _ = lim.apply([1.0] * 6, t=10.0)
    assert b == pytest.approx([x + acc * period for x in a])


def test_impossible_limits_are_refused():
    for v, a in (([0.1] * 5, [0.0] * 6), ([0.1] * 6, [-1.0] + [0.0] * 5), ([math.nan] + [0.1] * 5, [0.0] * 6)):
        with pytest.raises(ValueError):
            CommandLimiter(v, a)
