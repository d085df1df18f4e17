"""Self-Forcing's few-step sampler for one chunk, as pure functions over explicit state.

Flow matching with x_t = (1 - sigma) x0 + sigma eps and sigma = t / 1000
(Wan's `FlowMatchScheduler`); the network predicts the flow v = eps - x0, so
x0 = x_t - sigma v. Between denoising steps Self-Forcing re-noises the x0
prediction with FRESH noise at the next timestep (`pipeline/causal_inference.py`:
`scheduler.add_noise(denoised_pred, randn_like(...), next_timestep)`), and
after the last step runs the clean chunk once more at t = context_noise (0)
to write its keys and values: the commit pass.

(Self-Forcing looks sigma up as the nearest entry of its 1000-entry table;
for the warped timesteps that entry is exactly t / 1000. Only its t = 0 commit
pass differs (it finds 4.98 / 1000), and that pass's x0 is never used.)
"""

from __future__ import annotations

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
) -> tuple[torch.Tensor, list[KV]]:
    """Denoise one chunk over `dit.cfg.timesteps`, then run the commit pass and commit it into `attn`.

    Reference loop (one generator for the batch; the engine gives each session its own).

    Args:
        noise: (B, C, F, h, w) initial noise. cross_kv: the prompts' cache.
        attn: the sessions' dense self-attention state (updated: the chunk is committed).
        frame_offset: int64 (B,) first latent frame of the chunk.
        generator: source of the fresh noise between steps.

    Returns:
        x0 (B, C, F, h, w) of the chunk, and the per-layer K, V the commit pass wrote.
    """
    cfg = dit.cfg
    B, Fn = noise.shape[0], noise.shape[2]
    attn.begin_chunk(frame_offset, Fn)
    x = noise
    ts = cfg.timesteps
    x0 = x
    for i, t in enumerate(ts):
        tt = torch.full((B,), t, dtype=torch.float64, device=x.device)
        out = dit(x, tt, frame_offset, cross_kv, attn)
        assert out.flow is not None
        x0 = flow_to_x0(out.flow, x, tt, num_train_timesteps=cfg.num_train_timesteps)
        if i + 1 < len(ts):
            fresh = torch.randn(x0.shape, generator=generator, dtype=torch.float32, device=x0.device).to(x0.dtype)
            nxt = torch.full((B,), ts[i + 1], dtype=torch.float64, device=x.device)
            x = renoise(x0, fresh, nxt, num_train_timesteps=cfg.num_train_timesteps)
    tc = torch.full((B,), cfg.context_noise, dtype=torch.float64, device=x.device)
    kv = dit(x0, tc, frame_offset, cross_kv, attn, kv_only=True).kv
    attn.commit(kv)
    return x0, kv
