"""A session's inputs on the server: `ActionGate` (action messages checked and ordered) and `SessionInputs` (the
outbox to the session's engine).

The engine owns a session's inputs (`engine/conditioner.py`: held keys,
axis positions and pending movement, the input counter, and the epoch, wants and
conditioning it was last told); the server keeps no copy of them. What the
server keeps is what it decides: whether an action message is valid and
newer than the last (this module's gate), and what the user asked of the
session (the flush epoch, pause and cancel, the conditioning: the owning
`Session` writes them here). Every change goes out at once through the
session's `EngineLink` (set by `SessionManager`: the session's engine, or a
queue while the session moves) as the engine contract's messages
(`engine/messages.py`): an `InputDelta` per accepted action, a
`ConditionerState` when epoch, wants or conditioning changed.

The gate's rules:

Clients send action messages carrying the full set of held keys and
positions of absolute axes (a stick, a trigger), and the movement of relative
axes (the mouse) since their previous message, as the model declares them
(`ActionSpace`, `models/spec.py`). Messages may arrive out of order or be lost
(the `actions` data channel may be unordered and unreliable):

- held keys and positions are state, so the message with the highest seq wins
  and older ones are ignored for them (an absolute axis a message leaves out is
  at rest);
- movement is a delta, so every message's movement is added up per axis until
  the next chunk samples it (a lost message loses only its own movement). The
  wire's `mouse: [dx, dy]` is movement of the axes bound to "mouse.x" and
  "mouse.y".

Seq numbering is per client connection (`new_client` starts it afresh) and
no single message can freeze the keys: with N the newest seq applied,
- seq > N is the newest: keys applied (any jump ahead is allowed);
- N - SEQ_REORDER_WINDOW <= seq <= N is stale (a late, reordered message):
  keys and positions ignored, movement kept, and the caller is told so
  (`SeqOutcome.STALE`);
- seq < N - SEQ_REORDER_WINDOW restarts the numbering (a client that reset its
  counter, or a single wild seq before it): keys and positions applied, it
  becomes N.
So a wild seq far ahead is overtaken by the client's next message, and one
just ahead (within the window) holds the keys for at most SEQ_REORDER_WINDOW
messages.

Event loop only (every transport pushes from it).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from worldcast.engine.conditioner import ConditionerState, InputDelta
from worldcast.models.spec import ActionSpace, Conditioning
from worldcast.sessions.errors import InvalidAction, SessionClosedError

#: Largest |dx| or |dy| one message may carry, mouse counts.
MAX_MOUSE_DELTA = 10_000.0
#: How far behind the newest seq a message is still taken as reordered (stale) rather than a restart, messages.
SEQ_REORDER_WINDOW = 16


class SeqOutcome(enum.Enum):
    """What one pushed message did to the held keys (see the module docstring)."""

    NEWEST = "newest"  #: the newest message: its keys are held now
    STALE = "stale"  #: older than the newest: keys and positions ignored, movement kept
    RESTART = "restart"  #: far behind the newest: taken as a restarted numbering, keys held now

    @property
    def applied(self) -> bool:
        return self is not SeqOutcome.STALE


@dataclass(frozen=True)
class PushedAction:
    """An accepted action message, as `SessionInputs.on_push` is told it (what a recording logs).

    Attributes:
        seq: its seq; keys: the keys it held; mouse: (dx, dy) counts; axes: {axis: value} as sent (None: none).
        outcome: what it did to the held keys; at_s: its arrival, s (monotonic).
    """

    seq: int
    keys: list[str]
    mouse: tuple[float, float]
    axes: dict[str, float] | None
    outcome: SeqOutcome
    at_s: float


class EngineLink(Protocol):
    """Where a session's input changes go (`SessionManager` makes one per session)."""

    def push_input(self, delta: InputDelta) -> None:
        """One change of the inputs (an action, or a client coming or going)."""
        ...

    def update(self, state: ConditionerState) -> None:
        """Epoch, wants or conditioning changed (`state.context` given)."""
        ...

    @property
    def engine_id(self) -> int | None:
        """The engine the session runs on now (None: none, e.g. between two engines)."""
        ...


class ActionGate:
    """A session's action messages at the server's edge: checked against the model's declared buttons and axes,
    ordered by seq (see the module docstring), turned into `InputDelta`s. Keeps only the newest seq and the last
    arrival time.

    Args:
        space: the model's action space; other key and axis names are refused.
    """

    def __init__(self, space: ActionSpace) -> None:
        self.space = space
        self.key_names = space.keys
        self._axes = {a.name: a for a in space.axes}
        self._mouse = tuple(None if a is None else a.name for a in space.mouse)
        self._seq = -1
        self._last_push_s: float | None = None

    def push(self, seq: int, keys: list[str], mouse: tuple[float, float], *, now_s: float,
             axes: dict[str, float] | None = None) -> tuple[SeqOutcome, InputDelta]:
        """Check and order one action message.

        Args:
            seq: the client's sequence number, >= 0, increasing per message.
            keys: names of the keys held now.
            mouse: (dx, dy) counts since the client's previous message (movement of the axes bound to "mouse.x"
                and "mouse.y"; ignored where none is bound).
            now_s: arrival time, s (monotonic).
            axes: {axis name: value}: movement since the previous message of relative axes, the position now of
                absolute ones (left out: at rest), wire units within each axis's declared range.

        Returns:
            what it does to the held keys and positions (movement always counts), and the change to send.

        Raises:
            InvalidAction: unknown key or axis, or out-of-range values (nothing changes).
        """
        bad = [k for k in keys if k not in self.key_names]
        if bad:
            raise InvalidAction(f"unknown key {bad[0]!r}; known keys are {list(self.key_names)}")
        if seq < 0:
            raise InvalidAction("seq must be >= 0")
        dx, dy = mouse
        if not (abs(dx) <= MAX_MOUSE_DELTA and abs(dy) <= MAX_MOUSE_DELTA):
            raise InvalidAction(f"mouse deltas must lie within +-{MAX_MOUSE_DELTA:g} counts")
        moves: dict[str, float] = {}
        positions = self.space.rest_positions()
        for name, v in (axes or {}).items():
            ax = self._axes.get(name)
            if ax is None:
                raise InvalidAction(f"unknown axis {name!r}; known axes are {list(self._axes)}")
            lo, hi = ax.range
            if not (math.isfinite(v) and lo <= v <= hi):
                raise InvalidAction(f"axis {name!r} must lie within [{lo:g}, {hi:g}], got {v!r}")
            if ax.kind == "relative":
                moves[name] = float(v)
            else:
                positions[name] = float(v)
        for name, d in zip(self._mouse, (dx, dy)):
            if name is not None and d:
                moves[name] = moves.get(name, 0.0) + float(d)
        self._last_push_s = now_s
        if seq > self._seq:
            outcome = SeqOutcome.NEWEST
        elif seq < self._seq - SEQ_REORDER_WINDOW:
            outcome = SeqOutcome.RESTART
        else:
            outcome = SeqOutcome.STALE
        if outcome is not SeqOutcome.STALE:
            self._seq = seq
        applied = outcome.applied
        return outcome, InputDelta(tuple(sorted(set(keys))) if applied else None, self._seq,
                                   moves=tuple(sorted(moves.items())),
                                   positions=tuple(sorted(positions.items())) if applied else None)

    def new_client(self) -> InputDelta:
        """A new client connected: its seq numbering starts afresh, nothing is held, pending movement dropped."""
        self._seq = -1
        return InputDelta((), -1, positions=tuple(sorted(self.space.rest_positions().items())), clear=True)

    def release_all(self) -> InputDelta:
        """Release every key, put every absolute axis at rest and drop pending movement (the client left)."""
        return InputDelta((), self._seq, positions=tuple(sorted(self.space.rest_positions().items())), clear=True)

    @property
    def last_seq(self) -> int:
        """The newest applied seq (-1: none since the client connected)."""
        return self._seq

    @property
    def last_push_s(self) -> float | None:
        return self._last_push_s


class SessionInputs:
    """One session's inputs as the server sends them: the `ActionGate`, and what the user asked of the session
    (flush epoch, pause, cancel, the encoded conditioning with its version, whether it is ACTIVE), each change
    sent to `link` at once. Keeps no copy of what the engine owns (held keys, movement, the input counter).

    Args:
        session_id: the owner's id (error messages).
        space: the model's action space (`spec.actions`).
        context: the session's encoded conditioning ({name: array}, `spec.conditioning.tensors`).
        clock: monotonic clock, s (each push's arrival time).
        context_version: the conditioning's version to start from (0; a session restored from a snapshot starts
            from the version its engine state holds, so its caches are not rebuilt).
    """

    def __init__(self, session_id: str, *, space: ActionSpace, context: Conditioning,
                 clock: Callable[[], float], context_version: int = 0) -> None:
        self.session_id = session_id
        self.clock = clock
        self.actions = ActionGate(space)
        #: the owner's listener, called after each accepted push (before the change is sent)
        self.on_push: Callable[[PushedAction], None] | None = None
        #: where changes go (None: nowhere yet; `SessionManager` sets it once the engine has the session)
        self.link: EngineLink | None = None
        self._context = context
        self._context_version = context_version  #: bumped on every change (models with a prompt cache re-cache)
        self._epoch = 0
        self._active = False
        self._paused = False
        self._cancelled = False
        self._closed = False
        self._sent: tuple[int, bool, int] | None = None  #: (epoch, wants, context version) last sent

    def _changed(self) -> None:
        """Send epoch, wants and conditioning where one of them differs from what was sent last."""
        key = (self._epoch, self.wants_frames(), self._context_version)
        if key != self._sent and self.link is not None:
            self._sent = key
            self.link.update(self.engine_state())

    def push(self, seq: int, keys: list[str], mouse: tuple[float, float] = (0.0, 0.0), *,
             axes: dict[str, float] | None = None) -> SeqOutcome:
        """Check one action message (`ActionGate.push`), tell `on_push`, then send the change (so an engine
        woken by it sees the session ACTIVE first).

        Returns:
            whether its keys and positions were applied or it was stale (movement only).

        Raises:
            InvalidAction: the message breaks the schema; nothing changes.
            SessionClosedError: the session is closed; nothing changes.
        """
        if self._closed:
            raise SessionClosedError(f"session {self.session_id} is closed")
        now = self.clock()
        outcome, delta = self.actions.push(seq, keys, mouse, now_s=now, axes=axes)
        if self.on_push is not None:
            self.on_push(PushedAction(seq, keys, mouse, axes, outcome, now))
        if self.link is not None:
            self.link.push_input(delta)
        return outcome

    def new_client(self) -> None:
        """A new client connected: its seq numbering starts afresh, nothing is held."""
        delta = self.actions.new_client()
        if self.link is not None:
            self.link.push_input(delta)

    def release_all(self) -> None:
        """Release every key and drop pending movement (the client left)."""
        delta = self.actions.release_all()
        if self.link is not None:
            self.link.push_input(delta)

    @property
    def context_version(self) -> int:
        """The conditioning's version: 0 at creation, bumped by every `set_context`."""
        return self._context_version

    def set_context(self, context: Conditioning) -> None:
        """Condition the next chunks on `context` (bumps `context_version`)."""
        self._context = context
        self._context_version += 1
        self._changed()

    def new_epoch(self, *, cancel: bool = False) -> int:
        """Bump the flush epoch (with `cancel`: also stop generating until `resume`); returns the new epoch."""
        self._epoch += 1
        self._cancelled = self._cancelled or cancel
        self._changed()
        return self._epoch

    def pause(self) -> None:
        self._paused = True
        self._changed()

    def resume(self) -> None:
        """Undo `pause` and a cancelling `new_epoch`."""
        self._paused = self._cancelled = False
        self._changed()

    def set_lifecycle(self, *, active: bool, closed: bool) -> None:
        """The owner's state changed: whether it is ACTIVE, whether it is CLOSED (pushes are refused from then)."""
        self._active, self._closed = active, closed
        self._changed()

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def current_epoch(self) -> int:
        """The flush epoch: frames of an older one are not delivered (`FramePipeline.is_current`)."""
        return self._epoch

    def wants_frames(self) -> bool:
        """Whether the session should generate now: ACTIVE, not paused, not cancelled."""
        return self._active and not self._paused and not self._cancelled

    def engine_state(self) -> ConditionerState:
        """What the engine is told: epoch, wants, conditioning with its version (inputs are the engine's)."""
        return ConditionerState(epoch=self._epoch, wants_frames=self.wants_frames(),
                                context_version=self._context_version, context=self._context)

    def attach(self, link: EngineLink) -> None:
        """The engine has just been given `engine_state()` (with the session): changes go to `link` from now."""
        self.link = link
        self._sent = (self._epoch, self.wants_frames(), self._context_version)

    def resend(self) -> None:
        """Send epoch, wants and conditioning again, whole (after a move: the target's bytes may be older)."""
        self._sent = None
        self._changed()
