# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Parameter tables and start-up validation (pure functions, no DDS), plus the config file."""

import json
from pathlib import Path

import pytest

from vla_edge_ros import settings as P

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (d / "model.safetensors").write_bytes(b"")
    return str(d)


def test_defaults_match_the_design():
    d = P.defaults(P.REASONING_SPECS)
    assert d["period_ms"] == 33.0 and d["safety_margin_ms"] == 2.0 and d["ema_alpha"] == 0.2
    assert d["kv_capacity_tokens"] == 4096 and d["policy"] == "fifo" and d["window_frames"] == 8
    assert d["max_frame_age_ms"] == 200.0 and d["backend"] == "auto" and d["model_path"] == ""
    assert d["vram_ceiling_gb"] == 8.0 and d["fallback"] == "zero"
    c = P.defaults(P.CAMERA_SPECS)
    assert c["transport"] == "raw" and c["qos_reliability"] == "auto"


def test_every_spec_has_a_description_and_sane_range():
    for s in P.REASONING_SPECS + P.CAMERA_SPECS:
        assert len(s.description) > 10, s.name
        if s.lo is not None:
            for v in (s.default if isinstance(s.default, list) else [s.default]):
                assert s.lo <= v <= s.hi, s.name
        if s.choices is not None:
            assert s.default in s.choices


def test_valid(model_dir):
    v = P.validate_reasoning({"model_path": model_dir}, prompt_tokens=16)
    assert v["period_ms"] == 33.0


def test_empty_model_path_names_the_parameter():
    with pytest.raises(P.ParamError, match="model_path is empty"):
        P.validate_reasoning({})
    assert P.validate_reasoning({"make_tiny_model": True})["make_tiny_model"] is True


def test_missing_model_dir(tmp_path):
    with pytest.raises(P.ParamError, match="no such directory"):
        P.validate_reasoning({"model_path": str(tmp_path / "nope")})
    with pytest.raises(P.ParamError, match="no config.json"):
        P.validate_reasoning({"model_path": str(tmp_path)})


@pytest.mark.parametrize("period,margin", [(2.0, 2.0), (5.0, 6.0), (1.0, 1.0)])
def test_deadline_must_exceed_margin(model_dir, period, margin):
    with pytest.raises(P.ParamError, match="must be greater than safety_margin_ms"):
        P.validate_reasoning({"model_path": model_dir, "period_ms": period, "safety_margin_ms": margin})


def test_capacity_too_small(model_dir):
    from vla_edge_ros.kv_cache import min_capacity

    assert min_capacity(16) == 16 + 32 + 8
    P.validate_reasoning({"model_path": model_dir, "kv_capacity_tokens": 56}, prompt_tokens=16)
    with pytest.raises(P.ParamError, match=r"kv_capacity_tokens=55 is too small.*need 56"):
        P.validate_reasoning({"model_path": model_dir, "kv_capacity_tokens": 55}, prompt_tokens=16)


@pytest.mark.parametrize("name,value,pattern", [
    ("policy", "lru", "policy='lru' is not one of fifo, sliding_window, semantic"),
    ("backend", "tpu", "backend='tpu' is not one of"),
    ("fallback", "brake", "fallback='brake'"),
    ("ema_alpha", 0.0, r"ema_alpha=0.0 is outside"),
    ("ema_alpha", 1.5, r"ema_alpha=1.5 is outside"),
    ("period_ms", float("nan"), "period_ms=nan is outside"),
    ("window_frames", 0, "window_frames=0 is outside"),
    ("twist_map", [0, 1, 2], "twist_map needs 6 entries"),
    ("twist_map", [0, 1, 2, 3, 4, 9], "twist_map entries must be -1 or an action index"),
    ("action_labels", ["a"], "action_labels needs 8 entries"),
])
def test_bad_values(model_dir, name, value, pattern):
    with pytest.raises(P.ParamError, match=pattern):
        P.validate_reasoning({"model_path": model_dir, name: value})


def test_action_range(model_dir):
    with pytest.raises(P.ParamError, match="action_high=-1.0 must be greater than action_low=1.0"):
        P.validate_reasoning({"model_path": model_dir, "action_low": 1.0, "action_high": -1.0})


def test_all_problems_in_one_message(model_dir):
    with pytest.raises(P.ParamError) as e:
        P.validate_reasoning({"model_path": model_dir, "policy": "x", "fallback": "y"})
    assert "policy" in str(e.value) and "fallback" in str(e.value) and "\n" not in str(e.value)


def test_camera_validation():
    assert P.validate_camera({"transport": "compressed"})["transport"] == "compressed"
    with pytest.raises(P.ParamError, match="transport='theora'"):
        P.validate_camera({"transport": "theora"})
    with pytest.raises(P.ParamError, match="qos_reliability"):
        P.validate_camera({"qos_reliability": "sometimes"})


def test_generated_models_go_to_the_cache(monkeypatch, tmp_path):
    from vla_edge_ros.cache import cache_root, generated_model

    monkeypatch.setenv("VLA_EDGE_CACHE", str(tmp_path))
    assert generated_model("micro", 1) == str(tmp_path / "micro-seed1")
    assert (tmp_path / "micro-seed1" / "config.json").is_file()
    monkeypatch.delenv("VLA_EDGE_CACHE")
    assert cache_root().name in ("cache", "vla_edge_ros")  # out/cache in-tree, else XDG/vla_edge_ros


def test_config_file_matches_the_tables():
    yaml = pytest.importorskip("yaml")
    cfg = yaml.safe_load((ROOT / "config" / "vla_edge.yaml").read_text())
    reasoning = cfg["/**/vla_edge"]["ros__parameters"]
    camera = cfg["/**/vla_camera"]["ros__parameters"]
    r_names = {s.name for s in P.REASONING_SPECS}
    c_names = {s.name for s in P.CAMERA_SPECS}
    # every setting of the table, nothing else: a newcomer reads every setting and its default in the file
    assert set(reasoning) == r_names, (sorted(r_names - set(reasoning)), sorted(set(reasoning) - r_names))
    assert set(camera) == c_names, (sorted(c_names - set(camera)), sorted(set(camera) - c_names))
    for values, specs in ((reasoning, P.REASONING_SPECS), (camera, P.CAMERA_SPECS)):
        d = P.defaults(specs)
        for k, v in values.items():  # the shipped file states the defaults
            assert v == d[k], k
            assert type(v) is type(d[k]) or (isinstance(v, list)), k  # doubles written as doubles
    with pytest.raises(P.ParamError, match="model_path is empty"):
        P.validate_reasoning(reasoning)
    P.validate_camera(camera)


def test_an_unreadable_model_dir_is_one_problem_not_a_traceback(tmp_path):
    # root reads through chmod 000, so the OSError comes from a name the kernel refuses (ENAMETOOLONG)
    path = str(tmp_path / ("x" * 5000))
    with pytest.raises(P.ParamError) as e:
        P.validate_reasoning({"model_path": path})
    assert f"model_path={path!r}: cannot be read: OSError" in str(e.value), e.value


def test_unknown_parameters_are_named_with_the_closest_known_one():
    known = {s.name for s in P.REASONING_SPECS + P.CAMERA_SPECS}
    assert P.unknown_parameters_message(set(), known) is None
    msg = P.unknown_parameters_message({"perod_ms", "qos_dept", "zzz"}, known)
    assert msg == ("unknown parameters, ignored: perod_ms (did you mean period_ms?), qos_dept (did you mean "
                   "qos_depth?), zzz")
