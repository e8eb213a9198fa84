# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The instruction mailbox: `~/instruction` messages taken in the camera process, read by the control process.

rclpy copies a whole message into Python under the GIL when it takes it: a process taking 10 MB messages as fast as
they came held its SCHED_FIFO thread 20-36 ms a take (measured on this 2-core host: 49 stalls over 20 ms in 5 s
from 75 takes; none while the same process only received them in DDS without taking them; BENCHMARKS.md
"Instruction floods"). So the bringup takes the topic in the camera process, which already takes the camera's big
messages, checks the message's size and CDR there (`instruction.string_from_cdr`) and leaves the latest accepted
text or the latest refusal line here; the control process polls the mailbox from a thread of its own. The latest
wins, nothing queues, the writer never waits for the reader.

Three slots in a shared block (ROS-free, any buffer that both processes map): `topic` (written by the control
process: the name `~/instruction` resolves to on the reasoning node, remaps included; the child subscribes once it
is there), `text` and `refusal` (written by the camera child). A slot is a seqlock: `post` makes `seq` odd, writes
the length, the crc32 and the bytes, then makes `seq` even; `read` keeps a copy only when `seq` was the same even
value before and after it and the crc32 matches, so a torn copy is never used (it is read again at the next poll),
whatever order the other process's stores become visible in. A writer killed inside a post leaves `seq` odd: the
next post goes on from it. The refusal slot's post count is the number of refusals.
"""
from __future__ import annotations

import struct
import zlib

from .instruction import MAX_INSTRUCTION_BYTES

_HEAD = struct.Struct("<QQQ")  # seq, length, crc32
TOPIC_CAP = 1024  # a ROS topic name is at most ~250 characters
TEXT_CAP = MAX_INSTRUCTION_BYTES + 8  # string_from_cdr passes at most this much text
REFUSAL_CAP = 512  # one line; longer ones are cut
POLL_S = 0.05  # the control process's poll period (a poll wakes a thread that takes the interpreter lock)


class MailboxSlot:
    """One seqlock slot of `cap` bytes over `buf[offset:]`."""

    def __init__(self, buf, offset: int, cap: int):
        self._m = memoryview(buf)[offset:offset + _HEAD.size + cap]
        self.cap = cap

    @property
    def size(self) -> int:
        return _HEAD.size + self.cap

    def _seq(self) -> int:
        return int.from_bytes(self._m[0:8], "little")

    def posts(self) -> int:
        """How many posts have completed (a post in progress not counted)."""
        return self._seq() // 2

    def post(self, data: bytes) -> None:
        """Replace the slot's content with `data` (cut to `cap`)."""
        data = bytes(data[:self.cap])
        seq = self._seq()
        seq += seq % 2  # a writer killed inside its post left it odd
        self._m[0:8] = (seq + 1).to_bytes(8, "little")
        self._m[8:_HEAD.size] = struct.pack("<QQ", len(data), zlib.crc32(data))
        self._m[_HEAD.size:_HEAD.size + len(data)] = data
        self._m[0:8] = (seq + 2).to_bytes(8, "little")

    def read(self, last_seq: int = 0) -> tuple[int, bytes] | None:
        """(seq, data) when the slot holds a complete post other than `last_seq`'s; None when it holds nothing new
        or a post is being written (try again later)."""
        seq, n, crc = _HEAD.unpack(self._m[:_HEAD.size])
        if seq == last_seq or seq % 2 or seq == 0 or n > self.cap:
            return None
        data = bytes(self._m[_HEAD.size:_HEAD.size + n])
        if self._seq() != seq or zlib.crc32(data) != crc:
            return None
        return seq, data


class InstructionMailbox:
    """The three slots over `buf[offset:offset + MAILBOX_BYTES]`."""

    def __init__(self, buf, offset: int = 0):
        self.topic = MailboxSlot(buf, offset, TOPIC_CAP)
        self.text = MailboxSlot(buf, offset + self.topic.size, TEXT_CAP)
        self.refusal = MailboxSlot(buf, offset + self.topic.size + self.text.size, REFUSAL_CAP)

    def topic_name(self) -> str:
        """The topic to subscribe ("" until the control process has set it)."""
        got = self.topic.read()
        return got[1].decode("utf-8", "replace") if got else ""


MAILBOX_BYTES = 3 * _HEAD.size + TOPIC_CAP + TEXT_CAP + REFUSAL_CAP
