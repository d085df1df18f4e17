"""The world-model interface the engine drives.

A `WorldModel` is stateless across sessions: every call takes the session
state it needs (latents, cache views) as arguments, batched over sessions.
The engine owns the caches and the loop; see `engine/rollout.py`.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

import numpy as np
import torch

from worldcast.models.spec import WorldModelSpec


@dataclass
class KVView:
    """A batch of sessions' cached keys and values, as the model reads them.

    Attributes:
        kv: per layer (K, V), each (B, H, L, hd); L is the cache capacity in
            tokens (empty slots are marked by `k_valid`).
        k_frame: int64 (B, L) absolute frame index of each cached token.
        k_valid: bool (B, L) whether the slot holds a committed token.
    """

    kv: list[tuple[torch.Tensor, torch.Tensor]]
    k_frame: torch.Tensor
    k_valid: torch.Tensor


@dataclass
class ChunkConditioning:
    """Conditioning of one chunk of a batch of sessions.

    Attributes:
        action: float32 (B, F, A) action vectors, one per frame.
        prompt: float32 (B, F, P) prompt embeddings, one per frame.
        frame_index: int64 (B, F) absolute index of each frame in its session.
    """

    action: torch.Tensor
    prompt: torch.Tensor
    frame_index: torch.Tensor


class WorldModel(abc.ABC):
    """A causal video world model: batched denoise, commit, decode.

    Subclasses set `spec` and implement the methods below. Latents are
    float32 (B, F, C, h, w) with (C, h, w) = spec.latent_shape.
    """

    spec: WorldModelSpec
    device: torch.device

    @abc.abstractmethod
    def encode_prompt(self, text: str) -> np.ndarray:
        """Prompt text -> float32 (spec.prompt_dim,) embedding."""

    @abc.abstractmethod
    def encode_action(self, keys: dict[str, bool], mouse: tuple[float, float]) -> np.ndarray:
        """Held keys and accumulated mouse counts -> float32 (spec.actions.dim,)."""

    @abc.abstractmethod
    def initial_frame(self, *, seed: int, prompt_embedding: np.ndarray) -> np.ndarray:
        """The first frame a session starts from: uint8 (H, W, 3) RGB."""

    @abc.abstractmethod
    def encode_frames(self, frames: torch.Tensor) -> torch.Tensor:
        """uint8 (B, F, H, W, 3) -> latents (B, F, C, h, w)."""

    @abc.abstractmethod
    def denoise(
        self, x_t: torch.Tensor, prev: torch.Tensor, t: torch.Tensor, cond: ChunkConditioning, cache: KVView
    ) -> torch.Tensor:
        """One denoising step's prediction of the clean chunk.

        Args:
            x_t: (B, F, C, h, w) noisy latents at flow time `t`.
            prev: (B, C, h, w) last committed latent of each session.
            t: float32 (B,) flow time of each session's step.
            cond: the chunk's conditioning.
            cache: the sessions' KV caches.

        Returns:
            (B, F, C, h, w) predicted clean latents.
        """

    @abc.abstractmethod
    def commit(
        self, x0: torch.Tensor, prev: torch.Tensor, cond: ChunkConditioning, cache: KVView
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Keys and values of a finished chunk, for the engine to append.

        Returns:
            per layer (K, V), each (B, H, F*T, hd).
        """

    @abc.abstractmethod
    def decode(self, x0: torch.Tensor) -> torch.Tensor:
        """Latents (B, F, C, h, w) -> uint8 frames (B, F, H, W, 3) RGB."""


def rectified_flow_update(x_t: torch.Tensor, x0: torch.Tensor, t: torch.Tensor, t_next: torch.Tensor) -> torch.Tensor:
    """Deterministic rectified-flow (DDIM-like) step from flow time t to t_next < t.

    With x_t = (1 - t) x0 + t eps, the implied noise is eps = (x_t - (1 - t) x0) / t,
    and x_{t_next} = (1 - t_next) x0 + t_next eps (Liu et al. 2022, "Flow
    Straight and Fast"; Song et al. 2021, DDIM). t_next = 0 returns x0.

    Args:
        x_t: (B, ...) latents; x0: (B, ...) predicted clean latents;
        t, t_next: float32 (B,) flow times.
    """
    shape = (-1,) + (1,) * (x_t.dim() - 1)
    t = t.reshape(shape).clamp_min(1e-6)
    t_next = t_next.reshape(shape)
    eps = (x_t - (1 - t) * x0) / t
    return (1 - t_next) * x0 + t_next * eps
