"""The Wan 2.1 VAE decoder, streamed chunk by chunk with its causal-conv cache held by the caller.

Reads top to bottom: causal 3D conv with an explicit cache, RMS norm,
residual block, mid attention, resampling with the time conv, the decoder,
and `WanVAEDecoder` with `decode_chunk`. Module names match diffusers'
`AutoencoderKLWan` (`decoder.*`, `post_quant_conv.*`), so its state dict
loads as is. Shapes: B batch, C channels, T frames, (H, W) spatial.

The decoder's causal convolutions (kernel 3 in time) see the last 2 frames of
their input from the previous call; each such conv owns one cache tensor
(B, C_in, 2, H, W), and so does each temporal upsampler's time conv. The
cache list is fixed-size and fixed-shape: a session starts from zeros (which
is what diffusers' zero padding and its "Rep" marker compute), and every call
returns NEW tensors, never writing into the ones passed in. The only thing
special about a session's first latent frame is that the temporal upsamplers
skip their time conv for it, so it decodes to 1 pixel frame; every later
latent frame decodes to 4 (diffusers `WanResample.forward`, `upsample3d`).

Source read: diffusers `models/autoencoders/autoencoder_kl_wan.py` (Wan 2.1
path, `is_residual=False`); Wan-Video/Wan2.1 `wan/modules/vae.py`.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from worldcast.models.causal_wan.config import WanVAEConfig
from worldcast.models.causal_wan.dit import acc_dtype

CACHE_FRAMES = 2  #: input frames a kernel-3 causal conv keeps from the previous call


class _Cache:
    """Walks the cache list in call order: `take()` the next old tensor, `put()` its replacement.

    `_Cache(None)` is a fresh start: every `take()` returns None, which a causal conv reads as
    zeros of its input's shape (so a caller need not know the cache's shapes in advance).
    """

    def __init__(self, old: list[torch.Tensor] | None) -> None:
        self.old, self.new, self.i = old, [], 0

    def take(self) -> torch.Tensor | None:
        t = self.old[self.i] if self.old is not None else None
        self.i += 1
        return t

    def put(self, t: torch.Tensor) -> None:
        self.new.append(t)


class CausalConv3d(nn.Conv3d):
    """3D conv, causal in time: the previous call's last 2 input frames stand in for left padding."""

    def __init__(
        self, c_in: int, c_out: int, kernel: int | tuple[int, int, int], padding: tuple[int, int, int]
    ) -> None:
        super().__init__(c_in, c_out, kernel, padding=0)
        self.pad_hw = padding[1:]
        self.cached = self.kernel_size[0] > 1
        assert not self.cached or (self.kernel_size[0] == 3 and padding[0] == 1), "causal convs here are k_t=3, pad 1"

    def forward(self, x: torch.Tensor, cache: _Cache | None = None) -> torch.Tensor:  # type: ignore[override]
        """x (B, C_in, T, H, W) -> (B, C_out, T, H, W); reads and replaces one cache entry when k_t = 3."""
        if self.cached:
            assert cache is not None, "a causal conv needs its cache"
            prev = cache.take()
            if prev is None:  # a fresh start: zero left padding
                prev = x.new_zeros(x.shape[0], x.shape[1], CACHE_FRAMES, *x.shape[3:])
            x = torch.cat([prev.to(x.dtype), x], dim=2)  # (B, C_in, 2 + T, H, W)
            cache.put(x[:, :, -CACHE_FRAMES:].contiguous())
        if x.device.type == "cpu":
            return conv3d_by_frames(x, self.weight, self.bias, self.pad_hw)
        return F.conv3d(x, self.weight, self.bias, padding=(0, *self.pad_hw))


def conv3d_by_frames(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, pad_hw: tuple[int, ...]
) -> torch.Tensor:
    """`F.conv3d(x, weight, bias, padding=(0, *pad_hw))` (stride 1) as one 2D conv per temporal tap, summed.

    The same sum of products, grouped by tap; on CPU PyTorch runs small 3D convs
    through its slow reference kernel, and this is several times faster.
    x (B, C, T, H, W), weight (C_out, C, k_t, k_h, k_w) -> (B, C_out, T - k_t + 1, H', W').
    """
    B, C, T, H, W = x.shape
    kt = weight.shape[2]
    t_out = T - kt + 1
    frames = x.transpose(1, 2).contiguous()  # (B, T, C, H, W); a no-op when x came from here
    out = None
    for dt in range(kt):
        xs = frames[:, dt : dt + t_out].reshape(B * t_out, C, H, W)
        y = F.conv2d(xs, weight[:, :, dt], bias if dt == 0 else None, padding=tuple(pad_hw))
        out = y if out is None else out + y
    assert out is not None
    return out.view(B, t_out, *out.shape[1:]).transpose(1, 2)


class RMSNorm(nn.Module):
    """Channel RMS norm: x / ||x||_2 over channels * sqrt(C) * gamma (diffusers `WanRMS_norm`, no bias)."""

    def __init__(self, dim: int, *, images: bool) -> None:
        super().__init__()
        self.scale = dim**0.5
        self.gamma = nn.Parameter(torch.ones(dim, *((1, 1) if images else (1, 1, 1))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.to(acc_dtype(x.dtype))
        norm = (xf * xf).sum(dim=1, keepdim=True).sqrt()  # = ||x||_2 over channels (faster than .norm on CPU)
        y = (xf / norm.clamp_min(1e-12)).to(x.dtype)
        return y * self.scale * self.gamma.to(x.dtype)


class ResidualBlock(nn.Module):
    """RMSNorm, SiLU, causal conv, twice, plus a 1x1x1 shortcut when the width changes."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.norm1 = RMSNorm(c_in, images=False)
        self.conv1 = CausalConv3d(c_in, c_out, 3, padding=(1, 1, 1))
        self.norm2 = RMSNorm(c_out, images=False)
        self.conv2 = CausalConv3d(c_out, c_out, 3, padding=(1, 1, 1))
        self.conv_shortcut = CausalConv3d(c_in, c_out, 1, padding=(0, 0, 0)) if c_in != c_out else None

    def forward(self, x: torch.Tensor, cache: _Cache) -> torch.Tensor:
        h = self.conv_shortcut(x) if self.conv_shortcut is not None else x
        x = self.conv1(F.silu(self.norm1(x)), cache)
        x = self.conv2(F.silu(self.norm2(x)), cache)
        return x + h


class AttentionBlock(nn.Module):
    """Single-head spatial self-attention within each frame (diffusers `WanAttentionBlock`)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = RMSNorm(dim, images=True)
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1)
        self.proj = nn.Conv2d(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, T, H, W = x.shape
        y = self.norm(x.permute(0, 2, 1, 3, 4).reshape(B * T, C, H, W))
        qkv = self.to_qkv(y).flatten(2).transpose(1, 2)  # (B*T, H*W, 3C)
        q, k, v = qkv[:, None].chunk(3, dim=-1)  # each (B*T, 1, H*W, C)
        y = F.scaled_dot_product_attention(q, k, v)[:, 0].transpose(1, 2).reshape(B * T, C, H, W)
        y = self.proj(y).view(B, T, C, H, W).permute(0, 2, 1, 3, 4)
        return x + y


class Upsample(nn.Module):
    """2x nearest spatial upsampling and a 3x3 conv to half the width; "3d" also doubles time first."""

    def __init__(self, dim: int, *, temporal: bool) -> None:
        super().__init__()
        self.resample = nn.Sequential(nn.Identity(), nn.Conv2d(dim, dim // 2, 3, padding=1))  # [1] is the conv
        self.time_conv = CausalConv3d(dim, dim * 2, (3, 1, 1), padding=(1, 0, 0)) if temporal else None

    def forward(self, x: torch.Tensor, cache: _Cache, *, first_frame: bool) -> torch.Tensor:
        B, C, T, H, W = x.shape
        if self.time_conv is not None:
            if first_frame:  # the session's first latent frame is not doubled; its cache starts at zero
                cache.take()
                cache.put(x.new_zeros(B, C, CACHE_FRAMES, H, W))
            else:
                y = self.time_conv(x, cache)  # (B, 2C, T, H, W): two output frames per input frame
                x = y.view(B, 2, C, T, H, W).permute(0, 2, 3, 1, 4, 5).reshape(B, C, 2 * T, H, W)
        T = x.shape[2]
        y = x.permute(0, 2, 1, 3, 4).reshape(B * T, C, H, W)
        y = F.interpolate(y, scale_factor=2.0, mode="nearest-exact")  # an exact copy in any dtype
        y = self.resample[1](y)
        return y.view(B, T, C // 2, 2 * H, 2 * W).permute(0, 2, 1, 3, 4)


class MidBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.resnets = nn.ModuleList([ResidualBlock(dim, dim), ResidualBlock(dim, dim)])
        self.attentions = nn.ModuleList([AttentionBlock(dim)])

    def forward(self, x: torch.Tensor, cache: _Cache) -> torch.Tensor:
        x = self.resnets[0](x, cache)
        x = self.attentions[0](x)
        return self.resnets[1](x, cache)


class UpBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, num_res_blocks: int, mode: str | None) -> None:
        super().__init__()
        self.resnets = nn.ModuleList(
            [ResidualBlock(c_in if j == 0 else c_out, c_out) for j in range(num_res_blocks + 1)]
        )
        self.upsamplers = nn.ModuleList([Upsample(c_out, temporal=mode == "3d")]) if mode else None

    def forward(self, x: torch.Tensor, cache: _Cache, *, first_frame: bool) -> torch.Tensor:
        for r in self.resnets:
            x = r(x, cache)
        if self.upsamplers is not None:
            x = self.upsamplers[0](x, cache, first_frame=first_frame)
        return x


class Decoder(nn.Module):
    """Wan 2.1's 3D decoder: conv_in, mid block, up blocks (time doubled twice, space thrice), head."""

    def __init__(self, cfg: WanVAEConfig) -> None:
        super().__init__()
        dims = [cfg.base_dim * m for m in (cfg.dim_mult[-1], *cfg.dim_mult[::-1])]
        temporal_up = cfg.temporal_downsample[::-1]
        self.conv_in = CausalConv3d(cfg.z_dim, dims[0], 3, padding=(1, 1, 1))
        self.mid_block = MidBlock(dims[0])
        self.up_blocks = nn.ModuleList()
        last = len(cfg.dim_mult) - 1
        for i, (c_in, c_out) in enumerate(zip(dims[:-1], dims[1:])):
            c_in = c_in // 2 if i > 0 else c_in  # the previous upsampler halved the width
            mode = None if i == last else ("3d" if temporal_up[i] else "2d")
            self.up_blocks.append(UpBlock(c_in, c_out, cfg.num_res_blocks, mode))
        self.norm_out = RMSNorm(dims[-1], images=False)
        self.conv_out = CausalConv3d(dims[-1], 3, 3, padding=(1, 1, 1))

    def forward(self, x: torch.Tensor, cache: _Cache, *, first_frame: bool) -> torch.Tensor:
        x = self.conv_in(x, cache)
        x = self.mid_block(x, cache)
        for blk in self.up_blocks:
            x = blk(x, cache, first_frame=first_frame)
        return self.conv_out(F.silu(self.norm_out(x)), cache)

    def cache_channels(self) -> list[tuple[int, int]]:
        """(input channels, spatial scale vs the latent) of each cache entry, in call order."""
        out: list[tuple[int, int]] = [(self.conv_in.in_channels, 1)]
        scale = 1

        def res(r: ResidualBlock) -> None:
            out.extend([(r.conv1.in_channels, scale), (r.conv2.in_channels, scale)])

        for r in self.mid_block.resnets:
            res(r)
        for blk in self.up_blocks:
            for r in blk.resnets:
                res(r)
            if blk.upsamplers is not None:
                up = blk.upsamplers[0]
                if up.time_conv is not None:
                    out.append((up.time_conv.in_channels, scale))
                scale *= 2
        out.append((self.conv_out.in_channels, scale))
        return out


class WanVAEDecoder(nn.Module):
    """The Wan 2.1 VAE's decoding half, state-dict compatible with diffusers' `AutoencoderKLWan`
    (`decoder.*`, `post_quant_conv.*`; its encoder keys are not used)."""

    def __init__(self, cfg: WanVAEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.post_quant_conv = CausalConv3d(cfg.z_dim, cfg.z_dim, 1, padding=(0, 0, 0))
        self.decoder = Decoder(cfg)

    @property
    def dtype(self) -> torch.dtype:
        return self.post_quant_conv.weight.dtype

    def cache_spec(self, height: int, width: int) -> list[tuple[tuple[int, ...], torch.dtype]]:
        """Per-session decoder-cache tensors at a pixel frame size: [(shape without batch, dtype), ...].

        Every entry is (C, 2, H_l, W_l) at the resolution of its conv; the
        list's length and shapes are the same for every chunk (32 entries,
        about 1.9 GB in bf16 at 480x832 for the full Wan 2.1 decoder).

        Raises:
            ValueError: a frame size that does not divide by the spatial stride.
        """
        s = self.cfg.spatial_stride
        if height % s or width % s:
            raise ValueError(f"frame {height}x{width} must divide by {s}")
        h, w = height // s, width // s
        return [((c, CACHE_FRAMES, h * k, w * k), self.dtype) for c, k in self.decoder.cache_channels()]

    def cache_bytes(self, height: int, width: int) -> int:
        """Bytes of one session's decoder cache at a pixel frame size."""
        total = 0
        for shape, dt in self.cache_spec(height, width):
            n = 1
            for d in shape:
                n *= d
            total += n * torch.empty((), dtype=dt).element_size()
        return total

    def zero_cache(self, batch: int, height: int, width: int) -> list[torch.Tensor]:
        """The cache a session starts from: zeros of `cache_spec`, each (batch, *shape)."""
        dev = self.post_quant_conv.weight.device
        return [torch.zeros(batch, *shape, dtype=dt, device=dev) for shape, dt in self.cache_spec(height, width)]

    @torch.no_grad()
    def decode_chunk(
        self,
        z: torch.Tensor,
        cache: list[torch.Tensor] | None,
        *,
        first_chunk: bool,
        frames_per_call: int | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Decode a chunk of latent frames of a batch of sessions, streaming.

        The latents are unnormalised here (z * latents_std + latents_mean, as
        diffusers' WanPipeline does before `vae.decode`), then run through
        post_quant_conv and the decoder with the sessions' cache.

        Args:
            z: (B, z_dim, T, h, w) normalised latents (the DiT's space), any float dtype.
            cache: the list `decode_chunk` returned for the previous chunk (shapes
                `cache_spec`, batched); ignored (None is fine) when first_chunk.
            first_chunk: the sessions' first chunk: latent frame 0 decodes alone to
                1 pixel frame, from a zero cache. Same for the whole batch.
            frames_per_call: latent frames per decoder pass; None = all at once (fastest on CPU).
                The result is the same; 1 (as diffusers decodes) bounds activation memory to
                4 pixel frames per session, which the full decoder at 480x832 wants on a GPU.

        Returns:
            frames: float (B, T_pix, H, W, 3) RGB in [-1, 1] (clamped, as diffusers' decode),
                in the decoder's dtype; T_pix = 4T - 3 on the first chunk, else 4T.
                `frames_to_uint8` converts.
            new_cache: fresh tensors of the same shapes (the passed ones are not modified).

        Raises:
            ValueError: wrong channel count, or a missing/misshapen cache on a later chunk.
        """
        B, C, T, h, w = z.shape
        if C != self.cfg.z_dim:
            raise ValueError(f"z has {C} channels, the VAE takes {self.cfg.z_dim}")
        s = self.cfg.spatial_stride
        spec = self.cache_spec(h * s, w * s)
        if first_chunk:
            cache = [torch.zeros(B, *shape, dtype=dt, device=z.device) for shape, dt in spec]
        elif cache is None or len(cache) != len(spec):
            raise ValueError(f"a later chunk needs the {len(spec)}-entry cache of the previous chunk")
        else:
            for i, (c, (shape, _)) in enumerate(zip(cache, spec)):
                if tuple(c.shape) != (B, *shape):
                    raise ValueError(f"cache[{i}] has shape {tuple(c.shape)}, expected {(B, *shape)}")
        a = acc_dtype(self.dtype)
        mean = torch.tensor(self.cfg.latents_mean, dtype=a, device=z.device).view(1, -1, 1, 1, 1)
        std = torch.tensor(self.cfg.latents_std, dtype=a, device=z.device).view(1, -1, 1, 1, 1)
        x = (z.to(a) * std + mean).to(self.dtype)  # unnormalise (in float32 at least)
        x = self.post_quant_conv(x)
        outs = []
        if first_chunk:
            c0 = _Cache(cache)
            outs.append(self.decoder(x[:, :, :1], c0, first_frame=True))
            cache, x = c0.new, x[:, :, 1:]
        step = frames_per_call or max(1, x.shape[2])
        for i in range(0, x.shape[2], step):
            c1 = _Cache(cache)
            outs.append(self.decoder(x[:, :, i : i + step], c1, first_frame=False))
            cache = c1.new
        out = torch.cat(outs, dim=2).clamp(-1.0, 1.0)  # (B, 3, T_pix, H, W)
        return out.permute(0, 2, 3, 4, 1), cache


def frames_to_uint8(frames: torch.Tensor) -> torch.Tensor:
    """RGB in [-1, 1] (any shape) -> uint8 in [0, 255], rounding to nearest."""
    return ((frames.float() + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8)


def decoder_activation_bytes(vae: WanVAEDecoder, height: int, width: int, *, latent_frames: int,
                             dtype: torch.dtype | None = None) -> int:
    """Estimated peak activation bytes of one decoder pass of one session (a later chunk's pass).

    Runs the decoder on the meta device (no memory, no compute) with hooks on its causal convs;
    for each conv the live tensors are taken as its cache-extended input, its output and two
    more tensors of its input's size (the residual path and the norm/SiLU temporaries), and the
    largest sum over the convs is returned. An estimate of the allocator's peak, not a measurement:
    the GPU check records the measured peak beside it.

    Args:
        height, width: pixel frame size. latent_frames: latent frames per pass (`frames_per_call`).
        dtype: activation dtype (default the decoder's).
    """
    elem = torch.empty((), dtype=dtype or vae.dtype).element_size()
    with torch.device("meta"):
        shadow = WanVAEDecoder(vae.cfg)
    peak = [0]

    def hook(_m: nn.Module, inp: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        x = inp[0]
        cat = x.numel() * (x.shape[2] + CACHE_FRAMES) // max(1, x.shape[2])
        peak[0] = max(peak[0], (cat + out.numel() + 2 * x.numel()) * elem)

    handles = [m.register_forward_hook(hook) for m in shadow.modules() if isinstance(m, CausalConv3d)]
    try:
        s = vae.cfg.spatial_stride
        z = torch.zeros(1, vae.cfg.z_dim, latent_frames, height // s, width // s, device="meta")
        cache = [torch.zeros(1, *shape, device="meta") for shape, _ in shadow.cache_spec(height, width)]
        shadow.decode_chunk(z, cache, first_chunk=False, frames_per_call=latent_frames)
    finally:
        for h in handles:
            h.remove()
    return peak[0]
