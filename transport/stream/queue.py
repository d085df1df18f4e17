"""OutboundQueue: what a WebSocket stream still has to send, bounded, with media dropped for slow readers.

A stream's messages leave in one FIFO order: control messages (JSON events,
RPC replies, the init segment) and media items (an encoded frame, rendered
into its event and its media segment only when it is sent, so media dropped
never uses up the stream's sequence numbers or timeline).

Slow readers: a WebSocket send waits while the connection's write buffer is
full (uvicorn pauses writing at asyncio's high-water mark), so a reader that
stops reading makes media pile up here. When more than `max_media` items or
`max_media_bytes` bytes of media wait, every queued media item is dropped and
so is all further media up to the next keyframe (P-frames without their
references would not decode); once the queue has drained (the reader caught
up) `on_need_keyframe` asks the encoder for a fresh IDR. Control messages are
never dropped; more than `max_control` of them waiting means the reader is
gone for good (`QueueOverflow`). Memory per stream is therefore bounded by
max_media_bytes + the control messages + one message in flight + the socket
buffers below us.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from worldcast.transport.errors import QueueOverflow

#: Media items that may wait before a reader counts as slow (0.4 s of video at 20 fps).
MAX_MEDIA_ITEMS = 8
#: Bytes of media that may wait before a reader counts as slow.
MAX_MEDIA_BYTES = 1 << 20
#: Control messages that may wait before the stream gives up on the reader.
MAX_CONTROL_ITEMS = 512


class Close:
    """The sentinel `get` returns after `close`: everything queued before it has been handed out."""


CLOSE = Close()


@dataclass
class Render:
    """A control message rendered when it is sent (it may depend on what was sent before it).

    Attributes:
        fn: returns the messages to send.
    """

    fn: Callable[[], list[str | bytes]]


@dataclass
class MediaItem:
    """An encoded frame waiting to be sent.

    Attributes:
        sample: the encoded frame (`fmp4.EncodedSample`).
        keyframe: whether it starts a decodable run.
        nbytes: payload size, bytes.
        meta: what the protocol needs to render it (frame, encoder, segment, ...).
        queued_s: when it was queued, s (monotonic).
    """

    sample: Any
    keyframe: bool
    nbytes: int
    meta: dict[str, Any] = field(default_factory=dict)
    queued_s: float = field(default_factory=time.monotonic)


#: What `OutboundQueue.get` hands out.
Item = str | bytes | Render | MediaItem | Close


@dataclass
class QueueStats:
    """Counters of one stream's queue (bytes, items)."""

    media_queued: int = 0  #: media items accepted
    media_dropped: int = 0  #: media items dropped (slow reader, flush, waiting for a keyframe)
    #: media items dropped by reason: "slow_reader" (the backlog overflowed, and what followed until a
    #: keyframe) or "stale" (a flush or cut, and what followed until a keyframe)
    media_dropped_by: dict[str, int] = field(default_factory=dict)
    slow_reader_drops: int = 0  #: times the media backlog overflowed
    keyframes_requested: int = 0  #: IDRs asked for after a drain
    max_media_bytes: int = 0  #: peak bytes of media waiting
    max_items: int = 0  #: peak items waiting (control and media)


class OutboundQueue:
    """One stream's outgoing messages.

    Args:
        on_need_keyframe: called (on the event loop) when media resumes after drops.
        max_media, max_media_bytes, max_control: the bounds described in the module docstring.
        on_drop: called with (reason, items) whenever media items are dropped (see `QueueStats`).
    """

    def __init__(self, *, on_need_keyframe: Callable[[], None], max_media: int = MAX_MEDIA_ITEMS,
                 max_media_bytes: int = MAX_MEDIA_BYTES, max_control: int = MAX_CONTROL_ITEMS,
                 on_drop: Callable[[str, int], None] | None = None) -> None:
        self._items: collections.deque[Item] = collections.deque()
        self._ready = asyncio.Event()
        self._on_need_keyframe = on_need_keyframe
        self.max_media, self.max_media_bytes, self.max_control = max_media, max_media_bytes, max_control
        self.media_items = 0
        self.media_bytes = 0
        self.control_items = 0
        #: drop media until a keyframe: at the start, after a flush and after a slow-reader overflow
        self.waiting_for_keyframe = True
        self._keyframe_pending = False  #: a keyframe was asked for and has not arrived yet
        self._dropped_since_key = False
        self._sender_idle = False  #: the sender waits in `get` with nothing to send: the reader keeps up
        self._gap_reason = "stale"  #: why media is being dropped until the next keyframe
        self._on_drop = on_drop
        self.stats = QueueStats()

    def __len__(self) -> int:
        return len(self._items)

    def put_control(self, message: str | bytes | Render) -> None:
        """Queue a control message (never dropped).

        Raises:
            QueueOverflow: more than `max_control` control messages are waiting.
        """
        if self.control_items >= self.max_control:
            raise QueueOverflow(f"{self.control_items} control messages unsent: the reader is not reading")
        self._items.append(message)
        self.control_items += 1
        self._touch()

    def close(self) -> None:
        """Queue the end of the stream: `get` hands out what is queued before it, then `CLOSE`."""
        self._items.append(CLOSE)
        self._touch()

    def put_media(self, item: MediaItem) -> bool:
        """Queue an encoded frame unless media is being dropped; returns whether it was queued."""
        if self.waiting_for_keyframe and not item.keyframe:
            self._drop_one()
            return False
        if self.media_items + 1 > self.max_media or self.media_bytes + item.nbytes > self.max_media_bytes:
            self.stats.slow_reader_drops += 1
            self.purge_media("slow_reader")
            self._drop_one()
            return False
        self.waiting_for_keyframe = self._keyframe_pending = False
        self._items.append(item)
        self.media_items += 1
        self.media_bytes += item.nbytes
        self.stats.media_queued += 1
        self.stats.max_media_bytes = max(self.stats.max_media_bytes, self.media_bytes)
        self._touch()
        return True

    def purge_media(self, reason: str = "stale") -> int:
        """Drop every queued media item (a flush: "stale", or a slow reader: "slow_reader"); media resumes
        at a keyframe.

        Returns:
            items dropped.
        """
        kept: collections.deque[Item] = collections.deque(
            x for x in self._items if not isinstance(x, MediaItem))
        dropped = len(self._items) - len(kept)
        self._items = kept
        self._gap_reason = reason
        self._count_dropped(dropped)
        self.media_items = self.media_bytes = 0
        self.waiting_for_keyframe = True
        self._dropped_since_key = self._dropped_since_key or dropped > 0
        return dropped

    def _count_dropped(self, n: int) -> None:
        if n:
            self.stats.media_dropped += n
            by = self.stats.media_dropped_by
            by[self._gap_reason] = by.get(self._gap_reason, 0) + n
            if self._on_drop is not None:
                self._on_drop(self._gap_reason, n)

    def _drop_one(self) -> None:
        self._count_dropped(1)
        self._dropped_since_key = True
        self._maybe_request_keyframe()

    def _maybe_request_keyframe(self) -> None:
        """Ask for an IDR once the sender has sent everything (the reader caught up), once per gap."""
        if (self.waiting_for_keyframe and not self._keyframe_pending and self._dropped_since_key
                and self._sender_idle and not self._items):
            self._keyframe_pending = True
            self._dropped_since_key = False
            self.stats.keyframes_requested += 1
            self._on_need_keyframe()

    def _touch(self) -> None:
        self.stats.max_items = max(self.stats.max_items, len(self._items))
        self._ready.set()

    async def get(self) -> Item:
        """The next message to send (waits for one)."""
        while not self._items:
            self._sender_idle = True
            try:
                self._maybe_request_keyframe()
                self._ready.clear()
                await self._ready.wait()
            finally:
                self._sender_idle = False
        item = self._items.popleft()
        if isinstance(item, MediaItem):
            self.media_items -= 1
            self.media_bytes -= item.nbytes
        elif not isinstance(item, Close):
            self.control_items -= 1
        return item


@dataclass
class FrameAccount:
    """What became of every frame handed to a stream: sent, or dropped, and where.

    Frames reach a stream's sink, its encoder and its outbound queue; every one that is not sent is
    counted under the reason the stage that dropped it names ("encoder_queue", "stale", "closed",
    "encoder" from the sink; "slow_reader", "stale" from the queue; "unrouted": rendered to nothing).

    Attributes:
        handed_by_segment: frames handed to the stream, per directing segment index.
        sent: frames whose media went out.
        sent_by_segment: of those, per directing segment index.
        dropped: frames dropped, by reason.
        on_count: called with (outcome, frames) for each count: "sent", or "dropped_<reason>" (metrics).
    """

    handed_by_segment: dict[int, int] = field(default_factory=dict)
    sent: int = 0
    sent_by_segment: dict[int, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    on_count: Callable[[str, int], None] | None = None

    def count_handed(self, segment: int | None) -> None:
        if segment is not None:
            self.handed_by_segment[segment] = self.handed_by_segment.get(segment, 0) + 1

    def segment(self, index: int) -> tuple[int, int]:
        """(frames sent, frames dropped) of directing segment `index` on this stream."""
        sent = self.sent_by_segment.get(index, 0)
        return sent, max(0, self.handed_by_segment.get(index, 0) - sent)

    def count_sent(self, segment: int | None) -> None:
        self.sent += 1
        if segment is not None:
            self.sent_by_segment[segment] = self.sent_by_segment.get(segment, 0) + 1
        if self.on_count is not None:
            self.on_count("sent", 1)

    def count_dropped(self, reason: str, n: int = 1) -> None:
        if n:
            self.dropped[reason] = self.dropped.get(reason, 0) + n
            if self.on_count is not None:
                self.on_count(f"dropped_{reason}", n)

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())
