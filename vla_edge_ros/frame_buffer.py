# Copyright 2026 vla_edge_ros maintainers
# SPDX-License-Identifier: Apache-2.0
"""Freshest-frame handoff from the camera callback to the reasoning loop (DESIGN.md §3).

One producer (the camera callback) and one consumer (the reasoning timer) share a triple buffer:

* the producer copies each image into its private *back* slot, then swaps back <-> middle under a
  lock held only for that index swap and marks the middle slot "new";
* the consumer, when the middle slot is new, swaps front <-> middle under the same lock and reads
  its private *front* slot.

So the producer never waits for the consumer (it only ever touches a slot nobody else owns, plus a
few-instruction critical section), the consumer never sees a torn frame (it only reads a slot nobody
else writes) and always gets the newest *complete* frame. Frames the consumer was too slow to see
are counted in ``dropped``.

Exactly one producer and one consumer: ``publish`` and ``latest`` are each not safe to call from two
threads at once.

Two backings, one protocol.  ``FrameBuffer()`` keeps the slots in this process (threads hand over the
frame; the slots are CUDA pinned host memory when CuPy and a GPU are present).  ``FrameBuffer(shared=True)``
keeps slots, indices and metadata in one shared-memory block (``shared_block.py``: a file in /dev/shm or
``VLA_EDGE_SHM_DIR`` with an unpredictable name, its space reserved up front, removed by ``close()``) with a
process-shared lock (a POSIX semaphore, always in /dev/shm), so the producer can be another process: ``handle()``
gives what that process passes to ``FrameBuffer.attach``.  No room for either is one ``SharedBlockError`` line
(from the constructor and from ``renew_lock``), never a SIGBUS.  The vla_edge bringup uses it to keep the camera
(DDS receive, deserialising, conversion) out of the control loop's process (``nodes/camera_process.py``).

What makes the shared backing safe against a producer that dies at any instruction: the three slot indices
and the "new" flag are one 64-bit word, written with one aligned store, so an index swap has either happened
or not; and every lock acquisition has a timeout, so a lock left held by a killed process costs the consumer
at most ``CONSUMER_LOCK_TIMEOUT_S`` a call (it keeps its current frame) until the owner replaces the lock
(``renew_lock``, done before a new producer process starts).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

from .constants import FRAME_C, FRAME_H, FRAME_W
from .gpu import cupy_with_gpu
from .shared_block import SharedBlockError, create_block, no_room_message, open_block, remove_block

# Longest wait for the index swap's lock (the swap itself takes microseconds) with the shared backing, where
# the other side is a process that can die holding it: the consumer (the control loop) keeps its frame after
# 2 ms, the producer gives its frame up after 20 ms.  Threads of one process wait without a limit.
CONSUMER_LOCK_TIMEOUT_S = 0.002
PRODUCER_LOCK_TIMEOUT_S = 0.020

# control block: int64 words, then the three receive times (float64)
_STATE, _PUBLISHED, _DROPPED, _DELIVERED, _PRODUCER_TIMEOUTS, _CONSUMER_TIMEOUTS = 0, 1, 2, 3, 4, 5
_STAMP, _SEQ = 8, 11  # three words each, per slot
_CTL_WORDS = 16
_RECV_OFFSET = _CTL_WORDS * 8
_QUALITY_OFFSET = 256  # three int64 frame-quality words (frame_quality.QualityResult.word), one a slot
_BLOCKS_OFFSET = _QUALITY_OFFSET + 24  # three block maps of BLOCK_MAP_BYTES (frame_quality: 5 x 5 blocks)
BLOCK_MAP_BYTES = 25
_HEADER_BYTES = 512  # control block, receive times, quality words and block maps, padded; the slots follow
_INITIAL_STATE = 0 | (1 << 2) | (2 << 4)  # back 0, middle 1, front 2, nothing new


def _pack(back: int, middle: int, front: int, new: bool) -> int:
    return back | (middle << 2) | (front << 4) | (int(new) << 6)


def _unpack(state: int) -> tuple[int, int, int, bool]:
    return state & 3, (state >> 2) & 3, (state >> 4) & 3, bool((state >> 6) & 1)


@dataclass
class Frame:
    """The consumer's view of one published frame.

    ``image`` is a read-only view of the consumer's front slot, not a copy: it stays valid (is not
    overwritten) until the consumer's next ``latest()`` / ``latest_if_new()`` call. Copy it if it
    must live longer.
    """

    image: np.ndarray  # uint8 (H, W, C)
    stamp_ns: int  # capture stamp from the message header
    seq: int  # producer sequence number (monotonic, starts at 0)
    recv_time: float  # time.monotonic() at receive (CLOCK_MONOTONIC: the same clock in every process)
    quality: int = 0  # the camera's frame-quality word (frame_quality.unpack_word); 0: published unchecked
    blocks: bytes = b""  # the block map that came with it (BLOCK_MAP_BYTES; empty when unchecked)


@dataclass(frozen=True)
class SharedFrameBufferHandle:
    """What another process needs to attach to a shared FrameBuffer (picklable when a process is started)."""

    path: str
    shape: tuple
    dtype: str
    lock: object


def _slot_bytes(shape, dtype) -> int:
    return int(np.prod(shape)) * np.dtype(dtype).itemsize


SHM_PREFIX = "vla_edge_frames_"


def _process_shared_lock():
    """A lock two processes can share (a POSIX semaphore: a small file in /dev/shm, whatever VLA_EDGE_SHM_DIR says).
    A full /dev/shm is a ``SharedBlockError`` line, not an OSError traceback."""
    import errno
    import multiprocessing

    try:
        return multiprocessing.get_context("spawn").Lock()
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise SharedBlockError(no_room_message("/dev/shm", "the frame buffer's lock", None, movable=False)) \
                from None
        raise SharedBlockError(f"cannot create the frame buffer's lock in /dev/shm: {e.strerror or e}") from None


class FrameBuffer:
    """Single-producer / single-consumer triple buffer handing over the freshest frame."""

    def __init__(self, shape=(FRAME_H, FRAME_W, FRAME_C), dtype=np.uint8, pinned: bool | None = None,
                 shared: bool = False, _attach: SharedFrameBufferHandle | None = None):
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        self._mmap = self._path = None
        self._owner = _attach is None
        self._pinned_memory = None  # keeps the pinned pages alive
        nbytes = _slot_bytes(self.shape, self.dtype)
        if shared or _attach is not None:
            if pinned:
                raise RuntimeError("FrameBuffer(shared=True) is not pinned: the CUDA backend copies each frame into "
                                   "its own pinned staging buffer")
            self.pinned = False
            size = _HEADER_BYTES + 3 * nbytes
            if _attach is None:
                self._path, self._mmap = create_block(SHM_PREFIX, size, "frame buffer")
                try:
                    self._lock = _process_shared_lock()
                except BaseException:
                    remove_block(self._path)
                    raise
            else:
                self._path = _attach.path
                self._mmap = open_block(self._path, size)
                self._lock = _attach.lock
            raw = self._mmap
        else:
            cupy = cupy_with_gpu() if pinned is None or pinned else None
            if pinned and cupy is None:
                raise RuntimeError("FrameBuffer(pinned=True) needs CuPy and a CUDA GPU; pass pinned=None to fall back")
            self.pinned = cupy is not None
            if self.pinned:
                self._pinned_memory = cupy.cuda.alloc_pinned_memory(_HEADER_BYTES + 3 * nbytes)
                raw = self._pinned_memory
            else:
                raw = bytearray(_HEADER_BYTES + 3 * nbytes)
            self._lock = threading.Lock()
        shared_backing = self._mmap is not None
        self._producer_timeout = PRODUCER_LOCK_TIMEOUT_S if shared_backing else -1
        self._consumer_timeout = CONSUMER_LOCK_TIMEOUT_S if shared_backing else -1
        block = np.frombuffer(raw, np.uint8, _HEADER_BYTES + 3 * nbytes)
        self._ctl = block[:_RECV_OFFSET].view(np.int64)
        self._recv_time = block[_RECV_OFFSET:_RECV_OFFSET + 24].view(np.float64)
        self._quality = block[_QUALITY_OFFSET:_QUALITY_OFFSET + 24].view(np.int64)
        self._blocks = block[_BLOCKS_OFFSET:_BLOCKS_OFFSET + 3 * BLOCK_MAP_BYTES].reshape(3, BLOCK_MAP_BYTES)
        self._images = [block[_HEADER_BYTES + i * nbytes:_HEADER_BYTES + (i + 1) * nbytes].view(self.dtype)
                        .reshape(self.shape) for i in range(3)]
        if self._owner:
            block[:] = 0
            self._ctl[_STATE] = _INITIAL_STATE
            self._ctl[_SEQ:_SEQ + 3] = -1
        # The consumer gets read-only views so it cannot scribble on a slot the producer will reuse.
        self._views = []
        for image in self._images:
            view = image.view()
            view.flags.writeable = False
            self._views.append(view)
        self._front_frame: Frame | None = None  # cached Frame for the current front slot
        self._front_seq = -2

        # The producer's copy into its back slot. A seam for tests only: replacing it with a copy that pauses
        # half-way lets a test run the consumer at that exact moment (a torn-frame check that does not rely
        # on thread timing). Called as _write(dst_slot, src_image).
        self._write = np.copyto

    # --- shared backing -------------------------------------------------------------------------------

    @property
    def shared(self) -> bool:
        return self._mmap is not None

    def handle(self) -> SharedFrameBufferHandle:
        """What a producer process passes to ``FrameBuffer.attach`` (shared backing only)."""
        if self._mmap is None:
            raise RuntimeError("handle() needs FrameBuffer(shared=True)")
        return SharedFrameBufferHandle(self._path, self.shape, self.dtype.str, self._lock)

    @classmethod
    def attach(cls, handle: SharedFrameBufferHandle) -> "FrameBuffer":
        """The same buffer, opened in another process (normally the producer's)."""
        return cls(handle.shape, np.dtype(handle.dtype), _attach=handle)

    def renew_lock(self) -> None:
        """Replace the process-shared lock (owner side, before starting a new producer process): a producer killed
        inside its index swap may have left the old one held."""
        if self._mmap is None or not self._owner:
            raise RuntimeError("renew_lock() is for the owner of a shared FrameBuffer")
        self._lock = _process_shared_lock()  # on failure (SharedBlockError) the old lock stays

    def close(self) -> None:
        """Remove the shared block's file (owner) and drop this side's views; the mapping itself goes when the
        last view of it does (a Frame held elsewhere stays readable). No-op for the in-process backing."""
        if self._mmap is None:
            return
        if self._owner:
            remove_block(self._path)
        self._mmap = None

    # --- counters --------------------------------------------------------------------------------------

    @property
    def published(self) -> int:
        """publish() calls so far (written by the producer only)."""
        return int(self._ctl[_PUBLISHED])

    @property
    def dropped(self) -> int:
        """Frames replaced by a newer one before the consumer ever saw them."""
        return int(self._ctl[_DROPPED])

    @property
    def delivered(self) -> int:
        """Distinct frames handed to the consumer. published == delivered + dropped + (1 if one is pending)."""
        return int(self._ctl[_DELIVERED])

    @property
    def lock_timeouts(self) -> int:
        """Index swaps given up (shared backing) because the lock was not free in time: a producer process that
        died holding it, or a side descheduled inside the swap on a saturated CPU."""
        return int(self._ctl[_PRODUCER_TIMEOUTS]) + int(self._ctl[_CONSUMER_TIMEOUTS])

    # --- the protocol -----------------------------------------------------------------------------------

    def publish(self, image, stamp_ns: int, recv_time: float | None = None, quality: int = 0,
                blocks: bytes | None = None) -> int:
        """Copy ``image`` in as the newest frame and return its sequence number. Never waits for the consumer
        (beyond the index swap); -1 when the swap's lock could not be had (the frame is not handed over).
        ``quality`` / ``blocks``: the camera's frame-quality verdict on this frame (``QualityResult.word()`` and
        its block map), which travel in the same slot: the consumer gets them with exactly this frame."""
        image = np.asarray(image)
        if image.shape != self.shape or image.dtype != self.dtype:
            raise ValueError(
                f"FrameBuffer expects {self.dtype} images of shape {self.shape}, "
                f"got {image.dtype} {image.shape} (resize/convert before publishing)"
            )
        if recv_time is None:
            recv_time = time.monotonic()
        ctl = self._ctl
        seq = int(ctl[_PUBLISHED])
        back = _unpack(int(ctl[_STATE]))[0]  # only the producer ever changes back, so no lock needed to read it
        self._write(self._images[back], image)
        ctl[_STAMP + back] = int(stamp_ns)
        ctl[_SEQ + back] = seq
        self._recv_time[back] = float(recv_time)
        self._quality[back] = int(quality)
        self._blocks[back] = np.frombuffer(blocks, np.uint8, BLOCK_MAP_BYTES) if blocks else 0
        if not self._lock.acquire(timeout=self._producer_timeout):
            ctl[_PRODUCER_TIMEOUTS] += 1
            return -1
        try:
            back, middle, front, new = _unpack(int(ctl[_STATE]))
            if new:
                ctl[_DROPPED] += 1  # the unseen frame in the middle slot goes back to the producer
            ctl[_STATE] = _pack(middle, back, front, True)  # one store: the swap happened or it did not
        finally:
            self._lock.release()
        ctl[_PUBLISHED] = seq + 1
        return seq

    def latest(self) -> Frame | None:
        """The freshest complete frame, or None before the first publish.

        The returned Frame (and its image) stays valid until this consumer's next latest() or
        latest_if_new() call; without a new publish the same frame is returned again.
        """
        ctl = self._ctl
        if self._lock.acquire(timeout=self._consumer_timeout):
            try:
                back, middle, front, new = _unpack(int(ctl[_STATE]))
                if new:
                    ctl[_STATE] = _pack(back, front, middle, False)
                    ctl[_DELIVERED] += 1
            finally:
                self._lock.release()
        else:  # the producer holds the lock (or died holding it): keep the frame we have
            ctl[_CONSUMER_TIMEOUTS] += 1
        front = _unpack(int(ctl[_STATE]))[2]  # only the consumer changes front
        seq = int(ctl[_SEQ + front])
        if seq < 0:
            return None
        if self._front_frame is None or seq != self._front_seq:
            self._front_seq = seq
            quality = int(self._quality[front])
            self._front_frame = Frame(image=self._views[front], stamp_ns=int(ctl[_STAMP + front]), seq=seq,
                                      recv_time=float(self._recv_time[front]), quality=quality,
                                      blocks=self._blocks[front].tobytes() if quality else b"")
        return self._front_frame

    def latest_if_new(self, last_seq: int) -> Frame | None:
        """The freshest frame if it is newer than ``last_seq``, else None (nothing new since last time)."""
        frame = self.latest()
        if frame is None or frame.seq <= last_seq:
            return None
        return frame
