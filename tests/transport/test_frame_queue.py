"""FrameQueue: bounded drop-oldest, clear on flush, stale epochs skipped, every drop counted."""

from __future__ import annotations

import asyncio
from fractions import Fraction

import numpy as np

from worldcast.sessions.frames import VideoFrame
from worldcast.transport.media.frame_queue import FrameQueue


def frame(i: int, epoch: int = 0) -> VideoFrame:
    return VideoFrame(np.zeros((2, 2, 3), np.uint8), pts=i, time_base=Fraction(1, 90000), frame_index=i,
                      action_seq=-1, epoch=epoch, present_at_s=0.0)


async def test_full_queue_drops_the_oldest_and_get_skips_stale_epochs() -> None:
    epoch = [0]
    drops: list[int] = []
    q = FrameQueue(2, lambda f: f.epoch >= epoch[0], on_drop=lambda n, why: drops.append(n))
    for i in range(4):
        q.put(frame(i))
    assert len(q) == 2 and q.frames_in == 4 and q.frames_dropped == 2 and drops == [1, 1]
    assert (await q.get()).frame_index == 2  # type: ignore[union-attr]
    q.put(frame(4, epoch=1))
    epoch[0] = 1  # a flush: frame 3 (epoch 0) is stale now
    assert (await q.get()).frame_index == 4  # type: ignore[union-attr]
    assert q.frames_dropped == 3
    q.put(frame(5, epoch=1))
    q.put(frame(6, epoch=1))
    assert q.clear() == 2 and len(q) == 0 and q.frames_dropped == 5 and drops[-1] == 2
    assert q.dropped_by == {"full": 2, "stale": 1, "cleared": 2}  # every drop, and why


async def test_get_waits_for_a_frame_and_returns_none_once_its_sink_stops() -> None:
    q = FrameQueue(2, lambda f: True)
    alive = [True]
    waiting = asyncio.ensure_future(q.get(alive=lambda: alive[0]))
    await asyncio.sleep(0)
    assert not waiting.done()
    q.put(frame(7))
    assert (await waiting).frame_index == 7  # type: ignore[union-attr]
    waiting = asyncio.ensure_future(q.get(alive=lambda: alive[0]))
    await asyncio.sleep(0)
    alive[0] = False
    q.wake()
    assert await waiting is None
    accepted = FrameQueue(3, lambda f: True)
    for i in (3, 1, 5):
        accepted.put(frame(i))
    assert (await accepted.get(accept=lambda f: f.pts > 3)).frame_index == 5  # type: ignore[union-attr]
    assert accepted.frames_dropped == 2
