"""KVPool: per-session KV caches as fixed slots of one preallocated ring buffer.

Each session owns one slot: `sink_frames` attention-sink frames (its first
frames, kept forever) and a ring of `window_frames` frames. A frame with
absolute index i >= sink_frames lands in ring position
sink_frames + (i - sink_frames) % window_frames, overwriting the oldest
frame: eviction copies nothing, memory is fixed at allocation, and the
absolute index is stored beside each frame, so the model can compute
relative ages at read time and positions never run out.

Memory: 2 x layers x slots x heads x (sink + window) x tokens_per_frame x
head_dim x dtype bytes, allocated once. Slot count = budget // per-session bytes.
"""

from __future__ import annotations

import logging

import torch

from worldcast.engine.errors import KVPoolExhausted
from worldcast.models.base import KVView
from worldcast.models.spec import KVGeometry

logger = logging.getLogger(__name__)


class KVPool:
    """Fixed-budget pool of ring-buffer KV caches, one slot per session.

    Args:
        geometry: the model's KV geometry.
        budget_bytes: bytes for keys and values of all slots together.
        device: where the caches live.
        dtype: cache dtype (float32 on CPU; bfloat16 is the GPU choice).

    Raises:
        ValueError: the budget does not fit a single session.
    """

    def __init__(
        self,
        geometry: KVGeometry,
        *,
        budget_bytes: int,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.geometry = geometry
        self.device = torch.device(device)
        self.dtype = dtype
        per = geometry.bytes_per_session(torch.empty((), dtype=dtype).element_size())
        self.slot_bytes = per
        self.num_slots = budget_bytes // per
        if self.num_slots < 1:
            raise ValueError(f"KV budget {budget_bytes} B is below one session's {per} B")
        g = geometry
        shape = (g.layers, self.num_slots, g.heads, g.capacity_tokens, g.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=self.device)
        self.v = torch.zeros(shape, dtype=dtype, device=self.device)
        #: absolute frame index held by each frame position of each slot, -1 when empty: (slots, sink + window)
        self.frame_index = torch.full((self.num_slots, g.capacity_frames), -1, dtype=torch.long, device=self.device)
        self._free = list(range(self.num_slots - 1, -1, -1))
        self._owner: dict[str, int] = {}

    # -- allocation ------------------------------------------------------------------

    @property
    def budget_bytes(self) -> int:
        return self.num_slots * self.slot_bytes

    @property
    def used_bytes(self) -> int:
        return len(self._owner) * self.slot_bytes

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def allocate(self, session_id: str) -> int:
        """Give `session_id` an empty slot and return its index.

        Raises:
            KVPoolExhausted: every slot is taken.
            ValueError: the session already holds a slot.
        """
        if session_id in self._owner:
            raise ValueError(f"session {session_id} already holds KV slot {self._owner[session_id]}")
        if not self._free:
            raise KVPoolExhausted(f"all {self.num_slots} KV slots in use ({self.budget_bytes} B budget)")
        slot = self._free.pop()
        self.frame_index[slot] = -1
        self._owner[session_id] = slot
        return slot

    def free(self, session_id: str) -> None:
        """Return the session's slot to the pool (idempotent)."""
        slot = self._owner.pop(session_id, None)
        if slot is not None:
            self.frame_index[slot] = -1
            self._free.append(slot)

    def slot_of(self, session_id: str) -> int:
        return self._owner[session_id]

    # -- reads and writes --------------------------------------------------------------

    def position(self, frame_index: int) -> int:
        """Frame position within a slot for absolute frame `frame_index`."""
        g = self.geometry
        if frame_index < g.sink_frames:
            return frame_index
        return g.sink_frames + (frame_index - g.sink_frames) % g.window_frames

    def append(self, slot: int, frame_indices: list[int], kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Write a committed chunk's keys and values into `slot`.

        Args:
            slot: the session's slot.
            frame_indices: absolute index of each of the chunk's F frames.
            kv: per layer (K, V), each (H, F*T, hd) for this one session.
        """
        T = self.geometry.tokens_per_frame
        for f, idx in enumerate(frame_indices):
            p = self.position(idx)
            for layer, (k, v) in enumerate(kv):
                self.k[layer, slot, :, p * T : (p + 1) * T] = k[:, f * T : (f + 1) * T]
                self.v[layer, slot, :, p * T : (p + 1) * T] = v[:, f * T : (f + 1) * T]
            self.frame_index[slot, p] = idx

    def view(self, slots: list[int]) -> KVView:
        """The caches of `slots` as one batch (a copy when more than one slot)."""
        T = self.geometry.tokens_per_frame
        if len(slots) == 1:
            s = slots[0]
            kv = [(self.k[i, s : s + 1], self.v[i, s : s + 1]) for i in range(self.geometry.layers)]
            fi = self.frame_index[s : s + 1]
        else:
            idx = torch.tensor(slots, device=self.device)
            kv = [(self.k[i].index_select(0, idx), self.v[i].index_select(0, idx)) for i in range(self.geometry.layers)]
            fi = self.frame_index.index_select(0, idx)
        k_frame = fi.repeat_interleave(T, dim=1)  # (B, L)
        return KVView(kv=kv, k_frame=k_frame, k_valid=k_frame >= 0)

    def snapshot(self, slot: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Copies of one slot's (K, V, frame_index), for tests and debugging."""
        return self.k[:, slot].clone(), self.v[:, slot].clone(), self.frame_index[slot].clone()
