"""EncodedVideoTrack: a session's one H.264 encode as an aiortc video track, for WHEP spectators.

aiortc's `RTCRtpSender` takes either pictures (`av.VideoFrame`: it encodes them itself, one encoder per
sender) or encoded packets (`av.Packet`: it only packetizes them) from a track (aiortc 1.16,
`rtcrtpsender.py` `_next_encoded_frame`; `codecs/h264.py` `H264Encoder.pack`). A packet must be one Annex B
access unit (start-code delimited NAL units: `pack` splits on start codes and packetizes per RFC 6184,
single NAL units, STAP-A and FU-A), and its `pts` in its `time_base` becomes the RTP timestamp (converted
to the 90 kHz video clock, RFC 3551; the sender adds its random origin).

This track is fed by an `Fmp4Sink` of the session's `SessionEncode` (`transport/stream/fmp4.py`, kept in
the session's `FramePipeline.shared`), so every WHEP peer of a session, its fMP4 streams and its recording
share one encode: each encoded sample is turned into one packet (the encode's samples are length-prefixed
NAL units without parameter sets, which travel in the fMP4 avcC: each IDR gets the SPS and PPS put first,
so a receiver can start at any IDR), stamped with the frame's session PTS (the same 90 kHz PTS the
per-peer `SessionVideoTrack` hands aiortc).

A predicted picture decodes only after every one before it back to an IDR, so this track never drops one
packet alone: it starts at an IDR (a sink joining a running encode asks for one), and when it must drop
(its sender fell `depth` packets behind, or a flush cleared what it held) it drops everything it holds and
waits for the next IDR, asking the encode for one. A receiver's PLI or FIR asks too (`ask_keyframe`); the
encode grants such requests at most once per interval for all its receivers
(`transport/media/keyframes.py`), so one lossy viewer cannot make every viewer pay for IDRs.

Event loop only.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable

import av
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from worldcast.sessions.frames import FramePipeline, VideoFrame
from worldcast.transport.stream.fmp4 import EncodedSample, Fmp4Encoder, Fmp4Sink
from worldcast.transport.stream.mp4box import avcc_to_annexb

logger = logging.getLogger(__name__)

#: Encoded frames a track holds for its sender at most: the sender packetizes a frame in well under a frame
#: period, so more than this means it is stuck behind a congested socket.
PACKETS_HELD = 4


class EncodedVideoTrack(MediaStreamTrack):
    """A video track of the session's shared H.264 encode: `recv` returns one `av.Packet` per encoded frame.

    Args:
        pipeline: the session's frame pipeline (`Session.frames`; its `shared` holds the encode).
        fps: the model's frame rate.
        scale: integer upscale of the pictures (the encode is shared by sinks asking the same picture).
        stamp: stamp frame index and action seq into the pictures.
        depth: frames the encode holds at most before encoding (`SessionEncode`).
        name: for logs.
        clock: monotonic clock for keyframe requests, s.

    Attributes:
        sink: the `FrameSink` to attach to the session (`Session.attach_spectator`); frames reach the track
            only through it.
        frames_out: packets handed to the sender.
        skipped: encoded frames not sent (waiting for an IDR: before the first, or after a drop).
        dropped: packets dropped unsent (the sender behind, or a flush).
    """

    kind = "video"

    def __init__(self, pipeline: FramePipeline, *, fps: int, scale: int = 1, stamp: bool = False, depth: int = 2,
                 name: str = "", clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.name, self.clock = name, clock
        self._packets: collections.deque[av.Packet] = collections.deque()
        self._ready = asyncio.Event()
        self._awaiting_idr = True
        self.frames_out = 0
        self.skipped = 0
        self.dropped = 0
        self.last_pts = -1
        self.sink = Fmp4Sink(pipeline, fps=fps, on_sample=self._on_sample, on_clear=self._on_clear, scale=scale,
                             stamp=stamp, depth=depth, name=name)

    def __repr__(self) -> str:
        return f"EncodedVideoTrack({self.name})"

    # -- what the encode hands on ------------------------------------------------------------------------

    def _on_sample(self, frame: VideoFrame, encoder: Fmp4Encoder, sample: EncodedSample) -> None:
        if self.readyState != "live" or frame.pts <= self.last_pts:
            return
        if len(self._packets) >= PACKETS_HELD:  # the sender is behind: what it holds would only arrive late
            self._drop_held()
        if self._awaiting_idr and not sample.keyframe:
            self.skipped += 1
            return
        self._awaiting_idr = False
        packet = av.Packet(avcc_to_annexb(sample.data, before=encoder.parameter_sets if sample.keyframe else ()))
        packet.pts, packet.time_base, packet.is_keyframe = frame.pts, frame.time_base, sample.keyframe
        self.last_pts = frame.pts
        self._packets.append(packet)
        self._ready.set()

    def _on_clear(self) -> None:
        """A flush or cancel: what the track holds is stale (the encode's next frame is an IDR)."""
        if self._packets:
            self._drop_held()

    def _drop_held(self) -> None:
        self.dropped += len(self._packets)
        self._packets.clear()
        self._awaiting_idr = True
        self.ask_keyframe()

    # -- control ----------------------------------------------------------------------------------

    def ask_keyframe(self) -> bool:
        """Ask the session's encode for an IDR (a receiver's PLI or FIR, or this track dropped what it held).

        Returns:
            whether the encode granted it (requests of all its receivers are rate limited together).
        """
        encode = self.sink.encode
        if not encode.keyframe_requests.ask(self.clock()):
            return False
        encode.request_keyframe()
        return True

    def start(self) -> None:
        """Start the session's encode if it is not running (on the running loop)."""
        self.sink.start()

    # -- MediaStreamTrack -------------------------------------------------------------------------

    async def recv(self) -> av.Packet:
        """The next encoded frame, Annex B, with its session PTS (90 kHz).

        Raises:
            MediaStreamError: the track was stopped.
        """
        while not self._packets:
            if self.readyState != "live":
                raise MediaStreamError
            self._ready.clear()
            await self._ready.wait()
        if self.readyState != "live":
            raise MediaStreamError
        self.frames_out += 1
        return self._packets.popleft()

    def stop(self) -> None:
        super().stop()
        self._packets.clear()
        self._ready.set()  # a pending recv ends with MediaStreamError

    async def aclose(self) -> None:
        """Stop the track and leave the session's encode (the last sink to leave stops it; idempotent)."""
        self.stop()
        await self.sink.aclose()
