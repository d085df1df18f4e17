"""EncodedVideoTrack (transport/webrtc/encoded_track.py): the session's one encode as aiortc packets. A track
starts at an IDR that carries its SPS and PPS, in Annex B, with the frame's session PTS, and the packets decode;
a sender that falls behind gets nothing stale and restarts at an IDR it asked for; flushes do the same; the
IDR requests of every track of one encode are rate limited together (a fake clock). Real encodes, no peer."""

from __future__ import annotations

import asyncio
import time
from fractions import Fraction

import av
import numpy as np
import pytest
from aiortc.mediastreams import MediaStreamError

from worldcast.sessions.frames import FramePipeline, VideoFrame
from worldcast.transport.media.keyframes import KEYFRAME_REQUEST_INTERVAL_S
from worldcast.transport.stream import mp4box
from worldcast.transport.stream.fmp4 import EncodedSample, Fmp4Encoder, Fmp4Sink
from worldcast.transport.webrtc.encoded_track import PACKETS_HELD, EncodedVideoTrack

FPS = 20


def frame(i: int, *, epoch: int = 0) -> VideoFrame:
    y, x = np.mgrid[0:64, 0:64]
    img = np.stack([(x + 3 * i) % 256, (y * 2 + i) % 256, ((x ^ y) + 5 * i) % 256], -1).astype(np.uint8)
    return VideoFrame(image=img, pts=1000 + i * 4500, time_base=Fraction(1, 90000), frame_index=i,
                      action_seq=i - 1, epoch=epoch, present_at_s=100.0 + i / FPS)


class Encoded:
    """An fMP4 sink beside the track (the controller's stream, say): tells when each frame is encoded."""

    def __init__(self, pipeline: FramePipeline) -> None:
        self.indices: list[int] = []
        self.arrived = asyncio.Event()
        self.sink = Fmp4Sink(pipeline, fps=FPS, on_sample=self._on_sample, scale=2, name="stream")
        self.sink.start()

    def _on_sample(self, f: VideoFrame, enc: Fmp4Encoder, s: EncodedSample) -> None:
        self.indices.append(f.frame_index)
        self.arrived.set()

    async def put(self, i: int, *others: Fmp4Sink, epoch: int = 0) -> None:
        """Hand frame `i` on from every sink (a session hands each frame to all of them) and wait until encoded."""
        n = len(self.indices)
        f = frame(i, epoch=epoch)
        for sink in (self.sink, *others):
            sink.put(f)
        while len(self.indices) == n:
            self.arrived.clear()
            await asyncio.wait_for(self.arrived.wait(), 10)


def nal_types(packet: av.Packet) -> list[int]:
    return [u[0] & 0x1F for u in mp4box.split_annexb(bytes(packet))]


async def test_a_track_starts_at_an_idr_with_parameter_sets_and_the_session_pts_and_decodes() -> None:
    pipeline = FramePipeline(current_epoch=lambda: 0, send_ahead_s=0.0, clock=time.monotonic)
    stream = Encoded(pipeline)
    for i in range(3):
        await stream.put(i)
    track = EncodedVideoTrack(pipeline, fps=FPS, scale=2, name="whep")
    track.start()
    assert track.sink.encode is stream.sink.encode and len(pipeline.shared) == 1, "one encode for both"
    for i in range(3, 3 + PACKETS_HELD):  # as many as the track holds for a sender that has not come back yet
        await stream.put(i, track.sink)
    packets = [await asyncio.wait_for(track.recv(), 5) for _ in range(PACKETS_HELD)]
    assert track.skipped == 0 and track.dropped == 0
    assert packets[0].is_keyframe and not any(p.is_keyframe for p in packets[1:])
    assert nal_types(packets[0]) == [mp4box.NAL_SPS, mp4box.NAL_PPS, mp4box.NAL_IDR], "SPS and PPS first"
    assert bytes(packets[0]).startswith(b"\x00\x00\x00\x01"), "Annex B"
    assert all(mp4box.NAL_SPS not in nal_types(p) for p in packets[1:])
    assert [p.pts for p in packets] == [frame(i).pts for i in range(3, 3 + PACKETS_HELD)]
    assert all(p.time_base == Fraction(1, 90000) for p in packets)
    decoder = av.CodecContext.create("h264", "r")
    pictures = [f for p in packets for f in decoder.decode(av.Packet(bytes(p)))]
    assert len(pictures) == PACKETS_HELD and (pictures[0].width, pictures[0].height) == (128, 128)
    assert stream.sink.encode.frames_encoded == 3 + PACKETS_HELD, "each frame encoded once for both sinks"
    await track.aclose()
    assert stream.sink.encode in pipeline.shared.values(), "the stream still reads the encode"
    await stream.sink.aclose()
    assert pipeline.shared == {}


async def test_a_sender_that_falls_behind_gets_nothing_stale_and_restarts_at_the_idr_it_asked_for() -> None:
    pipeline = FramePipeline(current_epoch=lambda: 0, send_ahead_s=0.0, clock=time.monotonic)
    stream = Encoded(pipeline)
    track = EncodedVideoTrack(pipeline, fps=FPS, scale=2, name="whep", clock=lambda: 0.0)
    for i in range(PACKETS_HELD + 2):  # nobody takes the packets: the sender is stuck
        await stream.put(i, track.sink)
    # frames 0..3 held; frame 4 finds the track full: all four dropped, 4 (predicted) skipped, an IDR asked for
    assert track.dropped == PACKETS_HELD and track.skipped == 1
    assert stream.sink.encode.keyframe_requests.granted == 1
    p = await asyncio.wait_for(track.recv(), 5)
    assert p.is_keyframe and p.pts == frame(PACKETS_HELD + 1).pts, "the next frame out is the IDR asked for"
    # a flush drops what the track holds; it waits for the encode's next IDR (a flush makes one)
    await stream.put(PACKETS_HELD + 2, track.sink)
    track.sink.clear()
    assert track.dropped == PACKETS_HELD + 1
    await stream.put(PACKETS_HELD + 3, track.sink)
    p = await asyncio.wait_for(track.recv(), 5)
    assert p.is_keyframe and p.pts == frame(PACKETS_HELD + 3).pts
    await track.aclose()
    await stream.sink.aclose()


async def test_idr_requests_of_every_track_of_one_encode_are_rate_limited_together() -> None:
    now = [10.0]
    pipeline = FramePipeline(current_epoch=lambda: 0, send_ahead_s=0.0, clock=time.monotonic)
    a = EncodedVideoTrack(pipeline, fps=FPS, scale=2, name="a", clock=lambda: now[0])
    b = EncodedVideoTrack(pipeline, fps=FPS, scale=2, name="b", clock=lambda: now[0])
    assert a.sink.encode is b.sink.encode
    assert a.ask_keyframe() is True  # a's PLI
    now[0] += KEYFRAME_REQUEST_INTERVAL_S / 2
    assert b.ask_keyframe() is False, "b asks within the interval: everyone would pay"
    assert a.ask_keyframe() is False
    now[0] += KEYFRAME_REQUEST_INTERVAL_S / 2
    assert b.ask_keyframe() is True
    requests = a.sink.encode.keyframe_requests
    assert (requests.granted, requests.refused) == (2, 2)
    await a.aclose()
    await b.aclose()
    assert pipeline.shared == {}


async def test_a_stopped_track_ends_a_pending_recv_and_ignores_later_samples() -> None:
    pipeline = FramePipeline(current_epoch=lambda: 0, send_ahead_s=0.0, clock=time.monotonic)
    stream = Encoded(pipeline)
    track = EncodedVideoTrack(pipeline, fps=FPS, scale=2, name="whep")
    pending = asyncio.ensure_future(track.recv())
    await asyncio.sleep(0)  # let recv start waiting (one loop turn, not a timed wait)
    track.stop()
    with pytest.raises(MediaStreamError):
        await asyncio.wait_for(pending, 5)
    await stream.put(0, track.sink)
    assert track.frames_out == 0 and track.skipped == 0 and track.dropped == 0
    await track.aclose()
    await stream.sink.aclose()
