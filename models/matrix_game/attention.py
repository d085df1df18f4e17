"""Attention over a batch of sessions' caches, read in place from the engine's pool.

Three caches per session, all sink + rolling-window rings of latent frames
(`models/spec.py` `AttentionRingSpec`, the same visibility rule as
`kernels/ring_attention.py`: a chunk from latent frame c0 sees committed frames
c0 - window <= j < c0 and sinks j < min(sinks, c0), plus its own frames, both ways):

- "kv": the DiT's self-attention, T tokens per frame: `RingSelfAttention` over
  `kernels.ring_attention` (as causal Wan).
- "mouse_kv": per action block, one key per (frame, position): T keys per frame,
  but a query at position s sees only position s's keys (temporal attention).
- "keyboard_kv": per action block, one key per frame, shared by all positions.

The release keeps `local_attn_size` frames per cache and attends to all of them
(`Matrix-Game-2/wan/modules/action_module.py`, `causal_model.py`): with a chunk of
3, that is window = local_attn_size - 3 committed frames (3 universal, 1 GTA).
"""

from __future__ import annotations

import torch

from worldcast.kernels.ring_attention import RingBatch, ring_attention


class RingSelfAttention:
    """The DiT's self-attention backend over the pool's "kv" ring (`SelfAttentionBackend`)."""

    def __init__(self, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: RingBatch) -> None:
        self.k_pool, self.v_pool, self.batch = k_pool, v_pool, batch

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return ring_attention(q, k, v, self.k_pool[:, layer], self.v_pool[:, layer], self.batch)


def visible_frames(ring_frame: torch.Tensor, c0: int, *, window: int, sinks: int) -> torch.Tensor:
    """bool (P,): which ring positions a chunk starting at latent frame c0 sees (the ring rule above)."""
    f = ring_frame
    return (f >= 0) & (((f >= c0 - window) & (f < c0)) | ((f < sinks) & (f < c0)))


def window_attention(q: torch.Tensor, k_own: torch.Tensor, v_own: torch.Tensor, k_ring: torch.Tensor,
                     v_ring: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """One session's temporal attention: per position, over visible ring frames and the chunk's own.

    Args:
        q: (S, F, H, d) queries, F frames at each of S positions.
        k_own, v_own: (S or 1, F, H, d) the chunk's keys and values (1: shared by every position).
        k_ring, v_ring: (S or 1, P, H, d) the cached frames' (views of the pool).
        visible: bool (P,) which ring positions are seen.

    Returns:
        (S, F, H, d) in q's dtype; accumulated in float32 (float64 stays float64).
    """
    acc = torch.promote_types(q.dtype, torch.float32)
    S = q.shape[0]
    scale = q.shape[-1] ** -0.5
    qa = q.to(acc)
    kr, vr = k_ring.to(acc).expand(S, -1, -1, -1), v_ring.to(acc).expand(S, -1, -1, -1)
    ko, vo = k_own.to(acc).expand(S, -1, -1, -1), v_own.to(acc).expand(S, -1, -1, -1)
    lr = torch.einsum("sfhd,sphd->shfp", qa, kr) * scale  # (S, H, F, P)
    lr = lr.masked_fill(~visible.view(1, 1, 1, -1), float("-inf"))
    lo = torch.einsum("sfhd,sghd->shfg", qa, ko) * scale  # (S, H, F, F): own frames, always seen
    p = torch.cat([lr, lo], dim=-1).softmax(dim=-1)
    P = kr.shape[1]
    y = torch.einsum("shfp,sphd->sfhd", p[..., :P], vr) + torch.einsum("shfg,sghd->sfhd", p[..., P:], vo)
    return y.to(q.dtype)


class RingActionAttention:
    """The action module's attention backend over the pool's "mouse_kv" / "keyboard_kv" rings.

    Args:
        mouse: (k, v, frame) of the "mouse_kv" ring from `StateView.ring`, or None: k, v
            (slots, action layers, P * T, H, d), frame-major (position p, then token s); frame (slots, P).
        keyboard: (k, v, frame) of the "keyboard_kv" ring, or None: k, v (slots, action layers, P, H, d).
        slots_host: each session's slot. first_frame: each session's chunk start c0 (host ints).
        window, sinks: the rings' rule.
    """

    def __init__(self, mouse: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
                 keyboard: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None, slots_host: tuple[int, ...],
                 first_frame: tuple[int, ...], *, window: int, sinks: int) -> None:
        self._mouse, self._keyboard = mouse, keyboard
        self.slots = slots_host
        self._visible: dict[str, list[torch.Tensor]] = {}
        for name, ring in (("mouse", mouse), ("keyboard", keyboard)):
            if ring is not None:
                self._visible[name] = [visible_frames(ring[2][s], c0, window=window, sinks=sinks)
                                       for s, c0 in zip(slots_host, first_frame, strict=True)]

    def mouse(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        assert self._mouse is not None, "this model declares no mouse cache"
        k_pool, v_pool, frame = self._mouse
        P = frame.shape[1]
        out = torch.empty_like(q)
        for b, s in enumerate(self.slots):
            kr = k_pool[s, layer].view(P, -1, *k_pool.shape[-2:]).transpose(0, 1)  # (S, P, H, d), a view
            vr = v_pool[s, layer].view(P, -1, *v_pool.shape[-2:]).transpose(0, 1)
            out[b] = window_attention(q[b], k[b], v[b], kr, vr, self._visible["mouse"][b])
        return out

    def keyboard(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        assert self._keyboard is not None, "this model declares no keyboard cache"
        k_pool, v_pool, _ = self._keyboard
        out = torch.empty_like(q)
        for b, s in enumerate(self.slots):
            kr, vr = k_pool[s, layer][None], v_pool[s, layer][None]  # (1, P, H, d), views
            out[b] = window_attention(q[b], k[b][None], v[b][None], kr, vr, self._visible["keyboard"][b])
        return out
