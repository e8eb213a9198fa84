# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The checkpoint's own tokenizer and chat template, through maintained libraries (`tokenizers`, `jinja2`).

Sources, in this order: `tokenizer.json` in an HF model directory (its chat template from
`tokenizer_config.json`), or the vocabulary, merges, token types and chat template a GGUF file stores as
metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`), rebuilt as the byte-level BPE it describes: the
Qwen2 pre-tokenizer split, byte-level mapping, NFC normalization (as Qwen2's own tokenizer.json), control
tokens as special tokens, user-defined tokens as added tokens. A model without either has no tokenizer
(`load_tokenizer` returns None and `tokenizer_problem` says why in one line).

Chat templates come from the checkpoint, so they are rendered in jinja2's immutable sandbox (as HF
transformers does): a template cannot reach Python objects or the file system. The sandbox does not bound time or
memory, and a pure-Python render loop in a thread holds the interpreter lock and cannot be stopped, so every render
runs in a child process (`TemplateRenderer`, one per process, kept warm): a time budget per render (the child is
killed at it), an output cap (counted while the output streams), an address-space and a CPU limit on the child. Any
failure is one `TemplateRefused` line naming the bound and its numbers.
"""
from __future__ import annotations

import json
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from .gguf import _bytes_to_unicode, is_gguf
from .safetensors_io import ModelLoadError

MAX_TOKENIZER_BYTES = 64 << 20  # Qwen2.5's tokenizer.json is 7 MB
MAX_TEMPLATE_CHARS = 1 << 16
# A render's bounds. Qwen2.5's template renders a prompt in ~0.3 ms in the child (~1 ms with the pipe round trip, see
# the report of issue 43); the budget stays below one 33 ms period because the `instruction` parameter's check runs
# on the control thread and waits for it.
RENDER_BUDGET_S = 0.025
RENDER_START_S = 10.0  # a child's start: an interpreter, jinja2, the template compiled (not on the control path)
MAX_RENDER_CHARS = 1 << 16  # a prompt this long is far past any KV capacity (4 KiB instruction + the system prompt)
RENDER_MEMORY_BYTES = 256 << 20  # the child's address space may grow this much past what it holds once started
# Qwen2's pre-tokenizer split (the pattern of its tokenizer.json / llama.cpp's "qwen2" pre-type).
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")
GGUF_PRE_SPLITS = {"qwen2": QWEN2_SPLIT, "deepseek-r1-qwen": QWEN2_SPLIT}
CONTROL, USER_DEFINED = 3, 4  # llama.cpp token types


@dataclass
class TextTokenizer:
    """A `tokenizers.Tokenizer` plus the checkpoint's chat template and end-of-turn ids."""

    tok: object  # tokenizers.Tokenizer
    source: str
    chat_template: str | None = None
    eos_ids: tuple[int, ...] = ()
    bos_token: str | None = None
    eos_token: str | None = None
    special_ids: frozenset = field(default_factory=frozenset)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special-token strings in it ("<|im_start|>") are matched whole."""
        return list(self.tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids, skip_special: bool = False) -> str:
        return self.tok.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True, budget_s: float = RENDER_BUDGET_S,
                    start_s: float = RENDER_START_S) -> str:
        """`messages` ([{"role", "content"}]) through the checkpoint's chat template, bounded (`TemplateRenderer`):
        raises TemplateRefused (a ValueError, one line) without a template, or when it fails or exceeds a bound.
        `start_s`: how long to wait for the render child to start (0 on the control path: refused while it starts)."""
        if not self.chat_template:
            raise TemplateRefused(f"{self.source} has no chat template")
        context = {"messages": messages, "add_generation_prompt": add_generation_prompt,
                   "bos_token": self.bos_token or "", "eos_token": self.eos_token or "", "tools": None}
        return renderer().render(self.chat_template, context, budget_s, MAX_RENDER_CHARS, start_s)


class TemplateRefused(ValueError):
    """A chat template that failed or exceeded a bound (one line). `lasting`: the same render would fail again (a
    template error, the output cap); false for the time budget or a busy or restarting renderer."""

    def __init__(self, message: str, lasting: bool = True):
        super().__init__(message)
        self.lasting = lasting


class _OutputCap(Exception):
    pass


def _sandbox():
    """jinja2's immutable sandbox with the helpers HF chat templates use (`raise_exception`, `tojson`)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def _render_capped(template, context: dict, max_chars: int) -> str:
    """`template` rendered, refused as soon as the output streamed so far passes `max_chars` (a loop that writes
    forever is stopped by its length, not only by the clock)."""
    parts, n = [], 0
    for piece in template.generate(**context):
        n += len(piece)
        if n > max_chars:
            raise _OutputCap(f"the chat template's output passes the {max_chars}-character cap (at least {n})")
        parts.append(piece)
    return "".join(parts)


def _limit_cpu(resource, budget_s: float) -> None:
    """A CPU-time stop for the coming render, in case the parent cannot kill this child (SIGXCPU ends it)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(math.ceil(ru.ru_utime + ru.ru_stime + budget_s)) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.getrlimit(resource.RLIMIT_CPU)[1]))


def _template_worker() -> None:
    """The render child's loop (started by TemplateRenderer): one JSON request a line on stdin, one JSON answer a line
    on stdout, until EOF (the parent closed the pipe or died)."""
    import resource

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it; a Ctrl-C to the terminal is the parent's
    env = _sandbox()
    with open("/proc/self/statm") as f:  # what the interpreter and jinja2 hold: the cap is on top of it
        held = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    cap = held + RENDER_MEMORY_BYTES
    resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))
    compiled: dict = {}
    out = sys.stdout.buffer
    for line in sys.stdin.buffer:
        req = json.loads(line)
        try:
            _limit_cpu(resource, req["budget_s"])
            t = compiled.get(req["template"])
            if t is None:
                if len(compiled) >= 16:
                    compiled.clear()
                t = compiled[req["template"]] = env.from_string(req["template"])
            reply = {"ready": True} if req.get("compile") else {"ok": _render_capped(t, req["context"],
                                                                                     req["max_chars"])}
        except _OutputCap as e:
            reply = {"error": str(e)}
        except MemoryError:
            reply = {"error": f"the chat template needs more than the {RENDER_MEMORY_BYTES >> 20} MiB memory cap"}
        except Exception as e:  # noqa: BLE001 - anything a template raises (OverflowError, RecursionError...)
            reply = {"error": f"chat template failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}"}
        out.write(json.dumps(reply).encode() + b"\n")
        out.flush()


class TemplateRenderer:
    """Renders chat templates in a child process, one render at a time, each bounded in time (the child is killed at
    the budget and a fresh one started at once), in output size and, through the child's limits, in memory and CPU.
    The parent only waits on a pipe (no interpreter lock held), so a runaway template costs the caller at most its
    budget and costs nobody else anything."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._proc = None
        self._buf = b""
        self._ready = False  # the child answered its compile request
        self._template = None  # the template the current child compiled first
        self._compiled: set = set()  # templates the current child has compiled
        self._spawner = None  # the thread starting the next child, and what it made
        self._made: dict = {}

    def render(self, template: str, context: dict, budget_s: float = RENDER_BUDGET_S,
               max_chars: int = MAX_RENDER_CHARS, start_s: float = 0.0) -> str:
        """`template` rendered with `context` (JSON values): the render gets `budget_s` once the child is up, which
        may take `start_s` (0: on the control path the whole call, the wait for the lock and for a child still
        starting included, is within `budget_s`). Raises TemplateRefused (one line)."""
        t0 = time.monotonic()
        if os.getpid() != self._pid:  # a forked copy: the pipes are the parent's
            self.__init__()
        if not self._lock.acquire(timeout=budget_s + start_s):
            raise TemplateRefused(f"the chat template renderer is busy (another render for more than "
                                  f"{(budget_s + start_s) * 1000:.0f} ms)", lasting=False)
        try:
            if self._proc is None and self._spawner is None:
                self._start(template)
            up_by = t0 + (start_s or budget_s)
            if not self._adopt(up_by):
                raise TemplateRefused(f"the chat template renderer did not start within {start_s:g} s" if start_s
                                      else "the chat template renderer is restarting after a refused render",
                                      lasting=False)
            if not self._ready:
                reply = self._read(up_by, max_chars)
                if reply is None:
                    raise TemplateRefused(f"the chat template renderer did not start within {start_s:g} s" if start_s
                                          else "the chat template renderer is restarting after a refused render",
                                          lasting=False)
                self._ready = True  # primed, or the first template does not compile (the child is fine)
                if "error" not in reply:
                    self._compiled.add(self._template)
                elif self._template == template:
                    raise TemplateRefused(reply["error"])
            if start_s and template not in self._compiled:  # off the control path: compiling is not rendering
                self._send({"template": template, "compile": True, "budget_s": RENDER_START_S})
                reply = self._read(time.monotonic() + start_s, max_chars)
                if reply is None:
                    self._kill()
                    raise TemplateRefused(f"the chat template did not compile within {start_s:g} s", lasting=False)
                if "error" in reply:
                    raise TemplateRefused(reply["error"])
                self._compiled.add(template)
            self._send({"template": template, "context": context, "max_chars": int(max_chars),
                        "budget_s": budget_s})
            reply = self._read((time.monotonic() if start_s else t0) + budget_s, max_chars)
            if reply is None:
                self._kill()
                self._start(template)  # in the background: the next render finds it ready (~0.25 s)
                raise TemplateRefused(f"the chat template took more than the {budget_s * 1000:.0f} ms render budget "
                                      "(stopped)", lasting=False)
            self._compiled.add(template)
            if "error" in reply:
                raise TemplateRefused(reply["error"])
            out = reply.get("ok")
            if not isinstance(out, str) or len(out) > max_chars:
                raise TemplateRefused(f"the chat template's output passes the {max_chars}-character cap")
            return out
        finally:
            self._lock.release()

    def close(self) -> None:
        """Stop the child (a new one starts at the next render)."""
        with self._lock:
            if self._spawner is not None:
                self._adopt(time.monotonic() + RENDER_START_S)
            self._kill()

    def _start(self, template: str) -> None:
        """Start a fresh child in the background, asked to compile `template` first (a render after a restart does
        not pay for it). The child is created from a thread on normal scheduling: children inherit their creator's
        policy, and a runaway render must never run real-time next to the control thread."""
        from ..realtime import normal_scheduling

        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
        made: dict = {}

        def spawn():
            normal_scheduling()
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-c", "from vla_edge_ros.model.tokenizer import _template_worker; "
                                           "_template_worker()"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                    close_fds=True, start_new_session=True)
                proc.stdin.write(json.dumps({"template": template, "compile": True,
                                             "budget_s": RENDER_START_S}).encode() + b"\n")
                proc.stdin.flush()
                made["proc"] = proc
            except OSError as e:
                made["error"] = e

        self._made, self._template = made, template
        self._spawner = threading.Thread(target=spawn, name="vla-template-spawn", daemon=True)
        self._spawner.start()

    def _adopt(self, deadline: float) -> bool:
        """Wait (until `deadline`) for a child being started; True when there is one."""
        t = self._spawner
        if t is not None:
            t.join(max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                return False
            self._spawner = None
            if "proc" not in self._made:
                raise TemplateRefused(f"the chat template renderer cannot start: {self._made.get('error')}",
                                      lasting=False)
            self._proc, self._buf, self._ready, self._compiled = self._made["proc"], b"", False, set()
        return self._proc is not None

    def _kill(self) -> None:
        """SIGKILL the child (reaped in the background: waiting here would spend the caller's budget)."""
        p, self._proc, self._buf, self._ready = self._proc, None, b"", False
        if p is None:
            return
        try:
            p.kill()
        except OSError:
            pass
        for f in (p.stdin, p.stdout):
            try:
                f.close()
            except OSError:
                pass
        threading.Thread(target=p.wait, name="vla-template-reap", daemon=True).start()

    def _send(self, req: dict) -> None:
        try:
            self._proc.stdin.write(json.dumps(req).encode() + b"\n")
            self._proc.stdin.flush()
        except (OSError, ValueError):
            self._kill()
            raise TemplateRefused("the chat template renderer stopped (restarted for the next render)",
                                  lasting=False) from None

    def _read(self, deadline: float, max_chars: int):
        """The child's next answer, or None when `deadline` passes first; a child that dies or writes more than an
        answer can hold is killed (TemplateRefused)."""
        fd = self._proc.stdout.fileno()
        poll = select.poll()
        poll.register(fd, select.POLLIN)
        limit = 8 * max_chars + 4096  # JSON escapes at most 6 characters per character
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not poll.poll(max(1, int(left * 1000))):
                if time.monotonic() >= deadline:
                    return None
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk or len(self._buf) + len(chunk) > limit:
                code = self._proc.poll()
                self._kill()
                why = "wrote more than an answer can hold" if chunk else f"ended (exit status {code})"
                raise TemplateRefused(f"the chat template renderer {why}; a fresh one starts at the next render")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        try:
            reply = json.loads(line)
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            self._kill()
            raise TemplateRefused("the chat template renderer answered garbage; a fresh one starts at the next render")
        return reply


_RENDERER: list = []


def renderer() -> TemplateRenderer:
    """The process's TemplateRenderer (its child starts at the first render)."""
    if not _RENDERER:
        _RENDERER.append(TemplateRenderer())
    return _RENDERER[0]


def render_template(template: str, messages, add_generation_prompt=True, bos_token=None, eos_token=None,
                    budget_s: float = RENDER_BUDGET_S, start_s: float = RENDER_START_S) -> str:
    """`template` rendered for `messages`, bounded (TemplateRenderer); raises TemplateRefused (one line)."""
    context = {"messages": messages, "add_generation_prompt": add_generation_prompt, "bos_token": bos_token or "",
               "eos_token": eos_token or "", "tools": None}
    return renderer().render(template, context, budget_s, MAX_RENDER_CHARS, start_s)


def _from_tokenizer_json(model_dir: str) -> TextTokenizer:
    from tokenizers import Tokenizer

    path = os.path.join(model_dir, "tokenizer.json")
    if os.path.getsize(path) > MAX_TOKENIZER_BYTES:
        raise ModelLoadError(path, f"{os.path.getsize(path)} bytes: too large for a tokenizer")
    try:
        tok = Tokenizer.from_file(path)
    except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exception on a malformed file
        raise ModelLoadError(path, f"not a readable tokenizer ({type(e).__name__}: {str(e)[:200]})") from None
    template, eos, bos = None, None, None
    cfg_path = os.path.join(model_dir, "tokenizer_config.json")
    if os.path.isfile(cfg_path) and os.path.getsize(cfg_path) <= MAX_TOKENIZER_BYTES:
        try:
            with open(cfg_path, encoding="utf-8") as f:
                tc = json.load(f)
        except (OSError, json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            tc = {}
        if isinstance(tc, dict):
            template = tc.get("chat_template") if isinstance(tc.get("chat_template"), str) else None
            eos = _token_text(tc.get("eos_token"))
            bos = _token_text(tc.get("bos_token"))
    specials = frozenset(i for i, t in tok.get_added_tokens_decoder().items() if t.special)
    rows = _config_rows(model_dir)
    if rows is not None:
        check_tokenizer_fits(path, tok.get_vocab_size(with_added_tokens=True), rows)
    eos_ids = tuple(i for i in (tok.token_to_id(t) for t in (eos, "<|im_end|>", "<|endoftext|>") if t) if i is not None)
    return TextTokenizer(tok, path, _bounded_template(template), tuple(dict.fromkeys(eos_ids)), bos, eos, specials)


def _config_rows(model_dir: str) -> int | None:
    """The embedding rows config.json declares (None when unreadable: loading the model reports that)."""
    try:
        with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
            v = json.load(f).get("vocab_size")
    except (OSError, ValueError, AttributeError, RecursionError):
        return None
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _token_text(v):
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return v["content"]
    return None


def _bounded_template(t):
    return t if isinstance(t, str) and 0 < len(t) <= MAX_TEMPLATE_CHARS else None


def _from_gguf(path: str) -> TextTokenizer:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    from .gguf import _open, field

    reader = _open(path)
    model = field(reader, "tokenizer.ggml.model")
    if model is None:
        raise LookupError(f"{path} has no tokenizer (no tokenizer.ggml.* metadata)")
    if model != "gpt2":
        raise ModelLoadError(path, f"tokenizer.ggml.model {model!r} is not supported (byte-level BPE 'gpt2' only)")
    tokens = field(reader, "tokenizer.ggml.tokens")
    merges = field(reader, "tokenizer.ggml.merges", [])
    types = field(reader, "tokenizer.ggml.token_type")
    embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    rows = int(embed.shape[-1]) if embed is not None and len(embed.shape) else None  # ne order: [hidden, vocab]
    spelled = set(_bytes_to_unicode().values())
    _check_gguf_vocabulary(path, tokens, merges, types, rows)
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t if set(t) <= spelled else "".join(_bytes_to_unicode()[b] for b in t.encode()), i)
    pairs = _merge_pairs(path, merges, vocab)
    tok = Tokenizer(models.BPE(vocab, pairs, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    pre = GGUF_PRE_SPLITS.get(field(reader, "tokenizer.ggml.pre"), QWEN2_SPLIT)
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pre), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    control = [t for t, k in zip(tokens, types) if k == CONTROL and set(t) <= spelled | set("<|>_")]
    user = [t for t, k in zip(tokens, types) if k == USER_DEFINED]
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])

    def token_of(key):
        i = field(reader, f"tokenizer.ggml.{key}")
        return (int(i), tokens[int(i)]) if isinstance(i, int) and 0 <= i < len(tokens) else (None, None)

    eos_id, eos = token_of("eos_token_id")
    _, bos = token_of("bos_token_id")
    eos_ids = [eos_id] + [tok.token_to_id(t) for t in ("<|im_end|>", "<|endoftext|>")]
    template = field(reader, "tokenizer.chat_template")
    specials = frozenset(vocab[t] for t in control if t in vocab)
    return TextTokenizer(tok, path, _bounded_template(template),
                         tuple(dict.fromkeys(i for i in eos_ids if i is not None)), bos, eos, specials)


def _check_gguf_vocabulary(path: str, tokens, merges, types, rows: int | None) -> None:
    """A GGUF vocabulary the model can use, else one ModelLoadError line naming what disagrees: string tokens, no
    more than the embedding's rows, the 256 byte tokens a byte-level BPE needs, string merges, one token type per
    token (the control tokens are special tokens: without types an instruction could spell them)."""
    if not isinstance(tokens, list) or not tokens:
        raise ModelLoadError(path, "tokenizer.ggml.tokens missing or not a list")
    bad = next((i for i, t in enumerate(tokens) if not isinstance(t, str) or not t), None)
    if bad is not None:
        raise ModelLoadError(path, f"tokenizer.ggml.tokens[{bad}] is {tokens[bad]!r}, not a token string")
    if rows is not None:
        check_tokenizer_fits(path, len(tokens), rows)
    missing = sorted(set(_bytes_to_unicode().values()) - set(tokens))
    if missing:
        raise ModelLoadError(path, f"tokenizer.ggml.tokens ({len(tokens)} tokens) lacks {len(missing)} of the 256 "
                                   f"byte tokens a byte-level BPE needs (e.g. {missing[0]!r}): it cannot spell "
                                   "every text")
    if not isinstance(merges, list):
        raise ModelLoadError(path, "tokenizer.ggml.merges is not a list")
    bad = next((i for i, m in enumerate(merges) if not isinstance(m, str)), None)
    if bad is not None:
        raise ModelLoadError(path, f"tokenizer.ggml.merges[{bad}] is {merges[bad]!r}, not a merge string")
    if not isinstance(types, list) or len(types) != len(tokens):
        n = len(types) if isinstance(types, list) else "no"
        raise ModelLoadError(path, f"tokenizer.ggml.token_type holds {n} types for {len(tokens)} tokens: the "
                                   "special tokens cannot be told apart")
    bad = next((i for i, k in enumerate(types) if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= 6),
               None)
    if bad is not None:
        raise ModelLoadError(path, f"tokenizer.ggml.token_type[{bad}] is {types[bad]!r}, not a token type (0-6)")


def _merge_pairs(path: str, merges: list, vocab: dict) -> list[tuple[str, str]]:
    """The merges as pairs; one that names a token the vocabulary lacks, or makes one, is refused by index (the
    tokenizers library would raise or panic on it)."""
    pairs = []
    for i, m in enumerate(merges):
        a, sep, b = m.partition(" ")
        if not (sep and a and b) or " " in b:
            raise ModelLoadError(path, f"tokenizer.ggml.merges[{i}] {m[:60]!r} is not two tokens joined by a space")
        unknown = next((t for t in (a, b, a + b) if t not in vocab), None)
        if unknown is not None:
            raise ModelLoadError(path, f"tokenizer.ggml.merges[{i}] {m[:60]!r} names {unknown[:40]!r}, which the "
                                       "vocabulary lacks")
        pairs.append((a, b))
    return pairs


def check_tokenizer_fits(path: str, vocab_size: int, rows: int) -> None:
    """A tokenizer of `vocab_size` tokens (added ones included) against a model whose embedding has `rows` rows:
    more tokens than rows would give ids the model has no embedding for (ModelLoadError, one line). Fewer is
    normal (Qwen2.5's embedding is padded: 151,936 rows for 151,665 tokens)."""
    if vocab_size > rows:
        raise ModelLoadError(path, f"the tokenizer has {vocab_size} tokens but the model's embedding only {rows} rows: "
                                   "it is not this model's tokenizer")


# The last tokenizer built, by its files' identity: start-up asks twice for the same one (the prompt-length check
# before anything is allocated, then the engine), and building a GGUF's costs ~0.45 s. One entry: the model in use.
_LAST: dict = {}


def _files_key(path: str) -> tuple:
    """The files a tokenizer is built from, with their sizes and modification times (a changed file misses)."""
    names = [path] if is_gguf(path) else [os.path.join(path, n) for n in ("tokenizer.json", "tokenizer_config.json")]
    key = [os.path.realpath(path)]
    for n in names:
        try:
            st = os.stat(n)
            key.append((n, st.st_size, st.st_mtime_ns))
        except OSError:
            key.append((n, None))
    return tuple(key)


def load_tokenizer(path) -> TextTokenizer | None:
    """The tokenizer of the model at `path` (a GGUF file or a model directory), or None when it has none.
    A tokenizer that is present but broken raises ModelLoadError (one line). The last one built is reused while
    its files are unchanged (it is only read: encode, decode, the chat template)."""
    path = str(path)
    key = _files_key(path)
    if key in _LAST:
        return _LAST[key]
    tok = _build_tokenizer(path)
    _LAST.clear()
    _LAST[key] = tok
    return tok


def _build_tokenizer(path: str) -> TextTokenizer | None:
    if is_gguf(path):
        try:
            return _from_gguf(path)
        except LookupError:
            return None
    if os.path.isfile(os.path.join(path, "tokenizer.json")):
        return _from_tokenizer_json(path)
    return None


def tokenizer_problem(path) -> str:
    """One line: why the model at `path` has no tokenizer."""
    if is_gguf(path):
        return f"{path}: the GGUF file holds no tokenizer (no tokenizer.ggml.* metadata)"
    return f"{path}: no tokenizer.json in the model directory (generated models have none)"
