# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The node's instruction inputs (ROS only): the `~/instruction` topic and the check of the `instruction` parameter.

The topic is latched (reliable + transient local: a node started later gets the last task) and taken as serialized
bytes, decoded strictly (`instruction.string_from_cdr` + `clean`), so a message that is not valid UTF-8 is one
warning rather than text full of U+FFFD. The checks, the tokenizing and the change itself are the core's
(`Runtime.set_instruction`); this only translates messages and logs one line per refusal.

Where the message is taken: under the bringup (`vla_edge`, the launch files) in the camera process, never in the
control process. rclpy copies a whole message into Python under the interpreter lock when it takes it, and a
10 MB message taken in the control process held its SCHED_FIFO thread ~20 ms a take (missed ticks under a flood).
The camera child subscribes to the name `~/instruction` resolves to on this node (`relay_subscription`), refuses a
message by its size and CDR there and leaves the latest text or refusal in the `InstructionMailbox`; the
`vla-instruction-relay` thread here polls it every `instruction_mailbox.POLL_S`. A node made without a camera
process (tests, a node composed into another executable) subscribes itself, on its executor.

A message is rendered off the control thread: the latest one waiting (older ones are dropped unrendered) goes to the
`vla-instruction` thread, at most one a period (a flood costs one render and one change a tick), which renders it
(`Runtime.check_instruction`: the chat template within its budget, remembered by the PromptBuilder) and hands it
back through a guard condition; the change itself is then made on the node's executor thread
(`Runtime.set_instruction`, which finds the render done), so it never races a tick. The `instruction` parameter's
check must answer the setter at once, so it renders on the executor thread, within the render budget (below one
period).
"""
from __future__ import annotations

import threading
import time

from rcl_interfaces.msg import SetParametersResult
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import String

from ..instruction import InstructionError, TransientRefusal, check_with_retries, string_from_cdr
from ..instruction_mailbox import POLL_S

# The parameter check renders on the executor thread (rclpy wants its answer at once), between the timer's ticks: a
# template that runs away may hold that thread this long (plus the child's kill, ~5 ms); a normal render takes
# 0.2-1 ms. The topic path renders on its own thread with the builder's longer budget.
PARAMETER_RENDER_BUDGET_S = 0.010
LATCHED = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1, reliability=ReliabilityPolicy.RELIABLE,
                     durability=DurabilityPolicy.TRANSIENT_LOCAL)


class InstructionInput:
    def __init__(self, node, runtime, mailbox=None):
        """`runtime()`: the node's Runtime, or None while unconfigured (a message then waits for `configured`).
        `mailbox`: the camera process's InstructionMailbox (the child takes the topic), or None: subscribe here."""
        self.node, self.runtime = node, runtime
        self._early = None  # text or bytes received before configure: applied once configured (the last one wins)
        self._last_refusal = ("", 0.0)  # the last refusal logged and when
        self._cv = threading.Condition()
        self._waiting = None  # (text, source): the latest message not rendered yet
        self._rendered = None  # (text, source): rendered, for the executor thread to apply
        self.dropped = 0  # messages replaced by a newer one before they were rendered
        self._closed = False
        self._guard = node.create_guard_condition(self._apply_rendered)
        self._thread = threading.Thread(target=self._render_loop, name="vla-instruction", daemon=True)
        self._thread.start()
        node.add_on_set_parameters_callback(self._check_parameter)
        self.sub = self._relay = None
        if mailbox is None:
            self.sub = node.create_subscription(String, "~/instruction", self._on_message, LATCHED, raw=True)
        else:
            mailbox.topic.post(node.resolve_topic_name("~/instruction").encode())
            self._relay = threading.Thread(target=self._relay_loop, args=(mailbox,), name="vla-instruction-relay",
                                           daemon=True)
            self._relay.start()

    def configured(self) -> None:
        """Apply a ~/instruction that arrived while the node was unconfigured."""
        if self._early is not None:
            early, self._early = self._early, None
            self.set(early, "topic")

    def _check_parameter(self, params):
        """Refuse an `instruction` parameter the model cannot take (the setter gets the reason; nothing changes)."""
        rt = self.runtime()
        for prm in params:
            if prm.name == "instruction" and rt is not None:
                why = rt.check_instruction(prm.value, PARAMETER_RENDER_BUDGET_S)
                if why:
                    self.node.get_logger().warn(f"instruction parameter refused: {why}; the previous instruction "
                                                "stays")
                    return SetParametersResult(successful=False, reason=f"instruction refused: {why}")
        return SetParametersResult(successful=True)

    def _on_message(self, raw: bytes) -> None:
        try:
            text = string_from_cdr(raw)  # bytes: decoded strictly by the checks (instruction.clean)
        except InstructionError as e:
            rt = self.runtime()
            if rt is not None:
                rt.note_refusal("topic", e)
            self._refused("topic", e)
            return
        self.set(text, "topic")

    def _relay_loop(self, mailbox) -> None:
        """The `vla-instruction-relay` thread: what the camera child took from the topic, as `_on_message` would."""
        from ..realtime import normal_scheduling

        normal_scheduling()
        text_seq = refusal_seq = 0
        while not self._closed:
            got = mailbox.text.read(text_seq)
            if got is not None:
                text_seq = got[0]
                self.set(got[1], "topic")
            got = mailbox.refusal.read(refusal_seq)
            if got is not None:
                count, refusal_seq = (got[0] - refusal_seq) // 2, got[0]
                e = InstructionError(got[1].decode("utf-8", "replace"))
                rt = self.runtime()
                if rt is not None:
                    rt.note_refusal("topic", e, count)
                self._refused("topic", e)
            time.sleep(POLL_S)

    def set(self, text, source: str) -> None:
        """Queue `text` for rendering off the executor thread (the latest one waiting wins)."""
        if self.runtime() is None:
            self._early = text
            return
        with self._cv:
            if self._waiting is not None:
                self.dropped += 1
            self._waiting = (text, source)
            self._cv.notify()

    def _render_loop(self) -> None:
        """The `vla-instruction` thread: render the latest waiting message, hand it to the executor thread."""
        from ..realtime import normal_scheduling

        normal_scheduling()  # created by the node's constructor; never real-time whoever that was
        last = -1e9
        while True:
            with self._cv:
                while self._waiting is None and not self._closed:
                    self._cv.wait()
                # at most one render a period: a flood costs the loop one render and one change a tick, whatever
                # the rate (at most one change is applied per instruction_min_interval_cycles anyway); what arrives
                # meanwhile replaces the waiting message unrendered
                while not self._closed and time.monotonic() < last + self._gap_s():
                    self._cv.wait(timeout=max(0.0, last + self._gap_s() - time.monotonic()))
                if self._closed:
                    return
                item, self._waiting = self._waiting, None
                last = time.monotonic()
            rt = self.runtime()
            if rt is None:
                continue
            why = None
            try:  # renders and remembers the render (a render over its budget is tried again); reported below
                why = check_with_retries(rt.check_instruction, item[0], self._wait_newer)
            except Exception:  # noqa: BLE001 - set_instruction on the executor thread says what went wrong
                pass
            with self._cv:
                if self._closed:
                    return
                if isinstance(why, TransientRefusal) and self._waiting is not None:
                    self.dropped += 1  # refused while the host was busy, and a newer message came meanwhile
                    continue
                self._rendered = item
                try:
                    self._guard.trigger()
                except Exception:  # noqa: BLE001 - the node is being destroyed (shutdown): nothing to apply
                    return

    def _wait_newer(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for a newer message (or close); True if one came."""
        with self._cv:
            return bool(self._cv.wait_for(lambda: self._waiting is not None or self._closed, timeout_s))

    def _gap_s(self) -> float:
        """The least time between two renders: one period of the running loop."""
        rt = self.runtime()
        try:
            return float(rt.settings.period_ms) / 1000.0 if rt is not None else 0.0
        except (AttributeError, TypeError, ValueError):
            return 0.033

    def close(self) -> None:
        """End the rendering thread (a message still waiting is dropped)."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join(timeout=1.0)
        if self._relay is not None:
            self._relay.join(timeout=1.0)

    def _apply_rendered(self) -> None:
        with self._cv:
            item, self._rendered = self._rendered, None
        if item is not None:
            self._apply(*item)

    def _apply(self, text, source: str) -> None:
        rt = self.runtime()
        if rt is None:
            return
        try:
            instr = rt.set_instruction(text, source)
        except InstructionError as e:
            self._refused(source, e)
            return
        if instr is not None:
            self.node.get_logger().info(
                f"instruction from {source} ({instr.instruction_tokens} tokens, prompt {len(instr.ids)} tokens, "
                f"{instr.template}): {instr.text[:120]!r}; applying (instruction_change fallbacks until the prompt "
                "is prefilled)", throttle_duration_sec=1.0)

    def _refused(self, source: str, e: Exception) -> None:
        """One warning per refusal; a flood of the same reason is cut to one line a second."""
        line, now = f"instruction from {source} refused: {e}; the previous instruction stays", time.monotonic()
        if line != self._last_refusal[0] or now - self._last_refusal[1] >= 1.0:
            self.node.get_logger().warn(line)
            self._last_refusal = (line, now)


def relay_subscription(node, mailbox):
    """The camera child's side: subscribe `node` to the topic the mailbox names (None while it names none yet);
    each message is checked by its size and CDR here and only its text, or the refusal line, is posted."""
    topic = mailbox.topic_name()
    if not topic:
        return None

    def take(raw: bytes) -> None:
        try:
            mailbox.text.post(string_from_cdr(raw))
        except InstructionError as e:
            mailbox.refusal.post(str(e).encode("utf-8", "replace"))

    return node.create_subscription(String, topic, take, LATCHED, raw=True)
