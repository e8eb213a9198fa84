# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The language part of the VLA: a task in words, checked and turned into the pinned prompt (ROS-free).

An instruction arrives as text (the `instruction` parameter, the `~/instruction` topic, the bench's schedule). It is
checked before anything else is done with it, then rendered with the model's own chat template (or appended to the
system prompt as raw text) and tokenized with the model's own tokenizer. The result, an `Instruction`, is what the
engine prefills into the pinned prompt region of the KV cache (DESIGN.md §5, §8). The template comes from the model
file, so it renders bounded (model/chat_template.TemplateRenderer: a child process, a time budget, an output cap): a
template that fails or exceeds a bound refuses that instruction, and one that fails on a sample instruction refuses
the model when its PromptBuilder is made (configure).

Bounded before tokenizing: at most MAX_INSTRUCTION_CHARS characters; not valid UTF-8 (lone surrogates), empty,
or control characters only is refused; control characters inside the text are removed, and so are the strings of
the tokenizer's special and added tokens ("<|im_end|>", "<tool_call>"...), again until none is left (a removal can
join its neighbours into another: "<|im_<|im_end|>end|>"), so an instruction cannot close the user turn and write
one of its own. After tokenizing at most `max_instruction_tokens` tokens, and the whole prompt plus one frame and the
action tokens must fit the KV cache. Each refusal is one `InstructionError` line; the previous instruction stays.
"""
from __future__ import annotations

import threading
import time
import unicodedata
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from .constants import ACTION_TOKENS, ACTION_VOCAB, VISION_TOKENS
from .kv_cache import min_capacity
from .model.chat_template import RENDER_BUDGET_S, RENDER_START_S, TemplateRefused

MAX_INSTRUCTION_CHARS = 4096  # checked before tokenizing: a 1 MB string costs a length check, nothing more
MAX_INSTRUCTION_BYTES = 4 * MAX_INSTRUCTION_CHARS  # UTF-8 of the longest text: a longer message is refused uncopied
TEMPLATES = ("auto", "chat", "raw")  # auto: the model's chat template when it has one, else raw
KEEP_CONTROLS = ("\n", "\t")
MAX_SPECIAL_PASSES = 16  # special-token strings nested deeper than this are refused rather than unwrapped
# The sample instruction the chat template must render when the PromptBuilder is made (a model whose template fails
# on it would refuse every instruction: it is refused at configure instead).
PROBE_INSTRUCTION = "pick up the red block and put it in the bin"
PROBE_BUDGET_S = 1.0  # its render budget: at configure a busy host must not pass for a template that runs away
RENDERS_KEPT = 16  # renders remembered by text: the parameter's check and its change render once, not twice
TRANSIENT_REFUSAL_S = 1.0  # a refusal that may not repeat (the time budget) is remembered this long only
TRANSIENT_RETRIES = 3  # a latest request refused that way is checked again this many times, TRANSIENT_REFUSAL_S apart


class InstructionError(ValueError):
    """An instruction that is refused (one line); the active one stays. `lasting`: the same text would be refused
    again (false for a render over its time budget, which a busy host can cause)."""

    def __init__(self, message: str, lasting: bool = True):
        super().__init__(message)
        self.lasting = lasting


class TransientRefusal(str):
    """A refusal that may not repeat (`InstructionError.lasting` false): `Runtime.check_instruction`'s answer for a
    render over its time budget. `check_with_retries` tries such a text again."""


def check_with_retries(check, text, superseded) -> str | None:
    """`check(text)` (None, or why it is refused); a `TransientRefusal` is checked again once the PromptBuilder has
    forgotten it (TRANSIENT_REFUSAL_S), up to TRANSIENT_RETRIES times, so a render refused while the host was busy does
    not leave the old instruction in place for good. `superseded(timeout_s)` waits for a newer request and says whether
    one came (then this one is not tried again)."""
    why = check(text)
    for _ in range(TRANSIENT_RETRIES):
        if not isinstance(why, TransientRefusal) or superseded(TRANSIENT_REFUSAL_S + 0.05):
            break
        why = check(text)
    return why


@dataclass(frozen=True)
class Instruction:
    text: str  # as checked ("" = no task: the default system prompt)
    ids: np.ndarray  # int32: the whole pinned prompt
    instruction_tokens: int  # tokens of the instruction text alone (0 for none)
    template: str  # "chat" | "raw" | "none"
    source: str = "start"  # "start" | "parameter" | "topic" | "bench"


def string_from_cdr(raw: bytes) -> bytes:
    """The bytes of a serialized std_msgs/String (CDR: a 4-byte encapsulation header, a uint32 length that counts the
    trailing NUL, the bytes), undecoded: `clean` decodes them strictly, so a message that is not UTF-8 is refused
    by name (rclpy's own deserialization replaces such bytes with U+FFFD and the text would pass). A message whose
    text is longer than MAX_INSTRUCTION_BYTES is refused by its length alone, before any of it is copied or read."""
    size = len(raw)
    if size > 8 + MAX_INSTRUCTION_BYTES + 4:  # header, length, the text, its NUL and padding
        raise InstructionError(f"a {size}-byte message: longer than {MAX_INSTRUCTION_CHARS} characters (refused "
                               "before it is copied)")
    raw = bytes(raw)
    if size < 8 or raw[0] != 0 or raw[1] not in (0, 1):
        raise InstructionError(f"not a serialized std_msgs/String ({size} bytes, header {raw[:4].hex()})")
    n = int.from_bytes(raw[4:8], "little" if raw[1] == 1 else "big")
    if n < 1 or 8 + n > size:
        raise InstructionError(f"a serialized std_msgs/String whose length {n} exceeds its {size} bytes")
    return raw[8:8 + n - 1]


def clean(text) -> str:
    """`text` checked and with control characters removed; raises InstructionError saying why it is refused."""
    if isinstance(text, (bytes, bytearray)):
        if len(text) > 4 * MAX_INSTRUCTION_CHARS:
            raise InstructionError(f"{len(text)} bytes: longer than {MAX_INSTRUCTION_CHARS} characters (refused "
                                   f"before decoding)")
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as e:
            raise InstructionError(f"not valid UTF-8 ({e.reason} at byte {e.start})") from None
    if not isinstance(text, str):
        raise InstructionError(f"not text but {type(text).__name__}")
    if len(text) > MAX_INSTRUCTION_CHARS:
        raise InstructionError(f"{len(text)} characters: longer than {MAX_INSTRUCTION_CHARS} (refused before "
                               f"tokenizing)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InstructionError(f"not valid UTF-8 (a lone surrogate at character {e.start})") from None
    kept = "".join(c for c in text if c in KEEP_CONTROLS or unicodedata.category(c) not in ("Cc", "Cf", "Cs"))
    if not kept.strip():
        raise InstructionError("control characters only" if text.strip() else "empty")
    return kept.strip()


class PromptBuilder:
    """Turns instruction text into the pinned prompt of one model: its tokenizer (None: the model has none), its
    vocabulary (the prompt never holds action-range ids or the start token) and the KV capacity.

    With a chat template the constructor renders PROBE_INSTRUCTION (waiting up to RENDER_START_S for the render
    child to start) and raises InstructionError (one line) when the template fails on it; each `build` renders
    within `render_budget_s` (the whole call, so it may run on the control thread)."""

    def __init__(self, tokenizer, vocab_size: int, capacity: int, system_prompt: str, default_ids: np.ndarray,
                 template: str = "auto", max_instruction_tokens: int = 256, render_budget_s: float = RENDER_BUDGET_S,
                 action_tokens: int = ACTION_TOKENS, state_tokens: int = 0):
        if template not in TEMPLATES:
            raise InstructionError(f"instruction_template {template!r} must be one of {', '.join(TEMPLATES)}")
        self.tokenizer, self.capacity = tokenizer, int(capacity)
        self.action_tokens = int(action_tokens)  # the model's transient action slots (K x 8 with action chunks)
        self.state_tokens = int(state_tokens)  # and its state slot (1 with a state input)
        self.limit = int(vocab_size) - ACTION_VOCAB - 1  # ids at or above: the start token and the action range
        self.system_prompt = system_prompt
        self.default_ids = np.asarray(default_ids, np.int32)
        self.template = template
        if template == "auto":
            self.template = "chat" if tokenizer is not None and tokenizer.chat_template else "raw"
        self.max_instruction_tokens = int(max_instruction_tokens)
        self.render_budget_s = float(render_budget_s)
        self._specials = self._special_strings()
        self._renders: OrderedDict = OrderedDict()  # text -> (prompt, refusal, lasting, when)
        self.renders = 0  # chat-template renders done (remembered ones not counted): the work instructions cost
        if self.template == "chat" and tokenizer is not None and tokenizer.chat_template:
            try:
                self._render(PROBE_INSTRUCTION, RENDER_START_S, max(self.render_budget_s, PROBE_BUDGET_S))
            except InstructionError as e:
                raise InstructionError(f"the model's chat template fails on a sample instruction ({e}); "
                                       "instruction_template: raw runs the model without it") from None

    def default(self) -> Instruction:
        """No task: the system prompt alone (what the node ran before instructions existed)."""
        return Instruction("", self.default_ids, 0, "none")

    def build(self, text, source: str = "parameter", budget_s: float | None = None) -> Instruction:
        """The Instruction for `text`. An empty `instruction` parameter (or none at start-up) means the default prompt;
        an empty message on the topic is refused. Raises InstructionError (one line). `budget_s`: this call's render
        budget (default `render_budget_s`; the parameter check renders on the control thread with a shorter one)."""
        if (text is None or (isinstance(text, str) and text == "")) and source != "topic":
            return Instruction("", self.default_ids, 0, "none", source)
        text = clean(text)
        tok = self.tokenizer
        if tok is None:
            raise InstructionError("the model has no tokenizer (no tokenizer.json / GGUF vocabulary), so an "
                                   "instruction cannot be encoded; the default prompt stays")
        text = strip_specials(text, self._specials)
        n = len(tok.encode(text))
        if n > self.max_instruction_tokens:
            raise InstructionError(f"{n} tokens: more than max_instruction_tokens={self.max_instruction_tokens}")
        prompt = self._render(text, budget_s=budget_s) if self.template == "chat" else f"{self.system_prompt}\n{text}"
        ids = np.asarray(tok.encode(prompt), np.int32)
        if (ids >= self.limit).any() or (ids < 0).any():
            raise InstructionError("the prompt encodes to ids in the action range or the start token")
        need = min_capacity(len(ids), action_tokens=self.action_tokens, state_tokens=self.state_tokens)
        if need > self.capacity:
            state = f"{self.state_tokens} state token + " if self.state_tokens else ""
            raise InstructionError(f"the {len(ids)}-token prompt + one {VISION_TOKENS}-token frame + {state}"
                                   f"{self.action_tokens} "
                                   f"action tokens need {need} KV slots, more than kv_capacity_tokens="
                                   f"{self.capacity}")
        return Instruction(text, ids, n, self.template, source)

    def _render(self, text: str, start_s: float = 0.0, budget_s: float | None = None) -> str:
        """The chat prompt for `text`, bounded; a render (or a lasting refusal) is remembered by text, so the
        parameter's check and the change that follows it render once."""
        now = time.monotonic()
        hit = self._renders.get(text)
        if hit is not None and (hit[1] is None or hit[2] or now - hit[3] < TRANSIENT_REFUSAL_S):
            if hit[1] is not None:
                raise InstructionError(hit[1], lasting=hit[2])
            return hit[0]
        messages = [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": text}]
        self.renders += 1
        try:
            prompt, why, lasting = self.tokenizer.render_chat(messages, budget_s=budget_s or self.render_budget_s,
                                                              start_s=start_s), None, True
        except TemplateRefused as e:
            prompt, why, lasting = None, str(e), e.lasting
        self._renders[text] = (prompt, why, lasting, now)
        while len(self._renders) > RENDERS_KEPT:
            self._renders.popitem(last=False)
        if why is not None:
            raise InstructionError(why, lasting=lasting)
        return prompt

    def _special_strings(self) -> list[str]:
        """The strings of the tokenizer's special and added tokens, longest first. Added tokens that are one
        character or whitespace only are left out: they cannot open or close a turn, and removing them would mangle
        ordinary text."""
        tok = self.tokenizer
        try:
            added = tok.tok.get_added_tokens_decoder().values()
        except AttributeError:
            return []
        kept = {t.content for t in added if t.content and (t.special or (len(t.content) > 1 and t.content.strip()))}
        return sorted(kept, key=len, reverse=True)


def strip_specials(text: str, specials) -> str:
    """`text` without the strings of `specials`, removed until none is left (a removal can join its neighbours into
    another one: "<|im_<|im_end|>end|>"); raises InstructionError when nothing else is left, or when they nest more
    than MAX_SPECIAL_PASSES deep."""
    for _ in range(MAX_SPECIAL_PASSES + 1):  # each pass removes one level; the last one finds none
        found = [s for s in specials if s in text]
        if not found:
            if not text.strip():
                raise InstructionError("nothing but special-token strings")
            return text
        for s in found:
            text = text.replace(s, "")
    raise InstructionError(f"special-token strings nested more than {MAX_SPECIAL_PASSES} deep")


class InstructionFeed:
    """Instruction requests for a control loop, coalesced before any work and rendered off the loop's thread.

    `offer` (any thread, e.g. the loop itself for the bench's schedule) only replaces the one waiting request: a
    flood costs a reference swap a request, never a render. The `vla-instruction-feed` thread checks the latest one
    with `check(text)` (Runtime.check_instruction: the chat template within its budget, remembered by the
    PromptBuilder, so the change that follows does not render again; a render over its budget is tried again,
    `check_with_retries`); `take` (the loop, once a tick) returns at most one checked request, so the loop's own work
    per tick is one `set_instruction` whatever arrives."""

    def __init__(self, check, name: str = "vla-instruction-feed"):
        self._check = check
        self._cv = threading.Condition()
        self._waiting = None  # (text, source, when): the latest request not checked yet
        self._ready = None  # (text, source, when): checked, for the loop to apply
        self._closed = False
        self.offered = 0
        self.dropped = 0  # requests replaced by a newer one before they were checked (or while a refusal waited)
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def offer(self, text, source: str, when: float | None = None) -> None:
        """Queue `text`; a request still waiting (unchecked) is dropped and counted."""
        with self._cv:
            self.offered += 1
            if self._waiting is not None:
                self.dropped += 1
            self._waiting = (text, source, when)
            self._cv.notify()

    def take(self):
        """The latest checked request (text, source, when), or None; a checked one replaced by a newer checked one
        is dropped (counted)."""
        with self._cv:
            item, self._ready = self._ready, None
        return item

    def pending(self) -> bool:
        """A request is waiting or being checked, or checked and not taken yet."""
        with self._cv:
            return self._waiting is not None or self._ready is not None or self._busy

    _busy = False

    def _loop(self) -> None:
        from .realtime import normal_scheduling

        normal_scheduling()  # a helper of the loop's thread: never real-time, whoever created it
        while True:
            with self._cv:
                while self._waiting is None and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                item, self._waiting = self._waiting, None
                self._busy = True
            why = None
            try:  # renders and remembers; the refusal, if any, is the loop's set_instruction's
                why = check_with_retries(self._check, item[0], self._wait_newer)
            except Exception:  # noqa: BLE001 - the loop's set_instruction says what went wrong
                pass
            with self._cv:
                self._busy = False
                if isinstance(why, TransientRefusal) and self._waiting is not None:
                    self.dropped += 1  # refused while the host was busy, and a newer request came meanwhile
                    continue
                if self._ready is not None:
                    self.dropped += 1
                self._ready = item

    def _wait_newer(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for a newer request (or close); True if one came."""
        with self._cv:
            return bool(self._cv.wait_for(lambda: self._waiting is not None or self._closed, timeout_s))

    def close(self) -> None:
        """End the checking thread (a request still waiting is dropped)."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=1.0)


def summary(instr: Instruction, limit: int = 200) -> str:
    """The instruction's text for a report line (see `shorten`)."""
    return shorten(instr.text, limit)


def shorten(text, limit: int = 200) -> str:
    """Instruction text for a report line: at most `limit` characters, newlines shown as spaces."""
    t = str(text).replace("\n", " ")
    return t if len(t) <= limit else t[:limit - 3] + "..."
