"""Takes: "take it again from segment N" for a directing session.

A directing session keeps the world's state (its engine capture,
`engine/session_state.py`) at every segment boundary where the world stood
still: the session's start (before its first direction, where segment 0
begins) and the end of each segment that *finished* (reached its length: the
session paused, nothing in flight). A cut segment's end is no boundary: the
next direction took over within a chunk. A direction may then name
`from_segment` N: the world is put back where segment N began (`rewind`), the
segments from N on are abandoned, and the direction's segment starts from
there, as a new segment (its index the next one, `Segment.retake_of` N). With
the same direction, a retake makes the frames segment N made (a test).

A boundary counts only once confirmed: segment N's first delivered frame must
be the frame the captured state makes next (its index equals the capture's
`next_frame`), so a capture that landed after segment N began (a direction
sent before the pause took effect) is never used.

Captures are kept in memory, newest first, within `max_bytes` a session
(`--retake-mib`); a boundary that does not fit is not kept, and taking it
again is refused with the reason. A recorded session's log gets a `retake`
event and the boundary's state beside it, so `worldcast replay` takes it
again too (`sessions/replay.py`).

Events: none of its own; the directing session's `segment_complete` and
`segment_start` drive it. Event loop only.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from worldcast.models.spec import Conditioning
from worldcast.sessions.directing import DirectingSession, DirectionAck, Segment, SegmentEnd
from worldcast.sessions.errors import DirectingRefusal
from worldcast.sessions.session import SessionState

logger = logging.getLogger(__name__)

#: Every directing session's takes (found by `takes_of`).
_TAKES: weakref.WeakKeyDictionary[DirectingSession, Takes] = weakref.WeakKeyDictionary()


def takes_of(director: DirectingSession) -> Takes | None:
    """The takes kept for `director` (None: retakes are off, or its server keeps none)."""
    return _TAKES.get(director)


@dataclass
class Boundary:
    """The world where a segment began.

    Attributes:
        segment: the index of the segment that began (or will begin) from it.
        next_frame: the index of the frame the state makes next.
        state: the captured state (`session_state.capture`).
    """

    segment: int
    next_frame: int
    state: bytes


class Takes:
    """Boundary captures of one directing session, and taking a segment again (see the module docstring).

    Args:
        director: the directing session.
        capture: captures the session's whole state at its next chunk boundary (it generates on).
        rewind: puts the session's world back to a captured state (the session keeps its id, streams, clock).
        next_frame: the index of the frame a captured state makes next.
        max_bytes: captured state kept at most, bytes.
        on_retake: told of each retake applied: (segment taken again, the state restored, the new segment's
            flush epoch); a recording keeps them.
    """

    def __init__(self, director: DirectingSession, *, capture: Callable[[], Awaitable[bytes]],
                 rewind: Callable[[bytes], Awaitable[None]], next_frame: Callable[[bytes], int],
                 max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError("Takes need a positive max_bytes")
        self.director = director
        self._capture, self._rewind, self._next_frame = capture, rewind, next_frame
        self.max_bytes = max_bytes
        self.boundaries: dict[int, Boundary] = {}  #: by the segment that began from it
        self.not_kept: dict[int, str] = {}  #: boundaries not kept, by segment: why
        self.on_retake: Callable[[int, bytes, int], None] | None = None
        self._lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        director.on("segment_complete", self._on_complete)
        director.session.on("state", self._on_state)
        _TAKES[director] = self

    def __repr__(self) -> str:
        return f"Takes({self.director.session.id}, {len(self.boundaries)} boundaries)"

    # -- keeping boundaries ----------------------------------------------------------------------------

    def keep_start(self) -> None:
        """Keep the session's start (segment 0 begins there): call once it is placed on its engine.

        The engine makes the session's initial frames (a directing session drops them: no segment is open) at
        once, paused or not, so the start is captured now (before them, or after: whichever the engine reaches
        first) and again once the first of them is dropped, if no direction came first; the capture whose
        next frame is segment 0's first is the one used (`check`).
        """
        d = self.director
        self._keep(0)
        if d.frames_dropped == 0 and d.segment_count == 0:
            def after_initial_frames(frame: object) -> None:
                d.on_gated.remove(after_initial_frames)
                if d.segment_count == 0:
                    self._keep(0)
            d.on_gated.append(after_initial_frames)

    def _on_state(self, session: object, state: object) -> None:
        if state == SessionState.CLOSED:  # its captures go with it
            for t in list(self._tasks):
                t.cancel()
            self.boundaries.clear()

    def _on_complete(self, seg: Segment) -> None:
        if seg.end is SegmentEnd.FINISHED:  # paused at its end: nothing in flight until the next direction
            self._keep(self.director.segment_count)

    def _keep(self, segment: int) -> None:
        task = asyncio.get_running_loop().create_task(self._capture_boundary(segment),
                                                      name=f"takes-{self.director.session.id}-{segment}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _capture_boundary(self, segment: int) -> None:
        try:
            state = await self._capture()
        except Exception as e:  # noqa: BLE001 - a boundary not kept is a refusal later, never a failure now
            self.not_kept[segment] = f"its start could not be captured ({e})"
            logger.info("%r: segment %d's start not kept: %s", self, segment, e)
            return
        b = Boundary(segment, self._next_frame(state), state)
        kept = self.boundaries.get(segment)
        if kept is not None and self._confirmed(kept) and not self._confirmed(b):
            return  # (a second capture of the start that came too late: the first is the segment's)
        if not self._confirmed(b, allow_pending=True):
            self.not_kept[segment] = "a direction arrived before the world stood still at its start"
            return
        self.boundaries[segment] = b
        self.not_kept.pop(segment, None)
        self._trim()

    def _trim(self) -> None:
        """Drop the oldest boundaries until the rest fit `max_bytes`."""
        for seg in sorted(self.boundaries):
            if sum(len(b.state) for b in self.boundaries.values()) <= self.max_bytes:
                break
            b = self.boundaries.pop(seg)
            self.not_kept[seg] = (f"its start was dropped to keep newer ones within {self.max_bytes} bytes "
                                  f"(--retake-mib; it takes {len(b.state)})")

    def _segment(self, index: int) -> Segment | None:
        return next((s for s in self.director.segments if s.index == index), None)

    def _confirmed(self, b: Boundary, *, allow_pending: bool = False) -> bool:
        """Whether segment `b.segment` began from `b`: its first delivered frame is the one `b` makes next (a
        segment not begun yet, or with no frame yet, is pending: allowed where asked)."""
        seg = self._segment(b.segment)
        if seg is None or seg.first_frame_index is None:
            return allow_pending and b.segment >= self.director.segment_count - 1
        return seg.first_frame_index == b.next_frame

    # -- taking a segment again ----------------------------------------------------------------------------

    def check(self, segment: int) -> Boundary:
        """The boundary segment `segment` began from, if it may be taken again.

        Raises:
            DirectingRefusal: no such segment, it has not begun, or its start was not kept (the reason).
        """
        if not 0 <= segment < self.director.segment_count:
            raise DirectingRefusal(f"from_segment {segment}: no such segment (this session has had "
                                   f"{self.director.segment_count})")
        b = self.boundaries.get(segment)
        if b is None:
            why = self.not_kept.get(segment)
            if why is None:
                prev = self._segment(segment - 1)
                why = ("it began with a cut (the direction came during the segment before): only a finished "
                       "segment's end is kept" if prev is not None and prev.end is SegmentEnd.CUT
                       else "its start was not kept")
            raise DirectingRefusal(f"segment {segment} cannot be taken again: {why}")
        if not self._confirmed(b):
            self.boundaries.pop(segment, None)
            self.not_kept[segment] = "it did not begin where its start was captured"
            raise DirectingRefusal(f"segment {segment} cannot be taken again: it did not begin where its start "
                                   "was captured")
        return b

    async def retake(self, segment: int, direction_id: str, prompt: str, context: Conditioning, *,
                     duration_s: float | None = None, open_ended: bool = False) -> DirectionAck:
        """Put the world back where segment `segment` began and start this direction's segment from there.

        Args:
            segment: the segment to take again.
            direction_id, prompt, context, duration_s, open_ended: the direction (`DirectingSession.direct`).

        Returns:
            the direction's ack (its segment's `retake_of` is `segment`; `cut` is the segment it cut, if one
            was open).

        Raises:
            DirectingRefusal: the segment cannot be taken again (nothing changes).
            SessionClosedError: the session is closed.
            Exception: whatever `rewind` raises once the world was removed (the session is then closed).
        """
        async with self._lock:
            b = self.check(segment)
            d = self.director
            cut = d.halt()  # nothing generates while the world is put back
            await self._rewind(b.state)
            ack = d.direct(direction_id, prompt, context, duration_s=duration_s, open_ended=open_ended,
                           retake_of=segment)
            for seg in list(self.boundaries):  # the abandoned take's boundaries
                if seg > segment:
                    del self.boundaries[seg]
                    self.not_kept[seg] = f"it was abandoned when segment {segment} was taken again"
            logger.info("%r: segment %d taken again as segment %d", self, segment, ack.segment.index)
            if self.on_retake is not None:
                self.on_retake(segment, b.state, ack.segment.epoch)
            return DirectionAck(ack.direction_id, ack.segment, cut)

    async def aclose(self) -> None:
        """Cancel captures in flight, then await them (idempotent)."""
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.boundaries.clear()
