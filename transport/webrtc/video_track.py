"""SessionVideoTrack: a session's frames as an aiortc video track (a `FrameSink`).

It holds at most `depth` frames (a `FrameQueue`: the oldest is dropped, never
delayed), hands them to aiortc's encoder with the session's 90 kHz PTS
(RFC 3551 video clock), optionally scaled up and stamped, and tells a flush
when aiortc's sender no longer holds a frame of an older epoch (`settle`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import av
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from worldcast.sessions.frames import VideoFrame
from worldcast.transport.media import picture
from worldcast.transport.media.frame_queue import FrameQueue, QueuedSink

logger = logging.getLogger(__name__)

#: Longest a flush or cancel reply waits for aiortc's sender to finish sending a frame it holds, s
#: (one VP8 encode plus its packets take milliseconds; this bounds a sender that never comes back).
SETTLE_TIMEOUT_S = 1.0


class SessionVideoTrack(QueuedSink, MediaStreamTrack):
    """A video track fed by a session: a frame sink of depth `depth` (1 or 2).

    aiortc's sender calls `recv`, encodes the frame it gets (in a thread), sends
    all of that frame's RTP packets, and only then calls `recv` again: between
    the two the frame is in the sender's hands. `settle(epoch)` waits until no
    frame older than `epoch` is there, so a flush reply sent after it is
    followed by no older-epoch video (bar RTP retransmissions of packets sent
    before it, on loss).

    Args:
        is_current: the session's stale-frame decision (`FramePipeline.is_current`); frames it refuses are
            dropped at `recv`.
        scale: integer upscale factor applied before encoding (1 = model resolution).
        depth: frames held at most.
        stamp: stamp each frame's index and applied action seq into its bottom rows, after
            upscaling (`transport/media/stamp.py`; for latency measurement).
    """

    kind = "video"

    def __init__(self, is_current: Callable[[VideoFrame], bool], *, scale: int = 1, depth: int = 2,
                 stamp: bool = False) -> None:
        super().__init__()
        self.stamp = stamp
        self.queue = FrameQueue(depth, is_current)
        self.scale = scale
        self.frames_out = 0
        self.last_pts = -1
        self._out_epoch: int | None = None  #: epoch of the frame the sender holds (None: none)
        self._sender_back = asyncio.Event()
        self._sender_back.set()

    def stop(self) -> None:
        super().stop()
        self.queue.wake()  # a pending recv ends with MediaStreamError
        self._sender_back.set()

    async def settle(self, epoch: int, timeout_s: float = SETTLE_TIMEOUT_S) -> bool:
        """Wait until the sender holds no frame older than `epoch` (the frame it holds is then sent).

        Returns:
            False if the sender did not come back within `timeout_s`, s.
        """
        if self._out_epoch is None or self._out_epoch >= epoch or self.readyState != "live":
            return True
        try:
            await asyncio.wait_for(self._sender_back.wait(), timeout_s)
        except TimeoutError:
            logger.warning("SessionVideoTrack: sender held an epoch-%s frame for over %.1f s", self._out_epoch,
                           timeout_s)
            return False
        return True

    async def recv(self) -> av.VideoFrame:
        self._out_epoch = None  # the sender is back: the previous frame's packets are all sent
        self._sender_back.set()
        f = await self.queue.get(alive=lambda: self.readyState == "live", accept=lambda f: f.pts > self.last_pts)
        if f is None:
            raise MediaStreamError
        out = picture.yuv420p(picture.prepare(f, scale=self.scale, stamp=self.stamp))
        out.pts, out.time_base = f.pts, f.time_base
        self.last_pts = f.pts
        self.frames_out += 1
        self._out_epoch = f.epoch  # no await from the epoch check to here: a flush cannot slip between
        self._sender_back.clear()
        return out
