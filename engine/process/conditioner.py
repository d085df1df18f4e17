"""MirrorConditioner: an engine process's copy of one session's conditioning, fed by the server.

In its own process the device thread cannot ask the server's `SessionInputs`
for the freshest actions at each chunk start (a round trip per chunk, behind
the server's event loop). So the server pushes every change as it happens,
and the engine keeps a mirror that answers the `Conditioner` calls locally
(`InputDelta` and `ConditionerState` are defined beside `Conditioner` in
`engine/rollout.py`: an in-process engine's handle is told of them too):

- `InputDelta`: after every change of the session's action buffer
  (`sessions/actions.py`): the held keys and newest seq as the buffer decided
  them, and the mouse movement to add (a delta: movement is summed until a
  chunk samples it, as the buffer does);
- `ConditionerState`: epoch, whether the session wants frames, and the
  encoded conditioning with its version (the arrays only when the version
  changed), after every flush, cancel, pause, resume, prompt or state change.

The mirror counts the inputs it is pushed (`input_version`: every `InputDelta`
that is not a `clear` is one action message), so a chunk can start early on a
fresh input in an engine process as in the server's (`engine/step_scheduler.py`).

`sample_chunk` then does what `SessionInputs.sample_chunk` (`sessions/actions.py`) does: held keys for
every frame, the summed movement split evenly over the chunk's frames
(consumed), each frame's action through the model's `encode_action`.
Flush guarantees stay with the server: it drops frames of an older epoch
at delivery (`Session.deliver`), so a mirror that learns of a flush a
message later only costs that chunk's compute.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np

from worldcast.engine.rollout import ChunkInputs, ConditionerState, InputDelta
from worldcast.models.base import WorldModel


class MirrorConditioner:
    """A `Conditioner` answered from pushed state (thread-safe: fed by the command thread, read by the
    device thread).

    Args:
        model: the engine's model (`encode_action`, the key names).
        state: the session's full state (its `context` must be given).

    Raises:
        ValueError: `state.context` is None.
    """

    def __init__(self, model: WorldModel, state: ConditionerState) -> None:
        if state.context is None:
            raise ValueError("a mirror starts from a full state (context given)")
        self.model = model
        self._keys = model.spec.actions.keys
        self._lock = threading.Lock()
        self._state = state
        self._mouse = list(state.mouse)

    # -- fed by the server ---------------------------------------------------------------------

    def update(self, state: ConditionerState) -> None:
        """Take a new epoch / wants / conditioning (the context kept when `state.context` is None; the
        input counter is the mirror's own)."""
        with self._lock:
            ctx = state.context if state.context is not None else self._state.context
            self._state = replace(self._state, epoch=state.epoch, wants_frames=state.wants_frames,
                                  context_version=state.context_version, context=ctx)

    def push(self, delta: InputDelta) -> None:
        """Apply one input change."""
        with self._lock:
            if delta.clear:
                self._mouse = [0.0, 0.0]
            self._mouse[0] += delta.mouse[0]
            self._mouse[1] += delta.mouse[1]
            inputs = self._state.input_version + (0 if delta.clear else 1)
            self._state = replace(self._state, held=tuple(delta.held), seq=delta.seq, input_version=inputs)

    # -- Conditioner (device thread) ----------------------------------------------------------------

    def sample_chunk(self, frames: int) -> ChunkInputs:
        with self._lock:  # one lock: the counter and the actions it claims are read together
            st = self._state
            dx, dy = self._mouse
            self._mouse = [0.0, 0.0]
        held = {k: (k in st.held) for k in self._keys}
        m = (dx / frames, dy / frames)
        vecs = np.stack([self.model.encode_action(dict(held), m) for _ in range(frames)])
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
            return replace(self._state, mouse=(self._mouse[0], self._mouse[1]))
