"""ShmFrameRing: decoded frames from an engine process to the server, through shared memory.

An engine process writes each frame's pixels into the next slot of a ring
in POSIX shared memory (`multiprocessing.shared_memory`) and sends only a
small `FrameMeta` (ids, index, slot, PTS inputs) over its pipe; the server
copies the pixels out of the slot and releases it. No pixels are pickled.

One writer (the engine's device thread) and one reader (the server's
reader thread for that engine), so the ring needs no lock: the writer
counts the frames it has written, the reader publishes how many it has
released in the ring's header, and a slot is written only when the reader
has released it (`written - released < slots`). The pipe message that
follows each write is the synchronisation point (a syscall on both
sides), so the reader never sees a slot before its pixels are in it. A
full ring (a reader stalled for `slots` frames) makes the writer drop the
frame and count it, never wait: the device does not stall on the server.

The server creates the ring (it outlives a killed engine process, and the
server unlinks it); the engine attaches by name.

Layout: a 64-byte header (uint64 `released` at offset 0), then `slots`
slots of `slot_bytes` each.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass, field
from multiprocessing import shared_memory

import numpy as np

from worldcast.engine.errors import ShmFrameRingFull
from worldcast.engine.step_output import ChunkRecord

logger = logging.getLogger(__name__)

#: Bytes before the first slot (the `released` counter, padded to a cache line).
HEADER_BYTES = 64


@dataclass(frozen=True)
class FrameMeta:
    """Everything of a `FrameOut` but its pixels, which lie in ring slot `ring_index % slots`.

    Attributes:
        session_id: owner.
        frame_index: absolute pixel frame index in the session.
        ring_index: the writer's frame counter when it wrote the pixels (absolute, not modulo); -1: the ring was
            full and the pixels were dropped (the frame is told without them: `FrameOut.lost`).
        shape: (H, W, 3) of the uint8 RGB image.
        present_at_s: intended presentation time, s (CLOCK_MONOTONIC, shared by the processes of a host).
        action_seq: seq of the last action applied (-1: none).
        epoch: flush epoch it was generated under.
        timings_ms: server stage times (queue, denoise, decode), ms.
        chunk: what made its chunk, on a chunk's first frame (`FrameOut.chunk`).
    """

    session_id: str
    frame_index: int
    ring_index: int
    shape: tuple[int, int, int]
    present_at_s: float
    action_seq: int
    epoch: int
    timings_ms: dict[str, float] = field(default_factory=dict)
    chunk: ChunkRecord | None = None


class ShmFrameRing:
    """A single-writer, single-reader ring of frame slots in shared memory.

    Create it in the server with `ShmFrameRing.create`, pass `name`, `slots` and
    `slot_bytes` to the engine, which calls `ShmFrameRing.attach`.

    Args:
        shm: the shared memory block.
        slots: frame slots.
        slot_bytes: bytes of one slot (H * W * 3 of the largest frame).
        owner: True in the process that created (and will unlink) the block.
    """

    def __init__(self, shm: shared_memory.SharedMemory, *, slots: int, slot_bytes: int, owner: bool) -> None:
        if slots < 1 or slot_bytes < 1:
            raise ValueError("a frame ring needs at least one slot of at least one byte")
        if shm.size < HEADER_BYTES + slots * slot_bytes:
            raise ValueError(f"shared memory {shm.name} holds {shm.size} B, under the ring's "
                             f"{HEADER_BYTES + slots * slot_bytes} B")
        self.shm, self.slots, self.slot_bytes, self.owner = shm, slots, slot_bytes, owner
        self._released = np.ndarray((1,), dtype=np.uint64, buffer=shm.buf, offset=0)
        self._data = np.ndarray((slots, slot_bytes), dtype=np.uint8, buffer=shm.buf, offset=HEADER_BYTES)
        self._close_lock = threading.Lock()
        self._closed = False
        self.written = 0  #: frames written (writer side)
        self.dropped = 0  #: frames the writer dropped on a full ring

    @property
    def name(self) -> str:
        return self.shm.name

    @classmethod
    def create(cls, *, slots: int, slot_bytes: int) -> ShmFrameRing:
        """A new, empty ring in a fresh shared-memory block (the caller owns and unlinks it)."""
        size = HEADER_BYTES + slots * slot_bytes
        shm = shared_memory.SharedMemory(create=True, size=size)
        shm.buf[:HEADER_BYTES] = bytes(HEADER_BYTES)
        return cls(shm, slots=slots, slot_bytes=slot_bytes, owner=True)

    @classmethod
    def attach(cls, name: str, *, slots: int, slot_bytes: int) -> ShmFrameRing:
        """Open an existing ring by name (the engine side).

        Raises:
            FileNotFoundError: no such shared-memory block.
        """
        # Python 3.11 registers every attach with the resource tracker; a process started by
        # multiprocessing's spawn shares the server's tracker, whose set of names then holds the block
        # once, and the server's unlink unregisters it.
        shm = shared_memory.SharedMemory(name=name)
        return cls(shm, slots=slots, slot_bytes=slot_bytes, owner=False)

    @staticmethod
    def slots_for(*, frame_bytes: int, frames: int, max_bytes: int) -> int:
        """Slots to allocate: `frames`, but no more than fit `max_bytes` (at least 2)."""
        return max(2, min(frames, math.floor(max_bytes / max(1, frame_bytes))))

    # -- writer ------------------------------------------------------------------------------

    def released(self) -> int:
        """Frames the reader has released (read from shared memory)."""
        return int(self._released[0])

    def write(self, image: np.ndarray) -> int:
        """Copy one frame into the next slot.

        Args:
            image: uint8 (H, W, 3) RGB, at most `slot_bytes` bytes.

        Returns:
            its ring index (pass it in the frame's `FrameMeta`).

        Raises:
            ShmFrameRingFull: the reader has not released the slot yet (the frame is not written; counted
                in `dropped`).
            ValueError: the image is not uint8 or is larger than a slot.
        """
        if image.dtype != np.uint8:
            raise ValueError(f"frames are uint8, got {image.dtype}")
        n = image.nbytes
        if n > self.slot_bytes:
            raise ValueError(f"a frame of {tuple(image.shape)} ({n} B) exceeds the ring's {self.slot_bytes} B slots")
        if self.written - self.released() >= self.slots:
            self.dropped += 1
            raise ShmFrameRingFull(f"all {self.slots} frame slots are unreleased")
        idx = self.written
        slot = self._data[idx % self.slots]
        np.copyto(slot[:n].reshape(image.shape), image)
        self.written = idx + 1
        return idx

    # -- reader ------------------------------------------------------------------------------

    def read(self, meta: FrameMeta) -> np.ndarray:
        """Copy a frame's pixels out of its slot and release the slot (frames are read in ring order).

        Returns:
            uint8 `meta.shape` array, the reader's own copy.
        """
        n = math.prod(meta.shape)
        out = self._data[meta.ring_index % self.slots, :n].reshape(meta.shape).copy()
        self._released[0] = np.uint64(meta.ring_index + 1)
        return out

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Unmap the block; the owner also unlinks it (idempotent, any thread)."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            self._released = np.zeros(1, np.uint64)  # drop the views before closing the mapping
            self._data = np.zeros((self.slots, 0), np.uint8)
            try:
                self.shm.close()
            except BufferError:  # a view still exported somewhere: leave the mapping to the process's exit
                logger.debug("ShmFrameRing(%s): mapping still in use at close", self.name)
            if self.owner:
                try:
                    self.shm.unlink()
                except FileNotFoundError:
                    pass
                self.owner = False
