# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Chat templates rendered bounded, in a child process (stdlib and jinja2 only: the child imports nothing else).

Chat templates come from the checkpoint, so they are rendered in jinja2's immutable sandbox (as HF transformers
does): a template cannot reach Python objects or the file system. The sandbox does not bound time or memory, and a
pure-Python render loop in a thread holds the interpreter lock and cannot be stopped, so every render runs in a child
process (`TemplateRenderer`, one per process, kept warm): a time budget per render (the child is killed at it), an
output cap (counted while the output streams), an address-space and a CPU limit on the child. Any failure is one
`TemplateRefused` line naming the bound and its numbers.

The child is what a runaway template costs the host, so it is kept cheap and behind the control loop: it imports
only this module (an interpreter and jinja2, ~70 ms of CPU to replace a killed one, not the ~250 ms that numpy and
the model package cost) and runs at RENDER_NICE, as the camera process runs at its `process_nice`.
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

# A render's bounds. Qwen2.5's template renders a prompt in ~0.3 ms in the child (~1 ms with the pipe round trip, see
# the report of issue 43); the budget stays below one 33 ms period because the `instruction` parameter's check runs
# on the control thread and waits for it.
RENDER_BUDGET_S = 0.025
RENDER_START_S = 10.0  # a child's start: an interpreter, jinja2, the template compiled (not on the control path)
MAX_RENDER_CHARS = 1 << 16  # a prompt this long is far past any KV capacity (4 KiB instruction + the system prompt)
# The child's address space may grow this much past what it holds once started. A capped render holds a few hundred
# KB (65,536 characters, the parts list, the JSON reply); the cap is an address-space limit, so an allocation past it
# fails before a page is touched: `'x' * 10**8` is a ~1 ms refusal, not 100 MB of page faults that outrun the render
# budget and cost a kill and a new child on the control loop's cores (under a 256 MiB cap it did).
RENDER_MEMORY_BYTES = 32 << 20
# Niceness of the render child (and of the replacement started after a kill): a template that runs away to its
# budget, or a child starting, takes CPU from the engine and the control thread only when a core is idle.
RENDER_NICE = 10


class TemplateRefused(ValueError):
    """A chat template that failed or exceeded a bound (one line). `lasting`: the same render would fail again (a
    template error, the output cap); false for the time budget or a busy or restarting renderer."""

    def __init__(self, message: str, lasting: bool = True):
        super().__init__(message)
        self.lasting = lasting


class _OutputCap(Exception):
    pass


def sandbox():
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


def template_worker() -> None:
    """The render child's loop (started by TemplateRenderer): one JSON request a line on stdin, one JSON answer a line
    on stdout, until EOF (the parent closed the pipe or died)."""
    import resource

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it; a Ctrl-C to the terminal is the parent's
    env = sandbox()
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
        not pay for it). The child is created from a thread on normal scheduling at RENDER_NICE: children inherit
        their creator's policy and niceness, and a runaway render must never run real-time next to the control
        thread."""
        from ..realtime import normal_scheduling

        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
        made: dict = {}

        def spawn():
            normal_scheduling()
            try:  # Linux: this thread's niceness only; the child inherits it
                os.setpriority(os.PRIO_PROCESS, 0, max(RENDER_NICE, os.getpriority(os.PRIO_PROCESS, 0)))
            except OSError:
                pass
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-c", "from vla_edge_ros.model.chat_template import template_worker; "
                                           "template_worker()"],
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
