"""The commit fold for TinyWorld: the next chunk's first denoising step also writes the previous frame's K/V.

What serves (unfolded): chunk j ends with its decode and a commit pass, a
forward over its clean latent at flow time 0 that writes its keys and values
into the ring; chunk j + 1's first denoising step then reads them there.

Folded: chunk j + 1's first denoising step runs two frames in one forward,
j (clean, t = 0) and j + 1 (noise, t = timesteps[0]), under a block-causal
mask (`fold_mask`): frame j's queries see the ring as its commit pass would
and its own keys, never frame j + 1's; frame j + 1's see the ring by their own
window rule, frame j's keys as a ring frame of age 1, and their own. The
network's blocks are per-frame except attention (per-frame adaLN, the MLP's
depthwise conv per frame grid, the pixel head per frame), so both outputs are the same math as the two
passes, up to float reduction order (`latency_bench/fold.py` checks it and
times both ways).
"""

from __future__ import annotations

import torch

from worldcast.models.tinyworld.model import ring_bias
from worldcast.models.tinyworld.network import ChunkRingAttention, TinyWorldConfig, TinyWorldDenoiser


def fold_mask(ring_frame: torch.Tensor, c0: torch.Tensor, slopes: torch.Tensor, cfg: TinyWorldConfig,
              dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The attention mask of a folded step: (B, H, 2T, L + 2T) in `dtype`, over the ring's L keys, then the
    committed frame's T keys, then the new frame's T keys.

    Args:
        ring_frame: int64 (B, P) the absolute frame each ring slot holds before the commit (-1: empty).
        c0: int64 (B, 1) the new frame; the committed frame is c0 - 1.
        slopes: float32 (H,) ALiBi slopes (`network.alibi_slopes`).
    """
    T = cfg.tokens_per_frame
    j = c0 - 1
    zeros = torch.zeros((ring_frame.shape[0], slopes.shape[0], T), device=ring_frame.device)
    committed = torch.cat([ring_bias(ring_frame, j, slopes, cfg), zeros, torch.full_like(zeros, float("-inf"))], -1)
    age_one = (-slopes[None, :, None]).expand_as(zeros)  # the committed frame is one frame older than c0
    new = torch.cat([ring_bias(ring_frame, c0, slopes, cfg), age_one, zeros], -1)
    rows = torch.stack([committed, new], dim=2)  # (B, H, 2, L + 2T)
    return rows.repeat_interleave(T, dim=2).to(dtype)  # (B, H, 2T, L + 2T)


def fold_step(net: TinyWorldDenoiser, x0_prev: torch.Tensor, prev_prev: torch.Tensor, x_t: torch.Tensor,
              t: torch.Tensor, action_prev: torch.Tensor, action: torch.Tensor, prompt_prev: torch.Tensor,
              prompt: torch.Tensor, k_ring: torch.Tensor, v_ring: torch.Tensor,
              mask: torch.Tensor, draw_noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One forward for the commit of frame j and the first denoising step of frame j + 1.

    Args:
        x0_prev: (B, 1, C, h, w) frame j's clean latent; prev_prev: (B, 1, C, h, w) frame j - 1's.
        x_t: (B, 1, C, h, w) frame j + 1's noisy latent at flow time t (B, 1).
        action_prev, action: (B, 1, A) each frame's action; prompt_prev, prompt: (B, 1, P) each frame's prompt.
        k_ring, v_ring: (B, layers, L, H, hd) the ring before frame j's commit.
        mask: `fold_mask` of that ring.
        draw_noise: (B, 1, 1, h, w) float32 frame j + 1's draw noise (`TinyWorldModel.draw_noise`).

    Returns:
        float32 x0 (B, 1, C, h, w) of frame j + 1, and frame j's keys and values, each
        (B, layers, T, H, hd) in the weights' dtype (what `commit_step` returns).
    """
    T = net.cfg.tokens_per_frame
    x0_prev = x0_prev.clamp(-1, 1)  # the frame as shown and committed (`TinyWorldModel.commit`)
    x = torch.cat([x0_prev, x_t], dim=1)
    prev = torch.cat([prev_prev, x0_prev], dim=1)
    tt = torch.cat([torch.zeros_like(t), t], dim=1)
    noise = torch.cat([torch.zeros_like(draw_noise), draw_noise], dim=1)  # frame j draws nothing (it is committed)
    x0, kv = net(x, prev, tt, torch.cat([action_prev, action], dim=1), torch.cat([prompt_prev, prompt], dim=1),
                 ChunkRingAttention(k_ring, v_ring, mask), predict_from=1, draw_noise=noise)
    assert x0 is not None
    k = torch.stack([k[:, :T] for k, _ in kv], dim=1)
    v = torch.stack([v[:, :T] for _, v in kv], dim=1)
    return x0.float(), k, v
