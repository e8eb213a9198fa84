# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The tools' cases of issue 43, item 6, each in a real process with its documented exit status and one line.

vla-edge-generate: a prompt past the model's context (a 43,000-character CJK prompt, 100,000 --prompt-ids) is refused
in one line before anything is allocated, under a memory cap that the old run was killed at; lone surrogates in
--prompt and --system without --chat are one line (exit 2). vla-edge-quantize: a GGUF with NaN weights, a hidden or
FFN size that is not a multiple of 128, a missing model and a FIFO named x.gguf are models that cannot be quantized
(exit 3, not the option-error 2); the FIFO's reason says what it is, for every tool (check_model_path)."""
from __future__ import annotations

import dataclasses
import os
import resource
import subprocess
import sys

import numpy as np
import pytest

from vla_edge_ros.model.checkpoint import check_model_path, load_model
from vla_edge_ros.model.config import PRESETS
from vla_edge_ros.model.generate import make_model
from vla_edge_ros.textgen import PREFILL_BLOCK, generate, text_model

pytest.importorskip("gguf")
from vla_edge_ros.model.gguf import save_gguf  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEMORY_CAP = 3 << 30  # the address-space cap of the runs below: far above what a refusal needs


def _cap():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


def _run(code_or_tool, *args, timeout=180):
    """Run a tool (a name) in a process under MEMORY_CAP; `code_or_tool` may be Python code calling main(argv)."""
    cmd = ([sys.executable, "-c", code_or_tool] if "\n" in code_or_tool or "(" in code_or_tool
           else [sys.executable, "-m", f"vla_edge_ros.tools.{code_or_tool}"])
    return subprocess.run([*cmd, *map(str, args)], capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          env=dict(os.environ, PYTHONPATH=ROOT), preexec_fn=_cap)


def _one_line(r, prog: str, rc: int) -> str:
    assert r.returncode == rc, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: "), r.stderr[-2000:]
    return lines[0]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tools43")
    make_model(str(d / "tiny"), "tiny", seed=1)
    w = load_model(str(d / "tiny"))
    out = {"dir": str(d / "tiny"), "gguf": save_gguf(d / "tiny.gguf", w, "F32", "F32")}  # byte-level vocabulary
    w.layers[0]["wo"] = np.full(w.layers[0]["wo"].shape, np.nan, np.float32)
    out["nan"] = save_gguf(d / "nan.gguf", w, "F16", "F16")
    for name, change in (("hidden", dict(hidden_size=320, num_attention_heads=5, num_key_value_heads=1)),
                         ("ffn", dict(intermediate_size=600))):
        make_model(str(d / name), cfg=dataclasses.replace(PRESETS["tiny"], **change), seed=1)
        out[name] = save_gguf(d / f"{name}.gguf", load_model(str(d / name)), "F16", "F16")
        out[name + "_dir"] = str(d / name)
    os.mkfifo(d / "x.gguf")
    out["fifo"] = str(d / "x.gguf")
    out["root"] = d
    return out


# --- vla-edge-generate ------------------------------------------------------------------------------------------

def test_a_cjk_prompt_past_the_context_is_one_line_under_a_memory_cap(models):
    prompt = "机器人" * 14334  # 43,002 characters, 129,006 byte tokens: past the 32,768-position context
    line = _one_line(_run("generate", "--model", models["gguf"], "--prompt", prompt), "vla-edge-generate", 2)
    assert "past the model's context of 32768" in line and "129006 tokens" in line


def test_100000_prompt_ids_are_one_line_under_a_memory_cap(models):
    code = ("import sys; from vla_edge_ros.tools.generate import main; "
            "sys.exit(main(['--model', sys.argv[1], '--prompt-ids', ','.join(['5'] * 100000)]))")
    line = _one_line(_run(code, models["dir"]), "vla-edge-generate", 2)  # argv cannot hold it: main(argv)
    assert "100000 tokens" in line and "past the model's context" in line


def test_a_long_prompt_within_the_context_runs_in_blocks(models):
    """The prefill runs in PREFILL_BLOCK-token blocks: the same greedy tokens as one pass, and a 3-block prompt
    runs under the memory cap."""
    from vla_edge_ros.model.reference import ReferenceModel

    w = load_model(models["dir"])
    ids = [int(x) for x in np.random.default_rng(0).integers(0, 1500, 2 * PREFILL_BLOCK + 17)]
    m = text_model(w, "numpy", len(ids) + 4)
    blocked = generate(m, ids, 4).ids
    whole = ReferenceModel(w, len(ids) + 4)
    first = int(whole.text_logits(ids, 0, last_only=True)[-1].argmax())
    assert blocked[0] == first
    r = _run("generate", "--model", models["dir"], "--prompt-ids", ",".join(map(str, ids)), "--tokens", "2",
             "--backend", "numpy", "--no-stop")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]


def test_a_lone_surrogate_in_the_prompt_is_one_line(models):
    r = subprocess.run([sys.executable, "-m", "vla_edge_ros.tools.generate", "--model", models["gguf"].encode(),
                        "--prompt", b"go \xff there"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env=dict(os.environ, PYTHONPATH=ROOT))  # argv bytes that are not UTF-8: lone surrogates
    line = _one_line(r, "vla-edge-generate", 2)
    assert "--prompt is not valid UTF-8" in line


def test_system_without_chat_is_refused(models):
    line = _one_line(_run("generate", "--model", models["gguf"], "--prompt", "hi", "--system", "be brief"),
                     "vla-edge-generate", 2)
    assert "--system needs --chat" in line


# --- vla-edge-quantize and the FIFO -------------------------------------------------------------------------------

@pytest.mark.parametrize("case, needle", [
    ("nan", "contains NaN or Inf"), ("hidden", "hidden_size 320 not a multiple of the 128-channel group"),
    ("ffn", "intermediate_size 600 not a multiple of the 128-channel group"),
    ("hidden_dir", "hidden_size 320 not a multiple"), ("fifo", "a FIFO (named pipe), not a GGUF file"),
    ("missing", "no such model"),
])
def test_quantize_refuses_a_model_it_cannot_quantize_with_exit_3(models, case, needle):
    model = str(models["root"] / "nope") if case == "missing" else models[case]
    out = models["root"] / f"q_{case}"
    line = _one_line(_run("quantize", "--model", model, "--format", "awq", "--out", out, timeout=60),
                     "vla-edge-quantize", 3)
    assert needle in line and not out.exists()


def test_a_fifo_named_like_a_gguf_is_named_as_a_fifo_by_every_tool(models):
    why = check_model_path(models["fifo"])
    assert "FIFO" in why and "not readable" not in why
    line = _one_line(_run("generate", "--model", models["fifo"], "--prompt-ids", "1,2", timeout=60),
                     "vla-edge-generate", 3)
    assert "a FIFO (named pipe)" in line
