"""ShmFrameRing: frames through shared memory, in ring order, never overwritten before release."""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest

from worldcast.engine.errors import ShmFrameRingFull
from worldcast.engine.process.shm_frames import FrameMeta, ShmFrameRing


def _meta(idx: int, shape: tuple[int, int, int]) -> FrameMeta:
    return FrameMeta("s", idx, idx, shape, float(idx), -1, 0)


def test_frames_come_back_identical_in_order_and_slots_are_reused_after_release() -> None:
    ring = ShmFrameRing.create(slots=3, slot_bytes=4 * 5 * 3)
    try:
        rng = np.random.default_rng(0)
        for i in range(10):  # more frames than slots: each released before the ring wraps onto it
            img = rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)
            idx = ring.write(img)
            assert idx == i
            out = ring.read(_meta(idx, (4, 5, 3)))
            assert out.dtype == np.uint8 and np.array_equal(out, img)
            assert ring.released() == i + 1
        small = np.full((2, 2, 3), 7, np.uint8)  # a frame smaller than the slot
        assert np.array_equal(ring.read(_meta(ring.write(small), (2, 2, 3))), small)
    finally:
        ring.close()


def test_a_full_ring_drops_the_new_frame_instead_of_overwriting_an_unread_one() -> None:
    ring = ShmFrameRing.create(slots=2, slot_bytes=3)
    try:
        a, b, c = (np.full((1, 1, 3), v, np.uint8) for v in (1, 2, 3))
        ia, ib = ring.write(a), ring.write(b)
        with pytest.raises(ShmFrameRingFull):
            ring.write(c)
        assert ring.dropped == 1 and ring.written == 2
        assert np.array_equal(ring.read(_meta(ia, (1, 1, 3))), a)  # unread frames were not touched
        assert np.array_equal(ring.read(_meta(ib, (1, 1, 3))), b)
        ic = ring.write(c)
        assert ic == 2 and np.array_equal(ring.read(_meta(ic, (1, 1, 3))), c)
    finally:
        ring.close()


def test_bad_frames_are_refused_and_change_nothing() -> None:
    ring = ShmFrameRing.create(slots=2, slot_bytes=12)
    try:
        with pytest.raises(ValueError, match="exceeds"):
            ring.write(np.zeros((2, 3, 3), np.uint8))
        with pytest.raises(ValueError, match="uint8"):
            ring.write(np.zeros((1, 1, 3), np.float32))
        assert ring.written == 0 and ring.dropped == 0
    finally:
        ring.close()
    with pytest.raises(ValueError):
        ShmFrameRing.create(slots=0, slot_bytes=1)


def _write_from_child(name: str, slots: int, slot_bytes: int, value: int) -> None:
    ring = ShmFrameRing.attach(name, slots=slots, slot_bytes=slot_bytes)
    ring.write(np.full((2, 2, 3), value, np.uint8))
    ring.close()


def test_another_process_writes_what_this_one_reads_and_the_owner_unlinks() -> None:
    ring = ShmFrameRing.create(slots=2, slot_bytes=12)
    name = ring.name
    try:
        p = mp.get_context("spawn").Process(target=_write_from_child, args=(name, 2, 12, 42))
        p.start()
        p.join(60)
        assert p.exitcode == 0
        assert np.array_equal(ring.read(_meta(0, (2, 2, 3))), np.full((2, 2, 3), 42, np.uint8))
    finally:
        ring.close()
    with pytest.raises(FileNotFoundError):
        ShmFrameRing.attach(name, slots=2, slot_bytes=12)
    ring.close()  # idempotent
