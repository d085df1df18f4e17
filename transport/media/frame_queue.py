"""FrameQueue: the bounded, drop-oldest frame buffer every frame sink is built on.

A sink (aiortc track, LiveKit source, fMP4 muxer) must never block the
session that delivers to it and never delay a frame behind stale ones: it
holds at most `depth` frames (two, or one chunk's), drops the oldest when a
new one arrives and it is full, drops everything on `clear` (a flush), and
skips frames that are no longer current when they are taken (`get`), by the
session's own decision (`FramePipeline.is_current`, `sessions/frames.py`:
the one place a frame is judged stale). Counters say what happened to every frame, and why
each dropped one was: `full` (a newer frame pushed it out: the consumer is
behind), `cleared` (a flush) or `stale` (an older epoch when taken, or as the
sink reports it).

Event-loop only (not thread-safe); `put` and `clear` never await.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

from worldcast.sessions.frames import VideoFrame


class FrameQueue:
    """At most `depth` frames, oldest dropped first; `get` waits for the next current one.

    Args:
        depth: frames held at most (>= 1).
        is_current: the session's stale-frame decision (`FramePipeline.is_current`); frames it refuses are
            skipped by `get`.
        on_drop: called with (frames, reason) each time some are dropped; reason is "full", "cleared"
            or "stale".

    Attributes:
        frames_in: frames put.
        frames_dropped: frames dropped without being taken.
        dropped_by: frames dropped, by reason.
    """

    def __init__(self, depth: int, is_current: Callable[[VideoFrame], bool], *,
                 on_drop: Callable[[int, str], None] | None = None) -> None:
        if depth < 1:
            raise ValueError("a frame queue holds at least one frame")
        self._q: collections.deque[VideoFrame] = collections.deque(maxlen=depth)
        self._ready = asyncio.Event()
        self.is_current = is_current
        self._on_drop = on_drop
        self.frames_in = 0
        self.frames_dropped = 0
        self.dropped_by: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._q)

    @property
    def depth(self) -> int:
        return self._q.maxlen or 0

    def _dropped(self, n: int, reason: str) -> None:
        if n:
            self.frames_dropped += n
            self.dropped_by[reason] = self.dropped_by.get(reason, 0) + n
            if self._on_drop is not None:
                self._on_drop(n, reason)

    def put(self, frame: VideoFrame) -> None:
        """Add a frame, dropping the oldest when full (never blocks)."""
        full = len(self._q) == self._q.maxlen
        self._q.append(frame)
        self.frames_in += 1
        if full:
            self._dropped(1, "full")
        self._ready.set()

    def clear(self) -> int:
        """Drop every queued frame; returns how many."""
        n = len(self._q)
        self._q.clear()
        self._ready.clear()
        self._dropped(n, "cleared")
        return n

    def wake(self) -> None:
        """Wake a waiting `get` (e.g. to let it see that its sink stopped)."""
        self._ready.set()

    def drop(self, n: int = 1, reason: str = "stale") -> None:
        """Count frames the sink itself dropped after taking them (e.g. stale once encoded)."""
        self._dropped(n, reason)

    async def get(self, *, alive: Callable[[], bool] = lambda: True,
                  accept: Callable[[VideoFrame], bool] | None = None) -> VideoFrame | None:
        """The next queued frame of the current epoch (and passing `accept`), waiting for one.

        Returns:
            the frame, or None once `alive()` is false (checked on every wake-up).
        """
        while True:
            if not alive():
                return None
            while not self._q:
                self._ready.clear()
                await self._ready.wait()
                if not alive():
                    return None
            f = self._q.popleft()
            if self.is_current(f) and (accept is None or accept(f)):
                return f
            self._dropped(1, "stale")


class QueuedSink:
    """The `Session` sink interface over a `FrameQueue` held as `self.queue`, for the sinks that own one
    (the WebRTC track, the LiveKit source, the fMP4 sink). A sink may override `put` or `clear`."""

    queue: FrameQueue

    def put(self, frame: VideoFrame) -> None:
        """Queue a frame (never blocks; drops the oldest when full)."""
        self.queue.put(frame)

    def clear(self) -> None:
        """Drop every queued frame."""
        self.queue.clear()

    @property
    def frames_in(self) -> int:
        """Frames handed to the sink."""
        return self.queue.frames_in

    @property
    def frames_dropped(self) -> int:
        """Frames dropped before they went out (full, cleared, stale epoch, or as the sink counts them)."""
        return self.queue.frames_dropped
