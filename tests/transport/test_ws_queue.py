"""OutboundQueue: order, media dropped for slow readers up to a keyframe, keyframes asked for once drained."""

from __future__ import annotations

import asyncio

import pytest

from worldcast.transport.errors import QueueOverflow
from worldcast.transport.stream.queue import CLOSE, MediaItem, OutboundQueue


def media(n: int, key: bool = False, size: int = 100) -> MediaItem:
    return MediaItem(sample=n, keyframe=key, nbytes=size)


async def drain(q: OutboundQueue) -> list:  # type: ignore[type-arg]
    out = []
    while len(q):
        out.append(await q.get())
    return out


async def test_messages_leave_in_order_and_media_starts_at_a_keyframe() -> None:
    asks: list[int] = []
    q = OutboundQueue(on_need_keyframe=lambda: asks.append(1))
    assert not q.put_media(media(0))  # nothing decodable before the first keyframe
    q.put_control("hello")
    assert q.put_media(media(1, key=True)) and q.put_media(media(2))
    q.put_control("bye")
    got = await drain(q)
    assert [g if isinstance(g, str) else g.sample for g in got] == ["hello", 1, 2, "bye"]
    assert q.stats.media_dropped == 1 and q.media_bytes == 0 and q.control_items == 0


async def test_a_slow_reader_loses_media_up_to_the_next_keyframe_and_gets_one_when_drained() -> None:
    asks: list[int] = []
    q = OutboundQueue(on_need_keyframe=lambda: asks.append(1), max_media=3)
    q.put_media(media(0, key=True))
    q.put_control("segment_start")
    for i in range(1, 3):
        assert q.put_media(media(i))
    assert not q.put_media(media(3)), "the fourth waiting frame overflows"
    assert q.stats.slow_reader_drops == 1 and q.media_items == 0 and q.waiting_for_keyframe
    assert not q.put_media(media(4)), "P-frames after the gap would not decode"
    assert asks == [], "no keyframe while the reader is still behind"
    assert await q.get() == "segment_start", "control messages survive"
    getter = asyncio.ensure_future(q.get())  # the sender comes back for more and finds nothing: caught up
    await asyncio.sleep(0)
    assert asks == [1]
    assert not q.put_media(media(5)) and asks == [1], "asked once per gap"
    assert q.put_media(media(6, key=True))
    item = await asyncio.wait_for(getter, 1)
    assert isinstance(item, MediaItem) and item.sample == 6 and not q.waiting_for_keyframe
    assert q.stats.media_dropped == 6


async def test_byte_bound_and_purge() -> None:
    q = OutboundQueue(on_need_keyframe=lambda: None, max_media_bytes=250)
    q.put_media(media(0, key=True, size=200))
    assert not q.put_media(media(1, size=100)), "over the byte bound"
    assert q.stats.max_media_bytes == 200
    q.put_media(media(2, key=True))
    q.put_control("x")
    assert q.purge_media() == 1 and q.waiting_for_keyframe and len(q) == 1
    q.close()
    assert await q.get() == "x" and await q.get() is CLOSE


def test_control_backlog_is_bounded() -> None:
    q = OutboundQueue(on_need_keyframe=lambda: None, max_control=2)
    q.put_control("a")
    q.put_control("b")
    with pytest.raises(QueueOverflow):
        q.put_control("c")


def test_every_dropped_item_is_counted_with_its_reason() -> None:
    drops: list[tuple[str, int]] = []
    q = OutboundQueue(on_need_keyframe=lambda: None, max_media=2, on_drop=lambda why, n: drops.append((why, n)))
    q.put_media(media(0, key=True))
    q.put_media(media(1))
    assert q.purge_media() == 2  # a flush
    assert not q.put_media(media(2))  # a P-frame before the next keyframe: dropped, for the same reason
    q.put_media(media(3, key=True))
    q.put_media(media(4))
    assert not q.put_media(media(5))  # the backlog overflows: a slow reader
    assert not q.put_media(media(6))
    assert drops == [("stale", 2), ("stale", 1), ("slow_reader", 2), ("slow_reader", 1), ("slow_reader", 1)]
    assert q.stats.media_dropped_by == {"stale": 3, "slow_reader": 4} and q.stats.media_dropped == 7
