"""LiveKitVideoSink: bounded, drops the oldest and stale frames, timestamps from PTS; both publishers
hand real frames to the SDK's native sources (no room needed)."""

from __future__ import annotations

import asyncio
from fractions import Fraction

import numpy as np
import pytest

pytest.importorskip("livekit.rtc")

from worldcast.sessions.frames import VideoFrame  # noqa: E402
from worldcast.transport.livekit.source import (  # noqa: E402
    EncodedPublisher,
    LiveKitVideoSink,
    RawPublisher,
)
from worldcast.transport.media.picture import prepare  # noqa: E402


def frame(i: int, *, epoch: int = 0, t0_s: float = 1000.0) -> VideoFrame:
    img = np.full((64, 64, 3), i % 256, np.uint8)
    return VideoFrame(image=img, pts=i * 4500, time_base=Fraction(1, 90000), frame_index=i, action_seq=i - 1,
                      epoch=epoch, present_at_s=t0_s + i * 0.05)


class RecordingPublisher:
    """Stand-in for the SDK's source: records what the sink hands over."""

    source = None

    def __init__(self) -> None:
        self.got: list[tuple[int, int, tuple[int, ...]]] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def publish(self, image, timestamp_us, f, current):  # type: ignore[no-untyped-def]
        await self.gate.wait()
        if not current():
            return False
        self.got.append((f.frame_index, timestamp_us, image.shape))
        return True

    async def aclose(self) -> None:
        pass


async def test_sink_holds_two_drops_oldest_and_stale() -> None:
    epoch = [0]
    pub = RecordingPublisher()
    sink = LiveKitVideoSink(pub, lambda f: f.epoch >= epoch[0], scale=2)
    for i in range(5):  # no pump yet: the sink keeps the newest two
        sink.put(frame(i))
    assert sink.frames_dropped == 3
    sink.start()
    for _ in range(100):
        if len(pub.got) == 2:
            break
        await asyncio.sleep(0.01)
    assert [g[0] for g in pub.got] == [3, 4] and pub.got[0][2] == (128, 128, 3)
    ts = [g[1] for g in pub.got]
    assert ts[1] - ts[0] == 50_000  # 4500 ticks of 90 kHz = 50 ms
    assert ts[0] == round(frame(3).present_at_s * 1e6)  # on the monotonic clock, from the PTS

    # a flush while a frame is being published: that frame and the queued one are stale
    pub.gate.clear()
    sink.put(frame(5))
    await asyncio.sleep(0.05)
    sink.put(frame(6))
    epoch[0] = 1
    sink.clear()
    pub.gate.set()
    sink.put(frame(7, epoch=1))
    for _ in range(100):
        if len(pub.got) == 3:
            break
        await asyncio.sleep(0.01)
    assert [g[0] for g in pub.got] == [3, 4, 7]
    await sink.aclose()
    await sink.aclose()  # idempotent


async def test_raw_and_encoded_publishers_feed_native_sources() -> None:
    raw = RawPublisher(128, 128)
    assert await raw.publish(prepare(frame(1), scale=2, stamp=False), 1_000_000, frame(1), lambda: True)
    assert not await raw.publish(prepare(frame(2), scale=2, stamp=False), 1_050_000, frame(2), lambda: False)
    await raw.aclose()

    enc = EncodedPublisher(128, 128, max_bitrate_bps=1_000_000, fps=20)
    assert await enc.publish(prepare(frame(1), scale=2, stamp=False), 1_000_000, frame(1), lambda: True)
    assert enc.frames_encoded == 1 and not enc._need_key
    # flushed during the encode: dropped, and the next frame must be a keyframe
    assert not await enc.publish(prepare(frame(2), scale=2, stamp=False), 1_050_000, frame(2), lambda: False)
    assert enc._need_key
    packets = enc._encode(prepare(frame(3), scale=2, stamp=False), 3 * 4500, True)
    assert packets and packets[0][1] and packets[0][0].startswith(b"\x00\x00\x00\x01")  # Annex B keyframe
    await enc.aclose()
