"""LongLive's re-cache after a prompt switch, as a rule over latent frames, and its dense reference.

What LongLive 1.0 computes (NVlabs/LongLive@2462895
`pipeline/interactive_causal_inference.py` `_recache_after_switch` with
`global_sink: true`, over `wan/modules/causal_model.py`
`CausalWanSelfAttention.forward`'s KV-cache branch), for a switch before the
chunk starting at latent frame c, with window L = `local_attn_size` and S =
`sink_size` sinks:

- the cross-attention cache is rebuilt from the new prompt;
- the last n = min(L, c) generated latent frames [c - n, c) are run once more
  at the context-noise timestep (0) under the new prompt, as one block whose
  frames all attend each other (the cache branch ignores the block mask);
- if c - n > 0 (a switch after the first L frames), the sinks are protected
  (`is_recompute`): their old-prompt keys and values stay, the first S of the
  re-run frames land on the sink positions and are dropped, and each re-run
  query attends the old sinks plus the new keys of the last L - S frames
  [c - (L - S), c). Only those L - S frames matter, so only they are re-run;
- if c - n = 0 (a switch within the first L frames), nothing is protected:
  every frame [0, c), the sinks among them, is re-encoded attending the
  others' new keys only.

With global attention (L = -1) n = c. The same rule serves the presets whose
window is their trained horizon (Self-Forcing, CausVid: L = 21, S = 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from worldcast.models.causal_wan.dense_attention import DenseSelfAttention
from worldcast.models.causal_wan.dit import KV, CausalWanDiT


@dataclass(frozen=True)
class RecachePlan:
    """Which latent frames a prompt switch re-encodes.

    Attributes:
        frames: latent frames re-run under the new prompt, ascending (all attend each other).
        keep_sinks: the sinks' old keys and values stay and are attended besides `frames`' new ones
            (False: `frames` includes the sinks, or there are none).
        sink_frames: the sinks kept, [0, S) when `keep_sinks`, else ().
    """

    frames: tuple[int, ...]
    keep_sinks: bool
    sink_frames: tuple[int, ...] = ()


def recache_plan(next_frame: int, *, local_attn_size: int, sink_size: int) -> RecachePlan | None:
    """The re-cache before the chunk starting at latent frame `next_frame` (None: nothing generated yet).

    Raises:
        ValueError: a negative frame.
    """
    if next_frame < 0:
        raise ValueError(f"next_frame {next_frame} must be >= 0")
    if next_frame == 0:
        return None
    n = next_frame if local_attn_size == -1 else min(local_attn_size, next_frame)
    start = next_frame - n
    if start == 0 or sink_size == 0:
        return RecachePlan(frames=tuple(range(start, next_frame)), keep_sinks=False)
    return RecachePlan(frames=tuple(range(next_frame - (local_attn_size - sink_size), next_frame)), keep_sinks=True,
                       sink_frames=tuple(range(sink_size)))


class PrefixAttention:
    """`SelfAttentionBackend` for a re-cache pass: fixed per-layer prefix keys (the kept sinks, or none) plus
    the pass's own keys, all visible (no mask).

    Args:
        prefix: per layer (K, V) each (B, L_p, H, hd), or None for no prefix.
    """

    def __init__(self, prefix: list[KV] | None) -> None:
        self.prefix = prefix

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.prefix is not None:
            pk, pv = self.prefix[layer]
            k = torch.cat([pk.to(k.dtype), k], dim=1)
            v = torch.cat([pv.to(v.dtype), v], dim=1)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return y.transpose(1, 2)


def recache_kv(dit: CausalWanDiT, x0: torch.Tensor, frames: tuple[int, ...], cross: list[KV],
               prefix: list[KV] | None) -> list[KV]:
    """The re-run frames' new keys and values: one commit pass of their latents under the new prompt.

    Args:
        x0: (B, C, F_r, h, w) the committed latents of `frames` (the DiT's layout).
        frames: their latent frame indices (consecutive).
        cross: the new prompt's cross-attention cache.
        prefix: the kept sinks' old per-layer (K, V), or None.

    Returns:
        per layer (K, V) each (B, F_r * T, H, hd), K after RoPE at the frames' absolute positions.
    """
    assert list(frames) == list(range(frames[0], frames[0] + len(frames))), "re-run frames are consecutive"
    B = x0.shape[0]
    t = torch.full((B,), dit.cfg.context_noise, dtype=torch.float64, device=x0.device)
    off = torch.full((B,), frames[0], dtype=torch.int64, device=x0.device)
    return dit(x0, t, off, cross, PrefixAttention(prefix), kv_only=True).kv


def recache_dense(dit: CausalWanDiT, attn: DenseSelfAttention, latents: dict[int, torch.Tensor], cross: list[KV],
                  next_frame: int) -> RecachePlan | None:
    """The reference re-cache on a dense cache (one session): rewrite the kept frames' K/V in `attn`.

    Args:
        latents: committed x0 per latent frame, each (C, h, w) (at least the plan's frames).
        cross: the new prompt's cross-attention cache.

    Returns:
        the plan that was carried out (None: nothing to re-cache).
    """
    cfg = dit.cfg
    plan = recache_plan(next_frame, local_attn_size=cfg.local_attn_size, sink_size=cfg.sink_size)
    if plan is None:
        return None
    assert attn.batch == 1, "one session"
    prefix = None
    if plan.keep_sinks:
        sel = attn.valid[0] & (attn.frame[0] < cfg.sink_size)
        prefix = [(k[:, sel], v[:, sel]) for k, v in zip(attn.k, attn.v)]  # type: ignore[index]
    x0 = torch.stack([latents[f] for f in plan.frames], dim=1)[None]  # (1, C, F_r, h, w)
    kv = recache_kv(dit, x0, plan.frames, cross, prefix)
    T = kv[0][0].shape[1] // len(plan.frames)
    for f_i, f in enumerate(plan.frames):
        sel = attn.valid[0] & (attn.frame[0] == f)
        if not bool(sel.any()):
            continue  # evicted: no later chunk sees it
        for layer, (k, v) in enumerate(kv):
            attn.k[layer][0, sel] = k[0, f_i * T:(f_i + 1) * T].to(attn.k[layer].dtype)  # type: ignore[index]
            attn.v[layer][0, sel] = v[0, f_i * T:(f_i + 1) * T].to(attn.v[layer].dtype)  # type: ignore[index]
    return plan
