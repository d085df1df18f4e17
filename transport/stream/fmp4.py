"""Fragmented MP4 (H.264) for MediaSource: the encoder, the fragmenter and a session frame sink.

- `Fmp4Encoder` (no asyncio): libx264 through PyAV in the one realtime
  configuration (`transport/media/h264.py`: one packet out per frame in, an
  IDR every second and whenever asked), constant quality. Its init
  segment (`ftyp` + `moov`) comes from PyAV's mp4 muxer with
  `movflags=empty_moov+default_base_moof`: it declares no duration (mvhd and
  mdhd durations 0, no `mehd`), which Chromium treats as a live stream and
  renders in its low-delay mode. The MIME codec string is read from the SPS in
  that init segment's `avcC` (RFC 6381), never assumed: with `ultrafast`,
  x264 emits Constrained Baseline (`avc1.42C0xx`).
- `Fmp4Fragmenter` writes one media segment (`moof` + `mdat`, `mp4box.py`)
  per encoded frame the moment it is encoded; FFmpeg's muxer would hold each
  fragment until the next frame arrives (one frame period).
- `SessionEncode` is a session's one encode for encoded video: it holds at
  most `depth` frames (the oldest is dropped; two, or a chunk's frames when a
  chunk holds more: the engine delivers a chunk's frames together), encodes
  them on a worker thread of its own and hands each encoded sample, with its
  frame, to every `Fmp4Sink` of the session on the event loop. `clear` (flush,
  cancel) drops queued frames and makes the next encoded frame an IDR.
- `Fmp4Sink` is one stream's `FrameSink` (`sessions/frames.py`) over it: `put`
  never blocks; it joins the session's encode (kept in the session's
  `FramePipeline.shared`) and leaves it at its close, so streams of one
  session (and what reads its encoded video next: recordings, spectators)
  share one encode.

The media timeline is gapless: the n-th fragment a fragmenter writes starts
at n frame periods (one period = 1/fps s), whatever the session's wall-clock
PTS did in between (a pause, a skipped frame, media dropped for a slow
reader), so MediaSource never meets a hole in its buffered range. Each
frame's session PTS (90 kHz) travels beside it in the stream's events.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import av

from worldcast.sessions.frames import FramePipeline, VideoFrame
from worldcast.transport.media import h264
from worldcast.transport.media import picture as media_picture
from worldcast.transport.media.frame_queue import FrameQueue
from worldcast.transport.media.keyframes import KeyframeRequests
from worldcast.transport.stream.mp4box import (
    Sample,
    annexb_to_avcc,
    avc_codec_string,
    media_segment,
    parameter_sets_from_avcc,
    parse_init,
    sps_from_avcc,
)

logger = logging.getLogger(__name__)

#: Track timescale when it divides into whole frame periods: the 90 kHz video clock (RFC 3551).
PREFERRED_TIMESCALE = 90_000


@dataclass(frozen=True)
class EncodedSample:
    """One encoded frame.

    Attributes:
        data: length-prefixed H.264 NAL units (4-byte lengths; no SPS/PPS: those are in avcC).
        keyframe: an IDR picture (decodable without earlier frames).
        encode_ms: time spent preparing and encoding the picture, ms.
    """

    data: bytes
    keyframe: bool
    encode_ms: float


class Fmp4Encoder:
    """H.264 encoder with a fragmented-MP4 init segment (no asyncio, one thread at a time).

    Args:
        width, height: picture size, pixels (even: 4:2:0 chroma).
        fps: frame rate, frames/s; each frame lasts 1/fps s in the media timeline.
        gop_frames: frames between unrequested IDRs (None: `h264.KEYFRAME_INTERVAL_S`).
        crf: x264 constant rate factor (lower: better quality, more bytes).

    Attributes:
        init_segment: ftyp + moov bytes (send first; the same for every stream of this geometry).
        codec: RFC 6381 codec string from the SPS, e.g. "avc1.42C00C".
        mime: MIME type for `MediaSource.addSourceBuffer`, e.g. 'video/mp4; codecs="avc1.42C00C"'.
        parameter_sets: the SPS and PPS NAL units of the avcC (an RTP sender puts them before each IDR).
        timescale: track timescale, units/s.
        frame_duration: one frame period in timescale units.

    Raises:
        ValueError: odd or non-positive size, or fps out of range.
    """

    def __init__(self, *, width: int, height: int, fps: int, gop_frames: int | None = None, crf: int = 23) -> None:
        if not 1 <= fps <= 240:
            raise ValueError(f"fps must lie in 1..240, got {fps}")
        self.width, self.height, self.fps = width, height, fps
        self.timescale = PREFERRED_TIMESCALE if PREFERRED_TIMESCALE % fps == 0 else fps * 1000
        self.frame_duration = self.timescale // fps
        self._buf = io.BytesIO()
        self._container = av.open(self._buf, "w", format="mp4",
                                  options={"movflags": "empty_moov+default_base_moof"})
        st = self._container.add_stream("libx264", rate=fps)
        h264.configure(st.codec_context, width=width, height=height, fps=fps, gop_frames=gop_frames, crf=crf)
        st.time_base = Fraction(1, self.timescale)
        self._stream = st
        self._container.start_encoding()  # opens the codec and writes ftyp + moov (empty_moov)
        self.init_segment = self._buf.getvalue()
        info = parse_init(self.init_segment)
        if info.avcc is None:
            raise RuntimeError("the mp4 muxer wrote no avcC")
        assert info.movie_duration == 0 and not info.has_mehd, "a live init segment must declare no duration"
        assert info.timescale == self.timescale, (info.timescale, self.timescale)
        self.track_id = info.track_id
        self.codec = avc_codec_string(sps_from_avcc(info.avcc))
        self.parameter_sets = parameter_sets_from_avcc(info.avcc)
        self.mime = f'video/mp4; codecs="{self.codec}"'
        self.frames_in = 0
        self._closed = False

    def encode(self, picture: av.VideoFrame, *, keyframe: bool = False) -> list[EncodedSample]:
        """Encode one yuv420p picture of the encoder's size; the first is always an IDR.

        Returns:
            the encoded samples (one per picture: zerolatency has no encoder delay).
        """
        t0 = time.perf_counter()
        picture.pts, picture.time_base = self.frames_in, Fraction(1, self.fps)
        picture.pict_type = av.video.frame.PictureType.I if keyframe else av.video.frame.PictureType.NONE
        packets = self._stream.encode(picture)
        self.frames_in += 1
        ms = (time.perf_counter() - t0) * 1e3
        return [EncodedSample(annexb_to_avcc(bytes(p)), bool(p.is_keyframe), ms) for p in packets]

    def close(self) -> None:
        """Release the codec (idempotent). The init segment stays readable."""
        if self._closed:
            return
        self._closed = True
        try:
            self._stream.codec_context.close()
        except Exception:  # noqa: BLE001 - closing a codec that never encoded can complain
            pass


class Fmp4Fragmenter:
    """Writes media segments for one stream: sequence numbers from 1, gapless decode times.

    Args:
        track_id: the init segment's track.
        frame_duration: one frame period in the track's timescale.
    """

    def __init__(self, *, track_id: int, frame_duration: int) -> None:
        self.track_id, self.frame_duration = track_id, frame_duration
        self.fragments = 0

    @classmethod
    def from_encoder(cls, encoder: Fmp4Encoder) -> Fmp4Fragmenter:
        return cls(track_id=encoder.track_id, frame_duration=encoder.frame_duration)

    def next_decode_time(self) -> int:
        """Decode time of the next fragment, timescale units."""
        return self.fragments * self.frame_duration

    def fragment(self, sample: EncodedSample) -> bytes:
        """The media segment carrying `sample`.

        Raises:
            ValueError: the stream's first fragment is not a keyframe (MSE could not decode it).
        """
        if self.fragments == 0 and not sample.keyframe:
            raise ValueError("a stream's first media segment must start with a keyframe")
        data = media_segment(sequence_number=self.fragments + 1, track_id=self.track_id,
                             base_decode_time=self.next_decode_time(),
                             samples=[Sample(sample.data, self.frame_duration, sample.keyframe)])
        self.fragments += 1
        return data


#: Callback of `Fmp4Sink`: (frame, encoder, sample), on the event loop.
SampleCallback = Callable[[VideoFrame, Fmp4Encoder, EncodedSample], None]


#: `FrameQueue` drop reasons as an fMP4 sink names them.
_DROP_REASONS = {"full": "encoder_queue", "cleared": "stale", "stale": "stale"}


class SessionEncode:
    """One H.264 encode of a session's frames, off the event loop, shared by every `Fmp4Sink` of the session that
    asks for the same picture (fps, scale, stamp): the session's one encoder for encoded video. Made and found
    through `join` (kept in the session's `FramePipeline.shared`), ended when its last sink leaves.

    Frames put by several sinks (each sink is the session's, so each gets every frame) are queued once;
    what happens to each frame is told to every sink: its sample (`on_sample`), or why it was dropped
    (`on_drop`). A sink's `clear` (a flush) drops the queue and makes the next encoded frame an IDR, which every
    sink can start from; a sink that joins late asks for one too.

    Args:
        fps: the model's frame rate.
        is_current: the session's stale-frame decision (`FramePipeline.is_current`).
        scale: integer upscale of the pictures.
        stamp: stamp frame index and action seq into the pictures.
        depth: frames held at most before encoding (the oldest is dropped): 2, or the frames of one chunk if
            more (they arrive together).
        name: for logs and the worker thread's name.
    """

    def __init__(self, *, fps: int, is_current: Callable[[VideoFrame], bool], scale: int = 1, stamp: bool = False,
                 depth: int = 2, name: str = "") -> None:
        if not 1 <= depth <= 64:
            raise ValueError("a frame sink holds 1 to 64 frames (two, or one chunk's)")
        self.fps, self.scale, self.stamp, self.name = fps, scale, stamp, name
        self.queue = FrameQueue(depth, is_current, on_drop=self._queue_dropped)
        self.sinks: list[Fmp4Sink] = []
        self._key: tuple[object, ...] | None = None
        self._shared: dict[object, object] | None = None
        self._last_put: VideoFrame | None = None
        self._keyframe = False
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"fmp4-{name}")
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.encoder: Fmp4Encoder | None = None
        self.frames_encoded = 0
        self.keyframes = 0
        self.encode_ms_max = 0.0
        #: receivers' requests for an IDR (WHEP peers' PLIs), granted at most once per interval for all of them
        self.keyframe_requests = KeyframeRequests()
        self._frames_done = 0  #: frames queued and since handed on or dropped
        self._markers: list[tuple[int, Callable[[], None]]] = []

    @classmethod
    def join(cls, sink: Fmp4Sink, pipeline: FramePipeline, *, fps: int, scale: int, stamp: bool, depth: int,
             name: str) -> SessionEncode:
        """The session's encode for this picture (made on first use), with `sink` subscribed to it."""
        key = ("fmp4", fps, scale, stamp)
        enc = pipeline.shared.get(key)
        if not isinstance(enc, SessionEncode) or enc._closed:
            enc = cls(fps=fps, is_current=pipeline.is_current, scale=scale, stamp=stamp, depth=depth, name=name)
            enc._key, enc._shared = key, pipeline.shared
            pipeline.shared[key] = enc
        elif enc.frames_encoded:
            enc._keyframe = True  # a sink that joins a running encode starts at the next IDR
        enc.sinks.append(sink)
        return enc

    async def leave(self, sink: Fmp4Sink) -> None:
        """`sink` is done; the last one to leave stops the encode and releases the encoder (idempotent). The frames
        still queued or being encoded are told to the leaving sink as dropped ("closed")."""
        if sink not in self.sinks:
            return
        if len(self.sinks) == 1:
            await self.aclose()  # the queue's frames are dropped as "closed" to every sink, this one included
            self.sinks.remove(sink)
            return
        self.sinks.remove(sink)
        pending = min(self.frames_in - self._frames_done, sink.frames_in)
        if pending > 0 and sink.on_drop is not None:
            sink.on_drop("closed", pending)

    # -- what the sinks hand on ------------------------------------------------------------------------

    def put(self, frame: VideoFrame) -> bool:
        """Queue a frame for encoding once, however many sinks hand it on, in PTS order (never blocks; drops the
        oldest queued frame when full).

        Returns:
            False for a frame it has had already and is done with (a sink that joined was handed the session's
            last frame): that sink's to account. A frame it has and is still working on is told to every sink.
        """
        if self._closed:
            return True
        last = self._last_put
        if last is not None and frame.pts <= last.pts:
            return frame is last and self._frames_done < self.frames_in
        self._last_put = frame
        self.queue.put(frame)
        return True

    def clear(self) -> None:
        """Drop queued frames; the next encoded frame is an IDR."""
        self._keyframe = True
        self.queue.clear()

    @property
    def frames_in(self) -> int:
        """Frames queued for encoding (each once)."""
        return self.queue.frames_in

    def when_done(self, callback: Callable[[], None]) -> None:
        """Call `callback` (on the event loop) once every frame queued so far has been handed on or dropped."""
        self._markers.append((self.frames_in, callback))
        self._done(0)

    def _queue_dropped(self, n: int, reason: str) -> None:
        why = "closed" if self._closed else _DROP_REASONS.get(reason, reason)
        self._tell_drop(why, n)
        self._done(n)

    def _tell_drop(self, why: str, n: int) -> None:
        for sink in list(self.sinks):
            if sink.on_drop is not None:
                try:
                    sink.on_drop(why, n)
                except Exception:  # noqa: BLE001 - a counter's bug must not stop the encoder
                    logger.exception("SessionEncode(%s): on_drop failed", self.name)

    def _done(self, n: int) -> None:
        self._frames_done += n
        while self._markers and self._markers[0][0] <= self._frames_done:
            _, cb = self._markers.pop(0)
            try:
                cb()
            except Exception:  # noqa: BLE001 - a callback's bug must not stop the encoder
                logger.exception("SessionEncode(%s): when_done callback failed", self.name)

    # -- control ----------------------------------------------------------------------------------

    def request_keyframe(self) -> None:
        """Make the next encoded frame an IDR (a reader caught up after drops)."""
        self._keyframe = True

    def start(self) -> None:
        """Start the encoding task (on the running loop; idempotent)."""
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"fmp4-encode-{self.name}")
            self._task.add_done_callback(_log_task_failure)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            frame = await self.queue.get()
            assert frame is not None
            keyframe, self._keyframe = self._keyframe, False
            samples = await loop.run_in_executor(self._executor, self._encode, frame, keyframe)
            enc = self.encoder
            assert enc is not None
            if not self.queue.is_current(frame) or self._closed:  # flushed while it was being encoded
                self._keyframe = True  # the decoder never sees this one: restart the references
                self.queue.drop(1)
                continue
            if not samples:
                self.queue.drop(1, "encoder")
                continue
            for s in samples:
                self.frames_encoded += 1
                self.keyframes += s.keyframe
                self.encode_ms_max = max(self.encode_ms_max, s.encode_ms)
                for sink in list(self.sinks):
                    sink.on_sample(frame, enc, s)
            self._done(1)

    def _encode(self, frame: VideoFrame, keyframe: bool) -> list[EncodedSample]:
        """Worker thread: build the picture and encode it (creating the encoder on the first frame)."""
        t0 = time.perf_counter()
        picture = media_picture.yuv420p(media_picture.prepare(frame, scale=self.scale, stamp=self.stamp))
        if self.encoder is None or (self.encoder.width, self.encoder.height) != (picture.width, picture.height):
            if self.encoder is not None:
                self.encoder.close()
            self.encoder = Fmp4Encoder(width=picture.width, height=picture.height, fps=self.fps)
            logger.info("SessionEncode(%s): %dx%d @ %d fps, %s", self.name, picture.width, picture.height, self.fps,
                        self.encoder.codec)
        prep_ms = (time.perf_counter() - t0) * 1e3
        return [EncodedSample(s.data, s.keyframe, s.encode_ms + prep_ms)
                for s in self.encoder.encode(picture, keyframe=keyframe)]

    async def aclose(self) -> None:
        """Stop encoding and release the encoder (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._shared is not None and self._shared.get(self._key) is self:
            del self._shared[self._key]
        self.queue.clear()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        # the encoder is only touched on the worker thread: close it there, after any encode in flight
        await asyncio.wrap_future(self._executor.submit(lambda: self.encoder.close() if self.encoder else None))
        self._executor.shutdown(wait=False)


class Fmp4Sink:
    """One stream's `FrameSink` of a session's encoded video: it hands frames to the session's shared encode
    (`SessionEncode`) and gets back each encoded sample, or why a frame it handed on was dropped.

    Args:
        pipeline: the session's frame pipeline (`Session.frames`; its `shared` holds the encode).
        fps: the model's frame rate.
        on_sample: called on the event loop with (frame, encoder, sample) for every encoded frame that is still
            current.
        on_clear: called on the event loop when the sink is cleared (flush/cancel).
        scale: integer upscale of the pictures.
        stamp: stamp frame index and action seq into the pictures.
        depth: frames the encode holds at most before encoding (see `SessionEncode`).
        name: for logs.
        on_drop: called on the event loop with (reason, frames) for every frame handed on that does not reach
            `on_sample`: "encoder_queue" (pushed out of the full queue: the encoder is behind), "stale" (a flush
            or cut dropped it, queued or while it was encoded), "closed" (queued at the close) or "encoder" (the
            encoder returned nothing for it).
    """

    def __init__(self, pipeline: FramePipeline, *, fps: int, on_sample: SampleCallback,
                 on_clear: Callable[[], None] | None = None, scale: int = 1, stamp: bool = False, depth: int = 2,
                 name: str = "", on_drop: Callable[[str, int], None] | None = None) -> None:
        self.on_sample, self.on_clear, self.on_drop = on_sample, on_clear, on_drop
        self.name = name
        self.frames_in = 0  #: frames handed to this sink while it was open
        self._left = False
        self.encode = SessionEncode.join(self, pipeline, fps=fps, scale=scale, stamp=stamp, depth=depth, name=name)

    # -- FrameSink --------------------------------------------------------------------------------

    def put(self, frame: VideoFrame) -> None:
        """Hand a frame to the session's encode (never blocks; ignored once the sink is closed)."""
        if self._left:
            return
        self.frames_in += 1
        if not self.encode.put(frame) and self.on_drop is not None:
            self.on_drop("stale", 1)  # the encode is past it (this sink joined a running encode)

    def clear(self) -> None:
        """Drop queued frames; the next encoded frame is an IDR."""
        if self.on_clear is not None:
            self.on_clear()
        self.encode.clear()

    # -- control ----------------------------------------------------------------------------------

    def when_done(self, callback: Callable[[], None]) -> None:
        """Call `callback` (on the event loop) once every frame handed on so far has been handed back or dropped."""
        self.encode.when_done(callback)

    def request_keyframe(self) -> None:
        """Make the next encoded frame an IDR (this stream's reader caught up after drops)."""
        self.encode.request_keyframe()

    def start(self) -> None:
        """Start the session's encode if it is not running (on the running loop)."""
        self.encode.start()

    async def aclose(self) -> None:
        """Leave the session's encode (the last sink to leave stops it; idempotent)."""
        self._left = True
        await self.encode.leave(self)


def _log_task_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("%s failed", task.get_name(), exc_info=task.exception())
