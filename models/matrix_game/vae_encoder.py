"""The Wan 2.1 VAE encoder, and the first-frame conditioning Matrix-Game 2.0 builds with it.

Reads top to bottom: the spatial/temporal downsampler, the encoder, `WanVAEEncoder.encode`
(pixels -> normalised latents), then Matrix-Game 2.0's conditioning: the 4-channel mask and
the 16-channel latents of "the image, then gray frames", kept as a short table per session.

Module names match diffusers' `AutoencoderKLWan` (`encoder.*`, `quant_conv.*`), so its state
dict loads as is; the causal conv, RMS norm, residual and mid blocks are the decoder's
(`models/causal_wan/vae.py`). Shapes: B batch, C channels, T frames, (H, W) pixels, (h, w) latent.

The encoder streams like the decoder: frame 0 alone, then later frames (any multiple of 4);
its causal convs see the previous call's last 2 input frames, and a temporal downsampler
keeps its input's last frame. Frame 0 is not convolved in time by the downsamplers, so
1 + 4k pixel frames encode to 1 + k latent frames.

Sources read: diffusers 0.42.1 `models/autoencoders/autoencoder_kl_wan.py` (`WanEncoder3d`,
`WanResample` 'downsample2d'/'downsample3d', `AutoencoderKLWan._encode`); Matrix-Game 2.0
`Matrix-Game-2/wan/vae/wanx_vae_src/vae.py` (`Encoder3d`, `VideoVAE_.encode`: mu only,
normalised as (mu - mean) * (1 / std)) and `Matrix-Game-2/inference.py` (`generate_videos`:
the image followed by 4 (N - 1) zero frames, encoded; mask ones on latent frame 0, its first
4 channels; `cond_concat = [mask, latents]`).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from worldcast.models.causal_wan.config import WanVAEConfig
from worldcast.models.causal_wan.dit import acc_dtype
from worldcast.models.causal_wan.vae import CausalConv3d, MidBlock, ResidualBlock, RMSNorm, _Cache, conv3d_by_frames

MASK_CHANNELS = 4  #: channels of Matrix-Game's first-frame mask (`mask_cond[:, :4]` in the release)


class Downsample(nn.Module):
    """Halve H and W (pad right/bottom by 1, 3x3 conv of stride 2); "3d" also halves time.

    The time conv is causal, kernel (3, 1, 1), stride 2, over [the previous call's last
    frame, this call's frames]; on the session's first frame it is skipped (diffusers
    `WanResample` 'downsample3d'), so frame 0 stays one frame.
    """

    def __init__(self, dim: int, *, temporal: bool) -> None:
        super().__init__()
        self.resample = nn.Sequential(nn.ZeroPad2d((0, 1, 0, 1)), nn.Conv2d(dim, dim, 3, stride=2))
        self.time_conv = nn.Conv3d(dim, dim, (3, 1, 1), stride=(2, 1, 1)) if temporal else None

    def forward(self, x: torch.Tensor, cache: _Cache, *, first_frame: bool) -> torch.Tensor:
        """x (B, C, T, H, W) -> (B, C, T', H/2, W/2); T' = T, or T/2 for "3d" after frame 0."""
        B, C, T, H, W = x.shape
        y = self.resample(x.transpose(1, 2).reshape(B * T, C, H, W))  # (B*T, C, H/2, W/2)
        x = y.view(B, T, C, H // 2, W // 2).transpose(1, 2)
        if self.time_conv is None:
            return x
        prev = cache.take()  # (B, C, 1, H/2, W/2): the last frame of the previous call
        cache.put(x[:, :, -1:].contiguous())
        if first_frame:
            assert T == 1, "the first call of a temporal downsampler takes frame 0 alone"
            return x
        assert prev is not None and T % 2 == 0, "later calls take an even number of frames after frame 0"
        x = torch.cat([prev.to(x.dtype), x], dim=2)  # (B, C, 1 + T, h, w)
        w, b = self.time_conv.weight, self.time_conv.bias
        if x.device.type == "cpu":  # stride-1 per-tap 2D convs, every other output kept
            return conv3d_by_frames(x, w, b, (0, 0))[:, :, ::2]
        return F.conv3d(x, w, b, stride=(2, 1, 1))


class Encoder(nn.Module):
    """Wan 2.1's 3D encoder: conv_in, down blocks (space halved thrice, time twice), mid block, head.

    `down_blocks` is flat, as in diffusers: per stage `num_res_blocks` residual blocks, then a
    downsampler (except after the last stage). The head gives 2 * z_dim channels (mean, log-variance).
    """

    def __init__(self, cfg: WanVAEConfig) -> None:
        super().__init__()
        dims = [cfg.base_dim * m for m in (1, *cfg.dim_mult)]
        self.conv_in = CausalConv3d(3, dims[0], 3, padding=(1, 1, 1))
        self.down_blocks = nn.ModuleList()
        for i, (c_in, c_out) in enumerate(zip(dims[:-1], dims[1:])):
            for _ in range(cfg.num_res_blocks):
                self.down_blocks.append(ResidualBlock(c_in, c_out))
                c_in = c_out
            if i != len(cfg.dim_mult) - 1:
                self.down_blocks.append(Downsample(c_out, temporal=cfg.temporal_downsample[i]))
        self.mid_block = MidBlock(dims[-1])
        self.norm_out = RMSNorm(dims[-1], images=False)
        self.conv_out = CausalConv3d(dims[-1], 2 * cfg.z_dim, 3, padding=(1, 1, 1))

    def forward(self, x: torch.Tensor, cache: _Cache, *, first_frame: bool) -> torch.Tensor:
        """x (B, 3, T, H, W) -> (B, 2 z_dim, T_lat, H/8, W/8); reads and replaces the cache in call order."""
        x = self.conv_in(x, cache)
        for blk in self.down_blocks:
            x = blk(x, cache, first_frame=first_frame) if isinstance(blk, Downsample) else blk(x, cache)
        x = self.mid_block(x, cache)
        return self.conv_out(F.silu(self.norm_out(x)), cache)

    def temporal_ops(self) -> list[str]:
        """The encoder's ops along time, input to output: "c" a kernel-3 causal conv, "d" a time halving."""
        ops = ["c"]
        for blk in self.down_blocks:
            if isinstance(blk, ResidualBlock):
                ops += ["c", "c"]
            elif blk.time_conv is not None:
                ops.append("d")
        return ops + ["c"] * (2 * len(self.mid_block.resnets)) + ["c"]


class WanVAEEncoder(nn.Module):
    """The Wan 2.1 VAE's encoding half, state-dict compatible with diffusers' `AutoencoderKLWan`
    (`encoder.*`, `quant_conv.*`; the decoder keys belong to `WanVAEDecoder`)."""

    def __init__(self, cfg: WanVAEConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = Encoder(cfg)
        self.quant_conv = CausalConv3d(2 * cfg.z_dim, 2 * cfg.z_dim, 1, padding=(0, 0, 0))

    @property
    def dtype(self) -> torch.dtype:
        return self.quant_conv.weight.dtype

    @torch.no_grad()
    def encode(self, video: torch.Tensor, *, latent_frames_per_call: int | None = None) -> torch.Tensor:
        """Encode pixel frames to normalised latents (the posterior's mean; no sampling).

        Frame 0 is encoded alone, then the later frames `latent_frames_per_call` latent
        frames (4 pixel frames each) at a time, with the causal-conv cache carried across
        calls: the result does not depend on the split. The mean is normalised per channel
        as (mu - latents_mean) * (1 / latents_std), as the release and diffusers' Wan i2v
        pipeline do.

        Args:
            video: (B, 3, T, H, W) RGB in [-1, 1], any float dtype; T = 1 + 4k, H and W
                multiples of the spatial stride (8).
            latent_frames_per_call: latent frames per encoder pass after frame 0; None = all
                at once (fastest on CPU). 1 is what diffusers does (bounded activation memory).

        Returns:
            (B, z_dim, 1 + k, H/8, W/8) in the encoder's dtype.

        Raises:
            ValueError: wrong channel count, frame count or frame size.
        """
        B, C, T, H, W = video.shape
        s, ts = self.cfg.spatial_stride, self.cfg.temporal_stride
        if C != 3:
            raise ValueError(f"video has {C} channels, the VAE encodes RGB (3)")
        if T < 1 or (T - 1) % ts:
            raise ValueError(f"video has {T} frames, the VAE encodes 1 + {ts}k")
        if H % s or W % s:
            raise ValueError(f"frame {H}x{W} must divide by {s}")
        if latent_frames_per_call is not None and latent_frames_per_call < 1:
            raise ValueError(f"latent_frames_per_call must be >= 1, got {latent_frames_per_call}")
        x = video.to(self.dtype)
        c = _Cache(None)
        outs = [self.encoder(x[:, :, :1], c, first_frame=True)]
        cache = c.new
        step = ts * (latent_frames_per_call or max(1, (T - 1) // ts))
        for i in range(1, T, step):
            c = _Cache(cache)
            outs.append(self.encoder(x[:, :, i : i + step], c, first_frame=False))
            cache = c.new
        mu = self.quant_conv(torch.cat(outs, dim=2))[:, : self.cfg.z_dim]  # (B, z, 1 + k, h, w); [z:] is log-var
        a = acc_dtype(self.dtype)
        mean = torch.tensor(self.cfg.latents_mean, dtype=a, device=mu.device).view(1, -1, 1, 1, 1)
        inv_std = 1.0 / torch.tensor(self.cfg.latents_std, dtype=a, device=mu.device).view(1, -1, 1, 1, 1)
        return ((mu.to(a) - mean) * inv_std).to(self.dtype)

    def condition_horizon(self) -> int:
        """S: encoding [image, zero frames...], latent frame n >= S no longer depends on the image.

        Walks the encoder's time ops backwards from latent frame n: a causal conv's output
        frame i reads input frames i - 2 .. i; a time halving's output frame i >= 1 reads
        2i - 2 .. 2i (frame 0 passes through). Frame n is free of the image (pixel frame 0)
        and of the start's zero padding when every frame it reaches has index >= 1; all such
        frames see the same zero inputs, so they are equal. S is 29 for the Wan 2.1 VAE
        (tested against the encoder itself: frames S, S + 1, ... equal, frame S - 1 differs).
        """
        ops = self.encoder.temporal_ops()

        def free(n: int) -> bool:
            i = n
            for op in reversed(ops):
                i = i - 2 if op == "c" else 2 * i - 2
                if i < 1:
                    return False
            return True

        n = 1
        while not free(n):
            n += 1
        return n


# -----------------------------------------------------------------------------
# Matrix-Game 2.0's first-frame conditioning


@torch.no_grad()
def first_frame_condition(
    vae: WanVAEEncoder, image: torch.Tensor, *, latent_frames_per_call: int | None = 4
) -> torch.Tensor:
    """The per-session table of Matrix-Game 2.0's concatenated conditioning ("cond_concat").

    The release encodes the image followed by 4 (N - 1) zero (mid-gray) frames and
    concatenates a mask (ones on latent frame 0, zeros after) in front, for a fixed N.
    Latent frames from `vae.condition_horizon()` = S on are all equal (see there), so
    frames 0 .. S hold every value of any N; `condition_frames` reads the table at any
    absolute latent frame index.

    Args:
        vae: the encoder.
        image: (B, 3, H, W) the first frame in [-1, 1] (`preprocess.image_to_tensor`).
        latent_frames_per_call: see `WanVAEEncoder.encode` (4 bounds the activations to
            16 pixel frames per pass; the full encoder at 352x640 then peaks near 1 GB in bf16).

    Returns:
        (B, 4 + z_dim, S + 1, H/8, W/8) in the encoder's dtype: channels [mask(4), latents(z_dim)].
    """
    if image.dim() != 4:
        raise ValueError(f"image must be (B, 3, H, W), got shape {tuple(image.shape)}")
    B, _, H, W = image.shape
    S = vae.condition_horizon()
    video = torch.cat([image[:, :, None], image.new_zeros(B, 3, vae.cfg.temporal_stride * S, H, W)], dim=2)
    latents = vae.encode(video, latent_frames_per_call=latent_frames_per_call)  # (B, z, S + 1, h, w)
    mask = torch.zeros_like(latents[:, :MASK_CHANNELS])
    mask[:, :, 0] = 1.0
    return torch.cat([mask, latents], dim=1)


def condition_frames(table: torch.Tensor, frame_index: torch.Tensor) -> torch.Tensor:
    """The conditioning of given absolute latent frames, read from `first_frame_condition`'s table.

    Args:
        table: (B, C, S + 1, h, w) one table per session.
        frame_index: int64 (B, F) absolute latent frame of each of the chunk's frames, >= 0.

    Returns:
        (B, C, F, h, w): table frame min(index, S) per entry (what the release's cond_concat
        holds at that index, for any N above it).

    Raises:
        ValueError: batch mismatch or a negative index.
    """
    B, C, n, h, w = table.shape
    if frame_index.dim() != 2 or frame_index.shape[0] != B:
        raise ValueError(f"frame_index must be (B={B}, F), got shape {tuple(frame_index.shape)}")
    if bool((frame_index < 0).any()):
        raise ValueError("frame_index must be >= 0")
    idx = frame_index.to(device=table.device, dtype=torch.long).clamp(max=n - 1)  # (B, F)
    rows = torch.arange(B, device=table.device)[:, None]
    return table.permute(0, 2, 1, 3, 4)[rows, idx].permute(0, 2, 1, 3, 4)  # (B, C, F, h, w)


def tiny_vae_config(**overrides: object) -> WanVAEConfig:
    """A small Wan 2.1-shaped VAE for CPU tests and the random-weight variant: the release's
    stage and block counts (so the same conditioning horizon, 29), base width 4, z_dim 16."""
    kw: dict[str, object] = dict(base_dim=4, z_dim=16, dim_mult=(1, 2, 2, 2), num_res_blocks=2)
    kw.update(overrides)
    return WanVAEConfig(**kw)  # type: ignore[arg-type]
