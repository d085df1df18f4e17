"""Matrix-Game 2.0's action module: keyboard and mouse conditioning inside a DiT block.

What it computes is the release's `ActionModule` (SkyworkAI/Matrix-Game,
`Matrix-Game-2/wan/modules/action_module.py`, after Matrix-Game / GameFactory,
arXiv 2501.08325), with its KV-cache branch (the one inference runs). Shapes: B
batch, F latent frames of the chunk, S = h*w tokens per latent frame, N = F*S,
D model width, W = 12 pixel frames of actions per latent frame, Hm / Hk action
heads, d = 64 the action head dim.

- Mouse: each token (frame i, position s) gets the mouse values of its latent
  frame's W pixel frames (W * mouse_dim values) concatenated to its hidden state,
  through `mouse_mlp` to width c, then per-position temporal attention over latent
  frames: q, k, v (B, S, F, Hm, d), RMS-normalised per head (no gain: the release's
  `WanRMSNorm` in this file ignores its weight), rotated by latent-frame position,
  attending to the same position's keys of the cached frames and of the chunk.
- Keyboard: each latent frame's W keyboard rows are embedded (`keyboard_embed`,
  per row) and flattened into one key/value per latent frame (B, F, Hk, d); every
  token queries them (`mouse_attn_q` of the hidden state after the mouse step), with
  the same RoPE, over the cached frames' keys and the chunk's.

Both use the release's action RoPE: the head dim splits as `mouse_qk_dim_list`
(8, 28, 28) over positions (latent frame, 0, 0) (its table is built on a
(frames, 1, 1) grid, so only the first 8 dims rotate), base `rope_theta` 256,
adjacent pairs rotated. Angles come from int64 positions in float64 (the release
reads a float32 table of 7500 frames and fails past it).

Which pixel frames a latent frame sees (release, `forward`: the action rows are
left-padded with 12 copies of pixel frame 0, then latent frame i takes padded rows
[4i, 4i + 12)): latent frame j uses pixel frames [4j - 12, 4j), indices below 0 taken
as pixel frame 0. `action_windows` builds them from a chunk's rows and the history.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn as nn

from worldcast.models.causal_wan.dit import acc_dtype, apply_rope
from worldcast.models.matrix_game.config import ActionConfig

KV = tuple[torch.Tensor, torch.Tensor]


# -----------------------------------------------------------------------------
# Which actions each latent frame sees


@dataclass
class ActionWindows:
    """Per latent frame of a chunk, the action rows of the pixel frames it sees.

    Attributes:
        keyboard: (B, F, W, keyboard_dim) or None (no keyboard branch).
        mouse: (B, F, W, mouse_dim) or None (no mouse branch).
    """

    keyboard: torch.Tensor | None
    mouse: torch.Tensor | None


def action_windows(history: torch.Tensor, chunk: torch.Tensor, first_chunk: torch.Tensor, a: ActionConfig,
                   *, frames: int) -> ActionWindows:
    """The action windows of a chunk's latent frames, from the chunk's rows and the session's history.

    A chunk starting at latent frame c0 > 0 covers pixel frames [4c0 - 3, 4c0 + 9) (12 rows); its
    latent frames c0 + i need pixel frames [4(c0 + i) - 12, 4(c0 + i)), so the rows
    [history | chunk] = pixel frames [4c0 - 12, 4c0 + 9) hold them all: window i is rows
    [4i, 4i + W). A session's first chunk (9 pixel frames) arrives left-padded to 12 rows with
    copies of pixel frame 0 (`pad_first_chunk`), and its history is pixel frame 0 repeated
    (the release's padding).

    Args:
        history: (B, Hp, A) the previous chunks' last Hp = W - 3 pixel frames' action vectors.
        chunk: (B, R, A) the chunk's rows, R = 4 * frames.
        first_chunk: bool (B,) whether the row is a session's first chunk (its history is unused).
        a: the action module config (W = a.window_pixel_frames; A = keyboard_dim + mouse_dim).
        frames: latent frames of the chunk.

    Returns:
        ActionWindows with (B, frames, W, ·) keyboard and mouse rows.
    """
    r, W = a.vae_time_compression_ratio, a.window_pixel_frames
    B, R, A = chunk.shape
    assert R == r * frames, f"a chunk of {frames} latent frames has {r * frames} action rows, got {R}"
    assert history.shape == (B, W - (r - 1), A), f"history must be (B, {W - (r - 1)}, {A}), got {tuple(history.shape)}"
    assert A == a.action_dim, f"action vectors have {A} values, the module takes {a.action_dim}"
    pad = chunk[:, :1].expand_as(history)
    hist = torch.where(first_chunk.view(B, 1, 1), pad, history.to(chunk.dtype))
    rows = torch.cat([hist, chunk], dim=1)  # (B, Hp + R, A): pixel frames [4c0 - 12, 4c0 + 9)
    win = rows.unfold(1, W, r).permute(0, 1, 3, 2)  # (B, frames, W, A)
    assert win.shape[1] == frames
    kd = a.keyboard_dim_in if a.enable_keyboard else 0
    return ActionWindows(keyboard=win[..., :kd] if a.enable_keyboard else None,
                         mouse=win[..., kd:] if a.enable_mouse else None)


def pad_first_chunk(rows: torch.Tensor, *, missing: int) -> torch.Tensor:
    """Left-pad a session's first chunk's rows (T, A) with `missing` copies of its first row."""
    return torch.cat([rows[:1].expand(missing, -1), rows], dim=0)


# -----------------------------------------------------------------------------
# The action RoPE


def action_rope_cos_sin(frame_pos: torch.Tensor, a: ActionConfig, *, dtype: torch.dtype
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotation tables of the action attention at absolute latent-frame positions.

    The release builds them with `get_nd_rotary_pos_embed(mouse_qk_dim_list, [frames, 1, 1],
    theta=rope_theta)` (`posemb_layers.py`): part i of the head dim rotates pairs by
    position_i * theta^(-2k / d_i) with positions (frame, 0, 0).

    Args:
        frame_pos: int64 (B, F) absolute latent frames.

    Returns:
        cos, sin: (B, F, 1, d/2) in `dtype` (broadcast over positions s by the caller).
    """
    dev = frame_pos.device
    parts = []
    for i, d in enumerate(a.mouse_qk_dim_list):
        inv = a.rope_theta ** (-torch.arange(0, d, 2, device=dev, dtype=torch.float64) / d)  # (d/2,)
        pos = frame_pos.to(torch.float64) if i == 0 else torch.zeros_like(frame_pos, dtype=torch.float64)
        parts.append(pos[..., None] * inv)  # (B, F, d/2)
    ang = torch.cat(parts, dim=-1)[:, :, None, :]  # (B, F, 1, d/2)
    return ang.cos().to(dtype), ang.sin().to(dtype)


# -----------------------------------------------------------------------------
# Modules


class UnscaledRMSNorm(nn.Module):
    """x / rms(x) over the last dim, computed in `acc_dtype`.

    The release's `WanRMSNorm` of `action_module.py` declares a gain but its forward never applies
    it; the parameter is kept so checkpoints load, and ignored the same way.
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.to(acc_dtype(x.dtype))
        return (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)).to(x.dtype)


class ActionAttention(Protocol):
    """What the action module needs from whoever owns the session's action caches.

    `mouse(layer, q, k, v)`: q, k, v (B, S, F, H, d), q and k rotated; per position s,
    softmax(q K^T / sqrt(d)) V over that position's cached keys of the visible frames plus the
    chunk's own. `keyboard(layer, q, k, v)`: q (B, S, F, H, d), k, v (B, F, H, d) one key per
    latent frame, shared by every position. Both return (B, S, F, H, d). `layer` counts the
    blocks that have an action module (0, 1, ...). `attention.RingActionAttention` reads the
    engine's pool.
    """

    def mouse(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...

    def keyboard(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


@dataclass
class ActionKV:
    """The chunk's action keys (rotated) and values of one block, for the caller to cache.

    Attributes:
        mouse: (k, v) each (B, S, F, Hm, d), or None.
        keyboard: (k, v) each (B, F, Hk, d), or None.
    """

    mouse: KV | None
    keyboard: KV | None


class ActionModule(nn.Module):
    """Keyboard and mouse conditioning of one block (the release's `ActionModule`, inference branch).

    Parameter names are the release's (`blocks.{i}.action_model.*`).

    Args:
        a: the action module's config. dim: the DiT width (the release's img_hidden_size).
    """

    def __init__(self, a: ActionConfig, dim: int) -> None:
        super().__init__()
        self.cfg = a
        W, d = a.window_pixel_frames, a.head_dim

        def norm() -> nn.Module:
            return UnscaledRMSNorm(d, eps=1e-6) if a.qk_norm else nn.Identity()

        if a.enable_keyboard:
            self.keyboard_embed = nn.Sequential(nn.Linear(a.keyboard_dim_in, a.hidden_size), nn.SiLU(),
                                                nn.Linear(a.hidden_size, a.hidden_size))
        if a.enable_mouse:
            c = a.mouse_hidden_dim
            self.mouse_mlp = nn.Sequential(nn.Linear(a.mouse_dim_in * W + dim, c), nn.GELU(approximate="tanh"),
                                           nn.Linear(c, c), nn.LayerNorm(c))
            self.t_qkv = nn.Linear(c, 3 * c, bias=a.qkv_bias)
            self.img_attn_q_norm, self.img_attn_k_norm = norm(), norm()
            self.proj_mouse = nn.Linear(c, dim, bias=a.qkv_bias)
        if a.enable_keyboard:
            ck = a.keyboard_hidden_dim
            self.key_attn_q_norm, self.key_attn_k_norm = norm(), norm()
            self.mouse_attn_q = nn.Linear(dim, ck, bias=a.qkv_bias)  # (the release's name: it queries the keyboard)
            self.keyboard_attn_kv = nn.Linear(a.hidden_size * W, 2 * ck, bias=a.qkv_bias)
            self.proj_keyboard = nn.Linear(ck, dim, bias=a.qkv_bias)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], windows: ActionWindows,
                attend: ActionAttention, layer: int) -> tuple[torch.Tensor, ActionKV]:
        """One chunk through the action module.

        Args:
            x: (B, N, D) hidden states after cross-attention, N = F * S frame-major.
            rope: (cos, sin) (B, F, 1, d/2) from `action_rope_cos_sin`.
            windows: the chunk's action windows (`action_windows`).
            attend: owner of the action caches. layer: this block's index among action blocks.

        Returns:
            x (B, N, D) with the mouse and keyboard residuals added, and the chunk's action K, V.
        """
        a = self.cfg
        B, N, D = x.shape
        cos, sin = rope
        Fn = cos.shape[1]
        S = N // Fn
        mouse_kv = keyboard_kv = None
        if a.enable_mouse:
            assert windows.mouse is not None, "the mouse branch needs mouse windows"
            hs = x.view(B, Fn, S, D).transpose(1, 2)  # (B, S, F, D)
            g = windows.mouse.flatten(2).to(x.dtype)[:, None].expand(B, S, Fn, -1)  # (B, S, F, W * mouse_dim)
            h = self.mouse_mlp(torch.cat([hs, g], dim=-1))  # (B, S, F, c)
            q, k, v = self.t_qkv(h).unflatten(-1, (3, a.heads, -1)).unbind(-3)  # each (B, S, F, Hm, d)
            q = apply_rope(self.img_attn_q_norm(q), cos[:, None], sin[:, None])
            k = apply_rope(self.img_attn_k_norm(k), cos[:, None], sin[:, None])
            y = attend.mouse(layer, q, k, v)  # (B, S, F, Hm, d)
            x = x + self.proj_mouse(y.transpose(1, 2).reshape(B, N, -1))
            mouse_kv = (k, v)
        if a.enable_keyboard:
            assert windows.keyboard is not None, "the keyboard branch needs keyboard windows"
            e = self.keyboard_embed(windows.keyboard.to(x.dtype)).flatten(2)  # (B, F, W * hidden)
            k, v = self.keyboard_attn_kv(e).unflatten(-1, (2, a.heads, -1)).unbind(-3)  # each (B, F, Hk, d)
            q = self.mouse_attn_q(x).unflatten(-1, (a.heads, -1))  # (B, N, Hk, d)
            q = self.key_attn_q_norm(q).view(B, Fn, S, a.heads, -1).transpose(1, 2)  # (B, S, F, Hk, d)
            q = apply_rope(q, cos[:, None], sin[:, None])
            k = apply_rope(self.key_attn_k_norm(k), cos, sin)
            y = attend.keyboard(layer, q, k, v)  # (B, S, F, Hk, d)
            x = x + self.proj_keyboard(y.transpose(1, 2).reshape(B, N, -1))
            keyboard_kv = (k, v)
        return x, ActionKV(mouse=mouse_kv, keyboard=keyboard_kv)
