"""The causal Wan 2.1 DiT, chunk by chunk, with the session state passed in and out.

Reads top to bottom like nanoGPT: numerics helpers, 3D RoPE, the timestep
sinusoid, attention modules, the transformer block, the head, the model.
Shapes use B batch, C latent channels, F latent frames of the chunk,
(h, w) the token grid of one frame, T = h*w tokens per frame, N = F*T tokens
of the chunk, D width, H heads, hd head dim, Lc text tokens.

What it computes is Wan 2.1's T2V network (Wan-Video/Wan2.1
`wan/modules/model.py`) with Self-Forcing's causal inference
(`wan/modules/causal_model.py`): the chunk's keys are rotated at their
absolute latent-frame positions, attend to the session's cached keys through
a caller-supplied `self_attn.attend`, and are returned (after RoPE) for the
caller to cache. The model holds no per-session state.

Parameter names are those of the original Wan / Self-Forcing checkpoints
(`blocks.0.self_attn.q.weight`, ...); `loading.py` maps diffusers' names onto them.

Numerics (as Self-Forcing and diffusers keep them): LayerNorm, RMSNorm, the
adaLN modulation and the residual updates are computed in float32 when the
weights are bf16/fp16 (in the weights' dtype otherwise, so fp64 stays fp64);
RoPE angles and the timestep sinusoid are computed in float64 from int64
positions and float timesteps, so nothing runs off a table in a long session.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F

from worldcast.models.causal_wan.config import CausalWanConfig

KV = tuple[torch.Tensor, torch.Tensor]

#: Parameter-name fragments kept in float32 by `CausalWanDiT.cast` when the rest goes to bf16/fp16
#: (the time MLPs and the modulation tables; diffusers' `_keep_in_fp32_modules` keeps the same set).
FP32_PARAMS = ("time_embedding.", "time_projection.", "modulation")


def param_dtype(name: str, dtype: torch.dtype) -> torch.dtype:
    """The dtype parameter `name` is kept in when the model runs in `dtype` (float32 for `FP32_PARAMS` under a
    half type, else `dtype`)."""
    keep = dtype in (torch.bfloat16, torch.float16) and any(s in name for s in FP32_PARAMS)
    return torch.float32 if keep else dtype


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype for norms and modulation: float32 for half types, else `dtype` itself."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else dtype


# -----------------------------------------------------------------------------
# 3D RoPE and the timestep sinusoid, from positions, in float64


def rope_cos_sin(
    frame_pos: torch.Tensor, h: int, w: int, cfg: CausalWanConfig, *, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotation cos/sin of every token of a chunk, from absolute positions (Su et al. 2021, RoFormer).

    The head dim splits into (frame, row, column) parts of `cfg.rope_dims`;
    each part rotates adjacent pairs (x[2i], x[2i+1]) by position * theta^(-2i/d_part),
    as Wan's `rope_params`/`rope_apply` do. Angles are computed in float64 on
    the fly from int64 positions (no fixed-length table).

    Args:
        frame_pos: int64 (B, F) absolute latent-frame index of each frame of the chunk.
        h, w: token grid of one frame.
        dtype: dtype of the returned tables (the dtype rotation is applied in).

    Returns:
        cos, sin: each (B, F*h*w, 1, hd/2), token order (frame, row, column).
    """
    B, Fn = frame_pos.shape
    dev = frame_pos.device
    parts = []
    for d, pos in zip(
        cfg.rope_dims,
        (frame_pos.to(torch.float64), torch.arange(h, device=dev, dtype=torch.float64),
         torch.arange(w, device=dev, dtype=torch.float64)),
    ):  # fmt: skip
        inv_freq = cfg.rope_theta ** (-torch.arange(0, d, 2, device=dev, dtype=torch.float64) / d)  # (d/2,)
        parts.append(pos[..., None] * inv_freq)
    ang_f, ang_h, ang_w = parts  # (B, F, df/2), (h, dh/2), (w, dw/2)
    ang = torch.cat(
        [
            ang_f[:, :, None, None, :].expand(B, Fn, h, w, -1),
            ang_h[None, None, :, None, :].expand(B, Fn, h, w, -1),
            ang_w[None, None, None, :, :].expand(B, Fn, h, w, -1),
        ],
        dim=-1,
    ).reshape(B, Fn * h * w, 1, -1)  # (B, N, 1, hd/2)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs of x: (B, N, H, hd) with cos/sin (B, N, 1, hd/2); computed in cos.dtype."""
    xr = x.to(cos.dtype).unflatten(-1, (-1, 2))  # (B, N, H, hd/2, 2)
    x1, x2 = xr[..., 0], xr[..., 1]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.to(x.dtype)


def timestep_sinusoid(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Wan's timestep embedding [cos | sin] of t * 10000^(-i/(dim/2)), in float64.

    Args:
        t: (M,) timesteps in Wan's [0, 1000] scale, any float dtype.
        dim: embedding length (even).

    Returns:
        float64 (M, dim). Source: Wan `sinusoidal_embedding_1d` (diffusers'
        `Timesteps(flip_sin_to_cos=True, downscale_freq_shift=0)` is the same formula in float32).
    """
    half = dim // 2
    freqs = torch.pow(10000.0, -torch.arange(half, device=t.device, dtype=torch.float64) / half)
    arg = t.to(torch.float64)[:, None] * freqs
    return torch.cat([arg.cos(), arg.sin()], dim=1)


# -----------------------------------------------------------------------------
# Norms


class RMSNorm(nn.Module):
    """RMSNorm over the last dim (all heads together, Wan's qk norm), computed in `acc_dtype`."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.to(acc_dtype(x.dtype))
        y = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (y * self.weight.to(y.dtype)).to(x.dtype)


class LayerNorm(nn.LayerNorm):
    """LayerNorm returning `acc_dtype` of its input (the caller modulates, then casts)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        a = acc_dtype(x.dtype)
        wt = None if self.weight is None else self.weight.to(a)
        bs = None if self.bias is None else self.bias.to(a)
        return F.layer_norm(x.to(a), self.normalized_shape, wt, bs, self.eps)


# -----------------------------------------------------------------------------
# Attention


class SelfAttentionBackend(Protocol):
    """What the DiT needs from whoever owns the session's cached keys and values.

    `attend(layer, q, k, v)`: q, k, v are the chunk's (B, N, H, hd) tensors,
    q and k after RoPE; returns (B, N, H, hd), softmax(q K^T / sqrt(hd)) V over
    the session's visible cached keys of `layer` plus the chunk's own k, v.
    The engine's implementation reads its pool in place; `DenseSelfAttention`
    (dense_attention.py) is the reference.
    """

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


class SelfAttention(nn.Module):
    """Projections of Wan's self-attention; the attention itself is the caller's `attend`."""

    def __init__(self, cfg: CausalWanConfig) -> None:
        super().__init__()
        d = cfg.dim
        self.heads = cfg.heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.norm_q = RMSNorm(d, cfg.eps) if cfg.qk_norm else nn.Identity()
        self.norm_k = RMSNorm(d, cfg.eps) if cfg.qk_norm else nn.Identity()

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, need_q: bool = True) -> tuple:
        """x (B, N, D) -> q (or None), k, v each (B, N, H, hd); q and k rotated."""
        k = apply_rope(self.norm_k(self.k(x)).unflatten(-1, (self.heads, -1)), cos, sin)
        v = self.v(x).unflatten(-1, (self.heads, -1))
        q = apply_rope(self.norm_q(self.q(x)).unflatten(-1, (self.heads, -1)), cos, sin) if need_q else None
        return q, k, v


class CrossAttention(nn.Module):
    """Wan's text cross-attention: queries from the chunk, keys/values from the cached prompt."""

    def __init__(self, cfg: CausalWanConfig) -> None:
        super().__init__()
        d = cfg.dim
        self.heads = cfg.heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.norm_q = RMSNorm(d, cfg.eps) if cfg.qk_norm else nn.Identity()
        self.norm_k = RMSNorm(d, cfg.eps) if cfg.qk_norm else nn.Identity()

    def kv(self, ctx: torch.Tensor) -> KV:
        """Embedded prompt (B, Lc, D) -> K, V each (B, Lc, H, hd)."""
        k = self.norm_k(self.k(ctx)).unflatten(-1, (self.heads, -1))
        v = self.v(ctx).unflatten(-1, (self.heads, -1))
        return k, v

    def forward(self, x: torch.Tensor, kv: KV) -> torch.Tensor:
        q = self.norm_q(self.q(x)).unflatten(-1, (self.heads, -1))  # (B, N, H, hd)
        k, v = kv
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.o(y.transpose(1, 2).flatten(2))  # (B, N, D)


# -----------------------------------------------------------------------------
# Transformer block and head


class Block(nn.Module):
    """adaLN-modulated self-attention, cross-attention, FFN (Wan's `WanAttentionBlock`).

    Names follow the original checkpoints: norm1 before self-attention, norm3
    (affine when cross_attn_norm) before cross-attention, norm2 before the FFN.
    """

    def __init__(self, cfg: CausalWanConfig) -> None:
        super().__init__()
        d = cfg.dim
        self.norm1 = LayerNorm(d, cfg.eps, elementwise_affine=False)
        self.self_attn = SelfAttention(cfg)
        self.norm3 = LayerNorm(d, cfg.eps, elementwise_affine=True) if cfg.cross_attn_norm else None
        self.cross_attn = CrossAttention(cfg)
        self.norm2 = LayerNorm(d, cfg.eps, elementwise_affine=False)
        self.ffn = nn.Sequential(nn.Linear(d, cfg.ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(cfg.ffn_dim, d))
        self.modulation = nn.Parameter(torch.randn(1, 6, d) / d**0.5)

    def modulation_terms(self, e0: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """e0 (B, F, 6, D) -> shift1, scale1, gate1, shift2, scale2, gate2, each (B, F, 1, D) in acc_dtype(dtype)."""
        a = acc_dtype(dtype)
        mod = (self.modulation.to(a)[:, None] + e0.to(a))[:, :, :, None]  # (B, F, 6, 1, D)
        return mod.unbind(2)

    @staticmethod
    def _per_frame(t: torch.Tensor, Fn: int) -> torch.Tensor:
        B, N, D = t.shape
        return t.view(B, Fn, N // Fn, D)  # (B, N, D) -> (B, F, T, D)

    def self_attn_residual(
        self, x: torch.Tensor, mod: tuple[torch.Tensor, ...], rope: tuple[torch.Tensor, torch.Tensor],
        attend: SelfAttentionBackend, layer: int, *, kv_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x + gate1 * self_attn(norm1(x) * (1 + scale1) + shift1); also the chunk's k (after RoPE), v.

        x (B, N, D); returns x (unchanged when kv_only), k, v (B, N, H, hd).
        """
        B, N, D = x.shape
        shift1, scale1, gate1 = mod[:3]
        Fn = shift1.shape[1]
        h = (self._per_frame(self.norm1(x), Fn) * (1 + scale1) + shift1).to(x.dtype).view(B, N, D)
        q, k, v = self.self_attn.qkv(h, *rope, need_q=not kv_only)
        if kv_only:
            return x, k, v
        y = self.self_attn.o(attend.attend(layer, q, k, v).flatten(2))  # (B, N, D)
        a = acc_dtype(x.dtype)
        x = (self._per_frame(x, Fn).to(a) + self._per_frame(y, Fn).to(a) * gate1).to(x.dtype).view(B, N, D)
        return x, k, v

    def cross_attn_residual(self, x: torch.Tensor, cross_kv: KV) -> torch.Tensor:
        """x + cross_attn(norm3(x)) over the cached context K, V; x (B, N, D)."""
        h = self.norm3(x).to(x.dtype) if self.norm3 is not None else x
        return x + self.cross_attn(h, cross_kv)

    def ffn_residual(self, x: torch.Tensor, mod: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """x + gate2 * ffn(norm2(x) * (1 + scale2) + shift2); x (B, N, D)."""
        B, N, D = x.shape
        shift2, scale2, gate2 = mod[3:]
        Fn = shift2.shape[1]
        h = (self._per_frame(self.norm2(x), Fn) * (1 + scale2) + shift2).to(x.dtype).view(B, N, D)
        y = self.ffn(h)
        a = acc_dtype(x.dtype)
        return (self._per_frame(x, Fn).to(a) + self._per_frame(y, Fn).to(a) * gate2).to(x.dtype).view(B, N, D)

    def forward(
        self,
        x: torch.Tensor,
        e0: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        cross_kv: KV,
        attend: SelfAttentionBackend,
        layer: int,
        *,
        kv_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One block over the chunk: self-attention, cross-attention, FFN residual steps in turn.

        Args:
            x: (B, N, D) tokens. e0: (B, F, 6, D) timestep projection.
            rope: (cos, sin) from `rope_cos_sin`. cross_kv: this layer's prompt K, V.
            attend: the session-state owner's attention. layer: this block's index.
            kv_only: return after computing k, v (the commit pass's last block).

        Returns:
            x (B, N, D) (unchanged when kv_only), k, v (B, N, H, hd), k after RoPE.
        """
        mod = self.modulation_terms(e0, x.dtype)
        x, k, v = self.self_attn_residual(x, mod, rope, attend, layer, kv_only=kv_only)
        if kv_only:
            return x, k, v
        x = self.cross_attn_residual(x, cross_kv)
        x = self.ffn_residual(x, mod)
        return x, k, v


class Head(nn.Module):
    """Final modulated LayerNorm and linear map to patch values (Wan's `Head`)."""

    def __init__(self, cfg: CausalWanConfig) -> None:
        super().__init__()
        d = cfg.dim
        self.norm = LayerNorm(d, cfg.eps, elementwise_affine=False)
        self.head = nn.Linear(d, math.prod(cfg.patch) * cfg.out_channels)
        self.modulation = nn.Parameter(torch.randn(1, 2, d) / d**0.5)

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """x (B, N, D), e (B, F, D) time embedding -> (B, N, prod(patch) * C_out)."""
        B, N, D = x.shape
        Fn = e.shape[1]
        a = acc_dtype(x.dtype)
        shift, scale = (self.modulation.to(a)[:, None] + e.to(a)[:, :, None])[:, :, :, None].unbind(2)  # (B,F,1,D)
        h = (self.norm(x).view(B, Fn, N // Fn, D) * (1 + scale) + shift).to(x.dtype).view(B, N, D)
        return self.head(h)


# -----------------------------------------------------------------------------
# The model


@dataclass
class DiTOutput:
    """What one chunk forward returns.

    Attributes:
        flow: (B, C_out, F, H, W) flow (velocity) prediction v = eps - x0, in the
            weights' dtype; None for a kv_only pass. `flow_to_x0` turns it into x0.
        kv: per layer (K, V), each (B, N, H, hd): the chunk's own keys (after
            RoPE, at absolute positions) and values, for the caller to cache.
    """

    flow: torch.Tensor | None
    kv: list[KV]


class CausalWanDiT(nn.Module):
    """Causal Wan 2.1 DiT: one chunk of latent frames against the session state the caller holds."""

    def __init__(self, cfg: CausalWanConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.dim
        self.patch_embedding = nn.Conv3d(cfg.in_channels, d, kernel_size=cfg.patch, stride=cfg.patch)
        self.text_embedding = nn.Sequential(nn.Linear(cfg.text_dim, d), nn.GELU(approximate="tanh"), nn.Linear(d, d))
        self.time_embedding = nn.Sequential(nn.Linear(cfg.freq_dim, d), nn.SiLU(), nn.Linear(d, d))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(d, 6 * d))
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.layers)])
        self.head = Head(cfg)

    @property
    def dtype(self) -> torch.dtype:
        """dtype of the activations (the patch embedding's)."""
        return self.patch_embedding.weight.dtype

    def cast(self, dtype: torch.dtype) -> CausalWanDiT:
        """Cast weights to `dtype`, keeping `FP32_PARAMS` in float32 when `dtype` is a half type; returns self."""
        for name, p in self.named_parameters():
            p.data = p.data.to(param_dtype(name, dtype))
        return self

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @torch.no_grad()
    def cross_kv(self, context: torch.Tensor) -> list[KV]:
        """The prompt's cross-attention cache, computed once per prompt.

        Args:
            context: (B, Lc, text_dim) text-encoder output, Lc <= cfg.text_len;
                zero-padded here to text_len tokens (padding is attended, as in Wan).

        Returns:
            per layer (K, V), each (B, text_len, H, hd), in the weights' dtype.

        Raises:
            ValueError: wrong width or more than text_len tokens.
        """
        B, Lc, Dt = context.shape
        if Dt != self.cfg.text_dim or Lc > self.cfg.text_len:
            raise ValueError(f"context {tuple(context.shape)} must be (B, <= {self.cfg.text_len}, {self.cfg.text_dim})")
        w = self.text_embedding[0].weight
        ctx = F.pad(context.to(w.dtype), (0, 0, 0, self.cfg.text_len - Lc))
        ctx = self.text_embedding(ctx)  # (B, text_len, D)
        return [blk.cross_attn.kv(ctx) for blk in self.blocks]

    def time_embed(self, t: torch.Tensor, B: int, Fn: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Timesteps (B,) or (B, F) -> e (B, F, D), e0 (B, F, 6, D), in the time MLPs' dtype."""
        if t.dim() == 1:
            t = t[:, None].expand(B, Fn)
        assert t.shape == (B, Fn), f"t must be (B,) or (B, F) = ({B}, {Fn}), got {tuple(t.shape)}"
        w = self.time_embedding[0].weight
        e = self.time_embedding(timestep_sinusoid(t.reshape(-1), self.cfg.freq_dim).to(w.dtype))  # (B*F, D)
        e0 = self.time_projection(e)  # (B*F, 6D)
        return e.view(B, Fn, -1), e0.view(B, Fn, 6, -1)

    @torch.no_grad()
    def forward(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        frame_offset: torch.Tensor,
        cross_kv: list[KV],
        self_attn: SelfAttentionBackend,
        *,
        kv_only: bool = False,
    ) -> DiTOutput:
        """Run one chunk.

        Args:
            x: (B, C_in, F, H, W) latent chunk (normalised VAE latents, noisy at t).
            t: float (B,) or (B, F) timesteps in Wan's scale [0, 1000] (= 1000 x flow time);
                any float dtype (the sinusoid is taken in float64).
            frame_offset: int64 (B,) absolute latent-frame index of each chunk's first frame.
            cross_kv: per layer (K, V) from `cross_kv(context)`.
            self_attn: the owner of the session's self-attention state (see `SelfAttentionBackend`).
            kv_only: a commit pass: return the keys and values only, skipping the last
                block's attention, cross-attention and FFN and the head.

        Returns:
            DiTOutput with the flow prediction (None when kv_only) and per-layer post-RoPE K, V.
        """
        cfg = self.cfg
        B, C, Fn, H, W = x.shape
        _, ph, pw = cfg.patch
        assert C == cfg.in_channels, f"x has {C} channels, model takes {cfg.in_channels}"
        assert H % ph == 0 and W % pw == 0, f"latent {H}x{W} must divide by patch {ph}x{pw}"
        assert frame_offset.shape == (B,) and frame_offset.dtype == torch.int64, "frame_offset must be int64 (B,)"
        assert len(cross_kv) == cfg.layers, f"cross_kv has {len(cross_kv)} layers, model has {cfg.layers}"
        h, w = H // ph, W // pw

        e, e0 = self.time_embed(t, B, Fn)
        tok = self.patch_embedding(x.to(self.dtype)).flatten(2).transpose(1, 2)  # (B, N, D)
        frame_pos = frame_offset[:, None] + torch.arange(Fn, device=x.device)  # (B, F)
        rope = rope_cos_sin(frame_pos, h, w, cfg, dtype=acc_dtype(tok.dtype))

        kv: list[KV] = []
        for i, blk in enumerate(self.blocks):
            last = kv_only and i == cfg.layers - 1
            tok, k, v = blk(tok, e0, rope, cross_kv[i], self_attn, i, kv_only=last)
            kv.append((k, v))
        if kv_only:
            return DiTOutput(flow=None, kv=kv)

        out = self.head(tok, e)  # (B, N, p_t*p_h*p_w*C_out)
        out = out.view(B, Fn, h, w, *cfg.patch, cfg.out_channels)
        out = out.permute(0, 7, 1, 4, 2, 5, 3, 6).reshape(B, cfg.out_channels, Fn, H, W)
        return DiTOutput(flow=out, kv=kv)
