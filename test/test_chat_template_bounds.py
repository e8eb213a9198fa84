# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""A chat template can never stop the control loop (issue 43, item 1): the template comes from the model file and is
rendered for every instruction, so it renders in a child process with a time budget, an output cap and a memory
cap. A template that fails or runs away refuses that instruction (one line, promptly, the previous instruction
stays); one that fails on a sample instruction refuses the model at start-up; the normal Qwen2.5 template gives the
same prompt ids as before."""
from __future__ import annotations

import dataclasses
import shutil
import threading
import time

import numpy as np
import pytest

from vla_edge_ros.engine import Engine
from vla_edge_ros.instruction import InstructionError, PromptBuilder
from vla_edge_ros.model.checkpoint import load_model
from vla_edge_ros.model.generate import make_model
from vla_edge_ros.model.gguf import save_gguf
from vla_edge_ros.model.chat_template import RENDER_BUDGET_S, RENDER_MEMORY_BYTES, TemplateRefused, render_template
from vla_edge_ros.model.tokenizer import load_tokenizer

CAPACITY = 512
CHAT = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# The cases of issue 43: each runs only for an instruction that says "spin", so the model itself starts.
HOSTILE = {
    "range(10**9)": ("{{ range(10**9) | list }}", "OverflowError"),
    "10**10 iterations": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                          "render budget"),
    # not a constant: jinja2 folds constant expressions when it compiles (that one meets the memory cap there).
    # The allocation fails at the address-space cap before it touches memory: not the budget (a kill, a new child)
    "100 MB at once": ("{{ 'x' * (messages | length * 50000000) }}", "memory cap"),
    "100 MB streamed": ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "character cap"),
}
PROMPT_WITHIN_S = RENDER_BUDGET_S + 0.25  # the budget, the kill and a 2-core host's scheduling


def triggered(hostile: str) -> str:
    return "{% if 'spin' in messages[-1].content %}" + hostile + "{% endif %}" + CHAT


@pytest.fixture(scope="module")
def tiny_weights(tmp_path_factory):
    """The tiny model and the folder its per-test GGUFs go to (23 MB each, 255 MB by the file's end: deleted then)."""
    d = tmp_path_factory.mktemp("tpl")
    make_model(str(d / "tiny"), "tiny", seed=5)
    yield load_model(str(d / "tiny")), d
    shutil.rmtree(d, ignore_errors=True)


def gguf_with(tiny_weights, template: str, name: str) -> str:
    """The tiny model as a GGUF whose chat template is `template` (<|im_start|>, <|im_end|> control tokens)."""
    weights, d = tiny_weights
    return save_gguf(d / f"{name}.gguf", weights, "F32", "F32", chat_template=template,
                     control_tokens=("<|im_start|>", "<|im_end|>"))


def builder(tiny_weights, template: str, name: str) -> PromptBuilder:
    tok = load_tokenizer(gguf_with(tiny_weights, template, name))
    return PromptBuilder(tok, 2048, CAPACITY, "You drive a robot.", np.arange(4))


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_template_refuses_that_instruction_promptly_and_the_builder_goes_on(tiny_weights, case):
    hostile, why = HOSTILE[case]
    pb = builder(tiny_weights, triggered(hostile), f"h{list(HOSTILE).index(case)}")
    good = pb.build("go left")
    t0 = time.monotonic()
    with pytest.raises(InstructionError, match=why) as e:
        pb.build("spin around")
    took = time.monotonic() - t0
    assert took < PROMPT_WITHIN_S and "\n" not in str(e.value), (took, str(e.value))
    time.sleep(1.5)  # a killed render child is replaced in the background (~0.25 s)
    again = pb.build("go right")  # the builder, and the renderer under it, still work
    assert pb.tokenizer.decode(again.ids).endswith("go right<|im_end|>\n<|im_start|>assistant\n")
    assert pb.build("go left").ids.tolist() == good.ids.tolist()


def test_the_loop_publishes_every_tick_while_hostile_renders_run(tiny_weights):
    """The render runs in a child: the parent only waits on a pipe, so a thread that ticks every 5 ms is never held
    up (a pure-Python render in a thread would hold the interpreter lock for its whole budget and beyond)."""
    pb = builder(tiny_weights, triggered(HOSTILE["10**10 iterations"][0]), "ticks")
    stop, gaps = threading.Event(), []

    def tick():
        last = time.monotonic()
        while not stop.is_set():
            time.sleep(0.005)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    t = threading.Thread(target=tick)
    t.start()
    refused = 0
    try:
        for _ in range(4):
            try:
                pb.build("spin around")
            except InstructionError:
                refused += 1
            time.sleep(0.5)
    finally:
        stop.set()
        t.join()
    assert refused == 4
    assert max(gaps) < 0.1, f"a 5 ms tick waited {max(gaps) * 1000:.0f} ms"


def test_the_render_child_has_a_memory_cap():
    """With time to spare, a render that needs 300 MB meets the child's address-space cap, not the host's memory."""
    tpl = "{% set s = 'x' * 100000000 %}{{ (s ~ s ~ s) | length }}"
    with pytest.raises(TemplateRefused, match=f"{RENDER_MEMORY_BYTES >> 20} MiB memory cap"):
        render_template(tpl, [{"role": "user", "content": "go"}], budget_s=20.0)


def test_the_previous_instruction_stays(tiny_weights):
    path = gguf_with(tiny_weights, triggered(HOSTILE["10**10 iterations"][0]), "stays")
    e = Engine(path, backend="numpy", kv_capacity_tokens=CAPACITY, instruction="go left")
    try:
        before = e.prompt_ids.copy()
        with pytest.raises(InstructionError, match="render budget") as refused:
            e.prompts.build("spin around")
        assert not refused.value.lasting  # a budget refusal may not repeat: the instruction feeds try it again
        assert e.instruction.text == "go left" and e.prompt_ids.tolist() == before.tolist()
    finally:
        e.close()


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_template_that_fails_on_every_instruction_refuses_the_model_at_start_up(tiny_weights, case):
    from vla_edge_ros.frame_buffer import FrameBuffer
    from vla_edge_ros.runtime import Runtime, StartupError
    from vla_edge_ros.settings import ReasoningSettings

    path = gguf_with(tiny_weights, HOSTILE[case][0] + CHAT, f"s{list(HOSTILE).index(case)}")
    s = ReasoningSettings.from_values({"backend": "numpy", "kv_capacity_tokens": CAPACITY, "warmup_chunks": 1})
    t0 = time.monotonic()
    with pytest.raises(StartupError) as e:
        Runtime.build(path, s, FrameBuffer())
    msg = str(e.value)
    assert "\n" not in msg and "chat template fails on a sample instruction" in msg, msg
    assert "instruction_template: raw" in msg and time.monotonic() - t0 < 60
    raw = Engine(path, backend="numpy", kv_capacity_tokens=CAPACITY, instruction_template="raw",
                 instruction="go left")  # the way out the message names
    try:
        assert raw.instruction.template == "raw" and raw.instruction.text == "go left"
    finally:
        raw.close()


def test_the_qwen_template_gives_the_same_ids_as_an_unbounded_render(real_gguf):
    """The bounded render is the same jinja2 sandbox as before, only elsewhere: same text, same ids."""
    from vla_edge_ros.model.chat_template import sandbox

    tok = load_tokenizer(real_gguf)
    pb = PromptBuilder(tok, 151936, 4096, "You drive a robot.", np.arange(3))
    for text in ("pick up the red cup", "déplace le cube bleu\nà gauche", "go 3 m forward, then stop"):
        ids = pb.build(text).ids
        messages = [{"role": "system", "content": "You drive a robot."}, {"role": "user", "content": text}]
        ref = sandbox().from_string(tok.chat_template).render(messages=messages, add_generation_prompt=True,
                                                              bos_token="", eos_token=tok.eos_token or "",
                                                              tools=None)
        assert ids.tolist() == tok.encode(ref)
        assert tok.decode(ids).endswith(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n")


def test_the_parameter_check_and_the_change_render_once(tiny_weights):
    pb = builder(tiny_weights, CHAT, "once")
    calls = []
    real = pb.tokenizer.render_chat
    pb.tokenizer = dataclasses.replace(pb.tokenizer)
    pb.tokenizer.render_chat = lambda *a, **k: calls.append(1) or real(*a, **k)
    a, b = pb.build("go left"), pb.build("go left")
    assert a.ids.tolist() == b.ids.tolist() and len(calls) == 1
