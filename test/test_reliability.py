# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Issue 6, the ROS-free part: run-time parameter validation, the VRAM plan and its message, hostile
model directories (data only, never code), bags with unknown message types, --make-bag safety."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vla_edge_ros.admission import AdmissionController
from vla_edge_ros.model.config import PRESETS, ModelConfig
from vla_edge_ros.model.safetensors_io import ModelLoadError
from vla_edge_ros.model.weights import load_weights
from vla_edge_ros import settings as P
from vla_edge_ros.clips import IMAGE_T, Counters
from vla_edge_ros.synthetic_bag import make_test_bag
from vla_edge_ros.tools import replay as R
from vla_edge_ros.model.generate import make_model
from vla_edge_ros.vram_plan import GIB, VramPlanError, check_vram_plan, plan_for_model, vram_plan

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_model(str(tmp_path_factory.mktemp("m") / "tiny"), "tiny", seed=1)


# --- run-time parameters ------------------------------------------------------------------------------

def test_tunable_and_read_only_parameters():
    tun = set(P.tunable_names(P.REASONING_SPECS))
    assert {"period_ms", "safety_margin_ms", "ema_alpha", "tail_k", "max_frame_age_ms", "fallback"} <= tun
    # what sizes the model, the cache or the subscriptions stays read-only
    assert not tun & {"kv_capacity_tokens", "policy", "window_frames", "backend", "model_path", "vram_ceiling_gb",
                      "make_tiny_model", "warmup_chunks"}
    assert set(P.tunable_names(P.CAMERA_SPECS)) == {"warn_throttle_s"}


@pytest.mark.parametrize("changes,pattern", [
    ({"safety_margin_ms": 40.0}, "period_ms=33.0 must be greater than safety_margin_ms=40.0"),
    ({"period_ms": 1.5}, "must be greater than safety_margin_ms"),
    ({"ema_alpha": 0.0}, "ema_alpha=0.0 is outside"),
    ({"ema_alpha": float("nan")}, "ema_alpha=nan is outside"),
    ({"tail_k": -1.0}, "tail_k=-1.0 is outside"),
    ({"max_frame_age_ms": float("inf")}, "max_frame_age_ms=inf is outside"),
    ({"fallback": "brake"}, "fallback='brake' is not one of zero, hold"),
    ({"twist_map": [0, 1, 2, 3, 4, 9]}, "twist_map entries"),
    ({"twist_scale": [1.0, 2.0]}, "twist_scale needs 6 entries"),
    ({"kv_capacity_tokens": 1024}, "kv_capacity_tokens can only be changed while the node is unconfigured"),
    ({"policy": "semantic"}, "policy can only be changed while the node is unconfigured"),
    ({"action_labels": ["a"] * 8}, "action_labels is read-only"),
    ({"action_frame_id": "x" * 1024}, "action_frame_id is longer than 255 characters"),
    ({"velocity_limits": [0.5] * 5}, "velocity_limits needs 6 entries"),
    ({"velocity_limits": [0.5, 0.5, 0.5, 1.0, 1.0, float("nan")]}, "velocity_limits entries must be finite"),
    ({"acceleration_limits": [-1.0] + [0.0] * 5}, "acceleration_limits entries must be finite and in [0.0"),
    ({"action_stamp": "header"}, "action_stamp='header' is not one of now, frame"),
    ({"ema_alpha": "0.3"}, "ema_alpha: wrong type str"),
    ({"nonsense": 1}, "nonsense is not a parameter"),
])
def test_impossible_run_time_changes_are_refused_with_a_reason(changes, pattern):
    cur = P.defaults(P.REASONING_SPECS)
    problems = P.check_update(cur, changes, P.REASONING_SPECS)
    assert problems and pattern in "; ".join(problems), problems


def test_possible_run_time_changes_are_accepted():
    cur = P.defaults(P.REASONING_SPECS)
    ok = [{"period_ms": 50.0}, {"safety_margin_ms": 5.0}, {"ema_alpha": 0.5, "tail_k": 2.0},
          {"period_ms": 10.0, "safety_margin_ms": 9.0},  # together: checked against each other, not the old values
          {"fallback": "hold"}, {"max_frame_age_ms": 500.0}, {"twist_scale": [0.5] * 6}, {"twist_map": [-1] * 6},
          {"velocity_limits": [0.1] * 6}, {"acceleration_limits": [2.0] * 6}, {"action_stamp": "frame"}]
    for ch in ok:
        assert P.check_update(cur, ch, P.REASONING_SPECS) == [], ch


def test_model_settings_change_only_while_unconfigured():
    """A lifecycle manager may fix model_path (or the cache size) between configure attempts, not under a running
    engine."""
    cur = P.defaults(P.REASONING_SPECS)
    for ch in ({"model_path": "/models/other"}, {"kv_capacity_tokens": 1024, "policy": "semantic"},
               {"backend": "numpy"}, {"warmup_chunks": 0}):
        assert P.check_update(cur, ch, P.REASONING_SPECS, configured=False) == [], ch
        assert any("only be changed while the node is unconfigured" in p
                   for p in P.check_update(cur, ch, P.REASONING_SPECS, configured=True)), ch


def test_admission_and_cycle_configure():
    from vla_edge_ros.cycle import ReasoningCycle
    from vla_edge_ros.frame_buffer import FrameBuffer

    a = AdmissionController(period_ms=33.0, safety_margin_ms=2.0)
    a.configure(period_ms=50.0, ema_alpha=0.5)
    assert (a.period_ms, a.safety_margin_ms, a.ema_alpha) == (50.0, 2.0, 0.5)
    with pytest.raises(ValueError):
        a.configure(safety_margin_ms=60.0)
    assert a.safety_margin_ms == 2.0  # unchanged after a refusal
    c = ReasoningCycle(engine=None, frame_buffer=FrameBuffer(), admission=a)
    c.configure(period_ms=50.0, fallback="hold", max_frame_age_ms=300.0, probe_after=4)
    assert (c.period_s, c.fallback, c.max_frame_age_ms, c.probe_after) == (0.05, "hold", 300.0, 4)
    with pytest.raises(ValueError):
        c.configure(fallback="brake")
    with pytest.raises(ValueError):
        c.configure(safety_margin_ms=50.0)
    assert c.fallback == "hold" and c.margin_s == 0.002


# --- VRAM plan -----------------------------------------------------------------------------------------

def test_vram_plan_of_the_design_model():
    cfg = PRESETS["qwen2.5-1.5b"]
    plan = vram_plan(cfg, 4096)
    assert plan["total"] == sum(v for k, v in plan.items() if k != "total")
    # bf16 weights of the 1.5B transformer without the (unused) 151936-row LM head/embedding: ~2.6 GiB
    assert 2.4 * GIB < plan["weights"] < 2.9 * GIB
    assert plan["kv"] == 28 * 2 * 2 * 4096 * 128 * 2  # 112 MiB
    assert plan["total"] < 8 * GIB
    assert check_vram_plan(plan, 8.0) is plan
    # the KV part grows linearly with the capacity
    assert vram_plan(cfg, 8192)["kv"] == 2 * plan["kv"]


@pytest.mark.parametrize("preset,layers,nkv,hd", [
    ("qwen2.5-0.5b", 24, 2, 64), ("qwen2.5-1.5b", 28, 2, 128), ("qwen2.5-3b", 36, 2, 128)])
def test_vram_plan_per_published_shape(preset, layers, nkv, hd):
    """The plan of each published shape: its KV cache (layers x K,V x KV heads x slots x head_dim x bf16), bf16 and
    4-bit weights, inside the design's 8 GiB at 4096 slots; the lazily uploaded text head is not in it."""
    import dataclasses

    from vla_edge_ros.model.config import QuantConfig
    from vla_edge_ros.vram_plan import text_head_bytes

    cfg = PRESETS[preset]
    plan = vram_plan(cfg, 4096)
    assert cfg.head_dim == hd and plan["kv"] == layers * 2 * nkv * 4096 * hd * 2
    w4 = vram_plan(dataclasses.replace(cfg, quant=QuantConfig("awq")), 4096)
    assert w4["kv"] == plan["kv"] and 0.2 < w4["weights"] / plan["weights"] < 0.35
    assert plan["total"] < 8 * GIB and w4["total"] < plan["total"]
    # text_logits' full head (V rows padded to 128, bf16) + one 96-row prefill block of fp32 logits
    vp = -(-cfg.vocab_size // 128) * 128  # 151936 is 1187 x 128 already
    assert text_head_bytes(cfg) == 2 * vp * cfg.hidden_size + 4 * 96 * vp


def test_cuda_shapes_every_published_size_runs_and_the_rest_is_one_line():
    """check_cuda_shape (start-up): the 0.5B / 1.5B / 3B shapes and the test presets run on the CUDA kernels; a shape
    outside them is refused with one line naming each limit and the way out (backend: numpy)."""
    import dataclasses

    from vla_edge_ros.vram_plan import UnsupportedShapeError, check_cuda_shape, cuda_shape_problems

    for name, cfg in PRESETS.items():
        assert cuda_shape_problems(cfg) == [], name
        check_cuda_shape(cfg)
    base = PRESETS["qwen2.5-0.5b"]
    cases = [(dict(hidden_size=768, num_attention_heads=8), "head_dim 96"),  # head_dim 96
             (dict(hidden_size=960, num_attention_heads=15, num_key_value_heads=3), "hidden_size 960"),  # not % 128
             (dict(intermediate_size=4800), "intermediate_size 4800 must be multiples of 128"),
             (dict(hidden_size=2304, num_attention_heads=36, num_key_value_heads=4), "hidden_size 2304 > 2048"),
             (dict(num_attention_heads=28, num_key_value_heads=1, hidden_size=1792), "more than 16 query heads")]
    for kw, needle in cases:
        cfg = dataclasses.replace(base, **kw)
        with pytest.raises(UnsupportedShapeError) as e:
            check_cuda_shape(cfg)
        msg = str(e.value)
        assert needle in msg and "\n" not in msg and msg.endswith("(use backend: numpy)"), msg


def test_plan_over_the_ceiling_names_the_plan_and_the_ceiling():
    plan = vram_plan(PRESETS["qwen2.5-1.5b"], 4096)
    with pytest.raises(VramPlanError) as e:
        check_vram_plan(plan, 2.0, capacity=4096)
    msg = str(e.value)
    for needle in ("VRAM plan at kv_capacity_tokens=4096", "weights", "kv 112.0 MiB", "total",
                   "exceeds the ceiling vram_ceiling_gb=2", "(2048 MiB)", "lower kv_capacity_tokens"):
        assert needle in msg, msg


def test_plan_for_a_model_dir(tiny):
    plan = plan_for_model(tiny, 512)
    assert plan == vram_plan(ModelConfig.from_dir(tiny), 512)
    assert plan_for_model("/nonexistent", 512) is None


def test_out_of_memory_start_up_message_names_the_plan(tiny):
    pytest.importorskip("rclpy")
    from vla_edge_ros.runtime import engine_error_message

    class OutOfMemoryError(RuntimeError):  # what CuPy raises, by name
        pass

    msg = engine_error_message(OutOfMemoryError("Out of memory allocating 1,073,741,824 bytes"), tiny, "cuda", 512,
                               8.0)
    assert msg.startswith(f"cannot start the engine ({tiny}, backend cuda): OutOfMemoryError")
    assert "VRAM plan at kv_capacity_tokens=512" in msg and "vram_ceiling_gb=8" in msg and "total" in msg
    plain = engine_error_message(ValueError("bad"), tiny, "numpy", 512, 8.0)
    assert "VRAM plan" not in plain


@pytest.mark.gpu
def test_pure_plan_equals_the_cuda_backend_plan(tiny):
    cupy = pytest.importorskip("cupy")
    from vla_edge_ros.cuda.backend import CudaBackend

    cfg = PRESETS["small"]
    d = make_model(str(Path(tiny).parent / "small"), "small", seed=0)
    be = CudaBackend(load_weights(d), 1024)
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    assert be.plan == vram_plan(cfg, 1024, sms=sms)


# --- model directories: data only ---------------------------------------------------------------------

def copy_model(src, dst):
    shutil.copytree(src, dst)
    return str(dst)


def test_directory_with_only_a_pickle_checkpoint_is_refused(tiny, tmp_path):
    d = tmp_path / "pkl"
    d.mkdir()
    shutil.copy(Path(tiny) / "config.json", d / "config.json")
    marker = tmp_path / "PWNED"
    # a pickle that would create the marker file if anything unpickled it
    import pickle

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (d / "pytorch_model.bin").write_bytes(pickle.dumps(Evil()))
    with pytest.raises(ModelLoadError) as e:
        load_weights(str(d))
    assert "pytorch_model.bin" in str(e.value) and "pickle" in str(e.value)
    assert not marker.exists()
    # and the node's start-up check refuses the directory before loading anything
    with pytest.raises(P.ParamError, match="no model.safetensors"):
        P.validate_reasoning({"model_path": str(d)})


def test_hostile_config_is_parsed_as_data_only(tiny, tmp_path):
    d = Path(copy_model(tiny, tmp_path / "m"))
    marker = tmp_path / "EXECUTED"
    (d / "modeling_evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    (d / "configuration_evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    raw = json.loads((d / "config.json").read_text())
    raw.update(auto_map={"AutoConfig": "configuration_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.M"},
               trust_remote_code=True, __class__="os.system", _name_or_path="$(rm -rf ~)")
    # a quantization_config this runtime cannot run is refused in one line (the model is not run unquantized)
    (d / "config.json").write_text(json.dumps(dict(raw, quantization_config={"nested": [1, {"deep": "x" * 1000}]})))
    with pytest.raises(ModelLoadError, match="quantization_config"):
        ModelConfig.from_dir(str(d))
    (d / "config.json").write_text(json.dumps(raw))
    cfg = ModelConfig.from_dir(str(d))
    assert cfg == PRESETS["tiny"]
    w = load_weights(str(d))
    assert w.cfg == cfg
    from vla_edge_ros.engine import Engine

    eng = Engine(str(d), backend="numpy", kv_capacity_tokens=512)
    try:
        eng.run_chunk(np.zeros((64, 128, 3), np.uint8))
    finally:
        eng.close()
    assert not marker.exists()
    assert "modeling_evil" not in sys.modules and "configuration_evil" not in sys.modules


@pytest.mark.parametrize("key,value,pattern", [
    ("hidden_size", 10 ** 30, "bad value"),
    ("hidden_size", 1e300, "bad value"),
    ("num_hidden_layers", 1 << 40, "bad value"),
    ("vocab_size", "151936", "bad value '151936'"),
    ("hidden_size", True, "bad value True"),
    ("hidden_size", 512.5, "bad value 512.5"),
    ("hidden_size", None, "bad value None"),
    ("hidden_size", [512], "bad value [512]"),
    ("rope_theta", 10 ** 400, "bad value"),
    ("rope_theta", "1e6", "bad value"),
    ("tie_word_embeddings", "false", "bad value 'false'"),
    ("tie_word_embeddings", 0, "bad value 0"),
    ("rms_norm_eps", -1.0, "rms_norm_eps=-1.0 must be > 0"),
])
def test_config_values_of_the_wrong_type_or_size_are_refused(tmp_path, key, value, pattern):
    d = tmp_path / "c"
    d.mkdir()
    raw = PRESETS["tiny"].to_hf_dict()
    raw[key] = value
    (d / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ModelLoadError) as e:
        ModelConfig.from_dir(str(d))
    assert "config.json" in str(e.value) and key in str(e.value) and pattern in str(e.value), str(e.value)


@pytest.mark.parametrize("text", ['{"hidden_size": Infinity}', "[" * 100000 + "]" * 100000, '"just a string"',
                                  "\xff\xfe garbage"])
def test_unparseable_configs_are_refused(tmp_path, text):
    d = tmp_path / "c"
    d.mkdir()
    (d / "config.json").write_bytes(text.encode("latin-1"))
    with pytest.raises(ModelLoadError, match="config.json"):
        ModelConfig.from_dir(str(d))


def test_huge_config_file_is_refused_without_reading_it(tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    with open(d / "config.json", "wb") as f:
        f.truncate(64 << 20)  # sparse 64 MiB
    with pytest.raises(ModelLoadError, match="too large"):
        ModelConfig.from_dir(str(d))


def test_safetensors_header_with_hostile_shapes(tmp_path):
    import struct

    from vla_edge_ros.model.safetensors_io import load_file

    for shape, offs in [(["4"], [0, 8]), ([True], [0, 2]), ([2.0], [0, 4]), ([-1], [0, 0]), ([4], ["0", 8]),
                        ([1 << 63], [0, 0])]:
        fn = tmp_path / "x.safetensors"
        header = json.dumps({"w": {"dtype": "BF16", "shape": shape, "data_offsets": offs}}).encode()
        fn.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)
        with pytest.raises(ModelLoadError, match="tensor 'w'"):
            load_file(str(fn))


# --- bags ----------------------------------------------------------------------------------------------

def test_bag_with_unknown_message_types_is_replayed_and_they_are_counted(tmp_path):
    from rosbags.rosbag2 import Writer
    from rosbags.typesys import Stores, get_typestore, get_types_from_msg

    ts = get_typestore(Stores.ROS2_JAZZY)
    ts.register(get_types_from_msg("int32 x\nstring note\n", "acme_msgs/msg/Weird"))
    good = make_test_bag(tmp_path / "img", frames=6, width=32, height=16)
    items = list(R.bag_items(good, Counters()))
    img_t = IMAGE_T
    with Writer(tmp_path / "mixed", version=9) as w:
        weird = w.add_connection("/weird", "acme_msgs/msg/Weird", typestore=ts)
        cam = w.add_connection("/camera/image_raw", img_t, typestore=ts)
        for i, it in enumerate(items):
            w.write(weird, it.t_ns - 1, ts.serialize_cdr(ts.types["acme_msgs/msg/Weird"](x=i, note="?"),
                                                         "acme_msgs/msg/Weird"))
            w.write(weird, it.t_ns - 1, b"\x00\x01\x00\x00\xff\xff\xff\x7f truncated weird")  # corrupt + unknown
            if i == 3:
                w.write(cam, it.t_ns, b"\x00\x01\x00\x00 not an image")  # corrupt image message
                continue
            msg = ts.types[img_t](header=ts.types["std_msgs/msg/Header"](
                stamp=ts.types["builtin_interfaces/msg/Time"](sec=it.stamp_ns // 10 ** 9,
                                                              nanosec=it.stamp_ns % 10 ** 9),
                frame_id="camera"), height=16, width=32, encoding="rgb8", is_bigendian=0, step=96,
                data=np.frombuffer(it.raw["data"], np.uint8).copy())
            w.write(cam, it.t_ns, ts.serialize_cdr(msg, img_t))
    c = Counters()
    got = list(R.bag_items(tmp_path / "mixed", c))
    assert len(got) == 5 and c.skipped_corrupt == 1 and c.skipped_other == 12
    assert [g.stamp_ns for g in got] == [it.stamp_ns for i, it in enumerate(items) if i != 3]


def test_make_bag_refuses_to_overwrite_a_non_empty_directory(tmp_path):
    d = tmp_path / "existing"
    d.mkdir()
    (d / "precious.txt").write_text("keep me")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "vla_edge_ros.tools.replay", "--make-bag", str(d), "--frames", "3"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 2 and "exists" in r.stderr, r.stderr
    assert [p.name for p in d.iterdir()] == ["precious.txt"] and (d / "precious.txt").read_text() == "keep me"


def test_soak_verdict_and_growth():
    from vla_edge_ros.tools.soak import growth_pct, verdict

    assert growth_pct([100.0] * 10 + [101.0] * 10) == pytest.approx(1.0)
    assert growth_pct([100.0]) is None
    base = dict(rss_growth_pct=0.5, vram_growth_pct=None, cycles=1000, deadline_miss_rate=0.0, deadline_misses=0,
                cycles_after_warmup=800, deadline_misses_after_warmup=0, deadline_miss_rate_after_warmup=0.0,
                node_alive=True, node_exit=None, action_rate_hz=30.2, expected_rate_hz=1000 / 33)
    assert verdict(base, 2.0, 2.0, 0.0) == []
    assert "RSS grew" in verdict(dict(base, rss_growth_pct=2.5), 2.0, 2.0, 0.0)[0]
    assert "VRAM grew" in verdict(dict(base, vram_growth_pct=3.0), 2.0, 2.0, 0.0)[0]
    late = dict(deadline_miss_rate_after_warmup=0.00125, deadline_misses_after_warmup=1)
    assert "deadline-miss rate after warm-up" in verdict(dict(base, **late), 2.0, 2.0, 0.0)[0]
    # a miss during warm-up (the camera's start) is reported in the summary but not judged
    assert verdict(dict(base, deadline_miss_rate=0.001, deadline_misses=1), 2.0, 2.0, 0.0) == []
    assert "exited" in verdict(dict(base, node_alive=False, node_exit=1), 2.0, 2.0, 0.0)[0]
    assert not math.isnan(base["expected_rate_hz"])


# --- non-finite actions never leave the node (issue 13.1) --------------------------------------------

@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 1e300])
def test_non_finite_or_absurd_twist_scale_is_refused_at_start_up_and_at_run_time(tmp_path, bad):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    scale = [bad, 1.0, 1.0, 1.0, 1.0, 1.0]
    with pytest.raises(P.ParamError, match="twist_scale entries must be finite"):
        P.validate_reasoning({"model_path": str(tmp_path), "twist_scale": scale})
    problems = P.check_update(P.defaults(P.REASONING_SPECS), {"twist_scale": scale}, P.REASONING_SPECS)
    assert problems and "twist_scale entries must be finite" in problems[0], problems
    assert P.check_update(P.defaults(P.REASONING_SPECS), {"twist_scale": [-2.0, 0.5, 0, 1, 1, 1000]},
                          P.REASONING_SPECS) == []


def test_every_float_parameter_has_a_finite_range():
    for s in P.REASONING_SPECS + P.CAMERA_SPECS:
        floats = isinstance(s.default, float) or (isinstance(s.default, list) and s.default
                                                  and isinstance(s.default[0], float))
        if floats:
            assert s.lo is not None and math.isfinite(s.lo) and math.isfinite(s.hi), s.name
            changes = {s.name: [float("nan")] * len(s.default) if isinstance(s.default, list) else float("nan")}
            if s.tunable:
                assert P.check_update(P.defaults(P.REASONING_SPECS + P.CAMERA_SPECS), changes,
                                      P.REASONING_SPECS + P.CAMERA_SPECS), s.name


class _NanEngine:
    """The only stand-in here: the real engine decodes bins, which cannot be NaN; this one returns NaN
    actions so that the guard before publishing can be exercised."""

    busy = False

    def __init__(self, value=float("nan")):
        from vla_edge_ros.admission import PhaseTimings

        self.value, self.pt = value, PhaseTimings(0.1, 0.1, 0.1, 0.5)

    def submit(self, frame):
        import concurrent.futures
        from types import SimpleNamespace

        f = concurrent.futures.Future()
        f.set_result(SimpleNamespace(action=np.full(8, self.value, np.float32), timings=self.pt, tokens=np.arange(8),
                                     frame_id=0, retained=[0], evicted=[], cache_tokens=56))
        return f


@pytest.mark.parametrize("fallback", ["zero", "hold"])
def test_guard_before_publishing_turns_a_nan_action_into_a_zero_fallback(fallback):
    from vla_edge_ros.admission import PhaseTimings
    from vla_edge_ros.cycle import ReasoningCycle
    from vla_edge_ros.frame_buffer import FrameBuffer

    adm = AdmissionController(period_ms=1000.0, safety_margin_ms=2.0)
    adm.update(PhaseTimings(0.1, 0.1, 0.1, 0.5))
    fb = FrameBuffer(pinned=False)
    cyc = ReasoningCycle(_NanEngine(), fb, adm, period_ms=1000.0, fallback=fallback)
    fb.publish(np.zeros((64, 128, 3), np.uint8), stamp_ns=1)
    out = cyc.tick()
    assert out.reason == "fresh" and np.isnan(out.action).all()
    comps = cyc.finalize(out, [0, 1, 2, 3, 4, 5], [1.0] * 6)
    assert comps == [0.0] * 6 and out.source == "fallback" and out.reason == "non_finite" and "non-finite" in out.error
    assert not out.action.any() and cyc.non_finite == 1
    cyc.record_published(out)
    # neither a repeat of the model action nor a held fallback hands the NaN out again
    again = cyc.tick()
    comps = cyc.finalize(again, range(6), [1.0] * 6)
    assert np.isfinite(again.action).all() and all(np.isfinite(comps)), (again.reason, again.action)
    assert cyc.stats.summary()["fallbacks"]["non_finite"] == 1


def test_guard_zeroes_a_fallback_times_a_non_finite_scale():
    from vla_edge_ros.cycle import ReasoningCycle
    from vla_edge_ros.frame_buffer import FrameBuffer

    cyc = ReasoningCycle(None, FrameBuffer(pinned=False), AdmissionController(period_ms=33.0))
    out = cyc.tick()  # no frame: the zero fallback
    comps = cyc.finalize(out, range(6), [float("nan"), 1.0, float("inf"), 1.0, 1.0, 1.0])  # 0 x nan = nan
    assert comps == [0.0] * 6 and out.reason == "non_finite"
    ok = cyc.tick()
    assert cyc.finalize(ok, [0, -1, 2, 3, 4, 5], [2.0] * 6) == [0.0] * 6 and ok.reason == "no_frame"


# --- a configuration that can never meet the deadline says so (issue 13.8) ----------------------------

def test_deadline_warning_names_the_parameters_that_would_fix_it():
    from vla_edge_ros.runtime import deadline_warning

    assert deadline_warning(20.0, 33.0, 2.0, 4096, "numpy") is None
    assert deadline_warning(31.0, 33.0, 2.0, 4096, "numpy") is None  # exactly the budget fits
    w = deadline_warning(65.96, 33.0, 2.0, 4096, "numpy")
    assert "65.96 ms" in w and "31.00 ms" in w and "\n" not in w
    assert "kv_capacity_tokens (now 4096" in w and "period_ms above 68.0" in w and "backend cuda" in w
    assert "backend cuda" not in deadline_warning(40.0, 33.0, 2.0, 4096, "cuda")
