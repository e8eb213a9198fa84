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

Exactly one producer thread and one consumer thread: ``publish`` and ``latest`` are each not safe
to call from two threads at once.

The slots live in CUDA pinned host memory when CuPy and a GPU are present, so the engine's
host-to-device upload of a frame can be asynchronous (and captured in a CUDA graph).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

from .gpu import cupy_with_gpu

from .constants import FRAME_C, FRAME_H, FRAME_W


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
    recv_time: float  # time.monotonic() at receive


def _allocate_slot(shape: tuple, dtype: np.dtype, cupy) -> tuple[np.ndarray, object]:
    """A zeroed array for one slot; with ``cupy`` it is backed by pinned memory (kept alive via the 2nd item)."""
    if cupy is None:
        return np.zeros(shape, dtype), None
    count = int(np.prod(shape))
    memory = cupy.cuda.alloc_pinned_memory(count * dtype.itemsize)
    array = np.frombuffer(memory, dtype, count).reshape(shape)
    array.fill(0)
    return array, memory


class FrameBuffer:
    """Single-producer / single-consumer triple buffer handing over the freshest frame."""

    def __init__(self, shape=(FRAME_H, FRAME_W, FRAME_C), dtype=np.uint8, pinned: bool | None = None):
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        cupy = cupy_with_gpu() if pinned is None or pinned else None
        if pinned and cupy is None:
            raise RuntimeError("FrameBuffer(pinned=True) needs CuPy and a CUDA GPU; pass pinned=None to fall back")
        self.pinned = cupy is not None

        slots = [_allocate_slot(self.shape, self.dtype, cupy) for _ in range(3)]
        self._images = [image for image, _ in slots]
        self._pinned_memory = [memory for _, memory in slots]  # keeps the pinned pages alive
        # The consumer gets read-only views so it cannot scribble on a slot the producer will reuse.
        self._views = []
        for image in self._images:
            view = image.view()
            view.flags.writeable = False
            self._views.append(view)
        # Per-slot metadata, written by whoever owns the slot (same ownership rule as the pixels).
        self._stamp_ns = [0, 0, 0]
        self._seq = [-1, -1, -1]
        self._recv_time = [0.0, 0.0, 0.0]

        self._back, self._middle, self._front = 0, 1, 2
        self._middle_is_new = False
        self._swap_lock = threading.Lock()  # guards the three indices, the flag and the counters below
        self._front_frame: Frame | None = None  # cached Frame for the current front slot

        # The producer's copy into its back slot. A seam for tests only: replacing it with a copy that pauses
        # half-way lets a test run the consumer at that exact moment (a torn-frame check that does not rely
        # on thread timing). Called as _write(dst_slot, src_image).
        self._write = np.copyto

        self.published = 0  # publish() calls (producer-side only)
        self._dropped = 0
        self._delivered = 0

    @property
    def dropped(self) -> int:
        """Frames replaced by a newer one before the consumer ever saw them."""
        with self._swap_lock:
            return self._dropped

    @property
    def delivered(self) -> int:
        """Distinct frames handed to the consumer. published == delivered + dropped + (1 if one is pending)."""
        with self._swap_lock:
            return self._delivered

    def publish(self, image, stamp_ns: int, recv_time: float | None = None) -> int:
        """Copy ``image`` in as the newest frame and return its sequence number. Never waits for the consumer."""
        image = np.asarray(image)
        if image.shape != self.shape or image.dtype != self.dtype:
            raise ValueError(
                f"FrameBuffer expects {self.dtype} images of shape {self.shape}, "
                f"got {image.dtype} {image.shape} (resize/convert before publishing)"
            )
        if recv_time is None:
            recv_time = time.monotonic()
        seq = self.published
        back = self._back  # only the producer ever changes _back, so no lock needed to read it
        self._write(self._images[back], image)
        self._stamp_ns[back] = int(stamp_ns)
        self._seq[back] = seq
        self._recv_time[back] = float(recv_time)
        with self._swap_lock:
            if self._middle_is_new:
                self._dropped += 1  # the unseen frame in the middle slot goes back to the producer
            self._back, self._middle = self._middle, self._back
            self._middle_is_new = True
        self.published = seq + 1
        return seq

    def latest(self) -> Frame | None:
        """The freshest complete frame, or None before the first publish.

        The returned Frame (and its image) stays valid until this consumer's next latest() or
        latest_if_new() call; without a new publish the same frame is returned again.
        """
        with self._swap_lock:
            if self._middle_is_new:
                self._front, self._middle = self._middle, self._front
                self._middle_is_new = False
                self._delivered += 1
                swapped = True
            else:
                swapped = False
        if swapped:
            front = self._front  # only the consumer changes _front
            self._front_frame = Frame(
                image=self._views[front],
                stamp_ns=self._stamp_ns[front],
                seq=self._seq[front],
                recv_time=self._recv_time[front],
            )
        return self._front_frame

    def latest_if_new(self, last_seq: int) -> Frame | None:
        """The freshest frame if it is newer than ``last_seq``, else None (nothing new since last time)."""
        frame = self.latest()
        if frame is None or frame.seq <= last_seq:
            return None
        return frame
