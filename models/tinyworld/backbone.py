"""TinyWorld's shared parts: frames and the camera warp, the attention bias over frame age, how a block reaches
its keys, and the transformer block. Every TinyWorld network builds on these; nothing here knows the simulator
(`world.py`) or how a network paints.

Shapes in comments use B batch, F frames, T tokens per frame, D width, H heads, hd head dim, L cached key tokens,
S frame side, N = B*F.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F

from worldcast.kernels.attention import attention
from worldcast.kernels.frame_attention import FrameAgeBias


class BackboneConfig(Protocol):
    """What the shared parts read of a network's config (`network.TinyWorldConfig` has it all)."""

    @property
    def width(self) -> int: ...  #: transformer width D
    @property
    def heads(self) -> int: ...  #: attention heads H
    @property
    def mlp_ratio(self) -> int: ...  #: MLP hidden = mlp_ratio * width
    @property
    def window_frames(self) -> int: ...  #: rolling-window frames kept in the KV cache
    @property
    def sink_frames(self) -> int: ...  #: attention-sink frames kept forever
    @property
    def grid(self) -> int: ...  #: token grid side
    @property
    def head_dim(self) -> int: ...  #: width // heads
    @property
    def tokens_per_frame(self) -> int: ...  #: tokens T of one frame (grid * grid)


# -----------------------------------------------------------------------------
# Frames and the camera warp


def to_frame_space(img: torch.Tensor) -> torch.Tensor:
    """RGB in [0, 1] -> the network's frame space [-1, 1] (any shape)."""
    return img * 2 - 1


def to_pixels(x: torch.Tensor) -> torch.Tensor:
    """Frame space (N, 3, S, S) -> uint8 (N, S, S, 3) RGB (clamped, rounded)."""
    img = ((x.float() + 1) * 127.5).clamp(0, 255) + 0.5
    return img.to(torch.uint8).permute(0, 2, 3, 1)


def marker_mask(size: int) -> torch.Tensor:
    """bool (S, S): the player marker's pixels, a cross at the centre (the simulator draws it; an overlay, not ground)."""
    m = torch.zeros(size, size, dtype=torch.bool)
    c = size // 2
    m[c - 1 : c + 1, c - 3 : c + 3] = True
    m[c - 3 : c + 3, c - 1 : c + 1] = True
    return m


def warp(prev: torch.Tensor, dx: torch.Tensor, dy: torch.Tensor, marker: torch.Tensor) -> tuple[torch.Tensor,
                                                                                              torch.Tensor]:
    """The previous frame as the camera's move shows it, and which pixels it can show.

    After a move by (dx, dy) the new view's pixel (r, c) is the previous view's (r + dy, c + dx)
    (the view's corner moves by the camera's move). Pixels whose source lies outside
    the previous view or on its player marker, and the marker's own pixels (an overlay drawn
    over the world), are unknown.

    Args:
        prev: (N, 3, S, S) previous frames, frame space.
        dx, dy: int64 (N,) camera moves in pixels.
        marker: bool (S, S) the marker's pixels (`marker_mask`).

    Returns:
        warped (N, 3, S, S) in prev's dtype, 0 where unknown; known (N, 1, S, S) in prev's dtype, 1 or 0.
    """
    N, C, S, _ = prev.shape
    r = torch.arange(S, device=prev.device)
    ys, xs = r[None] + dy[:, None], r[None] + dx[:, None]  # (N, S) source row / column
    ok = ((ys >= 0) & (ys < S))[:, :, None] & ((xs >= 0) & (xs < S))[:, None, :]  # (N, S, S)
    src = ys.clamp(0, S - 1)[:, :, None] * S + xs.clamp(0, S - 1)[:, None, :]  # (N, S, S)
    src = src.flatten(1)  # (N, S*S)
    ok = ok.flatten(1) & ~marker.flatten()[src] & ~marker.flatten()[None]
    warped = prev.flatten(2).gather(2, src[:, None].expand(-1, C, -1))  # (N, C, S*S)
    known = ok[:, None].to(prev.dtype)
    return (warped * known).view(N, C, S, S), known.view(N, 1, S, S)


# -----------------------------------------------------------------------------
# Attention bias over frame age


def alibi_slopes(heads: int) -> torch.Tensor:
    """Per-head slopes (H,) of the linear age penalty, in logits per frame of age.

    Geometric from 1/2 down (Press et al. 2022, ALiBi); half the heads get a
    slope of 0, so some heads see all cached frames equally.
    """
    n = heads - heads // 2
    s = torch.tensor([2.0 ** (-(i + 1)) for i in range(n)] + [0.0] * (heads // 2))
    return s


def frame_age_bias(
    q_frame: torch.Tensor, k_frame: torch.Tensor, k_valid: torch.Tensor, *, cfg: BackboneConfig
) -> torch.Tensor:
    """Attention bias between query and key frames, per head.

    A query frame i sees key frame j iff j == i (its own frame), or
    i - window <= j < i (the rolling window of committed frames), or
    j < sink_frames and j < i (an attention sink). The bias is
    -slope_h * age with age = i - j, capped at window + 1 for sinks.

    Args:
        q_frame: int64 (B, Nq) absolute frame index of each query token.
        k_frame: int64 (B, Nk) absolute frame index of each key token.
        k_valid: bool (B, Nk) whether that key slot holds data.
        cfg: window and sink sizes.

    Returns:
        float32 (B, H, Nq, Nk): 0 or negative where allowed, -inf elsewhere.
    """
    return frame_age_bias_lazy(q_frame, k_frame, k_valid, cfg=cfg).dense()


def frame_age_bias_lazy(
    q_frame: torch.Tensor, k_frame: torch.Tensor, k_valid: torch.Tensor, *, cfg: BackboneConfig
) -> FrameAgeBias:
    """`frame_age_bias` before materialisation: fused attention kernels evaluate it per key block."""
    return FrameAgeBias(q_frame, k_frame, k_valid, alibi_slopes(cfg.heads).to(q_frame.device),
                        window=cfg.window_frames, sink_frames=cfg.sink_frames)


# -----------------------------------------------------------------------------
# How a block's self-attention reaches its keys


class Attend(Protocol):
    """A forward pass's self-attention: the chunk's queries against cached keys plus its own.

    Called once per block with that block's `layer` index and the chunk's own
    q, k, v, each (B, N, H, hd) with N = F*T; returns (B, N, H, hd). Serving
    passes one that reads the engine's pool in place (`TinyWorldModel`);
    training and offline rollouts pass a `DenseAttention`.
    """

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


class DenseAttention:
    """Self-attention over explicit past keys plus the chunk's own, with a dense (or lazy) bias.

    Args:
        past_kv: per layer cached (K, V), each (B, L, H, hd), or None (no cache).
        bias: (B, H, N, L + N) additive bias (see `frame_age_bias`), or its lazy form.
    """

    def __init__(self, past_kv: list[tuple[torch.Tensor, torch.Tensor]] | None,
                 bias: torch.Tensor | FrameAgeBias) -> None:
        self.past_kv, self.bias = past_kv, bias

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.past_kv is not None:
            pk, pv = self.past_kv[layer]
            k, v = torch.cat([pk, k], dim=1), torch.cat([pv, v], dim=1)
        y = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), self.bias)  # (B, H, N, hd)
        return y.transpose(1, 2)


class ChunkRingAttention:
    """Self-attention of a chunk over its batch's ring of cached keys plus its own keys: one SDPA per layer.

    Pure tensors, so a compiled step can take it whole. The ring is what the engine's pool holds
    for the batch's slots (a view of it when the slots are one contiguous run); the mask carries
    the ring's visibility rule and the frame-age ALiBi (`kernels/ring_attention.py` states the
    rule), built once per chunk.

    Args:
        k_ring, v_ring: (B, layers, L, H, hd) the batch's ring keys and values, L = P * T.
        mask: (B, H, 1 or N, L + N) additive logits bias over ring keys then the chunk's own N keys
            (0 or negative where visible, -inf elsewhere), in the compute dtype.
    """

    def __init__(self, k_ring: torch.Tensor, v_ring: torch.Tensor, mask: torch.Tensor) -> None:
        self.k_ring, self.v_ring, self.mask = k_ring, v_ring, mask

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        kk = torch.cat([self.k_ring[:, layer], k], dim=1).transpose(1, 2)  # (B, H, L + N, hd)
        vv = torch.cat([self.v_ring[:, layer], v], dim=1).transpose(1, 2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), kk, vv, attn_mask=self.mask)  # (B, H, N, hd)
        return y.transpose(1, 2)


# -----------------------------------------------------------------------------
# Transformer


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of flow time t in [0, 1]: (N,) -> (N, dim) (Vaswani et al. 2017)."""
    half = dim // 2
    freqs = torch.exp(-math.log(1000.0) * torch.arange(half, device=t.device) / half)
    args = t[:, None].float() * 1000.0 * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def _modulate(n: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN modulation n * (1 + scale) + shift, as two kernels (n + shift, then + n * scale) instead of three."""
    return torch.add(n, shift).addcmul_(n, scale)


class Block(nn.Module):
    """Pre-norm transformer block with adaLN-Zero modulation and a conv MLP."""

    def __init__(self, cfg: BackboneConfig) -> None:
        super().__init__()
        d = cfg.width
        self.cfg = cfg
        self.norm1 = nn.LayerNorm(d, elementwise_affine=False)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d, elementwise_affine=False)
        hidden = cfg.mlp_ratio * d
        self.fc1 = nn.Linear(d, hidden)
        self.dw = nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden)
        self.fc2 = nn.Linear(hidden, d)
        self.ada = nn.Linear(d, 6 * d)
        nn.init.zeros_(self.ada.weight)
        nn.init.zeros_(self.ada.bias)

    def forward(
        self,
        x: torch.Tensor,
        cond: torch.Tensor,
        attend: Attend,
        layer: int,
        *,
        kv_only: bool = False,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """One block.

        Args:
            x: (B, F, T, D) tokens of F frames.
            cond: (B, F, D) per-frame conditioning.
            attend: the pass's self-attention (cached keys plus these frames' own).
            layer: this block's index (which cached layer `attend` reads).
            kv_only: compute only this block's keys and values (x is returned unchanged);
                for the last block of a commit pass, whose output nothing reads.

        Returns:
            the new x (B, F, T, D) and this block's own (K, V), each (B, F*T, H, hd),
            for the caller to cache.
        """
        B, Fr, T, D = x.shape
        H, hd = self.cfg.heads, self.cfg.head_dim
        if kv_only:
            s1, c1 = self.ada(F.silu(cond))[:, :, None].chunk(6, dim=-1)[:2]
            h = _modulate(self.norm1(x), s1, c1)
            _, k, v = self.qkv(h).reshape(B, Fr * T, 3, H, hd).unbind(2)
            return x, (k, v)
        s1, c1, g1, s2, c2, g2 = self.ada(F.silu(cond))[:, :, None].chunk(6, dim=-1)  # (B, F, 1, D) each
        h = _modulate(self.norm1(x), s1, c1)
        q, k, v = self.qkv(h).reshape(B, Fr * T, 3, H, hd).unbind(2)  # (B, F*T, H, hd) views
        y = attend(layer, q, k, v)  # (B, F*T, H, hd)
        y = y.reshape(B, Fr, T, D)
        x = torch.addcmul(x, g1, self.proj(y))  # x + g1 * proj(y), one kernel
        h = _modulate(self.norm2(x), s2, c2)
        g = self.cfg.grid
        h = self.fc1(h).reshape(B * Fr, g, g, -1).permute(0, 3, 1, 2)  # (B*F, hidden, g, g)
        h = F.gelu(self.dw(h) + h).permute(0, 2, 3, 1).reshape(B, Fr, T, -1)
        x = torch.addcmul(x, g2, self.fc2(h))
        return x, (k, v)


def ring_bias(ring_frame: torch.Tensor, c0: torch.Tensor, slopes: torch.Tensor, cfg: BackboneConfig) -> torch.Tensor:
    """The ring part of the attention mask of a query frame c0: float32 (B, H, P * T) over the ring's keys.

    The rule of `kernels/ring_attention.py`: a ring frame j is visible iff it holds data and
    c0 - window <= j < c0 or j < sinks (and j < c0); its bias is -slope * age with age = c0 - j,
    capped at window + 1 for sinks; -inf where not visible.

    Args:
        ring_frame: int64 (B, P) the absolute frame each ring slot holds (-1: empty).
        c0: int64 (B, 1) the query frame.
        slopes: float32 (H,) ALiBi slopes (`network.alibi_slopes`).
    """
    W, S = cfg.window_frames, cfg.sink_frames
    kf = ring_frame
    visible = (kf >= 0) & (((kf >= c0 - W) & (kf < c0)) | ((kf < S) & (kf < c0)))
    age = (c0 - kf).float()  # (B, P)
    age = torch.where((kf < S) & (age > W + 1), torch.full_like(age, W + 1), age)
    bias = (-slopes[None, :, None] * age[:, None, :]).masked_fill(~visible[:, None, :], float("-inf"))
    return bias.repeat_interleave(cfg.tokens_per_frame, dim=-1)
