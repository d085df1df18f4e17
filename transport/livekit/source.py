"""LiveKitVideoSink: a session's frame sink that feeds a LiveKit video source.

The sink holds at most `depth` frames (the oldest is dropped, never
delayed) and a pump task hands each one to the SDK as soon as it arrives:
no pacing of our own. `rtc.VideoSource.capture_frame` has no queue (it
copies into the native library, which encodes and sends); the SDK's
`AVSynchronizer` would buffer up to 100 ms and is not used.

Capture timestamps come from the PTS: `timestamp_us = base_us + pts_us`,
with `base_us` the monotonic time (µs, CLOCK_MONOTONIC, the clock
libwebrtc's `rtc::TimeMicros` reads) of PTS 0, taken from the first
frame's presentation time. Two reasons not to pass `pts_us` alone: the SDK
turns a zero timestamp into "now" (the first frame's PTS is 0), and
libwebrtc drops a frame whose capture time is not after the previous one's
(`VideoStreamEncoder::OnFrame`), so PTS 0 followed by small PTS would drop
every frame until the PTS caught up with the clock.

Publishers:
- `RawPublisher`: RGB24 frames to `rtc.VideoSource`; libwebrtc encodes (VP8).
- `EncodedPublisher`: one H.264 encode with PyAV (`transport/media/h264.py`: libx264 ultrafast, zerolatency,
  SPS/PPS repeated on every keyframe) to `rtc.EncodedVideoSource`, keyframes
  on the SDK's request (`take_feedback`). The encode runs on a worker thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable
from fractions import Fraction
from typing import Protocol

import av
import numpy as np
from livekit import rtc

from worldcast.sessions.clock import VIDEO_CLOCK_RATE
from worldcast.sessions.frames import VideoFrame
from worldcast.transport.livekit.config import SourceKind
from worldcast.transport.media import h264, picture
from worldcast.transport.media.frame_queue import FrameQueue, QueuedSink

logger = logging.getLogger(__name__)

#: Per-frame metadata carried to subscribers in LiveKit's packet trailer: the frame index and the PTS in
#: µs (subscribers' render timestamps are 0 when the room asks for no playout delay).
METADATA_FEATURES = [rtc.FrameMetadataFeature.FMF_FRAME_ID, rtc.FrameMetadataFeature.FMF_USER_TIMESTAMP]


def frame_metadata(frame: VideoFrame) -> rtc.FrameMetadata:
    """The frame's index (mod 2**32) and PTS in µs as LiveKit frame metadata."""
    return rtc.FrameMetadata(frame_id=frame.frame_index & 0xFFFFFFFF,
                             user_timestamp=frame.pts * 1_000_000 // VIDEO_CLOCK_RATE)


class Publisher(Protocol):
    """Hands one picture to LiveKit."""

    source: rtc.VideoSource | rtc.EncodedVideoSource

    def publish_options(self, *, max_bitrate_bps: int, fps: float) -> rtc.TrackPublishOptions: ...

    async def publish(self, image: np.ndarray, timestamp_us: int, frame: VideoFrame,
                      current: Callable[[], bool]) -> bool:
        """Publish one picture unless `current()` turns false before it reaches the SDK; True if published."""
        ...

    async def aclose(self) -> None: ...


class RawPublisher:
    """Raw RGB24 pictures to `rtc.VideoSource` (the SDK encodes, VP8)."""

    def __init__(self, width: int, height: int) -> None:
        self.source = rtc.VideoSource(width, height)

    def publish_options(self, *, max_bitrate_bps: int, fps: float) -> rtc.TrackPublishOptions:
        return rtc.TrackPublishOptions(
            source=rtc.TrackSource.SOURCE_CAMERA, simulcast=False, video_codec=rtc.VideoCodec.VP8,
            video_encoding=rtc.VideoEncoding(max_bitrate=max_bitrate_bps, max_framerate=fps),
            # libwebrtc's CPU-overuse adaptation would scale our small pictures down (to a quarter and below)
            # whenever the model keeps the cores busy, which is always: keep the resolution and frame rate
            degradation_preference=rtc.DegradationPreference.MAINTAIN_FRAMERATE_AND_RESOLUTION,
            frame_metadata_features=METADATA_FEATURES)

    async def publish(self, image: np.ndarray, timestamp_us: int, frame: VideoFrame,
                      current: Callable[[], bool]) -> bool:
        if not current():
            return False
        h, w = image.shape[:2]
        self.source.capture_frame(rtc.VideoFrame(w, h, rtc.VideoBufferType.RGB24, image.tobytes()),
                                  timestamp_us=timestamp_us,
                                  metadata=frame_metadata(frame))
        return True

    async def aclose(self) -> None:
        await self.source.aclose()


class EncodedPublisher:
    """One H.264 encode (PyAV libx264) to `rtc.EncodedVideoSource` (pre-encoded backend)."""

    def __init__(self, width: int, height: int, *, max_bitrate_bps: int, fps: float) -> None:
        self.source = rtc.EncodedVideoSource(width, height)
        self.width, self.height = width, height
        ctx = av.CodecContext.create("libx264", "w")
        # the one realtime H.264 configuration; SPS/PPS before every keyframe: a late subscriber can start at any
        h264.configure(ctx, width=width, height=height, fps=fps, bitrate_bps=max_bitrate_bps, repeat_headers=True)
        ctx.time_base = Fraction(1, VIDEO_CLOCK_RATE)
        self.ctx = ctx
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="livekit-h264")
        self.frames_encoded = 0
        self._need_key = True  #: the next frame must be a keyframe (first frame, or one was discarded)

    def publish_options(self, *, max_bitrate_bps: int, fps: float) -> rtc.TrackPublishOptions:
        return rtc.TrackPublishOptions(
            source=rtc.TrackSource.SOURCE_CAMERA, simulcast=False, video_codec=rtc.VideoCodec.H264,
            video_encoder=rtc.VideoEncoderBackend.ENCODER_BACKEND_PRE_ENCODED,
            video_encoding=rtc.VideoEncoding(max_bitrate=max_bitrate_bps, max_framerate=fps),
            frame_metadata_features=METADATA_FEATURES)

    def _encode(self, image: np.ndarray, pts: int, keyframe: bool) -> list[tuple[bytes, bool]]:
        vf = picture.yuv420p(image)
        vf.pts = pts
        if keyframe:
            vf.pict_type = av.video.frame.PictureType.I
        return [(bytes(p), bool(p.is_keyframe)) for p in self.ctx.encode(vf)]

    async def publish(self, image: np.ndarray, timestamp_us: int, frame: VideoFrame,
                      current: Callable[[], bool]) -> bool:
        keyframe = self.source.take_feedback().keyframe_requested or self._need_key
        loop = asyncio.get_running_loop()
        packets = await loop.run_in_executor(self._thread, self._encode, image, frame.pts, keyframe)
        self.frames_encoded += 1
        if not current():  # flushed while encoding: drop it; later deltas would reference it, so restart
            self._need_key = True
            return False
        self._need_key = False
        for data, key in packets:
            self.source.capture_frame(rtc.EncodedVideoFrame(
                data=data, width=self.width, height=self.height, codec=rtc.VideoCodec.H264,
                frame_type=rtc.EncodedFrameType.ENCODED_FRAME_KEY if key else rtc.EncodedFrameType.ENCODED_FRAME_DELTA,
                timestamp_us=timestamp_us, metadata=frame_metadata(frame)))
        return True

    async def aclose(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
        await self.source.aclose()


def make_publisher(kind: SourceKind, width: int, height: int, *, max_bitrate_bps: int, fps: float) -> Publisher:
    """The publisher for `kind` at width x height pixels."""
    if kind == SourceKind.ENCODED:
        return EncodedPublisher(width, height, max_bitrate_bps=max_bitrate_bps, fps=fps)
    return RawPublisher(width, height)


class LiveKitVideoSink(QueuedSink):
    """A `FrameSink` feeding a LiveKit publisher: holds at most `depth` frames, drops the oldest.

    Args:
        publisher: where pictures go.
        is_current: the session's stale-frame decision (`FramePipeline.is_current`); frames it refuses are
            dropped.
        scale: integer upscale before publishing.
        stamp: stamp frame index and applied action seq into the picture (`transport/media/stamp.py`).
        on_published: called with each frame after the SDK took it (for per-frame metadata).
        depth: frames held at most (1 or 2).
    """

    def __init__(self, publisher: Publisher, is_current: Callable[[VideoFrame], bool], *, scale: int = 1,
                 stamp: bool = False,
                 on_published: Callable[[VideoFrame], None] | None = None, depth: int = 2) -> None:
        if depth not in (1, 2):
            raise ValueError("depth must be 1 or 2")
        self.publisher = publisher
        self.scale, self.stamp = scale, stamp
        self._on_published = on_published
        self.queue = FrameQueue(depth, is_current)
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._base_us: int | None = None
        self._last_ts_us = -1
        self.frames_out = 0
        self.publish_ms_total = 0.0  #: time spent preparing and handing pictures to the SDK, ms

    def start(self) -> None:
        """Start the pump task (on the running loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._pump(), name="livekit-video-sink")
            self._task.add_done_callback(_log_done)

    def timestamp_us(self, frame: VideoFrame) -> int:
        """The capture timestamp of `frame`, µs on the monotonic clock, strictly increasing."""
        pts_us = frame.pts * 1_000_000 // VIDEO_CLOCK_RATE
        if self._base_us is None:
            self._base_us = round(frame.present_at_s * 1e6) - pts_us
        ts = max(self._base_us + pts_us, self._last_ts_us + 1)
        self._last_ts_us = ts
        return ts

    async def _pump(self) -> None:
        while True:
            f = await self.queue.get()
            assert f is not None

            def current(f: VideoFrame = f) -> bool:
                return self.queue.is_current(f)

            t0 = time.perf_counter()
            try:
                ok = await self.publisher.publish(picture.prepare(f, scale=self.scale, stamp=self.stamp),
                                                  self.timestamp_us(f), f, current)
            except Exception:  # noqa: BLE001 - one bad frame must not end the stream
                logger.exception("LiveKitVideoSink: publishing frame %d failed", f.frame_index)
                continue
            self.publish_ms_total += (time.perf_counter() - t0) * 1e3
            if not ok or not current():  # flushed meanwhile: no metadata for a stale frame
                self.queue.drop(int(not ok))
                continue
            self.frames_out += 1
            if self._on_published is not None:
                self._on_published(f)

    async def aclose(self) -> None:
        """Stop the pump and release the source (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.clear()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.publisher.aclose()


def _log_done(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("%s ended: %r", task.get_name(), task.exception())
