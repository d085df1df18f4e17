"""TinyWorld's network: a frame autoencoder and a frame-causal latent transformer.

Reads top to bottom like nanoGPT: config, autoencoder, attention bias,
transformer block, the denoiser. Shapes in comments use
B batch, F frames, T tokens per frame, D width, H heads, hd head dim,
L cached key tokens.

Design (why it learns a moving world cheaply on a CPU):
- A small convolutional autoencoder maps a 64x64 RGB frame to a 16x16x8
  latent; the transformer works on 2x2 latent patches, so a frame is 64
  tokens of 32 values each (as latent video models do; Rombach et al. 2022).
- Each frame's tokens see the previous frame's latent at the same place, and
  the output is a change added to it, so "stand still" is the zero function
  and moving is a local shift (the residual bias of model-notes.md).
- Each MLP carries a depthwise 3x3 convolution over the token grid
  (as in CvT / ConvNeXt-style blocks), so shifting content to a neighbour
  token is one cheap, local operation.
- Frames attend causally to a bounded set of earlier frames (a rolling window
  plus attention-sink frames; Xiao et al. 2023, "Efficient Streaming Language
  Models with Attention Sinks"), with ALiBi-style linear biases over frame
  age (Press et al. 2022) applied at read time: no absolute time position,
  so positions never run out.
- Conditioning (flow-matching time, action, prompt embedding) modulates every
  block through adaLN-Zero (Peebles & Xie 2023, DiT).
- The denoiser predicts the clean latent x0; sampling follows the
  rectified-flow ODE x_t = (1 - t) x0 + t eps (Liu et al. 2022).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F

from worldcast.kernels.attention import attention
from worldcast.kernels.frame_attention import FrameAgeBias


@dataclass(frozen=True)
class TinyWorldConfig:
    """Hyperparameters of TinyWorld; the only source of them."""

    frame_size: int = 64  #: frame side, pixels
    latent_channels: int = 8  #: autoencoder latent channels
    latent_stride: int = 4  #: pixels per latent cell, per side
    patch: int = 2  #: latent cells per token, per side
    width: int = 192  #: transformer width D
    heads: int = 6  #: attention heads H
    layers: int = 5  #: transformer blocks
    mlp_ratio: int = 3  #: MLP hidden = mlp_ratio * width
    action_dim: int = 8  #: action vector length (see world.action_vector)
    prompt_dim: int = 384  #: prompt embedding length (all-MiniLM-L6-v2)
    window_frames: int = 4  #: rolling-window frames kept in the KV cache
    sink_frames: int = 1  #: attention-sink frames kept forever
    ae_width: int = 64  #: autoencoder channels

    def __post_init__(self) -> None:
        assert self.width % self.heads == 0, "width must divide by heads"
        assert self.frame_size % (self.latent_stride * self.patch) == 0, "frame must tile into tokens"

    @property
    def latent_size(self) -> int:
        """Latent grid side, cells."""
        return self.frame_size // self.latent_stride

    @property
    def grid(self) -> int:
        """Token grid side."""
        return self.latent_size // self.patch

    @property
    def tokens_per_frame(self) -> int:
        return self.grid * self.grid

    @property
    def token_dim(self) -> int:
        return self.latent_channels * self.patch * self.patch

    @property
    def head_dim(self) -> int:
        return self.width // self.heads


# -----------------------------------------------------------------------------
# Autoencoder


class FrameAutoencoder(nn.Module):
    """Convolutional autoencoder, (B, 3, 64, 64) in [0, 1] <-> (B, 8, 16, 16) latents.

    Latents are normalised per channel with `latent_mean` / `latent_std`
    (buffers measured after training), so the denoiser sees roughly unit-scale data.
    """

    def __init__(self, cfg: TinyWorldConfig) -> None:
        super().__init__()
        w, c = cfg.ae_width, cfg.latent_channels
        self.enc = nn.Sequential(
            nn.Conv2d(3, w // 2, 3, 1, 1), nn.GELU(),
            nn.Conv2d(w // 2, w, 4, 2, 1), nn.GELU(),
            nn.Conv2d(w, w, 3, 1, 1), nn.GELU(),
            nn.Conv2d(w, w, 4, 2, 1), nn.GELU(),
            nn.Conv2d(w, c, 1),
        )  # fmt: skip
        self.dec = nn.Sequential(
            nn.Conv2d(c, w, 3, 1, 1), nn.GELU(),
            nn.Conv2d(w, w, 3, 1, 1), nn.GELU(),
            nn.Upsample(scale_factor=2, mode="nearest"),
            nn.Conv2d(w, w * 3 // 4, 3, 1, 1), nn.GELU(),
            nn.Upsample(scale_factor=2, mode="nearest"),
            nn.Conv2d(w * 3 // 4, w // 2, 3, 1, 1), nn.GELU(),
            nn.Conv2d(w // 2, 3, 3, 1, 1),
        )  # fmt: skip
        self.register_buffer("latent_mean", torch.zeros(1, c, 1, 1))
        self.register_buffer("latent_std", torch.ones(1, c, 1, 1))

    def encode(self, img: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) float in [0, 1] -> normalised latents (B, C, S/4, S/4), in the weights' dtype."""
        img = img.to(self.latent_mean.dtype)
        return (self.enc(img * 2 - 1) - self.latent_mean) / self.latent_std

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Normalised latents (B, C, S/4, S/4) -> (B, 3, S, S) float, roughly [0, 1] (not clamped), in the
        weights' dtype."""
        z = z.to(self.latent_std.dtype)
        return (self.dec(z * self.latent_std + self.latent_mean) + 1) / 2


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
    q_frame: torch.Tensor, k_frame: torch.Tensor, k_valid: torch.Tensor, *, cfg: TinyWorldConfig
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
    q_frame: torch.Tensor, k_frame: torch.Tensor, k_valid: torch.Tensor, *, cfg: TinyWorldConfig
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

    def __init__(self, cfg: TinyWorldConfig) -> None:
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


class TinyWorldDenoiser(nn.Module):
    """Frame-causal latent transformer predicting a frame's clean latent.

    Tokens of a frame are its noisy latent patch and the previous frame's
    latent patch, side by side; the prediction is that previous latent plus
    a learned change.
    """

    def __init__(self, cfg: TinyWorldConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.width
        self.inp = nn.Linear(2 * cfg.token_dim, d)
        self.pos = nn.Parameter(torch.randn(1, 1, cfg.tokens_per_frame, d) * 0.02)
        self.t_mlp = nn.Sequential(nn.Linear(d, d), nn.SiLU(), nn.Linear(d, d))
        self.a_mlp = nn.Sequential(nn.Linear(cfg.action_dim, d), nn.SiLU(), nn.Linear(d, d))
        self.p_proj = nn.Sequential(nn.Linear(cfg.prompt_dim, d), nn.SiLU(), nn.Linear(d, d))
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.layers)])
        self.norm = nn.LayerNorm(d, elementwise_affine=False)
        self.ada_out = nn.Linear(d, 2 * d)
        self.out = nn.Linear(d, cfg.token_dim)
        for m in (self.ada_out, self.out):
            nn.init.zeros_(m.weight)
            nn.init.zeros_(m.bias)

    # -- token layout ---------------------------------------------------------

    def patchify(self, z: torch.Tensor) -> torch.Tensor:
        """Latents (N, C, h, w) -> tokens (N, T, C*p*p)."""
        p, g = self.cfg.patch, self.cfg.grid
        N, C = z.shape[:2]
        z = z.reshape(N, C, g, p, g, p).permute(0, 2, 4, 1, 3, 5)
        return z.reshape(N, g * g, C * p * p)

    def unpatchify(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens (N, T, C*p*p) -> latents (N, C, h, w)."""
        p, g, C = self.cfg.patch, self.cfg.grid, self.cfg.latent_channels
        N = x.shape[0]
        x = x.reshape(N, g, g, C, p, p).permute(0, 3, 1, 4, 2, 5)
        return x.reshape(N, C, g * p, g * p)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    # -- forward ---------------------------------------------------------------

    def forward(
        self,
        x_t: torch.Tensor,
        prev: torch.Tensor,
        t: torch.Tensor,
        action: torch.Tensor,
        prompt: torch.Tensor,
        attend: Attend,
        *,
        kv_only: bool = False,
    ) -> tuple[torch.Tensor | None, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Predict clean latents of F frames and return their keys and values.

        Args:
            x_t: (B, F, C, h, w) noisy latents at flow time t.
            prev: (B, F, C, h, w) the previous frame's clean latent for each frame.
            t: (B, F) flow time in [0, 1] (0 = clean, as in a commit pass).
            action: (B, F, action_dim) float32 action vectors.
            prompt: (B, F, prompt_dim) prompt embeddings (unit norm).
            attend: the self-attention over cached keys (`DenseAttention(past_kv, bias)` offline,
                the engine's pool when serving).
            kv_only: return only the keys and values (x0 is None): a commit pass. The last
                block then computes just its K/V projection and the output head is skipped.

        Returns:
            x0: (B, F, C, h, w) predicted clean latents (None when `kv_only`), and per
            layer the (K, V) of these F frames, each (B, F*T, H, hd); all in the weights'
            dtype (inputs of any float dtype are cast to it on entry).
        """
        cfg = self.cfg
        B, Fr = x_t.shape[:2]
        assert x_t.shape == prev.shape, f"x_t {tuple(x_t.shape)} vs prev {tuple(prev.shape)}"
        dt = self.inp.weight.dtype
        x_t, prev, action, prompt = x_t.to(dt), prev.to(dt), action.to(dt), prompt.to(dt)
        xt_tok = self.patchify(x_t.flatten(0, 1)).reshape(B, Fr, cfg.tokens_per_frame, -1)
        pv_tok = self.patchify(prev.flatten(0, 1)).reshape(B, Fr, cfg.tokens_per_frame, -1)
        x = self.inp(torch.cat([xt_tok, pv_tok], dim=-1)) + self.pos  # (B, F, T, D)
        cond = (
            self.t_mlp(timestep_embedding(t.flatten(), cfg.width).to(dt)).reshape(B, Fr, -1)
            + self.a_mlp(action)
            + self.p_proj(prompt)
        )  # (B, F, D)
        new_kv = []
        last = len(self.blocks) - 1
        for i, blk in enumerate(self.blocks):
            x, kv = blk(x, cond, attend, i, kv_only=kv_only and i == last)
            new_kv.append(kv)
        if kv_only:
            return None, new_kv
        sh, sc = self.ada_out(F.silu(cond))[:, :, None].chunk(2, dim=-1)
        delta = self.out(self.norm(x) * (1 + sc) + sh)  # (B, F, T, token_dim)
        x0_tok = pv_tok + delta
        x0 = self.unpatchify(x0_tok.flatten(0, 1)).reshape(x_t.shape)
        return x0, new_kv
