# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""bench/targets.py: issue 41's targets read from one device call's files (chunk_bench, the peers, text_speed, the
full-depth junit files). No GPU: the files are written here in the layouts those tools write."""
import importlib.util
import json
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tool():
    spec = importlib.util.spec_from_file_location("targets", os.path.join(REPO, "bench", "targets.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def _cb(out, preset, kind, dev_ms, sms=0, seen=None, card="NVIDIA H200", **extra):
    name = f"cb_{preset}_{kind}" + (f"_sm{sms}" if sms else "") + ".json"
    r = {"device": card, "sms": sms or 132, "sms_seen_by_probe": seen if seen is not None else (sms or 132),
         "chunk_device_ms": {"p50": dev_ms}, "chunk_host_ms": {"p50": dev_ms + 0.02}, **extra}
    (out / name).write_text(json.dumps(r))


def _junit(out, name, tests, failures):
    (out / name).write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest" tests="{tests}" '
                            f'failures="{failures}" errors="0" skipped="0"></testsuite></testsuites>')


def test_targets_met_missed_and_not_measured(tmp_path):
    t = _tool()
    p15, p05 = "qwen2.5-1.5b", "qwen2.5-0.5b"
    _cb(tmp_path, p15, "bf16", 9.8, decode_pass_ms={"p50": 0.99})
    _cb(tmp_path, p15, "awq", 4.9)
    _cb(tmp_path, p15, "awq-parallel", 2.0)
    _cb(tmp_path, p15, "awq-parallel-k8", 2.5)
    _cb(tmp_path, p15, "awq-parallel", 7.9, sms=8, seen=6)  # the probe saw 6 SMs: not a measurement of 8
    _cb(tmp_path, p05, "awq-parallel", 2.9, sms=8)
    (tmp_path / "torch_peer_1.5b_bf16.txt").write_text(
        "RESULTS " + json.dumps({"torch_compiled_graph_chunk_ms": {"p50": 25.36, "p99": 25.5, "min": 25.3}}) + "\n")
    (tmp_path / "ts_qwen2.5-0.5b_bf16.json").write_text(json.dumps(
        {"device": "NVIDIA H200", "decode_tokens_per_s": 1050.0, "prompt_tokens": 352, "prompt_ms_p50": 5.4}))
    _junit(tmp_path, "tests_05b.xml", 7, 0)
    _junit(tmp_path, "tests_15b.xml", 7, 1)
    res, devices = t.rows(str(tmp_path))
    got = {k: (m, v) for k, m, v in res}
    assert devices == {"NVIDIA H200"}
    assert got["1.5B bf16 autoregressive <= 7.5 ms"][1] == "missed"
    assert "pass 0.990 ms" in got["1.5B bf16 autoregressive <= 7.5 ms"][0]
    assert "peer 25.36 ms (2.58x" in got["1.5B bf16 autoregressive <= 7.5 ms"][0]
    assert got["1.5B 4-bit autoregressive <= 5 ms"][1] == "met"
    assert got["1.5B bf16 parallel <= 1.2 ms"][1] == "not measured"
    assert got["1.5B 4-bit parallel, 8 SMs <= 8 ms"][1] == "SM probe disagrees"
    assert got["0.5B 4-bit parallel, 8 SMs <= 3 ms"][1] == "met"
    assert got["1.5B K = 8 / K = 1, 4-bit parallel <= 1.3x"] == ("2.500 / 2.000 ms = 1.25x", "met")
    assert got["1.5B 4-bit / bf16 autoregressive, 8 SMs <= 1x"][1] == "not measured"
    assert got["0.5B bf16 greedy text >= 1000 tokens/s"][1] == "met"
    assert got["0.5B bf16 352-token prompt <= 5 ms"][1] == "missed"
    assert got["0.5B awq text >= 1000 tokens/s; 352-token prompt <= 5 ms"][1] == "not measured"
    assert got["0.5B full depth, every kind"] == ("7 passed, 0 failed, 0 skipped of 7", "passed")
    assert got["1.5B full depth, every kind"][1] == "FAILED"
    assert all(v != "met" for _, m, v in res if m == "-")  # nothing missing is ever met


def test_targets_read_two_calls_together(tmp_path):
    """Two calls' folders (the engine's parts, then the peers beside a re-run of the autoregressive kinds): a file
    found in the first folder wins, one only in the second is read from there; the command line takes both."""
    t = _tool()
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    _cb(a, "qwen2.5-1.5b", "bf16", 11.0)
    _cb(b, "qwen2.5-1.5b", "bf16", 7.0)
    _cb(b, "qwen2.5-1.5b", "awq", 4.0)
    res, _ = t.rows([str(a), str(b)])
    got = {k: (m, v) for k, m, v in res}
    assert got["1.5B bf16 autoregressive <= 7.5 ms"] == ("11.000 ms (host 11.020)", "missed")
    assert got["1.5B 4-bit autoregressive <= 5 ms"][1] == "met"
    assert t.main([str(a), str(b)]) == 0
    assert t.main([str(a), str(tmp_path / "absent")]) == 1
