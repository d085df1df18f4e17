"""SessionConditioner: the one owner of a session's inputs, on the engine, whichever kind of engine it is.

The server sends an engine the same messages whether the engine runs on a
thread of the server's process (`engine/local_engine.py`) or in a process of
its own (`engine/process/`): `engine/messages.py`. Two of them carry inputs,
and this class keeps what they say, so the device thread answers a
rollout's `Conditioner` calls (`engine/rollout.py`) without asking the
server anything:

- `InputDelta` (`PushInput`), one per accepted action message and one when a
  client comes or goes: the held keys and the positions of the absolute axes
  (None: unchanged; the server's action gate, `sessions/actions.py`, decided
  the message was a reordered, older one, so only its movement counts), the
  newest seq, and the movement of relative axes to add. Held keys and
  positions are state; movement is summed per axis until a chunk samples it
  (`ActionSpace.axis_values` spreads it over the chunk's frames).
- `ConditionerState` (`AddSession`, `UpdateSession`): the flush epoch,
  whether the session wants frames, and the encoded conditioning with its
  version (the arrays only when the version changed). These are what the
  user asked of the session (flush, cancel, pause, a prompt), decided by the
  server and applied here at the next step boundary.

The conditioner counts the inputs it is pushed (`input_version`: every
`InputDelta` that is not a `clear` is one action message), so a chunk can
start early on a fresh input (`engine/step_scheduler.py`). A move carries
its whole state (`conditioner_state`, in the session's state bytes:
`engine/session_state.py`).

Flush guarantees stay with the server: it drops frames of an older epoch at
delivery (`FramePipeline.is_current`, `sessions/frames.py`), so an engine that learns of a flush a message
later only costs that chunk's compute.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

import numpy as np

from worldcast.engine.rollout import ChunkInputs
from worldcast.models.base import WorldModel
from worldcast.models.spec import Conditioning


@dataclass(frozen=True)
class InputDelta:
    """One change of a session's inputs (`PushInput`).

    Attributes:
        held: names of the keys held now; None: unchanged (a reordered, older message: movement only).
        seq: the newest applied action seq (-1: none).
        moves: (relative axis, movement) pairs to add to the pending movement, wire units.
        positions: (absolute axis, position) for every absolute axis, wire units; None: unchanged (with `held`).
        clear: drop the pending movement before adding `moves` (a new client, or every key released); not
            counted as an input.
    """

    held: tuple[str, ...] | None
    seq: int
    moves: tuple[tuple[str, float], ...] = ()
    positions: tuple[tuple[str, float], ...] | None = None
    clear: bool = False


@dataclass(frozen=True)
class ConditionerState:
    """What a session's conditioner answers, as one value.

    Attributes:
        epoch: the flush epoch.
        wants_frames: whether the session should generate now.
        context_version: bumped on every conditioning change.
        context: the encoded conditioning ({name: array}); None in an update whose version did not change.
        held: keys held now.
        seq: newest applied action seq (-1: none).
        moves: (relative axis, movement) pending, not yet sampled by a chunk, wire units.
        positions: (absolute axis, position) given by the newest message, wire units (absent: at rest).
        input_version: actions pushed so far (`Conditioner.input_version`).
    """

    epoch: int
    wants_frames: bool
    context_version: int
    context: Conditioning | None
    held: tuple[str, ...] = ()
    seq: int = -1
    moves: tuple[tuple[str, float], ...] = ()
    positions: tuple[tuple[str, float], ...] = ()
    input_version: int = 0


class SessionConditioner:
    """A session's inputs on its engine, and its `Conditioner` (thread-safe: fed by the thread that applies the
    server's messages, read by the device thread).

    Args:
        model: the engine's model (`encode_action`, its `spec.actions`).
        state: the session's full state (its `context` must be given).

    Raises:
        ValueError: `state.context` is None.
    """

    def __init__(self, model: WorldModel, state: ConditionerState) -> None:
        if state.context is None:
            raise ValueError("a session's conditioner starts from a full state (context given)")
        self.model = model
        self._space = model.spec.actions
        self._lock = threading.Lock()
        self._state = state
        self._moves = dict(state.moves)

    # -- applied from the server's messages ------------------------------------------------------------

    def update(self, state: ConditionerState) -> None:
        """Take a new epoch / wants / conditioning (the context kept when `state.context` is None; held keys,
        movement and the input counter are this conditioner's own and stay)."""
        with self._lock:
            ctx = state.context if state.context is not None else self._state.context
            self._state = replace(self._state, epoch=state.epoch, wants_frames=state.wants_frames,
                                  context_version=state.context_version, context=ctx)

    def push(self, delta: InputDelta) -> None:
        """Apply one input change."""
        with self._lock:
            if delta.clear:
                self._moves = {}
            for name, v in delta.moves:
                self._moves[name] = self._moves.get(name, 0.0) + v
            inputs = self._state.input_version + (0 if delta.clear else 1)
            held = self._state.held if delta.held is None else tuple(delta.held)
            positions = self._state.positions if delta.positions is None else tuple(delta.positions)
            self._state = replace(self._state, held=held, positions=positions, seq=delta.seq,
                                  input_version=inputs)

    # -- Conditioner (device thread) --------------------------------------------------------------------

    def sample_chunk(self, frames: int) -> ChunkInputs:
        """The freshest actions for the next `frames` pixel frames (float32 (frames, A): held keys and axis
        positions on every frame, the pending movement spread evenly over them and consumed:
        `ActionSpace.axis_values`) and the conditioning."""
        with self._lock:  # one lock: the counter and the actions it claims are read together
            st = self._state
            moves, self._moves = self._moves, {}
        held = {k: (k in st.held) for k in self._space.keys}
        axes = self._space.axis_values(moves, dict(st.positions), frames)
        vec = np.asarray(self.model.encode_action(held, axes), dtype=np.float32)
        vecs = np.repeat(vec[None], frames, axis=0)
        assert st.context is not None
        return ChunkInputs(actions=vecs, context=st.context, action_seq=st.seq, epoch=st.epoch,
                           context_version=st.context_version, input_version=st.input_version)

    def current_epoch(self) -> int:
        with self._lock:
            return self._state.epoch

    def wants_frames(self) -> bool:
        with self._lock:
            return self._state.wants_frames

    def input_version(self) -> int:
        with self._lock:
            return self._state.input_version

    def conditioner_state(self) -> ConditionerState:
        """The whole state, pending movement included (what a move carries)."""
        with self._lock:
            return replace(self._state, moves=tuple(sorted(self._moves.items())))
