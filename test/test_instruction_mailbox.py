# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""The instruction mailbox (instruction_mailbox.py): the camera child's latest text or refusal reaches the control
process whole or not at all; a torn copy, a writer killed inside a post and text past a slot's size are handled."""
from __future__ import annotations

import multiprocessing
import zlib

from vla_edge_ros.instruction_mailbox import MAILBOX_BYTES, TEXT_CAP, InstructionMailbox, MailboxSlot


def _box():
    buf = bytearray(MAILBOX_BYTES + 16)
    return buf, InstructionMailbox(buf, 16)


def test_the_latest_post_wins_and_is_read_once():
    _, mb = _box()
    assert mb.text.read(0) is None and mb.topic_name() == ""
    mb.text.post(b"go left")
    mb.text.post(b"go right")
    seq, data = mb.text.read(0)
    assert data == b"go right" and mb.text.posts() == 2
    assert mb.text.read(seq) is None  # nothing new since
    mb.topic.post(b"/ns/vla_edge/instruction")
    assert mb.topic_name() == "/ns/vla_edge/instruction"


def test_slots_do_not_overlap_and_stay_inside_their_offset():
    buf, mb = _box()
    mb.topic.post(b"t" * 5000)
    mb.text.post(b"x" * (TEXT_CAP + 100))
    mb.refusal.post(b"r" * 5000)
    assert mb.topic_name() == "t" * mb.topic.cap  # cut to the slot
    assert mb.text.read(0)[1] == b"x" * TEXT_CAP
    assert mb.refusal.read(0)[1] == b"r" * mb.refusal.cap
    assert buf[:16] == bytearray(16)  # the words before the mailbox (the camera's stats) untouched


def test_a_torn_copy_is_never_used():
    buf, mb = _box()
    mb.text.post(b"go left")
    seq, _ = mb.text.read(0)
    off = 16 + mb.topic.size
    buf[off:off + 8] = (seq + 1).to_bytes(8, "little")  # a post in progress: seq odd
    buf[off + 24:off + 27] = b"Go "
    assert mb.text.read(0) is None
    buf[off:off + 8] = (seq + 2).to_bytes(8, "little")  # even again, but the bytes do not match their crc32
    assert mb.text.read(0) is None
    buf[off + 8:off + 24] = (7).to_bytes(8, "little") + zlib.crc32(b"Go left").to_bytes(8, "little")
    assert mb.text.read(0) == (seq + 2, b"Go left")


def test_a_writer_killed_inside_a_post_leaves_the_next_post_whole():
    buf = bytearray(64)
    slot = MailboxSlot(buf, 0, 32)
    buf[0:8] = (5).to_bytes(8, "little")  # killed after making seq odd
    assert slot.read(0) is None
    slot.post(b"stop")
    assert slot.read(0) == (8, b"stop")


def _post_many(path, n):
    import mmap

    with open(path, "r+b") as f:
        m = mmap.mmap(f.fileno(), MAILBOX_BYTES)
    mb = InstructionMailbox(m)
    for i in range(n):
        mb.text.post(f"go to spot {i} ".encode() * (1 + i % 40))


def test_another_process_writing_as_fast_as_it_can_is_read_whole(tmp_path):
    """Every copy the reader keeps is a post the writer made, while the writer posts in a loop."""
    import mmap

    path = tmp_path / "mailbox"
    path.write_bytes(bytes(MAILBOX_BYTES))
    with open(path, "r+b") as f:
        m = mmap.mmap(f.fileno(), MAILBOX_BYTES)
    mb = InstructionMailbox(m)
    n = 20000
    writer = multiprocessing.get_context("spawn").Process(target=_post_many, args=(str(path), n))
    writer.start()
    seen, last = 0, 0
    while writer.is_alive() or seen == 0:
        got = mb.text.read(last)
        if got is not None:
            last, data = got
            words = data.decode().split(" ")
            i = int(words[3])
            assert data == f"go to spot {i} ".encode() * (1 + i % 40)
            seen += 1
    writer.join()
    assert mb.text.read(0)[1].startswith(f"go to spot {n - 1} ".encode()) and seen > 1
