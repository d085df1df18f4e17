"""ActionBuffer: a session's latest input state, sampled once per chunk.

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
(`engine/engine_conditioner.py`), fed through `on_change`.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from worldcast.sessions.errors import InvalidAction

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
