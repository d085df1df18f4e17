"""Every frame handed to a WebSocket stream is accounted: sent, or dropped and where (issue 20, item 4).

Deterministic: the frames are delivered by hand into a real `StreamConnection` (real fMP4 sink and encoder,
real outbound queue) whose socket is a reader that does not read until told to, so the encoder queue and the
stream queue overflow on purpose, each by a known number of frames.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import numpy as np
import pytest

from tests.fakes import FakeClock
from worldcast.engine.step_output import FrameOut
from worldcast.models.spec import ConditioningRequest
from worldcast.sessions.directing import DirectingSession
from worldcast.sessions.session import Session
from worldcast.transport.stream.connection import StreamConnection
from worldcast.transport.stream.queue import MAX_MEDIA_ITEMS

pytestmark = pytest.mark.timeout(60)

EMB = np.zeros(384, np.float32)


class StalledReader:
    """A WebSocket whose peer does not read: every send waits until `release()`."""

    def __init__(self) -> None:
        self.scope: dict[str, object] = {}
        self.sent: list[str | bytes] = []
        self._reading = asyncio.Event()
        self._closed = asyncio.Event()

    def release(self) -> None:
        self._reading.set()

    async def send_text(self, text: str) -> None:
        await self._reading.wait()
        self.sent.append(text)

    async def send_bytes(self, data: bytes) -> None:
        await self._reading.wait()
        self.sent.append(data)

    async def receive(self) -> dict[str, object]:
        await self._closed.wait()
        return {"type": "websocket.disconnect"}

    async def close(self, code: int = 1000) -> None:
        self._closed.set()

    def events(self, name: str) -> list[dict[str, object]]:
        out = []
        for m in self.sent:
            if isinstance(m, str) and (ev := json.loads(m)).get("event") == name:
                out.append(ev)
        return out


async def until(cond: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.002)


async def test_drops_in_the_encoder_queue_and_for_a_slow_reader_are_counted_per_segment(model) -> None:  # type: ignore[no-untyped-def]
    s = Session("sid", "tok", model=model, conditioning=ConditioningRequest(text="a green meadow"),
                context={"prompt": EMB}, seed=0, clock=FakeClock(), mode="directing")
    d = DirectingSession(s, default_duration_s=60.0)
    s.pause()
    counted: dict[str, int] = {}
    ws = StalledReader()
    conn = StreamConnection(ws, s, on_frames=lambda k, n: counted.__setitem__(k, counted.get(k, 0) + n))  # type: ignore[arg-type]
    run = asyncio.ensure_future(conn.run())
    await until(lambda: s.sink_count == 1, "the stream to attach")
    seg = d.direct("d1", "a snowy field", {"prompt": EMB}).segment
    h, w = model.spec.frame_height, model.spec.frame_width
    n = [0]

    def deliver(k: int = 1) -> None:
        for _ in range(k):
            n[0] += 1
            s.frames.deliver(FrameOut("sid", n[0], np.zeros((h, w, 3), np.uint8), n[0] / 20, -1,
                                      s.inputs.current_epoch(), {}))

    # 1. a burst faster than the encoder: the sink keeps its newest `depth`, the rest is dropped there
    depth = conn.sink.encode.queue.depth
    deliver(depth + 5)
    assert conn.frames.dropped == {"encoder_queue": 5}
    await until(lambda: conn.sink.encode.frames_encoded == depth, "the kept frames to be encoded")
    # 2. the reader does not read: encoded frames wait in the stream queue until it overflows
    while conn.queue.stats.slow_reader_drops == 0:
        before = conn.sink.encode.frames_encoded
        deliver()
        await until(lambda b=before: conn.sink.encode.frames_encoded == b + 1, "one more frame encoded")  # type: ignore[misc]
    assert conn.frames.dropped == {"encoder_queue": 5, "slow_reader": MAX_MEDIA_ITEMS + 1}
    deliver()  # a P-frame after the overflow: dropped too (it would not decode without its references)
    await until(lambda: conn.frames.dropped_total == 5 + MAX_MEDIA_ITEMS + 2, "the P-frame's drop")
    # 3. the reader catches up: media resumes at a fresh keyframe, and those frames are sent
    ws.release()
    await until(lambda: conn.queue.stats.keyframes_requested == 1, "the drained queue to ask for an IDR")
    for _ in range(3):
        sent = conn.frames.sent
        deliver()
        await until(lambda k=sent: conn.frames.sent == k + 1, "a frame sent")  # type: ignore[misc]
    media = ws.events("media")
    assert len(media) == 3 and media[0]["keyframe"] is True
    d.halt()  # end the segment
    await until(lambda: bool(ws.events("segment_complete")), "segment_complete")
    done = ws.events("segment_complete")[0]
    generated = depth + 5 + (MAX_MEDIA_ITEMS + 1 - depth) + 1 + 3
    assert seg.frames == generated
    assert done["frames"] == 3 == len([m for m in ws.sent if isinstance(m, bytes)]) - 1  # (- the init segment)
    assert done["dropped"] == generated - 3
    assert conn.frames.handed_by_segment == {seg.index: generated}  # this stream's own count, not the segment's
    # every frame the stream took is accounted for, in the stream's numbers and in the metrics hook
    assert conn.sink.frames_in == conn.frames.sent + conn.frames.dropped_total == generated
    assert counted == {"sent": 3, "dropped_encoder_queue": 5, "dropped_slow_reader": MAX_MEDIA_ITEMS + 2}
    assert conn.queue.stats.media_dropped_by == {"slow_reader": MAX_MEDIA_ITEMS + 2}
    conn.close()
    await asyncio.wait_for(run, 10)
