"""StatePool: every session's declared state, in fixed slots of preallocated tensors.

A model declares its per-session state (`models/spec.py`: attention rings,
frame rings, fixed tensors such as a decoder cache or a prompt's
cross-attention cache). The pool allocates, for each declared tensor, one
tensor with a leading slot axis, `(S, *shape)`, once, within a byte budget:
S = budget // (bytes of one session's whole declared state), so a session is
admitted only with all of its state, and nothing is allocated mid-chunk.

Reads are in place: a model call gets a `PoolView` of its batch's slots;
attention indexes the pool's ring tensors by slot (no gather per step), and a
world memory is read the same way, only the cells a chunk needs.
Writes happen only in `apply`, which the engine calls when a chunk commits:
one indexed copy per tensor (per layer for rings) for the whole batch.

Ring positions: latent frame j lives at position j if j < sink, else at
sink + (j - sink) % window (`models.spec.ring_position`), overwriting the
frame `window` older; memory never grows with session age.

Slots are allocated and freed on the device thread only (`DeviceWorker`);
other threads read `free_slots` / `used_bytes`, which are plain ints.
"""

from __future__ import annotations

import logging

import torch

from worldcast.engine.errors import StatePoolExhausted
from worldcast.models.base import FrameWrite, MemoryWrite, Replace, RingWrite, StateUpdates
from worldcast.models.spec import AttentionRingSpec, FrameRingSpec, StateSpec, TensorStateSpec, WorldMemorySpec

logger = logging.getLogger(__name__)


class StatePool:
    """Fixed-budget pool of every session's declared state, one slot per session.

    Args:
        states: the model's declared state (`WorldModelSpec.states`).
        budget_bytes: bytes of all slots of all states together.
        device: where the state lives.

    Raises:
        ValueError: the budget does not fit one session's whole state.
    """

    def __init__(self, states: tuple[StateSpec, ...], *, budget_bytes: int,
                 device: str | torch.device = "cpu") -> None:
        self.states = {s.name: s for s in states}
        self.device = torch.device(device)
        self.slot_bytes = sum(s.bytes_per_session() for s in states)
        if self.slot_bytes <= 0:
            raise ValueError("a model must declare some per-session state")
        self.num_slots = budget_bytes // self.slot_bytes
        if self.num_slots < 1:
            raise ValueError(f"state budget {budget_bytes} B is below one session's {self.slot_bytes} B "
                             f"({', '.join(f'{s.name}: {s.bytes_per_session()} B' for s in states)})")
        #: state name -> tensor name -> (S, *shape)
        self.tensors: dict[str, dict[str, torch.Tensor]] = {
            s.name: {t: self._blank((self.num_slots, *shape), dtype) for t, (shape, dtype) in s.tensors().items()}
            for s in states
        }
        self._free = list(range(self.num_slots - 1, -1, -1))
        self._owner: dict[str, int] = {}
        self.used_slots = 0  #: slots held (a plain int other threads may read)

    def _blank(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if dtype == torch.int64:  # frame indices: -1 marks an empty position
            return torch.full(shape, -1, dtype=dtype, device=self.device)
        return torch.zeros(shape, dtype=dtype, device=self.device)

    # -- allocation ------------------------------------------------------------------

    @property
    def budget_bytes(self) -> int:
        return self.num_slots * self.slot_bytes

    @property
    def used_bytes(self) -> int:
        return self.used_slots * self.slot_bytes

    @property
    def free_slots(self) -> int:
        return self.num_slots - self.used_slots

    def allocate(self, session_id: str) -> int:
        """Give `session_id` a blank slot (every state zeroed, rings empty) and return its index.

        Raises:
            StatePoolExhausted: every slot is taken.
            ValueError: the session already holds a slot.
        """
        if session_id in self._owner:
            raise ValueError(f"session {session_id} already holds state slot {self._owner[session_id]}")
        if not self._free:
            raise StatePoolExhausted(f"all {self.num_slots} state slots in use ({self.budget_bytes} B budget, "
                                     f"{self.slot_bytes} B per session)")
        slot = self._free.pop()
        for ts in self.tensors.values():
            for t in ts.values():
                t[slot] = -1 if t.dtype == torch.int64 else 0
        self._owner[session_id] = slot
        self.used_slots = len(self._owner)
        return slot

    def free(self, session_id: str) -> None:
        """Return the session's slot to the pool (idempotent)."""
        slot = self._owner.pop(session_id, None)
        if slot is not None:
            self._free.append(slot)
            self.used_slots = len(self._owner)

    def holds(self, session_id: str) -> bool:
        """Whether the session holds a slot."""
        return session_id in self._owner

    # -- reads -------------------------------------------------------------------------

    def view(self, slots: list[int] | tuple[int, ...], slots_device: torch.Tensor | None = None) -> PoolView:
        """The state of `slots` as one batch, for a model call (see `models.base.StateView`)."""
        return PoolView(self, tuple(slots), slots_device)

    def snapshot(self, slot: int) -> dict[str, dict[str, torch.Tensor]]:
        """Copies of every tensor of one slot, for tests and debugging."""
        return {n: {t: x[slot].clone() for t, x in ts.items()} for n, ts in self.tensors.items()}

    # -- writes ------------------------------------------------------------------------

    def apply(self, view: PoolView, updates: StateUpdates) -> None:
        """Write a batch's updates into its slots: one indexed copy per tensor (per layer for rings).

        Raises:
            KeyError: an update names a state the model did not declare.
            TypeError: the update's kind does not fit the declared state.
        """
        slots = view.slots
        for name, u in updates.items():
            spec = self.states.get(name)
            if spec is None:
                raise KeyError(f"update of undeclared state {name!r}; declared: {sorted(self.states)}")
            ts = self.tensors[name]
            if isinstance(spec, AttentionRingSpec) and isinstance(u, RingWrite):
                pos = self._positions(u.frames, spec.sink_frames, spec.window_frames)  # (B, F)
                T = spec.tokens_per_frame
                tok = (pos[:, :, None] * T + torch.arange(T, device=self.device)).flatten(1)  # (B, F*T)
                for layer, (k, v) in enumerate(zip(u.k, u.v, strict=True)):
                    ts["k"][:, layer][slots[:, None], tok] = k.to(ts["k"].dtype)
                    ts["v"][:, layer][slots[:, None], tok] = v.to(ts["v"].dtype)
                ts["frame"][slots[:, None], pos] = u.frames.to(self.device)
            elif isinstance(spec, FrameRingSpec) and isinstance(u, FrameWrite):
                pos = self._positions(u.frames, spec.sink_frames, spec.window_frames)
                ts["data"][slots[:, None], pos] = u.data.to(ts["data"].dtype)
                ts["frame"][slots[:, None], pos] = u.frames.to(self.device)
            elif isinstance(spec, WorldMemorySpec) and isinstance(u, MemoryWrite):
                n = spec.side * spec.side
                cells = u.cells.to(self.device)
                ts["canvas"].view(-1, n, spec.channels)[slots[:, None], cells] = u.values.to(torch.uint8)
                ts["tag"].view(-1, n)[slots[:, None], cells] = u.tags.to(torch.int32)
            elif isinstance(spec, TensorStateSpec) and isinstance(u, Replace):
                ts["data"][slots] = u.data.to(ts["data"].dtype)
            else:
                raise TypeError(f"state {name!r} is a {type(spec).__name__}; cannot apply a {type(u).__name__}")

    def _positions(self, frames: torch.Tensor, sink: int, window: int) -> torch.Tensor:
        f = frames.to(self.device)
        return torch.where(f < sink, f, sink + (f - sink).remainder(window))


class PoolView:
    """A batch of slots of a `StatePool`, as a model reads it (implements `models.base.StateView`).

    Rings are the pool's own tensors (read in place through `slots`); fixed
    tensors of one session, or of a contiguous run of slots, are views; others
    are gathered.
    """

    def __init__(self, pool: StatePool, slots_host: tuple[int, ...], slots: torch.Tensor | None = None) -> None:
        self.pool = pool
        self._slots_host = slots_host
        self._slots = slots if slots is not None else torch.tensor(slots_host, dtype=torch.int64, device=pool.device)

    @property
    def batch(self) -> int:
        return len(self._slots_host)

    @property
    def slots(self) -> torch.Tensor:
        return self._slots

    @property
    def slots_host(self) -> tuple[int, ...]:
        return self._slots_host

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        s = self._slots_host
        if s == tuple(range(s[0], s[0] + len(s))):
            return x[s[0]:s[0] + len(s)]  # a view
        return x.index_select(0, self._slots)

    def ring(self, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        ts = self.pool.tensors[name]
        return ts["k"], ts["v"], ts["frame"]

    def memory(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        ts = self.pool.tensors[name]
        return ts["canvas"], ts["tag"]

    def tensor(self, name: str) -> torch.Tensor:
        return self._rows(self.pool.tensors[name]["data"])

    def frames(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        ts = self.pool.tensors[name]
        return self._rows(ts["data"]), self._rows(ts["frame"])
