"""DirectingSession: "vibe directing" as a layer above a `Session` (which never imports it).

A directing client sends text directions; each direction starts a *segment*:
the frames generated under that direction, for `duration_s` seconds of video
(rounded up to whole frames) or until the next direction, whichever comes
first. Segments continue the scene: the session's committed state (its KV
cache) is never reset, so segment k+1 picks up where segment k's last
committed chunk left off.

A new direction during a segment *cuts* it at the engine's next step
boundary: `direct` sets the prompt and flushes (`Session.set_prompt` +
`Session.flush`: every queued and in-flight frame of the old direction is
dropped, the chunk in flight restarts under the new prompt), so no frame
generated under the old direction is delivered after `direct` returns.
When a segment reaches its length, the session pauses (at the next step
boundary) until the next direction.

Segment k is generated under flush epochs >= its start epoch e_k (a flush
RPC inside the segment only raises the epoch), so a frame's epoch names its
segment. The directing session is the session's `FrameGate`: the session's
sinks (attached to the session, as for any session) get only frames of the
open segment. This module owns the directing rules transports apply:
segments, cuts at a step boundary, durations, `halt` (end now), pause and
resume (`pause`, `resume`), and which control RPCs a directed session refuses
(`check_control`); `sessions/projects.py` holds the project rules above it
(seeds, rollouts, caps, the rule-based rewrite). `director_of(session)` finds
a session's directing layer.

Events (`on`; callbacks synchronous, payload a `Segment`):
    "segment_start"     a direction opened a segment
    "segment_complete"  a segment ended (`Segment.end`: finished, cut or stopped)
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from worldcast.models.spec import Conditioning
from worldcast.sessions.errors import DirectingRefusal, SessionClosedError
from worldcast.sessions.frames import VideoFrame
from worldcast.sessions.session import Session, SessionState

logger = logging.getLogger(__name__)

#: Segment length when a direction names none, s (Dreamverse's segments are 5 s too).
DEFAULT_SEGMENT_S = 5.0
#: Segments remembered for `segment_for_epoch` (older frames are never delivered anyway).
SEGMENTS_KEPT = 16

DirectingEvent = Literal["segment_start", "segment_complete"]

#: Every session's directing layer (a session does not know its own).
_DIRECTORS: weakref.WeakKeyDictionary[Session, DirectingSession] = weakref.WeakKeyDictionary()


def director_of(session: Session) -> DirectingSession | None:
    """The directing layer over `session` (None: an interactive session)."""
    return _DIRECTORS.get(session)


class SegmentEnd(enum.Enum):
    """How a segment ended."""

    FINISHED = "finished"  #: it reached its length
    CUT = "cut"  #: a new direction arrived first
    STOPPED = "stopped"  #: the session closed


@dataclass
class Segment:
    """One direction's stretch of video.

    Attributes:
        index: 0, 1, 2, ... per directing session.
        direction_id: the client's id of the direction.
        prompt: the direction's text.
        epoch: flush epoch the segment started under.
        target_frames: frames it runs for (None: until the next direction).
        started_s: when the direction was applied, s (session clock).
        frames: frames delivered so far.
        first_frame_s: when its first frame was delivered, s (None: none yet).
        first_frame_index, last_frame_index, last_pts: of its delivered frames (None: none yet).
        end: how it ended (None: open).
        ended_s: when it ended, s.
        stage_ms_sum: per server stage (queue, denoise, decode), sum over its frames, ms.
        retake_of: the segment it took again, from that segment's start (`sessions/takes.py`; None: it went on
            from where the world was).
    """

    index: int
    direction_id: str
    prompt: str
    epoch: int
    target_frames: int | None
    started_s: float
    frames: int = 0
    first_frame_s: float | None = None
    first_frame_index: int | None = None
    last_frame_index: int | None = None
    last_pts: int | None = None
    end: SegmentEnd | None = None
    ended_s: float | None = None
    stage_ms_sum: dict[str, float] = field(default_factory=dict)
    retake_of: int | None = None
    _finishing: bool = False

    @property
    def open(self) -> bool:
        return self.end is None

    def summary(self, fps: float) -> dict[str, object]:
        """JSON-able facts about the segment (times in ms)."""
        ttff = None if self.first_frame_s is None else round((self.first_frame_s - self.started_s) * 1e3, 2)
        wall = None if self.ended_s is None else round((self.ended_s - self.started_s) * 1e3, 2)
        return {
            "segment": self.index,
            "direction_id": self.direction_id,
            "epoch": self.epoch,
            "frames": self.frames,
            "target_frames": self.target_frames,
            "first_frame_index": self.first_frame_index,
            "last_frame_index": self.last_frame_index,
            "last_pts": self.last_pts,
            "end": None if self.end is None else self.end.value,
            "retake_of": self.retake_of,
            "timings_ms": {
                "ttff": ttff,
                "wall": wall,
                "media": round(self.frames / fps * 1e3, 2),
                **{k: round(v / self.frames, 2) for k, v in self.stage_ms_sum.items() if self.frames},
            },
        }


@dataclass(frozen=True)
class DirectionAck:
    """What `direct` did: the segment it opened and the one it cut (None if none was open)."""

    direction_id: str
    segment: Segment
    cut: Segment | None


class DirectingSession:
    """Segments of directions over one `Session`, installed as its `FrameGate` (and found by `director_of`).

    Args:
        session: the session directed (created with mode "directing").
        default_duration_s: segment length of a direction that names none, s.
        defer: runs a callable soon on the session's thread (default: the running event loop's
            `call_soon`, or at once without one): a segment that reached its length ends after
            the rest of its chunk's frames, which the engine delivers together.
    """

    def __init__(self, session: Session, *, default_duration_s: float = DEFAULT_SEGMENT_S,
                 defer: Callable[[Callable[[], None]], None] | None = None) -> None:
        if not default_duration_s > 0:
            raise ValueError("default_duration_s must be > 0")
        self.session = session
        self.fps = float(session.model.spec.fps)
        self.default_duration_s = default_duration_s
        self._defer = defer
        self.segments: list[Segment] = []  #: the last SEGMENTS_KEPT segments, oldest first
        self.segment_count = 0
        self.frames_dropped = 0  #: frames delivered outside an open segment (before the first, after an end)
        self._listeners: dict[str, list[Callable[[Segment], None]]] = {}
        #: called with each frame dropped for want of an open segment (before the first direction, after a
        #: segment's end: the session's initial frames among them), on the event loop
        self.on_gated: list[Callable[[VideoFrame], None]] = []
        session.frames.set_gate(self)
        _DIRECTORS[session] = self
        session.on("state", self._on_state)

    def __repr__(self) -> str:
        return f"DirectingSession({self.session.id}, {self.segment_count} segments)"

    # -- events -------------------------------------------------------------------------------

    def on(self, event: DirectingEvent, callback: Callable[[Segment], None]) -> Callable[[], None]:
        """Subscribe to "segment_start" or "segment_complete"; returns an unsubscribe function.

        Raises:
            TypeError: `callback` is a coroutine function (callbacks must be synchronous).
        """
        if inspect.iscoroutinefunction(callback):
            raise TypeError("directing event callbacks must be synchronous")
        self._listeners.setdefault(event, []).append(callback)

        def unsubscribe() -> None:
            if callback in self._listeners.get(event, []):
                self._listeners[event].remove(callback)

        return unsubscribe

    def _emit(self, event: DirectingEvent, seg: Segment) -> None:
        for cb in list(self._listeners.get(event, [])):
            try:
                cb(seg)
            except Exception:  # noqa: BLE001 - a listener's bug must not break the session
                logger.exception("%r: %s listener failed", self, event)

    # -- directions ------------------------------------------------------------------------------

    @property
    def current(self) -> Segment | None:
        """The open segment, if any."""
        seg = self.segments[-1] if self.segments else None
        return seg if seg is not None and seg.open else None

    def target_frames(self, duration_s: float | None) -> int:
        """Frames in a segment of `duration_s` (None: the default length): rounded up, at least 1."""
        d = self.default_duration_s if duration_s is None else duration_s
        return max(1, math.ceil(d * self.fps - 1e-9))

    def direct(self, direction_id: str, prompt: str, context: Conditioning, *,
               duration_s: float | None = None, open_ended: bool = False,
               retake_of: int | None = None) -> DirectionAck:
        """Apply a direction now: cut the open segment (if any) and start a new one.

        Args:
            direction_id: the client's id for it (echoed in events).
            prompt: its text.
            context: the session's conditioning with this prompt, encoded (`Session.encode_prompt`).
            duration_s: segment length, s (None: `default_duration_s`).
            open_ended: run until the next direction instead (ignores `duration_s`).
            retake_of: the segment it takes again (`sessions/takes.py`, which put the world back first).

        Returns:
            the ack: the new segment and the cut one.

        Raises:
            SessionClosedError: the session is closed.
        """
        s = self.session
        if s.state == SessionState.CLOSED:
            raise SessionClosedError(f"session {s.id} is closed")
        now = s.clock()
        cut = self.current
        if cut is not None:
            self._end(cut, SegmentEnd.CUT, now)
        s.set_prompt(prompt, context)
        epoch = s.flush()  # drops old frames in every sink, restarts the chunk
        s.resume()
        seg = Segment(index=self.segment_count, direction_id=direction_id, prompt=prompt, epoch=epoch,
                      target_frames=None if open_ended else self.target_frames(duration_s), started_s=now,
                      retake_of=retake_of)
        self.segment_count += 1
        self.segments.append(seg)
        del self.segments[:-SEGMENTS_KEPT]
        logger.info("%r: segment %d (direction of %d chars, %s frames), cut %s", self, seg.index, len(prompt),
                    seg.target_frames, None if cut is None else cut.index)
        self._emit("segment_start", seg)
        return DirectionAck(direction_id, seg, cut)

    def halt(self) -> Segment | None:
        """End the open segment now (as cut) without starting another: the session stops generating at
        its next step boundary and every queued and in-flight frame is dropped (`Session.cancel`), until
        the next `direct`.

        Returns:
            the segment it ended (None if none was open).

        Raises:
            SessionClosedError: the session is closed.
        """
        s = self.session
        if s.state == SessionState.CLOSED:
            raise SessionClosedError(f"session {s.id} is closed")
        cut = self.current
        if cut is not None:
            self._end(cut, SegmentEnd.CUT, s.clock())
        s.cancel()
        return cut

    def segment_for_epoch(self, epoch: int) -> Segment | None:
        """The segment whose frames carry flush epoch `epoch` (None: before the first kept one)."""
        for seg in reversed(self.segments):
            if epoch >= seg.epoch:
                return seg
        return None

    def _end(self, seg: Segment, how: SegmentEnd, now_s: float) -> None:
        if not seg.open:
            return
        seg.end, seg.ended_s = how, now_s
        self._emit("segment_complete", seg)

    def _finish(self, seg: Segment) -> None:
        if seg.open and seg is self.current:
            try:
                self.session.pause()  # at the next step boundary; queued frames still play
            except SessionClosedError:
                pass
            self._end(seg, SegmentEnd.FINISHED, self.session.clock())

    # -- pause, resume, control ----------------------------------------------------------------------

    def pause(self) -> None:
        """Pause the open segment at the next step boundary (its queued frames still play); it stays open.

        Raises:
            SessionClosedError: the session is closed.
        """
        self.session.pause()

    def resume(self) -> bool:
        """Resume the open segment (at the next step). A finished or cut segment stays ended: only a new
        direction starts the next one.

        Returns:
            whether a segment resumed (False: none is open).

        Raises:
            DirectingRefusal: no direction yet: nothing to resume.
            SessionClosedError: the session is closed.
        """
        if self.segment_count == 0:
            raise DirectingRefusal("a directing session generates nothing until its first direction: send one")
        if self.current is None:
            return False
        self.session.resume()
        return True

    def check_control(self, method: str) -> None:
        """Whether a control request `method` (an RPC name: flush, cancel, set_prompt, pause, resume,
        get_state) may act on the directed session directly.

        Raises:
            DirectingRefusal: `set_prompt` (a direction changes the prompt, and opens a segment).
        """
        if method == "set_prompt":
            raise DirectingRefusal("a directing session changes its prompt with a direction, not set_prompt")

    def _on_state(self, session: Session, state: object) -> None:
        if state == SessionState.CLOSED:
            _DIRECTORS.pop(session, None)  # (the value holds its key: a closed session must leave by hand)
            if self.current is not None:
                self._end(self.current, SegmentEnd.STOPPED, session.clock())

    # -- FrameGate (the session's side) ------------------------------------------------------------------

    def admit(self, frame: VideoFrame) -> bool:
        """Count a delivered frame into the open segment and let it through, or drop it if none is open
        (or it is older than the segment)."""
        seg = self.current
        if seg is None or frame.epoch < seg.epoch:
            self.frames_dropped += 1
            if seg is None:
                for cb in list(self.on_gated):
                    cb(frame)
            return False
        if seg.frames == 0:
            seg.first_frame_s, seg.first_frame_index = self.session.clock(), frame.frame_index
        seg.frames += 1
        seg.last_frame_index, seg.last_pts = frame.frame_index, frame.pts
        for k, v in frame.timings_ms.items():
            seg.stage_ms_sum[k] = seg.stage_ms_sum.get(k, 0.0) + v
        if seg.target_frames is not None and seg.frames >= seg.target_frames and not seg._finishing:
            seg._finishing = True  # end after the rest of this chunk's frames (delivered in the same callback)
            self._call_soon(lambda: self._finish(seg))
        return True

    def _call_soon(self, fn: Callable[[], None]) -> None:
        if self._defer is not None:
            self._defer(fn)
            return
        try:
            asyncio.get_running_loop().call_soon(fn)
        except RuntimeError:  # no loop (unit tests): end now
            fn()
