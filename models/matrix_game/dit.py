"""The Matrix-Game 2.0 causal DiT: causal Wan 2.1 blocks, image cross-attention, an action module.

What it computes is the release's `CausalWanModel._forward_inference`
(SkyworkAI/Matrix-Game, `Matrix-Game-2/wan/modules/causal_model.py`), one chunk at
a time against session state the caller holds:

    x_in  = [noisy latents (16) | mask (4) | first-frame latent (16)]   (B, 36, F, h, w)
    tokens = patch_embedding(x_in)                                      (B, N, D), N = F * h/2 * w/2
    context = img_emb(CLIP features)                                    (B, 257, D), cached per session
    per block: self-attention (window ring, 3D RoPE at absolute frames)
               -> cross-attention over the image context
               -> action module (blocks that have one: mouse, then keyboard)
               -> FFN, each adaLN-modulated by the per-frame timestep
    head -> flow (B, 16, F, h, w)

The self-attention, cross-attention, FFN, head, RoPE and timestep pieces are
`models/causal_wan/dit.py`'s (`Block`'s residual steps, `Head`, `rope_cos_sin`,
`timestep_sinusoid`); this module adds the image embedding, the action module
between cross-attention and FFN, and the input concatenation. There is no text.
Parameter names are the release's (`blocks.0.action_model.t_qkv.weight`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
import torch.nn as nn

from worldcast.models.causal_wan.dit import (
    FP32_PARAMS,
    KV,
    Block,
    Head,
    SelfAttentionBackend,
    acc_dtype,
    rope_cos_sin,
    timestep_sinusoid,
)
from worldcast.models.matrix_game.action import (
    ActionAttention,
    ActionKV,
    ActionModule,
    ActionWindows,
    action_rope_cos_sin,
)
from worldcast.models.matrix_game.config import MatrixGameConfig


class MLPProj(nn.Module):
    """CLIP features -> cross-attention context: LayerNorm, Linear, GELU, Linear, LayerNorm (Wan i2v `MLPProj`)."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.proj = nn.Sequential(nn.LayerNorm(in_dim), nn.Linear(in_dim, in_dim), nn.GELU(),
                                  nn.Linear(in_dim, out_dim), nn.LayerNorm(out_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, in_dim) -> (B, L, out_dim)."""
        return self.proj(x)


class MatrixGameBlock(Block):
    """A causal Wan block with, where the config says so, an action module between cross-attention and FFN."""

    def __init__(self, cfg: MatrixGameConfig, index: int) -> None:
        super().__init__(cfg.wan)
        a = cfg.action
        self.action_model = ActionModule(a, cfg.dim) if a is not None and index in a.blocks else None

    def forward(  # type: ignore[override]
        self,
        x: torch.Tensor,
        e0: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        cross_kv: KV,
        attend: SelfAttentionBackend,
        layer: int,
        *,
        windows: ActionWindows | None = None,
        action_rope: tuple[torch.Tensor, torch.Tensor] | None = None,
        action_attend: ActionAttention | None = None,
        action_layer: int = -1,
        kv_only: bool = False,
    ) -> tuple[torch.Tensor, KV, ActionKV | None]:
        """One block over the chunk.

        Args:
            x: (B, N, D). e0: (B, F, 6, D). rope, cross_kv, attend, layer: as `Block.forward`.
            windows, action_rope, action_attend, action_layer: the action module's inputs
                (see `ActionModule.forward`), needed when this block has one.
            kv_only: the commit pass's last block: stop once every cache's keys are computed
                (after self-attention's k, v, or after the action module if the block has one).

        Returns:
            x (B, N, D), the self-attention (k, v) (B, N, H, hd), the action K, V (or None).
        """
        mod = self.modulation_terms(e0, x.dtype)
        last_needed = kv_only and self.action_model is None
        x, k, v = self.self_attn_residual(x, mod, rope, attend, layer, kv_only=last_needed)
        if last_needed:
            return x, (k, v), None
        x = self.cross_attn_residual(x, cross_kv)
        akv = None
        if self.action_model is not None:
            assert windows is not None and action_rope is not None and action_attend is not None, \
                f"block {layer} has an action module: pass its action windows, RoPE and caches"
            x, akv = self.action_model(x, action_rope, windows, action_attend, action_layer)
        if not kv_only:
            x = self.ffn_residual(x, mod)
        return x, (k, v), akv


@dataclass
class MatrixGameOutput:
    """What one chunk forward returns.

    Attributes:
        flow: (B, 16, F, h, w) flow prediction v = eps - x0 (None for a kv_only pass).
        kv: per block (K, V) (B, N, H, hd): self-attention keys after RoPE, values.
        action_kv: per action block (in block order) its `ActionKV`.
    """

    flow: torch.Tensor | None
    kv: list[KV]
    action_kv: list[ActionKV]


class MatrixGameDiT(nn.Module):
    """Matrix-Game 2.0's causal DiT: one chunk of latent frames against the session state the caller holds."""

    def __init__(self, cfg: MatrixGameConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.dim
        self.patch_embedding = nn.Conv3d(cfg.in_channels, d, kernel_size=cfg.patch, stride=cfg.patch)
        self.time_embedding = nn.Sequential(nn.Linear(cfg.freq_dim, d), nn.SiLU(), nn.Linear(d, d))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(d, 6 * d))
        self.blocks = nn.ModuleList([MatrixGameBlock(cfg, i) for i in range(cfg.layers)])
        self.head = Head(cfg.wan)
        self.img_emb = MLPProj(cfg.image_dim, d)
        self.action_blocks = tuple(i for i, b in enumerate(self.blocks) if b.action_model is not None)

    @property
    def dtype(self) -> torch.dtype:
        return self.patch_embedding.weight.dtype

    def cast(self, dtype: torch.dtype) -> MatrixGameDiT:
        """Cast weights to `dtype`, keeping the time MLPs and modulation tables in float32 for half types."""
        for name, p in self.named_parameters():
            keep = dtype in (torch.bfloat16, torch.float16) and any(s in name for s in FP32_PARAMS)
            p.data = p.data.to(torch.float32 if keep else dtype)
        return self

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @torch.no_grad()
    def cross_kv(self, clip: torch.Tensor) -> list[KV]:
        """The image's cross-attention cache, computed once per session.

        Args:
            clip: (B, L, image_dim) CLIP features (L = 257 for the release's ViT-H/14).

        Returns:
            per block (K, V), each (B, L, H, hd), in the weights' dtype.
        """
        B, L, Dc = clip.shape
        if Dc != self.cfg.image_dim:
            raise ValueError(f"CLIP features {tuple(clip.shape)} must be (B, L, {self.cfg.image_dim})")
        ctx = self.img_emb(clip.to(next(self.img_emb.parameters()).dtype)).to(self.dtype)  # (B, L, D)
        blocks = cast(list[MatrixGameBlock], list(self.blocks))
        return [blk.cross_attn.kv(ctx) for blk in blocks]

    def time_embed(self, t: torch.Tensor, B: int, Fn: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Timesteps (B,) or (B, F) -> e (B, F, D), e0 (B, F, 6, D) in the time MLPs' dtype."""
        if t.dim() == 1:
            t = t[:, None].expand(B, Fn)
        assert t.shape == (B, Fn), f"t must be (B,) or (B, F) = ({B}, {Fn}), got {tuple(t.shape)}"
        w = self.time_embedding[0].weight
        e = self.time_embedding(timestep_sinusoid(t.reshape(-1), self.cfg.freq_dim).to(w.dtype))  # (B*F, D)
        return e.view(B, Fn, -1), self.time_projection(e).view(B, Fn, 6, -1)

    @torch.no_grad()
    def forward(
        self,
        x: torch.Tensor,
        cond: torch.Tensor,
        t: torch.Tensor,
        frame_offset: torch.Tensor,
        cross_kv: list[KV],
        self_attn: SelfAttentionBackend,
        *,
        windows: ActionWindows | None = None,
        action_attn: ActionAttention | None = None,
        kv_only: bool = False,
    ) -> MatrixGameOutput:
        """Run one chunk.

        Args:
            x: (B, 16, F, h, w) noisy latents at t (normalised VAE latents).
            cond: (B, 20, F, h, w) [mask (4) | first-frame latent (16)] of the chunk's frames.
            t: float (B,) or (B, F) timesteps in Wan's scale [0, 1000].
            frame_offset: int64 (B,) absolute latent frame of each chunk's first frame.
            cross_kv: per block (K, V) from `cross_kv`.
            self_attn: owner of the sessions' self-attention cache (`SelfAttentionBackend`).
            windows: the chunk's action windows (`action.action_windows`); needed with an action module.
            action_attn: owner of the sessions' action caches (`action.ActionAttention`).
            kv_only: a commit pass: stop after the last cache's keys (no flow).

        Returns:
            MatrixGameOutput.
        """
        cfg = self.cfg
        B, C, Fn, H, W = x.shape
        _, ph, pw = cfg.patch
        assert C == cfg.out_channels, f"x has {C} channels, the model generates {cfg.out_channels}"
        assert cond.shape == (B, cfg.in_channels - C, Fn, H, W), \
            f"cond must be (B, {cfg.in_channels - C}, F, h, w) = {(B, cfg.in_channels - C, Fn, H, W)}"
        assert H % ph == 0 and W % pw == 0, f"latent {H}x{W} must divide by patch {ph}x{pw}"
        assert frame_offset.shape == (B,) and frame_offset.dtype == torch.int64, "frame_offset must be int64 (B,)"
        assert len(cross_kv) == cfg.layers, f"cross_kv has {len(cross_kv)} layers, model has {cfg.layers}"
        h, w = H // ph, W // pw

        e, e0 = self.time_embed(t, B, Fn)
        x_in = torch.cat([x.to(self.dtype), cond.to(self.dtype)], dim=1)  # (B, 36, F, H, W)
        tok = self.patch_embedding(x_in).flatten(2).transpose(1, 2)  # (B, N, D)
        frame_pos = frame_offset[:, None] + torch.arange(Fn, device=x.device)  # (B, F)
        a_dt = acc_dtype(tok.dtype)
        rope = rope_cos_sin(frame_pos, h, w, cfg.wan, dtype=a_dt)
        action_rope = action_rope_cos_sin(frame_pos, cfg.action, dtype=a_dt) if cfg.action is not None else None

        kv: list[KV] = []
        akv: list[ActionKV] = []
        last = cfg.layers - 1
        for i, blk in enumerate(self.blocks):
            tok, kvi, ai = blk(tok, e0, rope, cross_kv[i], self_attn, i, windows=windows, action_rope=action_rope,
                               action_attend=action_attn, action_layer=len(akv), kv_only=kv_only and i == last)
            kv.append(kvi)
            if ai is not None:
                akv.append(ai)
        if kv_only:
            return MatrixGameOutput(flow=None, kv=kv, action_kv=akv)
        out = self.head(tok, e)  # (B, N, p_t*p_h*p_w*C_out)
        out = out.view(B, Fn, h, w, *cfg.patch, cfg.out_channels)
        out = out.permute(0, 7, 1, 4, 2, 5, 3, 6).reshape(B, cfg.out_channels, Fn, H, W)
        return MatrixGameOutput(flow=out, kv=kv, action_kv=akv)
