"""FramePipeline: one session's frames from its engine to every sink, as one chain of stages.

Every frame an engine makes for a session passes the same stages, in this
order, whatever engine made it and whatever sinks read it:

1. **pacing** (`submit`): a chunk's frames come out of the engine together;
   each is handed on no earlier than `send_ahead_s` before its presentation
   time, so each sink stays a bounded drop-oldest queue of a frame or two
   instead of taking a chunk in a burst;
2. **the stale-epoch decision** (`is_current`): a frame generated under an
   older flush epoch than the session's, or after the session closed, is
   dropped. This is the one place the decision is made: every sink's queue
   asks the same `is_current` when it takes a frame (`transport/media/
   frame_queue.py`), so a frame that went stale while queued is dropped
   there by the same rule;
3. **PTS**: the frame gets its presentation timestamp on the session's one
   media clock (`sessions/clock.py`: 90 kHz, strictly increasing), before
   the gate, so a refused frame still uses up its PTS and the stream's
   timestamps stay on the session's clock;
4. **the frame gate** (directing, `sessions/directing.py`): a layer above the
   session may refuse frames outside what it asked for;
5. **the sinks**: every attached sink gets the frame (`FrameSink.put`, never
   blocking), then the `on_delivered` listeners (the session's "frame"
   event). What sinks derive from a frame is made once for all of them: the
   prepared picture (`VideoFrame.derived`, `transport/media/picture.py`) and
   the encoded video (`shared`: one encode per session for every sink that
   wants H.264, `transport/stream/fmp4.py` `SessionEncode`).

Each outcome has its counter and its name (`Outcome`). Event loop only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Literal, Protocol

import numpy as np

from worldcast.engine.step_output import FrameOut
from worldcast.sessions.clock import VIDEO_TIME_BASE, MediaClock

logger = logging.getLogger(__name__)

#: What became of one frame: handed to the sinks, dropped as stale (stage 2), or refused by the gate (stage 4).
#: "dropped_lost": its pixels never reached the server (an engine process's full frame ring: `FrameOut.lost`).
Outcome = Literal["delivered", "dropped_stale", "dropped_gated", "dropped_lost"]


@dataclass
class VideoFrame:
    """A frame on its way to a sink.

    Attributes:
        image: uint8 (H, W, 3) RGB.
        pts: presentation timestamp in `time_base` units (90 kHz), strictly increasing per session.
        time_base: Fraction(1, 90000) s.
        frame_index: absolute frame index in the session.
        action_seq: seq of the last action applied (-1: none).
        epoch: flush epoch it was generated under.
        present_at_s: intended presentation time, s (monotonic).
        timings_ms: server stage times up to publication (queue, denoise, decode), ms; see `FrameOut`.
        derived: what sinks derive from the frame, by key, so each is made once however many sinks read it
            (the prepared picture: `transport/media/picture.py`).
    """

    image: np.ndarray
    pts: int
    time_base: Fraction
    frame_index: int
    action_seq: int
    epoch: int
    present_at_s: float
    timings_ms: dict[str, float] = field(default_factory=dict)
    derived: dict[object, object] = field(default_factory=dict, repr=False, compare=False)


class FrameSink(Protocol):
    """Where a session's frames go (a WebRTC track, a LiveKit source, an fMP4 muxer).

    `put` must not block and must hold at most a frame or two, dropping the
    oldest; `clear` drops everything queued.
    """

    def put(self, frame: VideoFrame) -> None: ...

    def clear(self) -> None: ...


class FrameGate(Protocol):
    """A layer above the session that decides which delivered frames reach its sinks (directing: only
    the frames of the open segment, `sessions/directing.py`). Installed with `FramePipeline.set_gate`.

    `admit` is called once per current (not stale) frame, on the event loop, and must not block; a frame it
    admits was asked for by that layer, so it counts as the session's activity.
    """

    def admit(self, frame: VideoFrame) -> bool: ...


class FramePipeline:
    """One session's frame stages (see the module docstring).

    Args:
        current_epoch: the session's flush epoch now (`SessionInputs.current_epoch`).
        send_ahead_s: frames are handed on no earlier than this before their presentation time, s.
        clock: monotonic clock, s.
    """

    def __init__(self, *, current_epoch: Callable[[], int], send_ahead_s: float, clock: Callable[[], float]) -> None:
        self._current_epoch = current_epoch
        self.send_ahead_s = send_ahead_s
        self.clock = clock
        self.media_clock = MediaClock()
        self.sinks: list[FrameSink] = []
        self.gate: FrameGate | None = None
        self.closed = False  #: set when the session closes: nothing is delivered after it
        #: called with each delivered frame, after the sinks (the session's "frame" event)
        self.on_delivered: list[Callable[[VideoFrame], None]] = []
        #: called with each frame the gate admitted (the session's activity)
        self.on_admitted: Callable[[VideoFrame], None] | None = None
        #: called with every frame's outcome and its lateness (now - presentation time, s): metrics
        self.on_outcome: Callable[[Outcome, float], None] | None = None
        #: called with every frame the engine made, its outcome and its PTS (None unless delivered): a recording
        self.on_generated: Callable[[FrameOut, Outcome, int | None], None] | None = None
        self.last_frame: VideoFrame | None = None  #: the newest delivered frame (a new sink gets it at once)
        #: stages sinks of this session share, by the key their owner gives (the one encode for encoded video:
        #: `transport/stream/fmp4.py` `SessionEncode`); each owner adds and removes its own
        self.shared: dict[object, object] = {}
        self.generated = 0  #: frames that reached stage 2
        self.delivered = 0
        self.dropped_stale = 0
        self.dropped_gated = 0
        self.dropped_lost = 0

    # -- stage 1: pacing ---------------------------------------------------------------------------

    def submit(self, out: FrameOut) -> None:
        """Deliver `out` now, or `send_ahead_s` before its presentation time if that is later (a running loop
        schedules it; without one it is delivered now)."""
        due_in = out.present_at_s - self.send_ahead_s - self.clock()
        if due_in <= 0:
            self.deliver(out)
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.deliver(out)
            return
        loop.call_later(due_in, self.deliver, out)

    # -- stage 2: the stale-epoch decision ---------------------------------------------------------------

    def is_current(self, frame: VideoFrame | FrameOut) -> bool:
        """Whether `frame` may still be shown: made under the session's current flush epoch (or a later one)
        and the session open. Every sink's queue asks this when it takes a frame."""
        return not self.closed and frame.epoch >= self._current_epoch()

    # -- stages 2 to 5 -----------------------------------------------------------------------------------

    def deliver(self, out: FrameOut) -> VideoFrame | None:
        """Pass `out` through stages 2 to 5 now.

        Returns:
            the delivered frame, or None if dropped (stale, or refused by the gate).
        """
        self.generated += 1
        if out.lost:
            self.dropped_lost += 1
            self._outcome("dropped_lost", out.present_at_s, out)
            return None
        if not self.is_current(out):
            self.dropped_stale += 1
            self._outcome("dropped_stale", out.present_at_s, out)
            return None
        frame = VideoFrame(image=out.image, pts=self.media_clock.pts(out.present_at_s), time_base=VIDEO_TIME_BASE,
                           frame_index=out.frame_index, action_seq=out.action_seq, epoch=out.epoch,
                           present_at_s=out.present_at_s, timings_ms=out.timings_ms)
        if self.gate is not None:
            if not self.gate.admit(frame):
                self.dropped_gated += 1
                self._outcome("dropped_gated", out.present_at_s, out)
                return None
            if self.on_admitted is not None:
                self.on_admitted(frame)
        self.delivered += 1
        self.last_frame = frame
        for s in self.sinks:
            s.put(frame)
        for cb in list(self.on_delivered):
            try:
                cb(frame)
            except Exception:  # noqa: BLE001 - a listener's bug must not break delivery
                logger.exception("FramePipeline: a frame listener failed")
        self._outcome("delivered", out.present_at_s, out, frame.pts)
        return frame

    def _outcome(self, outcome: Outcome, present_at_s: float, out: FrameOut, pts: int | None = None) -> None:
        if self.on_outcome is not None:
            self.on_outcome(outcome, self.clock() - present_at_s)
        if self.on_generated is not None:
            try:
                self.on_generated(out, outcome, pts)
            except Exception:  # noqa: BLE001 - a recording's bug must not break delivery
                logger.exception("FramePipeline: the frame recorder failed")

    # -- sinks and the gate --------------------------------------------------------------------------

    def set_gate(self, gate: FrameGate) -> None:
        """Let `gate` decide which current frames reach the sinks (one gate per session).

        Raises:
            ValueError: another gate is installed.
        """
        if self.gate is not None and self.gate is not gate:
            raise ValueError("the session already has a frame gate")
        self.gate = gate

    def add_sink(self, sink: FrameSink) -> None:
        """Start handing frames to `sink`; it gets the newest frame at once (with a gate: the next one the gate
        admits)."""
        self.sinks.append(sink)
        if self.last_frame is not None and self.gate is None:
            sink.put(self.last_frame)

    def remove_sink(self, sink: FrameSink) -> bool:
        """Stop handing frames to `sink`; False if it was not attached."""
        if sink not in self.sinks:
            return False
        self.sinks.remove(sink)
        return True

    def clear(self) -> None:
        """Drop every frame the sinks hold (a flush, a cancel, the close)."""
        for s in self.sinks:
            s.clear()
