"""Shared test helpers: a fake clock and a scripted conditioner (stand-ins for time and a session)."""

from __future__ import annotations

import threading

import numpy as np

from worldcast.engine.rollout import ChunkInputs
from worldcast.models.tinyworld import world


class FakeClock:
    """A monotonic clock that moves only when told, s."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now = start_s

    def __call__(self) -> float:
        return self.now

    def advance(self, dt_s: float) -> None:
        self.now += dt_s


class ScriptedConditioner:
    """A Conditioner whose actions, prompt and flags the test sets directly (thread-safe)."""

    def __init__(self, prompt: np.ndarray | None = None, keys: dict[str, bool] | None = None) -> None:
        self.prompt = prompt if prompt is not None else np.eye(384, dtype=np.float32)[0]
        self.keys = keys or {}
        self.epoch = 0
        self.active = True
        self.seq = -1
        self.samples = 0
        self.lock = threading.Lock()

    def sample_chunk(self, frames: int) -> ChunkInputs:
        with self.lock:
            self.samples += 1
            a = np.stack([world.action_vector(self.keys) for _ in range(frames)])
            return ChunkInputs(actions=a, prompt=self.prompt, action_seq=self.seq, epoch=self.epoch)

    def current_epoch(self) -> int:
        with self.lock:
            return self.epoch

    def wants_frames(self) -> bool:
        with self.lock:
            return self.active
