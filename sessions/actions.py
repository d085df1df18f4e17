"""A session's inputs: `ActionBuffer` (its latest action state) and `SessionInputs` (everything the engine reads).

`SessionInputs` is the one place an action passes through on the session side: a transport's
`ActionHandler` pushes into it, the engine's device thread samples it at each chunk start
(`engine/rollout.py` `Conditioner`), and an engine handle reads all of it at once (`conditioner_state`) to
feed an engine process's mirror (`engine/process/conditioner.py`). After each accepted push it tells, in
order, the `Session` that owns it (`on_push`: activity, ACTIVE) and then the engine that reads it
(`on_input` listeners: a `LocalEngine` registers its device worker's `wake`, so an idle device starts the
next chunk at once). The owner writes the rest (epoch, conditioning, pause, lifecycle) through its own
public methods.

The buffer's rules:

Clients send action messages carrying the full set of held keys and the
mouse movement since their previous message. Messages may arrive out of order
or be lost (the `actions` data channel may be unordered and unreliable):

- held keys are state, so the message with the highest seq wins and older
  ones are ignored for keys;
- mouse movement is a delta, so every message's dx, dy is added up until the
  next chunk samples it (a lost message loses only its own movement).

Seq numbering is per client connection (`new_client` starts it afresh) and
no single message can freeze the keys: with N the newest seq applied,
- seq > N is the newest: keys applied (any jump ahead is allowed);
- N - SEQ_REORDER_WINDOW <= seq <= N is stale (a late, reordered message):
  keys ignored, mouse kept, and the caller is told so (`SeqOutcome.STALE`);
- seq < N - SEQ_REORDER_WINDOW restarts the numbering (a client that reset its
  counter, or a single wild seq before it): keys applied, it becomes N.
So a wild seq far ahead is overtaken by the client's next message, and one
just ahead (within the window) holds the keys for at most SEQ_REORDER_WINDOW
messages.

Thread-safe: pushed from the event loop, sampled from the device thread.
An engine in a process of its own samples a mirror of the buffer instead
(`engine/process/conditioner.py`), fed through `on_change` (set only for such an engine: `SessionManager`).
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from worldcast.engine.rollout import ChunkInputs, ConditionerState
from worldcast.models.base import WorldModel
from worldcast.models.spec import Conditioning
from worldcast.sessions.errors import InvalidAction, SessionClosedError

#: Largest |dx| or |dy| one message may carry, mouse counts.
MAX_MOUSE_DELTA = 10_000.0
#: How far behind the newest seq a message is still taken as reordered (stale) rather than a restart, messages.
SEQ_REORDER_WINDOW = 16


class SeqOutcome(enum.Enum):
    """What one pushed message did to the held keys (see the module docstring)."""

    NEWEST = "newest"  #: the newest message: its keys are held now
    STALE = "stale"  #: older than the newest: keys ignored, mouse movement kept
    RESTART = "restart"  #: far behind the newest: taken as a restarted numbering, keys held now

    @property
    def applied(self) -> bool:
        return self is not SeqOutcome.STALE


@dataclass
class ActionSample:
    """What one chunk applies.

    Attributes:
        keys: held keys by name, per frame (the same set for every frame of a chunk).
        mouse: (dx, dy) mouse counts for each frame; the accumulated movement split evenly.
        seq: highest action seq included (-1: no action yet).
    """

    keys: list[dict[str, bool]]
    mouse: list[tuple[float, float]]
    seq: int


@dataclass
class ActionBuffer:
    """Held keys (latest seq wins) plus accumulated mouse movement.

    Args:
        key_names: the keys the model understands; other names are rejected.
    """

    key_names: tuple[str, ...]
    _held: frozenset[str] = frozenset()
    _seq: int = -1
    _mouse: list[float] = field(default_factory=lambda: [0.0, 0.0])
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _last_push_s: float | None = None
    #: called after every change (on the pushing thread) with (held keys, newest seq, dx, dy, cleared): the
    #: keys and seq as now decided, the movement added, and whether pending movement was dropped first
    on_change: Callable[[frozenset[str], int, float, float, bool], None] | None = None

    def push(self, seq: int, keys: list[str], mouse: tuple[float, float], *, now_s: float) -> SeqOutcome:
        """Apply one validated action message.

        Args:
            seq: the client's sequence number, >= 0, increasing per message.
            keys: names of the keys held now.
            mouse: (dx, dy) counts since the client's previous message.
            now_s: arrival time, s (monotonic).

        Returns:
            What it did to the held keys (mouse movement is always added).

        Raises:
            InvalidAction: unknown key or out-of-range values (nothing is applied).
        """
        bad = [k for k in keys if k not in self.key_names]
        if bad:
            raise InvalidAction(f"unknown key {bad[0]!r}; known keys are {list(self.key_names)}")
        if seq < 0:
            raise InvalidAction("seq must be >= 0")
        dx, dy = mouse
        if not (abs(dx) <= MAX_MOUSE_DELTA and abs(dy) <= MAX_MOUSE_DELTA):
            raise InvalidAction(f"mouse deltas must lie within +-{MAX_MOUSE_DELTA:g} counts")
        with self._lock:
            self._mouse[0] += dx
            self._mouse[1] += dy
            self._last_push_s = now_s
            if seq > self._seq:
                outcome = SeqOutcome.NEWEST
            elif seq < self._seq - SEQ_REORDER_WINDOW:
                outcome = SeqOutcome.RESTART
            else:
                outcome = SeqOutcome.STALE
            if outcome is not SeqOutcome.STALE:
                self._seq = seq
                self._held = frozenset(keys)
            held, newest = self._held, self._seq
        if self.on_change is not None:
            self.on_change(held, newest, float(dx), float(dy), False)
        return outcome

    def sample(self, frames: int) -> ActionSample:
        """Take the state for the next chunk of `frames` frames; mouse movement is consumed."""
        with self._lock:
            held = {k: (k in self._held) for k in self.key_names}
            dx, dy = self._mouse
            self._mouse = [0.0, 0.0]
            seq = self._seq
        return ActionSample(
            keys=[dict(held) for _ in range(frames)],
            mouse=[(dx / frames, dy / frames)] * frames,
            seq=seq,
        )

    def new_client(self) -> None:
        """A new client connected: its seq numbering starts afresh, nothing is held."""
        with self._lock:
            self._seq = -1
            self._held = frozenset()
            self._mouse = [0.0, 0.0]
        if self.on_change is not None:
            self.on_change(frozenset(), -1, 0.0, 0.0, True)

    def release_all(self) -> None:
        """Release every key and drop pending mouse movement (e.g. when the client leaves)."""
        with self._lock:
            self._held = frozenset()
            self._mouse = [0.0, 0.0]
            seq = self._seq
        if self.on_change is not None:
            self.on_change(frozenset(), seq, 0.0, 0.0, True)

    def state(self) -> tuple[frozenset[str], int, tuple[float, float]]:
        """(held keys, newest seq, pending (dx, dy)) now."""
        with self._lock:
            return self._held, self._seq, (self._mouse[0], self._mouse[1])

    @property
    def last_seq(self) -> int:
        return self._seq

    @property
    def last_push_s(self) -> float | None:
        return self._last_push_s


class SessionInputs:
    """One session's inputs as the engine reads them: the `Conditioner` (`engine/rollout.py`) and
    `SessionSource` (`engine/engine_handle.py`) of a session.

    Holds the `ActionBuffer`, the input counter (`input_version`: accepted pushes), the flush epoch, the
    encoded conditioning with its version, and what `wants_frames` answers from (the session is ACTIVE,
    not paused, not cancelled). Written on the event loop (`push` by a transport's `ActionHandler`; the
    rest by the owning `Session`), read on the device thread; one lock guards the counters and flags, and
    `sample_chunk` reads the counter before the actions, so a chunk never claims an input it did not see.

    Args:
        session_id: the owner's id (error messages).
        model: the world model (`encode_action` and its key names).
        context: the session's encoded conditioning ({name: array}, `spec.conditioning.tensors`).
        clock: monotonic clock, s (each push's arrival time).
    """

    def __init__(self, session_id: str, *, model: WorldModel, context: Conditioning,
                 clock: Callable[[], float]) -> None:
        self.session_id = session_id
        self.model = model
        self.clock = clock
        self.actions = ActionBuffer(key_names=model.spec.actions.keys)
        #: the owner's listener, called on the pushing thread after each accepted push with its seq
        self.on_push: Callable[[int], None] | None = None
        #: the engine's listeners (`on_input`), called after `on_push`; replaced whole, so a push reads one tuple
        self._input_listeners: tuple[Callable[[], None], ...] = ()
        self._lock = threading.Lock()
        self._context = context
        self._context_version = 0  #: bumped on every conditioning change (models with a prompt cache re-cache)
        self._epoch = 0
        self._inputs = 0  #: accepted pushes (`input_version`)
        self._active = False
        self._paused = False
        self._cancelled = False
        self._closed = False

    # -- written on the event loop -----------------------------------------------------------------

    def push(self, seq: int, keys: list[str], mouse: tuple[float, float]) -> SeqOutcome:
        """Apply one validated action message (see `ActionBuffer.push`), count it, then tell `on_push` and
        then the `on_input` listeners (so an engine woken by one sees the session ACTIVE and the count).

        Returns:
            whether its keys were applied or it was stale (mouse movement only).

        Raises:
            InvalidAction: the message breaks the schema; nothing changes.
            SessionClosedError: the session is closed; nothing changes.
        """
        if self._closed:
            raise SessionClosedError(f"session {self.session_id} is closed")
        outcome = self.actions.push(seq, keys, mouse, now_s=self.clock())
        with self._lock:
            self._inputs += 1
        if self.on_push is not None:
            self.on_push(seq)
        for listener in self._input_listeners:
            listener()
        return outcome

    def on_input(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener()` after each accepted push (on the pushing thread, after `on_push`); any thread.

        For the engine that reads these inputs itself (`engine/local_engine.py`: its device worker's `wake`).
        It must be quick and must not raise. Returns the function that removes it (idempotent).
        """
        with self._lock:
            self._input_listeners = (*self._input_listeners, listener)

        def remove() -> None:
            with self._lock:
                rest = list(self._input_listeners)
                if listener in rest:
                    rest.remove(listener)
                self._input_listeners = tuple(rest)
        return remove

    def set_context(self, context: Conditioning) -> None:
        """Condition the next chunks on `context` (bumps `context_version`)."""
        with self._lock:
            self._context = context
            self._context_version += 1

    def new_epoch(self, *, cancel: bool = False) -> int:
        """Bump the flush epoch (with `cancel`: also stop generating until `resume`); returns the new epoch."""
        with self._lock:
            self._epoch += 1
            self._cancelled = self._cancelled or cancel
            return self._epoch

    def pause(self) -> None:
        with self._lock:
            self._paused = True

    def resume(self) -> None:
        """Undo `pause` and a cancelling `new_epoch`."""
        with self._lock:
            self._paused = self._cancelled = False

    def set_lifecycle(self, *, active: bool, closed: bool) -> None:
        """The owner's state changed: whether it is ACTIVE, whether it is CLOSED (pushes are refused from then)."""
        with self._lock:
            self._active, self._closed = active, closed

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    # -- read on the device thread (the engine's `Conditioner`) -----------------------------------------

    def sample_chunk(self, frames: int) -> ChunkInputs:
        """The freshest actions for the next `frames` pixel frames (float32 (frames, A)) and the conditioning;
        pending mouse movement is consumed."""
        with self._lock:
            inputs = self._inputs  # read before the actions: a chunk never claims an input it did not see
        s = self.actions.sample(frames)
        vecs = np.stack([self.model.encode_action(k, m) for k, m in zip(s.keys, s.mouse, strict=True)])
        with self._lock:
            return ChunkInputs(actions=vecs, context=self._context, action_seq=s.seq, epoch=self._epoch,
                               context_version=self._context_version, input_version=inputs)

    def current_epoch(self) -> int:
        with self._lock:
            return self._epoch

    def wants_frames(self) -> bool:
        """Whether the session should generate now: ACTIVE, not paused, not cancelled."""
        with self._lock:
            return self._active and not self._paused and not self._cancelled

    def input_version(self) -> int:
        """Actions pushed so far (each bumps it; the engine may start a chunk early on one)."""
        with self._lock:
            return self._inputs

    def conditioner_state(self) -> ConditionerState:
        """Everything `sample_chunk`, `current_epoch` and `wants_frames` answer from, at once (an engine
        in another process keeps a mirror of it: `engine/process/conditioner.py`)."""
        held, seq, mouse = self.actions.state()
        with self._lock:
            return ConditionerState(epoch=self._epoch, context_version=self._context_version, context=self._context,
                                    wants_frames=self._active and not self._paused and not self._cancelled,
                                    held=tuple(sorted(held)), seq=seq, mouse=mouse, input_version=self._inputs)
