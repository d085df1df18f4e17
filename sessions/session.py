"""Session: one user's world — state machine, prompt, inputs, viewers, and its frame pipeline.

States (`SessionState`): CREATED -> ACTIVE <-> IDLE -> CLOSED. A session is
ACTIVE while it should generate: a client is attached or acting. It goes
IDLE when its user stops acting for `idle_after_s`, and generation stops
costing compute; the next action makes it ACTIVE again.

Control operations, all cheap and effective at the engine's next step boundary:
- `flush()`: bump the epoch, drop every queued frame; the engine drops the
  chunk in flight and restarts it with the newest actions and prompt. Frames
  generated under an older epoch are never delivered after `flush` returns.
- `cancel()`: bump the epoch, drop queued frames, stop generating until `resume()`.
- `pause()` / `resume()`: stop / restart generating; nothing is dropped.

The engine does not read the session: the session's inputs, `Session.inputs` (`SessionInputs`,
`sessions/actions.py`: the action gate, the epoch, pause and cancel, the conditioning), send it every
change as the engine contract's messages (the engine owns held keys, movement and the input counter:
`engine/conditioner.py`). Transports push actions into the inputs directly; an accepted push reaches the
session through one listener (`SessionInputs.on_push`: activity, ACTIVE) and then goes to the engine; the
operations above write the inputs through the session's methods; frames come back through the session's
`FramePipeline` (`Session.frames`, `sessions/frames.py`: pacing, the stale-epoch decision, PTS, the frame
gate, the sinks).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from worldcast.engine.step_output import FrameOut
from worldcast.models.base import WorldModel
from worldcast.models.errors import ConditioningError
from worldcast.models.spec import Conditioning, ConditioningRequest
from worldcast.sessions.actions import PushedAction, SessionInputs
from worldcast.sessions.duty_cycle import DutyCycleMeter
from worldcast.sessions.errors import InvalidConditioning, SessionClosedError
from worldcast.sessions.frames import FramePipeline, FrameSink, Outcome
from worldcast.sessions.recording import EventLog
from worldcast.sessions.viewers import Viewers

logger = logging.getLogger(__name__)

#: What a session is driven by: actions ("interactive") or text directions, segment by segment ("directing").
SessionMode = Literal["interactive", "directing"]


class SessionState(enum.IntEnum):
    """Lifecycle of a session; ordered, so `state >= CLOSED` means finished."""

    CREATED = 0
    ACTIVE = 1
    IDLE = 2
    CLOSED = 3


_ALLOWED: dict[SessionState, set[SessionState]] = {
    SessionState.CREATED: {SessionState.ACTIVE, SessionState.IDLE, SessionState.CLOSED},
    SessionState.ACTIVE: {SessionState.IDLE, SessionState.CLOSED},
    SessionState.IDLE: {SessionState.ACTIVE, SessionState.CLOSED},
    SessionState.CLOSED: set(),
}


class CloseReason(enum.Enum):
    """Why a session closed."""

    CLIENT = "client"  #: DELETE or client disconnect
    TIMEOUT = "timeout"  #: no client and no activity for the session timeout
    ERROR = "error"  #: its step failed on the device
    SHUTDOWN = "shutdown"  #: the server is stopping


#: Session events; callbacks are synchronous and get (session, payload).
SessionEvent = Literal["state", "frame", "error", "control"]

#: Codes of a session's device-side failure (`SessionFailure.code`), as transports send them in their
#: `error` event: its own step failed ("session_failed"), the engine it ran on died ("engine_lost"), or that
#: engine stopped making progress ("engine_stalled": a notice, the session stays open; it is closed with
#: "engine_lost" if the engine is killed), or its recording stopped by itself ("recording_stopped": a size cap or a
#: disk error; a notice, the session goes on).
FailureCode = Literal["session_failed", "engine_lost", "engine_stalled", "recording_stopped"]


@dataclass(frozen=True)
class SessionFailure:
    """The payload of a session's "error" event: a stable code and a precise message (its `str`)."""

    code: FailureCode
    message: str

    def __str__(self) -> str:
        return self.message


class Session:
    """One user's session. Create through `SessionManager.create`.

    Args:
        session_id: unique id.
        token: bearer token that authorizes this session's routes.
        model: the world model (for action and conditioning encoding).
        conditioning: what the user asked the session to be conditioned on (prompt, image).
        context: its encoding (`WorldModel.encode_conditioning`), carried to the engine uninterpreted.
        seed: seed of the initial world and the sampler noise.
        idle_after_s: seconds without actions after which an ACTIVE session goes IDLE.
        clock: monotonic clock, s.
        stamp_frames: whether video sinks should stamp frame index and action seq into the
            pixels (latency measurement; off by default).
        mode: "interactive" or "directing" (a label: the directing layer above, `sessions/directing.py`,
            holds the segments and gates the frames).
        send_ahead_s: its frames reach the sinks no earlier than this before their presentation time, s
            (`FramePipeline`'s pacing).
        context_version: its conditioning's version to start from (`SessionInputs`; a snapshot's).
    """

    def __init__(
        self,
        session_id: str,
        token: str,
        *,
        model: WorldModel,
        conditioning: ConditioningRequest,
        context: Conditioning,
        seed: int,
        idle_after_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        stamp_frames: bool = False,
        mode: SessionMode = "interactive",
        send_ahead_s: float = 0.0,
        context_version: int = 0,
    ) -> None:
        self.id = session_id
        self.stamp_frames = stamp_frames
        self.mode: SessionMode = mode
        self.token = token
        self.model = model
        self.seed = seed
        self.idle_after_s = idle_after_s
        self.clock = clock
        self.created_s = clock()
        self.last_activity_s = self.created_s
        self.state = SessionState.CREATED
        self.close_reason: CloseReason | None = None
        #: what the engine reads (actions, epoch, conditioning, wants); transports push actions into it
        self.inputs = SessionInputs(session_id, space=model.spec.actions, context=context, clock=clock,
                                    context_version=context_version)
        self.inputs.on_push = self._pushed
        #: its frames' way from the engine to the sinks: pacing, the stale-epoch decision, PTS, the gate, the sinks
        self.frames = FramePipeline(current_epoch=self.inputs.current_epoch, send_ahead_s=send_ahead_s, clock=clock)
        self.frames.on_delivered.append(lambda frame: self._emit("frame", frame))
        self.frames.on_admitted = self._admitted
        self._conditioning = conditioning
        #: sinks attached before their viewer connected (a WebRTC peer negotiating), by id: connect-by time, s
        self._unconnected: dict[int, float] = {}
        self.had_viewer = False  #: a viewer has been connected at some point (see `attach_sink`)
        self.last_viewer_s: float | None = None  #: when the last connected viewer left, s (None: none has)
        self._listeners: dict[str, list[Callable[[Session, object], None]]] = {}
        self.duty = DutyCycleMeter(self.created_s)
        #: its viewer tokens and spectators (`sessions/viewers.py`); spectators' sinks, by id, are not viewers:
        #: they neither hold the session open nor wake it (`attach_spectator`)
        self.viewers = Viewers(session_id, clock=clock)
        self._spectator_sinks: set[int] = set()
        #: its recording's event log while one is written (`start_recording`; `sessions/recording.py`)
        self.recording: EventLog | None = None
        #: starts recording it from now (its manager's `start_recording`; None: nothing can record it)
        self.recorder: Callable[[], Awaitable[EventLog]] | None = None
        #: the viewer that holds control (`hand_over`; None: the session's own token, its owner's)
        self.controller_viewer: str | None = None

    def __repr__(self) -> str:
        return f"Session({self.id}, {self.state.name})"

    @property
    def engine_id(self) -> int | None:
        """The engine core it runs on (its engine link asks the engines' record; None: none now)."""
        link = self.inputs.link
        return None if link is None else link.engine_id

    # -- events ---------------------------------------------------------------------

    def on(self, event: SessionEvent, callback: Callable[[Session, object], None]) -> Callable[[], None]:
        """Subscribe to an event; returns an unsubscribe function.

        Events: "state" (payload: SessionState), "frame" (payload: VideoFrame, after delivery to
        sinks; never for a frame dropped as stale or refused by the frame gate), "error" (payload:
        `SessionFailure`), "control" (payload: the viewer id now holding control, None: the owner;
        `hand_over`). Control operations and actions are not events: they go to the engine from `inputs`
        itself (`SessionInputs`).

        Raises:
            TypeError: `callback` is a coroutine function (callbacks must be synchronous).
        """
        import inspect

        if inspect.iscoroutinefunction(callback):
            raise TypeError("session event callbacks must be synchronous")
        self._listeners.setdefault(event, []).append(callback)
        return lambda: self._listeners.get(event, []).remove(callback) if callback in self._listeners.get(
            event, []) else None

    def _emit(self, event: SessionEvent, payload: object) -> None:
        for cb in list(self._listeners.get(event, [])):
            try:
                cb(self, payload)
            except Exception:  # noqa: BLE001 - a listener's bug must not break the session
                logger.exception("%r: %s listener failed", self, event)

    def _set_state(self, new: SessionState) -> None:
        old = self.state
        if new == old:
            return
        if new not in _ALLOWED[old]:
            raise SessionClosedError(f"session {self.id} is {old.name.lower()}; cannot become {new.name.lower()}")
        self.state = new
        self._record("state", state=new.name.lower())
        self.inputs.set_lifecycle(active=new == SessionState.ACTIVE, closed=new == SessionState.CLOSED)
        self._touch_duty()
        logger.debug("%r: %s -> %s", self, old.name, new.name)
        self._emit("state", new)

    # -- duty cycle ----------------------------------------------------------------------------------

    def _touch_duty(self) -> None:
        self.duty.update(self.clock(), self.inputs.wants_frames())

    def duty_cycle(self) -> float:
        """Measured share of recent time spent generating, in [0, 1] (see `DutyCycleMeter`)."""
        self._touch_duty()
        return self.duty.value(self.clock())

    # -- user operations (event loop) -----------------------------------------------------------

    def _check_open(self) -> None:
        if self.state == SessionState.CLOSED:
            raise SessionClosedError(f"session {self.id} is closed")

    def activate(self) -> None:
        """Mark the session ACTIVE (a client attached or acted)."""
        self._check_open()
        self.last_activity_s = self.clock()
        self._set_state(SessionState.ACTIVE)

    def _pushed(self, a: PushedAction) -> None:
        """`SessionInputs.on_push`: an action was accepted (and counted): the session is active (its engine is
        told next, by the inputs themselves), and a recording logs it."""
        self.activate()
        if self.recording is not None:
            self.recording.write("action", seq=a.seq, keys=a.keys, mouse=[float(a.mouse[0]), float(a.mouse[1])],
                                 axes=a.axes or None, outcome=a.outcome.value, at=round(a.at_s - self.created_s, 6))

    # -- control --------------------------------------------------------------------------------------------

    def hand_over(self, viewer_id: str | None) -> None:
        """Give control to the live viewer `viewer_id` (None: back to the session's own token, its owner's). One
        controller at a time: the keys held are released, and every connection the previous controller opened
        is closed (the "control" event; each transport's controller connection listens). The new controller
        connects with its own token; the owner may always take control back; a viewer holding control that is
        revoked or runs out gives it back to the owner.

        Raises:
            SessionClosedError: closed.
            ValueError: no live viewer of that id.
        """
        self._check_open()
        if viewer_id is not None:
            v = self.viewers.tokens.get(viewer_id)
            if v is None or v.expires_at_s <= self.clock():
                raise ValueError(f"no live viewer {viewer_id!r} of this session")
            v.on_revoke.append(lambda reason, vid=viewer_id: self._control_lost(vid))
        if viewer_id == self.controller_viewer:
            return
        self.controller_viewer = viewer_id
        self.inputs.release_all()
        self._record("control", to=viewer_id)
        logger.info("%r: control handed to %s", self, viewer_id or "its owner")
        self._emit("control", viewer_id)

    def _control_lost(self, viewer_id: str) -> None:
        if self.controller_viewer == viewer_id and self.state != SessionState.CLOSED:
            self.hand_over(None)

    # -- recording ------------------------------------------------------------------------------------------

    def start_recording(self, log: EventLog) -> None:
        """Log what happens to the session into `log` from now (`sessions/recording.py`).

        Raises:
            SessionClosedError: closed.
            ValueError: it is already recording.
        """
        self._check_open()
        if self.recording is not None:
            raise ValueError(f"session {self.id} is already recording")
        self.recording = log
        self.frames.on_generated = self._record_frame
        log.on_stop = self._recording_stopped

    def _recording_stopped(self, reason: str) -> None:
        """The log stopped by itself (its cap, the disk): the session goes on, its clients are told."""
        self.recording = None
        self.frames.on_generated = None
        self._emit("error", SessionFailure("recording_stopped", f"the recording stopped: {reason}"))

    def stop_recording(self, reason: str = "asked") -> EventLog | None:
        """Stop its recording (no-op without one); returns the log that was written."""
        log, self.recording = self.recording, None
        self.frames.on_generated = None
        if log is not None:
            log.stop(reason)
        return log

    def _record_frame(self, out: FrameOut, outcome: Outcome, pts: int | None) -> None:
        if self.recording is not None:
            self.recording.frame(out, outcome, pts)

    def _record(self, kind: str, **fields: object) -> None:
        if self.recording is not None:
            self.recording.write(kind, **fields)

    @property
    def prompt(self) -> str | None:
        """The prompt the session is conditioned on: the user's, else the model's default (None: the model
        takes no text)."""
        if self.model.spec.conditioning.text is None:
            return None
        return self._conditioning.text or self.model.spec.default_prompt

    @property
    def conditioning(self) -> ConditioningRequest:
        """What the user asked for (prompt, image)."""
        return self._conditioning

    @property
    def takes_text(self) -> bool:
        """Whether the model takes a text prompt (so `set_prompt` and directions can work)."""
        return self.model.spec.conditioning.text is not None

    def encode_prompt(self, text: str) -> Conditioning:
        """The session's conditioning with a new prompt, encoded (the image, if any, kept).

        Slow (a text encoder): run it off the event loop, then `set_prompt`.

        Raises:
            InvalidConditioning: the model takes no text, or refuses this prompt (nothing changes).
        """
        request = self._conditioning.with_text(text)
        try:
            self.model.spec.conditioning.validate(request)
            return self.model.encode_conditioning(request)
        except ConditioningError as e:
            raise InvalidConditioning(e.field, e.reason) from None

    def set_prompt(self, text: str, context: Conditioning) -> None:
        """Condition the next chunks on a new prompt (`flush` to apply it to the chunk in flight).

        Args:
            text: the prompt.
            context: `encode_prompt(text)`.

        Raises:
            SessionClosedError: closed.
            InvalidConditioning: the model takes no text.
        """
        self._check_open()
        if not self.takes_text:
            raise InvalidConditioning("prompt", f"{self.model.spec.name} takes no text prompt")
        self._conditioning = self._conditioning.with_text(text)
        self.inputs.set_context(context)
        self._record("prompt", text=text, context_version=self.inputs.context_version)

    def flush(self) -> int:
        """Drop queued and in-flight frames under stale conditioning; restart the chunk.

        Returns:
            the new epoch: every frame delivered from now on carries it or a later one.
        """
        self._check_open()
        epoch = self.inputs.new_epoch()
        self._record("flush", epoch=epoch)
        self.frames.clear()
        self.activate()
        return epoch

    def cancel(self) -> int:
        """Stop generating at the next step boundary and drop queued frames, until `resume`.

        Returns:
            the new epoch.
        """
        self._check_open()
        epoch = self.inputs.new_epoch(cancel=True)
        self._record("cancel", epoch=epoch)
        self._touch_duty()
        self.frames.clear()
        return epoch

    def pause(self) -> None:
        """Stop generating at the next step boundary; queued frames still play."""
        self._check_open()
        self.inputs.pause()
        self._record("pause")
        self._touch_duty()

    def resume(self) -> None:
        """Undo `pause` and `cancel`; generation restarts with the freshest actions."""
        self._check_open()
        self.inputs.resume()
        self._record("resume")
        self._touch_duty()
        self.activate()

    @property
    def paused(self) -> bool:
        return self.inputs.paused

    @property
    def cancelled(self) -> bool:
        return self.inputs.cancelled

    # -- sinks ---------------------------------------------------------------------------------------

    def attach_sink(self, sink: FrameSink, *, connect_by_s: float | None = None) -> None:
        """Start delivering frames to `sink`; it gets the latest frame at once (with a frame gate: the next one the
        gate admits).

        Args:
            connect_by_s: the sink's viewer is still connecting (a WebRTC peer between its answer and
                `connected`) and has until this time (s, the session's clock) to do so; call
                `sink_connected` when it does. None: the viewer is connected now (a WebSocket stream
                after authentication, a LiveKit user in the room).

        Raises:
            SessionClosedError: the session is closed.
        """
        self._check_open()
        self.frames.add_sink(sink)
        if connect_by_s is None:
            self.had_viewer = True
        else:
            self._unconnected[id(sink)] = connect_by_s
        self.activate()

    def sink_connected(self, sink: FrameSink) -> None:
        """The viewer of a sink attached with `connect_by_s` has connected (no-op for other sinks)."""
        if self._unconnected.pop(id(sink), None) is not None and sink in self.frames.sinks:
            self.had_viewer = True

    def attach_spectator(self, sink: FrameSink) -> None:
        """Start delivering frames to a spectator's `sink` (view only): it gets the latest frame at once, like any
        sink, but it does not count as a viewer: it neither wakes the session nor holds it open, and the session
        goes idle when its last viewer leaves whatever spectators remain (`detach_sink` detaches it).

        Raises:
            SessionClosedError: the session is closed.
        """
        self._check_open()
        self._spectator_sinks.add(id(sink))
        self.frames.add_sink(sink)

    def detach_sink(self, sink: FrameSink) -> None:
        """Stop delivering frames to `sink` (a viewer's or a spectator's; no-op if not attached). When the last
        viewer's sink leaves, held inputs are released and the session goes IDLE."""
        if not self.frames.remove_sink(sink):
            return
        if id(sink) in self._spectator_sinks:
            self._spectator_sinks.discard(id(sink))
            return
        if self._unconnected.pop(id(sink), None) is None:
            self.last_viewer_s = self.clock()
        if len(self.frames.sinks) == len(self._spectator_sinks):
            # the last viewer left (closed tab, failed connection): stop costing compute
            self.inputs.release_all()
            if self.state == SessionState.ACTIVE:
                self._set_state(SessionState.IDLE)

    @property
    def viewer_count(self) -> int:
        """Sinks whose viewer is connected (attached without `connect_by_s`, or `sink_connected` since)."""
        return len(self.frames.sinks) - len(self._unconnected) - len(self._spectator_sinks)

    @property
    def connect_deadline_s(self) -> float | None:
        """The latest connect-by time of the sinks whose viewer is still connecting, s (None: none is)."""
        return max(self._unconnected.values()) if self._unconnected else None

    @property
    def sink_count(self) -> int:
        """Sinks of viewers, connected or connecting (spectators' not counted)."""
        return len(self.frames.sinks) - len(self._spectator_sinks)

    def _admitted(self, frame: object) -> None:
        """The frame gate admitted a frame: it was generated at its layer's request (a direction): activity."""
        self.last_activity_s = self.clock()

    def fail(self, reason: str, *, code: FailureCode = "session_failed") -> None:
        """Report a device-side failure of this session (it is then closed by its manager, except for
        "engine_stalled", a notice).

        Emits "error" with a `SessionFailure(code, reason)`.
        """
        self._emit("error", SessionFailure(code, reason))

    # -- housekeeping --------------------------------------------------------------------------------

    def tick(self, now_s: float) -> None:
        """Go IDLE after `idle_after_s` without actions."""
        if self.state == SessionState.ACTIVE:
            last = self.inputs.actions.last_push_s or self.last_activity_s
            if now_s - max(last, self.last_activity_s) > self.idle_after_s:
                self._set_state(SessionState.IDLE)

    def close(self, reason: CloseReason) -> None:
        """Close (idempotent). Sinks are cleared and detached."""
        if self.state == SessionState.CLOSED:
            return
        self.close_reason = reason
        self._set_state(SessionState.CLOSED)
        if self.recording is not None:
            log, self.recording = self.recording, None
            self.frames.on_generated = None
            log.close(reason.value)
        self.frames.closed = True
        self.frames.clear()
        self.frames.sinks.clear()
        self._unconnected.clear()
        self._spectator_sinks.clear()
        self.viewers.close()  # every viewer token revoked, every spectator stream closed

    def info(self) -> dict[str, object]:
        """A JSON-able summary (prompt length, not contents, goes to logs; the owner sees the prompt)."""
        return {
            "session_id": self.id,
            "mode": self.mode,
            "state": self.state.name.lower(),
            "prompt": self.prompt,
            "image": None if self._conditioning.image is None else {
                "width": int(self._conditioning.image.shape[1]), "height": int(self._conditioning.image.shape[0])},
            "paused": self.inputs.paused,
            "cancelled": self.inputs.cancelled,
            "epoch": self.inputs.current_epoch(),
            "frames_generated": self.frames.generated,
            "frames_delivered": self.frames.delivered,
            "frames_dropped_stale": self.frames.dropped_stale,
            "frames_dropped_gated": self.frames.dropped_gated,
            "frames_dropped_lost": self.frames.dropped_lost,
            "last_action_seq": self.inputs.actions.last_seq,
            "sinks": len(self.frames.sinks),
            "viewers": self.viewer_count,
            "viewer_tokens": len(self.viewers),
            "spectators": len(self.viewers.spectators),
            "duty_cycle": round(self.duty_cycle(), 4),
            "engine": self.engine_id,
        }
