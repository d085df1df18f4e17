"""Self-Forcing's few-step sampler for one chunk, as pure functions over explicit state.

Flow matching with x_t = (1 - sigma) x0 + sigma eps and sigma = t / 1000
(Wan's `FlowMatchScheduler`); the network predicts the flow v = eps - x0, so
x0 = x_t - sigma v. Between denoising steps Self-Forcing re-noises the x0
prediction with FRESH noise at the next timestep (`pipeline/causal_inference.py`:
`scheduler.add_noise(denoised_pred, randn_like(...), next_timestep)`), and
after the last step runs the clean chunk once more at t = context_noise (0)
to write its keys and values: the commit pass.

The references look each step's sigma up as the entry of their float32
1000-entry table nearest its timestep (schedule.py), so the time embedding
sees `cfg.timesteps` and the x0 conversion and re-noising use
`cfg.flow_times`; `x0_from_sigma` / `renoise_sigma` take those sigmas.
`flow_to_x0` / `renoise` take a timestep and use t / 1000 (for tests against
diffusers' modules, which have no table).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from worldcast.models.causal_wan.dense_attention import DenseSelfAttention
from worldcast.models.causal_wan.dit import KV, CausalWanDiT


def _sigma(t: torch.Tensor, x: torch.Tensor, num_train_timesteps: int) -> torch.Tensor:
    """Timesteps (B,) or (B, F) -> sigma broadcastable to x (B, C, F, H, W), float64."""
    s = t.to(torch.float64) / num_train_timesteps
    return s.view(-1, 1, 1, 1, 1) if s.dim() == 1 else s[:, None, :, None, None]


def flow_to_x0(
    flow: torch.Tensor, x_t: torch.Tensor, t: torch.Tensor, *, num_train_timesteps: int = 1000
) -> torch.Tensor:
    """x0 = x_t - sigma * flow, computed in float64, returned in x_t's dtype.

    Args:
        flow: (B, C, F, H, W) flow prediction. x_t: the same shape, the input at t.
        t: (B,) or (B, F) timesteps in [0, num_train_timesteps].
    """
    s = _sigma(t, x_t, num_train_timesteps)
    return (x_t.to(torch.float64) - s * flow.to(torch.float64)).to(x_t.dtype)


def _bcast(s: torch.Tensor) -> torch.Tensor:
    s = s.to(torch.float64)
    return s.view(-1, 1, 1, 1, 1) if s.dim() == 1 else s[:, None, :, None, None]


def x0_from_sigma(flow: torch.Tensor, x_t: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """x0 = x_t - sigma * flow in float64, returned in x_t's dtype (the references' `_convert_flow_pred_to_x0`).

    Args:
        flow, x_t: (B, C, F, H, W). sigma: (B,) or (B, F) noise levels in [0, 1].
    """
    return (x_t.to(torch.float64) - _bcast(sigma) * flow.to(torch.float64)).to(x_t.dtype)


def renoise_sigma(x0: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """x = (1 - sigma) x0 + sigma noise (the references' `add_noise`), computed in float64, in x0's dtype."""
    s = _bcast(sigma)
    return ((1 - s) * x0.to(torch.float64) + s * noise.to(torch.float64)).to(x0.dtype)


def renoise(x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor, *, num_train_timesteps: int = 1000) -> torch.Tensor:
    """x_t = (1 - sigma) x0 + sigma noise at timesteps t (B,) or (B, F); in x0's dtype."""
    s = _sigma(t, x0, num_train_timesteps)
    return ((1 - s) * x0.to(torch.float64) + s * noise.to(torch.float64)).to(x0.dtype)


@torch.no_grad()
def generate_chunk(
    dit: CausalWanDiT,
    noise: torch.Tensor,
    cross_kv: list[KV],
    attn: DenseSelfAttention,
    frame_offset: torch.Tensor,
    *,
    generator: torch.Generator | None = None,
    noise_fn: Callable[[tuple[int, ...]], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, list[KV]]:
    """Denoise one chunk over `dit.cfg.timesteps`, then run the commit pass and commit it into `attn`.

    Reference loop (one generator for the batch; the engine gives each session its own).

    Args:
        noise: (B, C, F, h, w) initial noise. cross_kv: the prompts' cache.
        attn: the sessions' dense self-attention state (updated: the chunk is committed).
        frame_offset: int64 (B,) first latent frame of the chunk.
        generator: source of the fresh noise between steps.
        noise_fn: draws the fresh noise of a given shape instead (e.g. a reference's recorded draws).

    Returns:
        x0 (B, C, F, h, w) of the chunk, and the per-layer K, V the commit pass wrote.
    """
    cfg = dit.cfg
    B, Fn = noise.shape[0], noise.shape[2]
    attn.begin_chunk(frame_offset, Fn)
    x = noise
    ts, sig = cfg.timesteps, cfg.flow_times
    x0 = x
    for i, t in enumerate(ts):
        tt = torch.full((B,), t, dtype=torch.float64, device=x.device)
        out = dit(x, tt, frame_offset, cross_kv, attn)
        assert out.flow is not None
        x0 = x0_from_sigma(out.flow, x, torch.full((B,), sig[i], dtype=torch.float64, device=x.device))
        if i + 1 < len(ts):
            if noise_fn is not None:
                fresh = noise_fn(tuple(x0.shape)).to(x0.dtype)
            else:
                fresh = torch.randn(x0.shape, generator=generator, dtype=torch.float32, device=x0.device).to(x0.dtype)
            x = renoise_sigma(x0, fresh, torch.full((B,), sig[i + 1], dtype=torch.float64, device=x.device))
    tc = torch.full((B,), cfg.context_noise, dtype=torch.float64, device=x.device)
    kv = dit(x0, tc, frame_offset, cross_kv, attn, kv_only=True).kv
    attn.commit(kv)
    return x0, kv
