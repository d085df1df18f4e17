"""The frame pipeline's stages in their order: pacing, the one stale-epoch decision (shared with every sink's
queue), PTS before the gate, the gate, the sinks; a picture prepared once for every sink of a frame."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from worldcast.engine.step_output import FrameOut
from worldcast.sessions.frames import FramePipeline, VideoFrame
from worldcast.transport.media import picture
from worldcast.transport.media.frame_queue import FrameQueue


class ListSink:
    def __init__(self) -> None:
        self.frames: list[VideoFrame] = []
        self.cleared = 0

    def put(self, frame: VideoFrame) -> None:
        self.frames.append(frame)

    def clear(self) -> None:
        self.cleared += 1


def out(idx: int, epoch: int, at_s: float) -> FrameOut:
    return FrameOut("sid", idx, np.full((8, 8, 3), idx, np.uint8), at_s, -1, epoch)


def test_stages_in_order_and_each_outcome_counted() -> None:
    epoch = [0]
    p = FramePipeline(current_epoch=lambda: epoch[0], send_ahead_s=0.0, clock=time.monotonic)
    seen: list[str] = []
    p.on_outcome = lambda outcome, late: seen.append(outcome)
    refuse = [True]

    class Gate:
        def admit(self, frame: VideoFrame) -> bool:
            return not refuse[0]

    sink = ListSink()
    p.add_sink(sink)
    p.set_gate(Gate())
    assert p.deliver(out(0, 0, 10.0)) is None, "refused by the gate"
    refuse[0] = False
    f1 = p.deliver(out(1, 0, 10.05))
    epoch[0] = 1
    assert p.deliver(out(2, 0, 10.10)) is None, "an older epoch: stale"
    f3 = p.deliver(out(3, 1, 10.15))
    assert f1 is not None and f3 is not None and sink.frames == [f1, f3]
    assert f1.pts == 4500, "the refused frame used up PTS 0: the stream stays on the session's clock"
    assert seen == ["dropped_gated", "delivered", "dropped_stale", "delivered"]
    assert (p.generated, p.delivered, p.dropped_stale, p.dropped_gated) == (4, 2, 1, 1)
    p.closed = True
    assert p.deliver(out(4, 1, 10.2)) is None and p.dropped_stale == 2, "nothing after the close"


def test_a_sink_queue_asks_the_pipeline_so_a_frame_that_went_stale_while_queued_is_dropped() -> None:
    epoch = [0]
    p = FramePipeline(current_epoch=lambda: epoch[0], send_ahead_s=0.0, clock=time.monotonic)

    async def run() -> list[int]:
        q = FrameQueue(4, p.is_current)
        p.add_sink(q)
        for i, e in ((0, 0), (1, 0)):
            p.deliver(out(i, e, 1.0 + i))
        epoch[0] = 1  # a flush after they were queued (the sink's clear not called: the queue's own check)
        p.deliver(out(2, 1, 3.0))
        got = await q.get()
        assert got is not None
        return [got.frame_index, q.dropped_by.get("stale", 0)]

    assert asyncio.run(run()) == [2, 2]


def test_pacing_hands_a_frame_on_no_earlier_than_send_ahead_before_its_presentation_time() -> None:
    async def run() -> None:
        p = FramePipeline(current_epoch=lambda: 0, send_ahead_s=0.05, clock=time.monotonic)
        sink = ListSink()
        p.add_sink(sink)
        at: list[float] = []
        second = asyncio.Event()
        p.on_delivered.append(lambda f: (at.append(time.monotonic()), len(at) == 2 and second.set()))
        now = time.monotonic()
        p.submit(out(0, 0, now))  # already due: at once
        assert len(sink.frames) == 1
        p.submit(out(1, 0, now + 0.25))
        assert len(sink.frames) == 1, "not before it is due"
        await asyncio.wait_for(second.wait(), 30)  # (the paced frame comes, or the test fails)
        assert len(sink.frames) == 2
        assert at[1] >= now + 0.25 - 0.05 - 0.005  # (the loop's clock resolution)

    asyncio.run(run())


def test_a_picture_is_prepared_once_for_every_sink_of_a_frame() -> None:
    p = FramePipeline(current_epoch=lambda: 0, send_ahead_s=0.0, clock=time.monotonic)
    f = p.deliver(out(5, 0, 1.0))
    assert f is not None
    a = picture.prepare(f, scale=4, stamp=True)
    b = picture.prepare(f, scale=4, stamp=True)
    assert a is b and a.shape == (32, 32, 3), "the second sink reads the first one's picture"
    c = picture.prepare(f, scale=2, stamp=False)
    assert c is not a and c.shape == (16, 16, 3) and (c == 5).all()
