# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Edge fit arithmetic (vla_edge_ros/edge.py), the board list and the vla-edge-plan tool. No GPU, no ROS."""
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from vla_edge_ros import edge
from vla_edge_ros.eviction import make_policy
from vla_edge_ros.kv_cache import KvCache
from vla_edge_ros.model.config import ACTION_DECODING, PRESETS
from vla_edge_ros.tools import plan as plan_tool
from vla_edge_ros.vram_plan import vram_plan

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIG = PRESETS["qwen2.5-1.5b"]
GB = 1e9


def with_model_options(cfg, quant=None, action_decoding=None):
    """The config as the QUANT helper's ModelConfig carries it (cfg.quant, cfg.action_decoding)."""
    geometry = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "vocab_size", "head_dim")
    ns = SimpleNamespace(**{k: getattr(cfg, k) for k in geometry}, quant=quant)
    if action_decoding is not None:
        ns.action_decoding = action_decoding
    return ns


def awq(symmetric=False, group=128):
    return SimpleNamespace(method="awq", bits=4, group_size=group, symmetric=symmetric)


# -- the DESIGN.md §11 numbers --------------------------------------------------------------------


def test_full_cache_keys_match_the_bench_at_4096_slots_and_a_64_token_prompt():
    # BENCHMARKS.md: 64-token prompt + 124 retained frames, each decode pass attends ~4069 keys
    assert edge.full_cache_keys(4096, 64) == 4069
    assert edge.frame_capacity(4096, 64) == 125


@pytest.mark.parametrize("capacity,prompt", [(4096, 64), (4096, 16), (1000, 0), (57, 17), (300, 5)])
def test_full_cache_keys_match_a_real_kv_cache_filled_to_capacity(capacity, prompt):
    kv = KvCache(capacity, prompt, make_policy("fifo"))
    for fid in range(kv.frame_capacity + 3):  # full, then evicting
        plan = kv.plan_frame(fid)
    assert len(kv.retained()) == kv.frame_capacity == edge.frame_capacity(capacity, prompt)
    # the middle decode pass attends the frame's context + 1 + 8//2 of its action slots
    assert edge.full_cache_keys(capacity, prompt) == plan.n_prefix + 32 + 1 + 4


def test_bf16_chunk_is_9_reads_of_2_74_gb():
    b = edge.chunk_bytes(BIG, 4096, prompt_tokens=64)
    assert b["weights"] == "bf16" and b["decoding"] == "autoregressive" and b["decode_passes"] == 8
    assert b["attended_keys"] == 4069
    assert b["decode_pass"] == pytest.approx(2.738 * GB, rel=0.005)  # docs/cuda_notes.md
    assert b["prefill"] == pytest.approx(2.74 * GB, rel=0.01)
    assert b["total"] == pytest.approx(24.6 * GB, rel=0.01)
    assert b["total"] == b["vision"] + b["prefill"] + 8 * b["decode_pass"]


def test_w4_chunk_is_9_reads_of_0_80_gb():
    b = edge.chunk_bytes(BIG, 4096, weights="w4", prompt_tokens=64)
    assert b["weights"] == "w4" and b["group_size"] == 128 and b["zero_points"]
    assert b["decode_pass"] == pytest.approx(0.80 * GB, rel=0.01)
    assert b["total"] == pytest.approx(7.2 * GB, rel=0.01)
    # the KV (0.12 GB a pass) is ~15 % of it
    assert b["kv_bytes_per_key"] * b["attended_keys"] / b["decode_pass"] == pytest.approx(0.146, abs=0.01)


def test_w4_parallel_chunk_is_one_read():
    b = edge.chunk_bytes(BIG, 4096, weights="w4", decoding="parallel", prompt_tokens=64)
    assert b["decode_passes"] == 0 and b["decode"] == 0 and b["prefill_rows"] == 40
    assert b["total"] == pytest.approx(0.8 * GB, rel=0.01)
    # against the autoregressive prefill: 8 more rows' KV (read and written), their 8 input embeddings and the
    # head's 256 rows once
    ar = edge.chunk_bytes(BIG, 4096, weights="w4", prompt_tokens=64)
    assert b["prefill"] - ar["prefill"] == 16 * b["kv_bytes_per_key"] + 8 * 2 * 1536 + b["head_bytes"]


def test_w4_layer_bytes_are_packed_int4_plus_16_bit_scales_and_4_bit_zeros_per_128():
    H, I, L = 1536, 8960, 28
    qkv = 1536 + 2 * 256
    params = (H * qkv + 1536 * H + H * 2 * I + I * H) * L
    nongemm = L * (2 * 2 * H + 4 * qkv) + 2 * H  # norms (bf16), q/k/v bias (fp32), final norm
    groups = params // 128
    assert edge.layer_weight_bytes(BIG, "w4") == params // 2 + 2 * groups + groups // 2 + nongemm
    sym = with_model_options(BIG, quant=awq(symmetric=True))
    assert edge.layer_weight_bytes(sym) == params // 2 + 2 * groups + nongemm
    assert edge.layer_weight_bytes(BIG, "bf16") == 2 * params + nongemm


def test_bf16_bytes_agree_with_the_vram_plan_weights():
    b = edge.chunk_bytes(BIG, 4096)
    vision_weights = 2 * (768 * 1536 + 1536 + 32 * 1536)
    assert b["layer_weight_bytes"] + b["head_bytes"] + vision_weights == vram_plan(BIG, 4096)["weights"]


# -- what the bytes depend on ---------------------------------------------------------------------


def test_more_keys_more_bytes():
    full = edge.full_cache_keys(4096, 16)
    totals = [edge.chunk_bytes(BIG, 4096, attended_keys=k, prompt_tokens=16)["total"] for k in (53, 1000, full)]
    assert totals[0] < totals[1] < totals[2]
    assert edge.chunk_bytes(BIG, 2048)["total"] < edge.chunk_bytes(BIG, 4096)["total"]  # default = full cache


def test_w4_is_less_than_bf16_and_parallel_less_than_autoregressive():
    for d in ACTION_DECODING:
        assert edge.chunk_bytes(BIG, 4096, weights="w4", decoding=d)["total"] < \
            edge.chunk_bytes(BIG, 4096, weights="bf16", decoding=d)["total"]
    for w in edge.WEIGHT_FORMATS:
        assert edge.chunk_bytes(BIG, 4096, weights=w, decoding="parallel")["total"] < \
            edge.chunk_bytes(BIG, 4096, weights=w, decoding="autoregressive")["total"]


def test_defaults_come_from_the_model_config():
    plain = edge.chunk_bytes(BIG, 4096)
    assert plain["weights"] == "bf16" and plain["decoding"] == "autoregressive"
    assert plain["prompt_tokens"] == 16  # the engine's DEFAULT_PROMPT_TOKENS
    q = with_model_options(BIG, quant=awq(), action_decoding="parallel")
    b = edge.chunk_bytes(q, 4096)
    assert b["weights"] == "w4" and b["decoding"] == "parallel"
    assert b == edge.chunk_bytes(BIG, 4096, weights="w4", decoding="parallel")
    assert edge.chunk_bytes(with_model_options(BIG, quant=awq(group=64)), 4096)["total"] > \
        edge.chunk_bytes(q, 4096, decoding="autoregressive")["total"]  # more groups, more scales


@pytest.mark.parametrize("kw,match", [
    (dict(weights="fp8"), "weights 'fp8'"),
    (dict(decoding="beam"), "decoding 'beam'"),
    (dict(attended_keys=10**6), "attended_keys"),
    (dict(attended_keys=5), "attended_keys"),
    (dict(prompt_tokens=-1), "prompt_tokens"),
])
def test_chunk_bytes_refuses_bad_input(kw, match):
    with pytest.raises(edge.EdgeError, match=match):
        edge.chunk_bytes(BIG, 4096, **kw)


def test_a_cache_without_room_for_a_frame_is_refused():
    with pytest.raises(edge.EdgeError, match="holds no frame"):
        edge.chunk_bytes(BIG, 50, prompt_tokens=16)


# -- projection -----------------------------------------------------------------------------------

PHASES = {"weights": "bf16", "vision": 1e6, "prefill": 2e9, "decode_pass": 1e9, "decode": 8e9, "total": 10.001e9}


def test_projection_divides_bytes_by_bandwidth_times_efficiency():
    board = edge.Board("b", bandwidth_gbps=500.0, memory_gb=8)
    p = edge.project(PHASES, board, efficiency=0.5)
    assert p["chunk_ms"] == pytest.approx(10.001e9 / 250e9 * 1e3)
    assert p["prefill_ms"] == pytest.approx(8.0) and p["decode_pass_ms"] == pytest.approx(4.0)
    assert p["vision_ms"] == pytest.approx(0.004) and p["decode_ms"] == pytest.approx(32.0)
    assert p["basis"] == "given" and "50.0 %" in p["note"] and edge.PEAK_NOTE in p["note"]


def test_measured_copy_bandwidth_is_used_where_the_board_has_one():
    board = edge.Board("b", bandwidth_gbps=1000.0, copy_gbps=800.0, memory_gb=8)
    p = edge.project(PHASES, board, efficiency=1.0)
    assert p["chunk_ms"] == pytest.approx(10.001e9 / 800e9 * 1e3)
    assert p["bandwidth_kind"] == "measured copy" and edge.PEAK_NOTE not in p["note"]


def test_verdict_against_period_minus_margin():
    board = edge.Board("b", bandwidth_gbps=1000.0, memory_gb=8)
    exact = dict(PHASES, total=10e9)  # 10 GB at 1000 GB/s = 10 ms
    p = edge.project(exact, board, 1.0, period_ms=12.0, safety_margin_ms=2.0)
    assert p["chunk_ms"] == p["budget_ms"] == 10.0 and p["verdict"] == "fits" and p["fits"]  # on the budget fits
    p = edge.project(PHASES, board, 1.0, period_ms=12.0, safety_margin_ms=2.0)  # 10.001 ms
    assert p["verdict"] == "does not fit" and not p["fits"]
    assert edge.project(PHASES, board, 1.0)["budget_ms"] == 31.0  # 33 - 2


def test_without_a_measured_efficiency_the_projection_is_a_labelled_floor():
    """The efficiency is the one measured on the model's own shape; no shape (or one never measured) is a floor."""
    board = edge.Board("b", bandwidth_gbps=1000.0, memory_gb=8)
    measured = {"shapes": {"s1": {"shape": {"hidden_size": 1536, "num_hidden_layers": 28},
                                  "efficiency": {"bf16": 0.25}}}}
    p = edge.project(PHASES, board, measured=measured)
    assert p["efficiency"] == 1.0 and p["basis"] == "floor" and "floor at 100 % of bandwidth" in p["note"]
    other = SimpleNamespace(hidden_size=896, num_hidden_layers=24)
    assert edge.project(PHASES, board, cfg=other, measured=measured)["basis"] == "floor"  # another shape's: not used
    p = edge.project(PHASES, board, cfg=BIG, measured=measured)
    assert p["basis"] == "measured" and p["chunk_ms"] == pytest.approx(40.004) and p["shape"] == "s1"
    assert "s1 shape" in p["note"]
    assert edge.project(PHASES, board, efficiency=0.5, cfg=BIG, measured=measured)["basis"] == "given"


@pytest.mark.parametrize("kw", [dict(efficiency=0.0), dict(efficiency=1.2), dict(efficiency=float("nan")),
                                dict(period_ms=2.0, safety_margin_ms=2.0), dict(safety_margin_ms=-1.0)])
def test_projection_refuses_impossible_numbers(kw):
    with pytest.raises(edge.EdgeError):
        edge.project(PHASES, edge.Board("b", 100.0, 8), **kw)


def test_efficiency_from_a_measured_chunk():
    # the H200 bf16 engine: 24.65 GB in 11.57 ms against a 4262 GB/s copy
    e = edge.efficiency_from_measurement(24.65e9, 11.57, 4262.0)
    assert e == pytest.approx(24.65e9 / 11.57e-3 / 4262e9)
    with pytest.raises(edge.EdgeError):
        edge.efficiency_from_measurement(1e9, 0.0, 100.0)


def test_memory_fit_reports_shared_memory():
    nano = edge.find_board("orin-nano")
    m = edge.memory_fit(4 * 10**9, nano)
    assert m["fraction"] == pytest.approx(0.5) and m["within"] and m["shared_memory"]
    assert not edge.memory_fit(9 * 10**9, nano)["within"]


# -- boards ---------------------------------------------------------------------------------------


def test_board_file_has_the_boards_with_their_bandwidths():
    boards = edge.load_boards()
    want = {"jetson-orin-nano-8gb": 68.0, "jetson-orin-nano-super": 102.0, "jetson-orin-nx-16gb": 102.4,
            "jetson-agx-orin-64gb": 204.8, "jetson-thor": 273.0, "rtx-4060": 272.0, "h200": 4800.0}
    assert {n: b.bandwidth_gbps for n, b in boards.items() if n in want} == want
    assert all(b.source and b.memory_gb > 0 for b in boards.values())
    assert edge.find_board("AGX-Orin").name == "jetson-agx-orin-64gb"
    assert edge.find_board("thor").name == "jetson-thor"
    with pytest.raises(edge.EdgeError, match="unknown board 'nano9'; known: jetson-orin-nano-8gb"):
        edge.find_board("nano9")


def test_design_table_floors_are_reproduced():
    # DESIGN.md §11: bf16 / 4-bit / 4-bit parallel at 100 % of the bandwidth
    rows = {"jetson-thor": (90, 26, 3), "jetson-agx-orin-64gb": (120, 35, 4), "jetson-orin-nx-16gb": (241, 71, 8),
            "jetson-orin-nano-8gb": (362, 106, 12)}
    kinds = [("bf16", "autoregressive"), ("w4", "autoregressive"), ("w4", "parallel")]
    for name, expected in rows.items():
        board = edge.find_board(name)
        for (w, d), ms in zip(kinds, expected):
            b = edge.chunk_bytes(BIG, 4096, weights=w, decoding=d, prompt_tokens=64)
            assert edge.project(b, board, efficiency=1.0)["chunk_ms"] == pytest.approx(ms, rel=0.1, abs=0.6)


def test_boards_file_is_found_in_an_installed_share_directory(tmp_path, monkeypatch):
    pytest.importorskip("ament_index_python")
    share = tmp_path / "share"
    (share / "ament_index" / "resource_index" / "packages").mkdir(parents=True)
    (share / "ament_index" / "resource_index" / "packages" / "vla_edge_ros").write_text("")
    (share / "vla_edge_ros" / "config").mkdir(parents=True)
    installed = share / "vla_edge_ros" / "config" / "boards.yaml"
    installed.write_text("boards:\n  only-board: {bandwidth_gbps: 10, memory_gb: 1, source: test}\n")
    monkeypatch.delenv("VLA_EDGE_BOARDS_FILE", raising=False)
    monkeypatch.setenv("AMENT_PREFIX_PATH", str(tmp_path))
    assert edge.boards_path() == str(installed)
    assert list(edge.load_boards()) == ["only-board"]
    monkeypatch.setenv("AMENT_PREFIX_PATH", str(tmp_path / "nothing"))
    assert edge.boards_path() == os.path.join(REPO, "config", "boards.yaml")  # the source checkout


@pytest.mark.parametrize("text,match", [
    ("boards: [1, 2]", "expected a mapping"),
    ("boards:\n  x: {bandwidth_gbps: -3, memory_gb: 8}", "bandwidth_gbps must be a positive number"),
    ("boards:\n  x: {bandwidth_gbps: 3}", "memory_gb must be a positive number"),
    ("boards: {x: [", "cannot read the board list"),
])
def test_a_bad_board_file_is_one_clear_error(tmp_path, text, match):
    p = tmp_path / "boards.yaml"
    p.write_text(text)
    with pytest.raises(edge.EdgeError, match=match):
        edge.load_boards(str(p))


# -- the tool -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("edge") / "tiny"
    subprocess.run([sys.executable, "-m", "vla_edge_ros.tools.make_model", "--preset", "tiny", "--out", str(out)],
                   check=True, cwd=REPO, capture_output=True)
    return str(out)


@pytest.fixture(scope="module")
def big_dir(tmp_path_factory):
    """A 1.5B-shape model dir with its config only: the plan reads no weights."""
    out = tmp_path_factory.mktemp("edge") / "big"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(BIG.to_hf_dict()))
    return str(out)


def run_tool(*args):
    return subprocess.run([sys.executable, "-m", "vla_edge_ros.tools.plan", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_tool_on_a_generated_tiny_model(tiny_dir, tmp_path):
    out = tmp_path / "plan.json"
    r = run_tool("--model", tiny_dir, "--board", "agx-orin", "--json", str(out))
    assert r.returncode == 0, r.stderr
    text = r.stdout
    for piece in ("VRAM plan (vram_plan.py)", "Bytes one chunk must move", "jetson-agx-orin-64gb", "fits",
                  "floor at 100 % of bandwidth", "hidden 512, 2 layers", "this model's shape has no measurement",
                  "Measured shapes, bf16, on each board", "qwen2.5-0.5b", "qwen2.5-3b"):
        assert piece in text
    assert "jetson-thor" not in text  # one board asked for
    data = json.loads(out.read_text())
    from vla_edge_ros.model.config import ModelConfig

    cfg = ModelConfig.from_dir(tiny_dir)
    assert data["chunk_bytes"] == edge.chunk_bytes(cfg, 4096)
    assert data["vram_plan_bytes"] == vram_plan(cfg, 4096)
    (p,) = data["boards"]
    want = edge.project(data["chunk_bytes"], edge.find_board("jetson-agx-orin-64gb"), cfg=cfg)
    assert want["basis"] == "floor"  # the tiny shape was never measured: no other shape's efficiency is borrowed
    assert p["verdict"] == want["verdict"] == "fits" and p["chunk_ms"] == pytest.approx(want["chunk_ms"])
    assert data["measured_shape"] is None and p["compute_bound"] is None


def test_tool_on_the_1_5b_shape_prints_every_board_and_the_design_numbers(big_dir):
    r = run_tool("--model", big_dir, "--prompt-tokens", "64", "--efficiency", "1")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any("total" in ln and "24.647 GB" in ln for ln in lines)
    for name in edge.load_boards():
        row = [ln for ln in lines if ln.strip().startswith(name + " ")][0]  # the projection table (then the shapes')
        assert ("does not fit" in row) == (name != "h200")
    nano = [ln for ln in lines if ln.strip().startswith("jetson-orin-nano-8gb ")][0]
    assert " 362.4" in nano  # 24.647 GB / 68 GB/s
    r = run_tool("--model", big_dir, "--weights", "w4", "--decoding", "parallel", "--board", "orin-nano",
                 "--efficiency", "0.5")
    assert r.returncode == 0, r.stderr
    assert "what-if" in r.stdout and "given efficiency: 50.0 %" in r.stdout and " fits " in r.stdout


def test_tool_help_has_every_option_default_and_an_example():
    r = run_tool("--help")
    assert r.returncode == 0
    for opt in ("--model", "--board", "--capacity", "--prompt-tokens", "--period-ms", "--margin-ms", "--efficiency",
                "--weights", "--decoding", "--json"):
        assert opt in r.stdout
    assert r.stdout.count("default:") >= 9 and "example:" in r.stdout and "vla-edge-plan --model" in r.stdout


@pytest.mark.parametrize("args,match", [
    (["--model", "/nonexistent/model"], "model directory not found"),
    (["--board", "nano9"], "unknown board 'nano9'; known: jetson-orin-nano-8gb"),
    (["--capacity", "abc"], "--capacity: 'abc' is not an integer"),
    (["--capacity", "40"], "--capacity 40 is too small"),
    (["--capacity", "99999999999"], "--capacity 99999999999 must be between"),
    (["--efficiency", "0"], "--efficiency 0 must be in (0, 1]"),
    (["--efficiency", "nan"], "not a finite number"),
    (["--period-ms", "2", "--margin-ms", "3"], "--period-ms / --margin-ms: deadline period_ms=2.0 must be greater"),
    (["--prompt-tokens", "-1"], "--prompt-tokens -1 must be >= 0"),
    (["--json", "/"], "is a directory"),
    (["--json", "/nonexistent/dir/p.json"], "does not exist"),
    (["--weights", "w8"], "invalid choice"),
])
def test_tool_errors_are_one_line(tiny_dir, capsys, args, match):
    if "--model" not in args:
        args = ["--model", tiny_dir] + args
    try:
        rc = plan_tool.main(args)
    except SystemExit as e:  # argparse
        rc = e.code
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("vla-edge-plan: error:") and match in err


def test_tool_errors_in_a_process_have_no_traceback(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    for args in (["--model", str(tmp_path)], []):
        r = run_tool(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr and r.stdout == ""
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("vla-edge-plan: error:")


def test_tool_reads_the_weight_format_and_decoding_from_a_quantized_model_dir(tmp_path):
    config = pytest.importorskip("vla_edge_ros.model.config")
    if not hasattr(config, "QuantConfig"):
        pytest.skip("this ModelConfig has no quantization options")
    import dataclasses

    cfg = dataclasses.replace(BIG, quant=config.QuantConfig("awq"), action_decoding="parallel")
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    assert edge.chunk_bytes(config.ModelConfig.from_dir(str(tmp_path)), 4096) == \
        edge.chunk_bytes(BIG, 4096, weights="w4", decoding="parallel")
    r = run_tool("--model", str(tmp_path), "--board", "orin-nano", "--efficiency", "1")
    assert r.returncode == 0, r.stderr
    assert "W4A16, group 128, zero points" in r.stdout and "action decoding parallel" in r.stdout
    assert "what-if" not in r.stdout


@pytest.mark.parametrize("preset", ["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b"])
def test_each_published_shape_uses_its_own_measurement(tmp_path, preset):
    """vla-edge-plan on a model of each measured shape: the efficiency and the SM-confined bound of that shape's entry
    in boards.yaml (named in the output), never another shape's."""
    import dataclasses

    cfg = dataclasses.replace(PRESETS[preset], quant=None)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf_dict()))
    name, entry = edge.measured_for(cfg)
    assert name == preset
    r = run_tool("--model", str(tmp_path), "--board", "orin-nano-super", "--weights", "w4", "--decoding", "parallel",
                 "--json", str(tmp_path / "p.json"))
    assert r.returncode == 0, r.stderr
    assert f"measured on this model's own shape ({preset})" in r.stdout
    data = json.loads((tmp_path / "p.json").read_text())
    (b,) = data["boards"]
    assert b["efficiency"] == entry["efficiency"]["w4-parallel"] and b["shape"] == preset
    c = b["compute_bound"]
    assert c["shape"] == preset and c["measured_ms"] == entry["sm_confined"]["chunk_ms"]["w4-parallel"][8]
    assert c["chunk_ms"] == pytest.approx(c["measured_ms"] * 1980 / 1020 / 0.5)
    # the side-by-side table holds every measured shape, each with its own numbers
    assert [s["shape"] for s in data["shapes"]] == list(edge.measured_shapes())
    for s in data["shapes"]:
        assert s["efficiency"] == edge.measured_shapes()[s["shape"]]["efficiency"]["w4-parallel"]


def test_a_shape_between_the_measured_ones_gets_floors_only():
    """A shape the boards file has no entry for (e.g. a 1.5B with fewer layers) borrows nothing."""
    import dataclasses

    cfg = dataclasses.replace(BIG, num_hidden_layers=20)
    assert edge.measured_for(cfg) == (None, None)
    assert edge.measured_efficiency("w4-parallel", cfg) == (None, None)
    assert edge.compute_bound("w4-parallel", edge.find_board("orin-nano"), cfg=cfg) is None
    assert edge.compute_bound("w4-parallel", edge.find_board("orin-nano")) is None  # no model: no shape to match


def test_compute_bound_scales_the_sm_confined_measurement():
    """vla-edge-plan's compute/latency bound: the chunk measured on N SMs of a Hopper card, scaled by SMs, clock and
    tensor rate."""
    measured = {"sm_confined": {"clock_mhz": 2000, "chunk_ms": {"w4-parallel": {8: 20.0, 16: 10.0}}}}
    nano = edge.Board("nano", 68.0, 8, sms=8, gpu_clock_mhz=1000, tensor_rate_vs_hopper=0.5)
    c = edge.compute_bound("w4-parallel", nano, measured)
    assert c["measured_sms"] == 8 and c["chunk_ms"] == pytest.approx(20.0 * 2 / 0.5)
    agx = edge.Board("agx", 204.8, 64, sms=20, gpu_clock_mhz=2000, tensor_rate_vs_hopper=1.0)
    assert edge.compute_bound("w4-parallel", agx, measured)["chunk_ms"] == pytest.approx(10.0 * 16 / 20)
    big = edge.Board("big", 4000.0, 80, sms=132, gpu_clock_mhz=2000, tensor_rate_vs_hopper=1.0)
    assert edge.compute_bound("w4-parallel", big, measured) is None  # 132 SMs: too far from 16 to scale linearly
    assert edge.compute_bound("bf16", nano, measured) is None  # kind not measured confined
    assert edge.compute_bound("w4-parallel", edge.Board("x", 68.0, 8), measured) is None  # board without SM data
    measured["shape"] = {"hidden_size": 1536}  # one shape's entry: only that shape
    assert edge.compute_bound("w4-parallel", nano, measured, cfg=SimpleNamespace(hidden_size=512)) is None
    assert edge.compute_bound("w4-parallel", nano, measured, cfg=SimpleNamespace(hidden_size=1536)) is not None


def test_the_data_file_carries_the_measurements():
    """Measured constants live in config/boards.yaml with their source, per shape, not in code."""
    shapes = edge.measured_shapes()
    assert set(shapes) == {"qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b"}
    for name, e in shapes.items():
        assert edge.measured_for(PRESETS[name])[0] == name  # each entry is the preset's geometry
        assert set(e["efficiency"]) == {"bf16", "w4", "bf16-parallel", "w4-parallel"}
        assert set(e["whole_gpu_chunk_ms"]) == set(e["efficiency"]) and e["device"].startswith("NVIDIA H")
        assert "chunk_bench" in e["source"] and "--sms" in e["source"]
        assert e["sm_confined"]["chunk_ms"]["w4-parallel"][8] > e["sm_confined"]["chunk_ms"]["w4-parallel"][16] > 0
    assert set(shapes["qwen2.5-0.5b"]["sm_confined"]["chunk_ms"]) == {"bf16", "w4", "bf16-parallel", "w4-parallel"}
    for b in edge.load_boards().values():
        assert b.sms and b.gpu_clock_mhz and b.tensor_rate_vs_hopper


def _cb_json(folder, preset, kind, weights, decoding, k, ms, eff, sms=132, seen=132):
    name = f"cb_{preset}_{kind}" + (f"_sm{sms}" if sms != 132 else "") + ".json"
    (folder / name).write_text(json.dumps({
        "device": "NVIDIA H200", "weights": weights, "action_decoding": decoding, "action_chunk": k, "sms": sms,
        "green_context": sms != 132, "sms_seen_by_probe": seen, "chunk_device_ms": {"p50": ms},
        "efficiency_of_copy_bw": eff}))


def test_boards_measured_writes_what_edge_reads(tmp_path):
    """bench/boards_measured.py turns one call's chunk_bench files into measured.shapes entries that edge.py reads
    back: the kind keys edge.chunk_kind gives (a K = 8 chunk its own), whole-GPU and confined times in their places;
    a confined run whose SM probe saw another count is refused."""
    import importlib.util

    import yaml

    spec = importlib.util.spec_from_file_location("boards_measured", os.path.join(REPO, "bench", "boards_measured.py"))
    bm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bm)
    p = "qwen2.5-1.5b"
    _cb_json(tmp_path, p, "awq-parallel", "w4", "parallel", 1, 2.2, 0.09)
    _cb_json(tmp_path, p, "awq-parallel-k8", "w4", "parallel", 8, 2.9, 0.07)
    _cb_json(tmp_path, p, "bf16", "bf16", "autoregressive", 1, 9.8, 0.59)
    _cb_json(tmp_path, p, "awq-parallel", "w4", "parallel", 1, 12.0, 0.02, sms=8, seen=8)
    _cb_json(tmp_path, p, "awq-parallel-k8", "w4", "parallel", 8, 15.0, 0.02, sms=8, seen=8)
    _cb_json(tmp_path, p, "awq-parallel-state", "w4", "parallel", 1, 99.0, 0.01)  # a state twin: not a kind
    shapes, devices = bm.collect(str(tmp_path))
    text = "measured:\n  shapes:\n" + bm.render(shapes, devices.pop(), 1980, "test")
    measured = yaml.safe_load(text)["measured"]
    name, entry = edge.measured_for(PRESETS[p], measured)
    assert name == p and entry["device"] == "NVIDIA H200"
    assert entry["efficiency"] == {"w4-parallel": 0.09, "w4-parallel-k8": 0.07, "bf16": 0.59}
    assert entry["whole_gpu_chunk_ms"]["w4-parallel"] == 2.2 and entry["whole_gpu_chunk_ms"]["w4-parallel-k8"] == 2.9
    nano = edge.Board("nano", 68.0, 8, sms=8, gpu_clock_mhz=990, tensor_rate_vs_hopper=0.5)
    c = edge.compute_bound("w4-parallel-k8", nano, measured, PRESETS[p])
    assert c["measured_ms"] == 15.0 and "8 SMs of an NVIDIA H200" in c["basis"]
    assert edge.compute_bound("w4-parallel", nano, measured, PRESETS[p])["chunk_ms"] == pytest.approx(12.0 * 2 * 2)
    _cb_json(tmp_path, p, "bf16", "bf16", "autoregressive", 1, 50.0, 0.1, sms=16, seen=12)
    with pytest.raises(SystemExit, match="the probe saw 12"):
        bm.collect(str(tmp_path))
