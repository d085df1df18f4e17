"""Offline batched rollouts of TinyWorld, for training and evaluation.

The serving path uses the engine's ring-buffer state pool (`engine/state_pool.py`);
this is the same algorithm over a plain list of per-frame keys and values,
kept to the window plus sinks exactly as the pool does, so training,
evaluation and serving see the same attention pattern.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from worldcast.models.base import rectified_flow_update
from worldcast.models.tinyworld.network import (
    DRAW_PLANES,
    DenseAttention,
    TinyWorldConfig,
    TinyWorldDenoiser,
    carry_noise,
    frame_age_bias,
    noise_canvas_side,
)


class ListKV:
    """Per-frame (K, V) of a batch, trimmed to sink + rolling window frames."""

    def __init__(self, cfg: TinyWorldConfig) -> None:
        self.cfg = cfg
        self.frames: list[tuple[int, list[tuple[torch.Tensor, torch.Tensor]]]] = []

    def append(self, frame_index: int, kv: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.frames.append((frame_index, kv))
        sinks = [f for f in self.frames if f[0] < self.cfg.sink_frames]
        window = [f for f in self.frames if f[0] >= self.cfg.sink_frames][-self.cfg.window_frames :]
        self.frames = sinks + window

    def view(self) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
        """Per layer concatenated (K, V) (B, L, H, hd) and the int64 (L,) frame index per token."""
        T = self.cfg.tokens_per_frame
        kv = [
            (torch.cat([f[1][i][0] for f in self.frames], 1), torch.cat([f[1][i][1] for f in self.frames], 1))
            for i in range(self.cfg.layers)
        ]
        idx = torch.tensor([f[0] for f in self.frames for _ in range(T)], dtype=torch.long)
        return kv, idx


def _step(
    net: TinyWorldDenoiser,
    x: torch.Tensor,
    prev: torch.Tensor,
    t: float,
    action: torch.Tensor,
    prompt: torch.Tensor,
    frame_index: int,
    cache: ListKV,
    draw_noise: torch.Tensor | None = None,
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    cfg = net.cfg
    B, T = x.shape[0], cfg.tokens_per_frame
    q = torch.full((B, T), frame_index, dtype=torch.long)
    if cache.frames:
        kv, kidx = cache.view()
        kf = torch.cat([kidx[None].expand(B, -1), q], 1)
    else:
        kv, kf = None, q
    bias = frame_age_bias(q, kf, torch.ones_like(kf, dtype=torch.bool), cfg=cfg)
    tt = torch.full((B, 1), t)
    return net(x[:, None], prev[:, None], tt, action[:, None], prompt[:, None], DenseAttention(kv, bias),
               draw_noise=None if draw_noise is None else draw_noise[:, None])


@torch.no_grad()
def iter_rollout(
    net: TinyWorldDenoiser,
    z0: torch.Tensor,
    actions: Iterator[torch.Tensor],
    prompts: Iterator[torch.Tensor],
    *,
    timesteps: tuple[float, ...],
    generator: torch.Generator | None = None,
) -> Iterator[torch.Tensor]:
    """Generate frames one at a time after a given first frame, feeding the model its own outputs.

    Memory stays bounded however long it runs (the cache keeps sink + window frames).

    Args:
        net: the denoiser (run without grad).
        z0: (B, C, h, w) latent of frame 0 (committed as the sink).
        actions: (B, A) per frame; the first one produced frame 0.
        prompts: (B, P) per frame, in step with `actions`.
        timesteps: descending flow times of the sampler.
        generator: for the initial noise of each frame.

    Yields:
        (B, C, h, w) latents of frames 1, 2, ... while actions last.
    """
    cache = ListKV(net.cfg)
    acts, pros = iter(actions), iter(prompts)
    _, kv = _step(net, z0, z0, 0.0, next(acts), next(pros), 0, cache)
    cache.append(0, kv)
    prev, B = z0, z0.shape[0]
    side = noise_canvas_side(z0.shape[-1])
    noise = torch.zeros(B, DRAW_PLANES, side, side)  # the draw noise, carried with the camera as the engine does
    for i, (a, p) in enumerate(zip(acts, pros), start=1):
        x = torch.randn(z0.shape, generator=generator)
        noise = carry_noise(noise, x.flatten(1), a)
        for k, t in enumerate(timesteps):
            x0, _ = _step(net, x, prev, t, a, p, i, cache, noise)
            t_next = timesteps[k + 1] if k + 1 < len(timesteps) else 0.0
            x = rectified_flow_update(x, x0[:, 0].float(), torch.full((B,), t), torch.full((B,), t_next))
        x = x.clamp(-1, 1)  # the frame as shown, and as the engine commits it
        _, kv = _step(net, x, prev, 0.0, a, p, i, cache)
        cache.append(i, kv)
        prev = x
        yield x


@torch.no_grad()
def rollout_latents(
    net: TinyWorldDenoiser,
    z0: torch.Tensor,
    actions: torch.Tensor,
    prompts: torch.Tensor,
    *,
    timesteps: tuple[float, ...],
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """All N frames after a given first frame (see `iter_rollout`).

    Args:
        actions: (B, N + 1, A); actions[:, i] produced frame i.
        prompts: (B, N + 1, P) prompt embeddings per frame.

    Returns:
        (B, N, C, h, w) generated latents of frames 1..N.
    """
    frames = iter_rollout(net, z0, actions.unbind(1), prompts.unbind(1), timesteps=timesteps, generator=generator)
    return torch.stack(list(frames), 1)
