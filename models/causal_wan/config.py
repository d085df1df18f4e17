"""Hyperparameters of the causal Wan family: the only source of them.

`CausalWanConfig` describes the DiT (Wan 2.1 T2V layout), its causal rollout
(chunk size, rolling window with attention sinks, the sampling schedule) and
its VAE decoder (`WanVAEConfig`). `tiny()` is the random-weight CPU config;
the checkpoints' own settings (Self-Forcing, CausVid, LongLive) are the
presets of `presets.py`, each citing the reference config it comes from.

Sources: Wan 2.1 `wan/configs/wan_t2v_1_3B.py` (network sizes); diffusers
`AutoencoderKLWan` (VAE sizes and latent statistics); `schedule.py` for the
timesteps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from worldcast.models.causal_wan.schedule import FlowSchedule

#: Per-channel mean and std of Wan 2.1 VAE latents (diffusers AutoencoderKLWan defaults,
#: the same numbers as Self-Forcing's utils/wan_wrapper.py WanVAEWrapper).
WAN21_LATENTS_MEAN = (
    -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
    0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
)  # fmt: skip
WAN21_LATENTS_STD = (
    2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
    3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
)  # fmt: skip


@dataclass(frozen=True)
class WanVAEConfig:
    """The Wan 2.1 VAE decoder (diffusers `AutoencoderKLWan` config keys in brackets)."""

    base_dim: int = 96  #: channels of the highest-resolution stage [base_dim / decoder_base_dim]
    z_dim: int = 16  #: latent channels [z_dim]
    dim_mult: tuple[int, ...] = (1, 2, 4, 4)  #: channel multipliers per stage [dim_mult]
    num_res_blocks: int = 2  #: residual blocks per stage (the decoder runs one more) [num_res_blocks]
    temporal_downsample: tuple[bool, ...] = (False, True, True)  #: encoder stages that halve time [temperal_downsample]
    latents_mean: tuple[float, ...] = WAN21_LATENTS_MEAN  #: per-channel latent mean [latents_mean]
    latents_std: tuple[float, ...] = WAN21_LATENTS_STD  #: per-channel latent std [latents_std]

    def __post_init__(self) -> None:
        if len(self.latents_mean) != self.z_dim or len(self.latents_std) != self.z_dim:
            raise ValueError(f"latents_mean/std need {self.z_dim} entries")
        if len(self.temporal_downsample) != len(self.dim_mult) - 1:
            raise ValueError("temporal_downsample needs len(dim_mult) - 1 entries")
        if any(s <= 0 for s in self.latents_std):
            raise ValueError("latents_std must be positive")

    @property
    def spatial_stride(self) -> int:
        """Pixels per latent cell, per side (8 for Wan 2.1)."""
        return 2 ** (len(self.dim_mult) - 1)

    @property
    def temporal_stride(self) -> int:
        """Pixel frames per latent frame after the first (4 for Wan 2.1); the first decodes to 1."""
        return 2 ** sum(self.temporal_downsample)


@dataclass(frozen=True)
class CausalWanConfig:
    """The causal Wan DiT, its rollout and its VAE decoder.

    Timesteps are in Wan's scale [0, num_train_timesteps], the scale the time embedding was
    trained on; each step's noise level (flow time sigma) is the reference table's entry
    nearest its timestep (`schedule.FlowSchedule`), not timestep / 1000.
    """

    dim: int = 1536  #: model width D
    ffn_dim: int = 8960  #: FFN hidden width
    freq_dim: int = 256  #: timestep sinusoid length
    text_dim: int = 4096  #: text encoder width (umT5-XXL d_model)
    heads: int = 12  #: attention heads H (head_dim = dim / heads)
    layers: int = 30  #: transformer blocks
    in_channels: int = 16  #: latent channels in
    out_channels: int = 16  #: latent channels out
    patch: tuple[int, int, int] = (1, 2, 2)  #: (t, h, w) latent cells per token
    eps: float = 1e-6  #: LayerNorm / RMSNorm epsilon
    cross_attn_norm: bool = True  #: affine LayerNorm before cross-attention
    qk_norm: bool = True  #: RMSNorm over all heads on q and k
    rope_theta: float = 10000.0  #: RoPE base
    text_len: int = 512  #: prompt tokens the cross-attention sees (zero-padded)
    frames_per_chunk: int = 3  #: latent frames denoised together
    local_attn_size: int = -1  #: latent frames a chunk attends to, sinks and itself included; -1 = all
    sink_size: int = 0  #: the session's first latent frames always attended (attention sinks)
    denoising_steps: tuple[int, ...] = (1000, 750, 500, 250)  #: Self-Forcing's denoising_step_list
    timestep_shift: float = 5.0  #: the sampling table's shift (schedule.py)
    warp_denoising_step: bool = True  #: map the steps through the shifted table (Self-Forcing), else use them
    num_train_timesteps: int = 1000  #: length of the training schedule
    context_noise: float = 0.0  #: timestep of the commit pass that writes a chunk's keys and values
    fps: int = 16  #: pixel frames per second of Wan 2.1 video (Hz)
    frame_height: int = 480  #: default pixel height
    frame_width: int = 832  #: default pixel width
    vae: WanVAEConfig = field(default_factory=WanVAEConfig)  #: the VAE decoder

    def __post_init__(self) -> None:
        if self.dim % self.heads:
            raise ValueError(f"dim {self.dim} must divide by heads {self.heads}")
        if self.head_dim % 2 or self.head_dim < 6:
            raise ValueError(f"head_dim {self.head_dim} must be even and >= 6 (3D RoPE)")
        if self.patch[0] != 1:
            raise ValueError("temporal patch must be 1 (one token row per latent frame)")
        if self.freq_dim % 2:
            raise ValueError("freq_dim must be even")
        if self.frames_per_chunk <= 0 or self.text_len <= 0:
            raise ValueError("frames_per_chunk and text_len must be positive")
        if self.sink_size < 0:
            raise ValueError("sink_size must be >= 0")
        if self.local_attn_size != -1 and self.local_attn_size < self.sink_size + self.frames_per_chunk:
            raise ValueError(
                f"local_attn_size {self.local_attn_size} must be -1 or >= sink_size + frames_per_chunk "
                f"({self.sink_size} + {self.frames_per_chunk}), or a chunk could not see itself"
            )
        if self.vae.z_dim != self.out_channels:
            raise ValueError(f"VAE z_dim {self.vae.z_dim} != DiT out_channels {self.out_channels}")
        if not 0 <= self.context_noise <= self.num_train_timesteps:
            raise ValueError("context_noise outside [0, num_train_timesteps]")
        stride = self.vae.spatial_stride * self.patch[1]
        if self.frame_height % stride or self.frame_width % stride:
            raise ValueError(f"frame size must divide by {stride} (VAE stride x patch)")
        if self.num_train_timesteps != 1000:
            raise ValueError("the references' tables have 1000 entries (num_train_timesteps=1000)")
        _ = self.schedule.sigmas  # validates the steps

    # -- derived geometry -------------------------------------------------------------

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def rope_dims(self) -> tuple[int, int, int]:
        """Head dims rotated by (frame, row, column) positions: Wan's split d - 4(d//6), 2(d//6), 2(d//6)."""
        hw = 2 * (self.head_dim // 6)
        return self.head_dim - 2 * hw, hw, hw

    @property
    def schedule(self) -> FlowSchedule:
        """The sampling schedule (the references' float32 table; see schedule.py)."""
        return FlowSchedule(self.denoising_steps, self.timestep_shift, self.warp_denoising_step,
                            self.num_train_timesteps)

    @property
    def timesteps(self) -> tuple[float, ...]:
        """What the time embedding sees at each denoising step, descending, in (0, num_train_timesteps]."""
        return self.schedule.timesteps

    @property
    def flow_times(self) -> tuple[float, ...]:
        """Each step's noise level sigma in (0, 1] (x_t = (1 - sigma) x0 + sigma eps): the table's entry
        nearest its timestep, as the references' `add_noise` and x0 conversion look it up."""
        return self.schedule.sigmas

    def timestep_of(self, sigma: float) -> float:
        """The embedding timestep of the step whose noise level is `sigma` (`context_noise` for sigma 0).

        Raises:
            ValueError: sigma is none of this schedule's levels.
        """
        if sigma == 0.0:
            return float(self.context_noise)
        for s, t in zip(self.flow_times, self.timesteps, strict=True):
            if abs(s - sigma) <= 1e-6:
                return t
        raise ValueError(f"noise level {sigma} is not a step of this schedule {self.flow_times}")

    def latent_size(self, height: int, width: int) -> tuple[int, int]:
        """Latent (h, w) of a pixel frame size; raises ValueError if it does not tile."""
        stride = self.vae.spatial_stride * self.patch[1]
        if height % stride or width % stride:
            raise ValueError(f"frame {height}x{width} must divide by {stride}")
        return height // self.vae.spatial_stride, width // self.vae.spatial_stride

    def tokens_per_frame(self, height: int, width: int) -> int:
        """Self-attention tokens per latent frame at a pixel frame size (1560 at 480x832)."""
        h, w = self.latent_size(height, width)
        return (h // self.patch[1]) * (w // self.patch[2])

    @property
    def kv_recent_frames(self) -> int:
        """Committed non-sink frames a chunk sees: local_attn_size - sink_size - frames_per_chunk.

        This is the rolling window of the engine's sink + window ring (`models/spec.py`
        `AttentionRingSpec.window_frames`): a chunk starting at c0 sees committed frames
        [c0 - kv_recent_frames, c0) and the sinks [0, sink_size). Raises ValueError when global.
        """
        return self.kv_cache_frames - self.sink_size

    @property
    def kv_cache_frames(self) -> int:
        """Committed latent frames a session must keep (sinks included) so every later chunk sees its window.

        A chunk ending at latent frame e sees frames [0, sink) and
        [e - (local_attn_size - sink), e); its own frames come from the chunk
        itself, so `local_attn_size - frames_per_chunk` committed frames suffice.

        Raises:
            ValueError: global attention (local_attn_size = -1) has no bounded window.
        """
        if self.local_attn_size == -1:
            raise ValueError("global attention (local_attn_size=-1) keeps every frame: no bounded KV window")
        return self.local_attn_size - self.frames_per_chunk

    def pixel_frames(self, latent_frames: int, *, first_chunk: bool) -> int:
        """Pixel frames that `latent_frames` latent frames decode to (the session's first latent frame gives 1)."""
        n = latent_frames * self.vae.temporal_stride
        return n - (self.vae.temporal_stride - 1) if first_chunk else n


# -- the random-weight config -------------------------------------------------------------


def tiny(**overrides: object) -> CausalWanConfig:
    """A random-weight config small enough for fp64 parity tests and live serving on a 2-core CPU.

    2 blocks of width 24 (2 heads of 12), 4 latent channels, a 4-stage VAE
    decoder of base width 4 (so 8x8 latents decode to 64x64 pixels), a window
    of 9 latent frames with 3 sinks, 16 text tokens of width 16. It makes
    noise-like video: nothing here is trained.
    """
    kw: dict[str, object] = dict(
        dim=24, ffn_dim=48, freq_dim=32, text_dim=16, heads=2, layers=2, in_channels=4, out_channels=4,
        text_len=16, local_attn_size=9, sink_size=3, frame_height=64, frame_width=64,
        vae=WanVAEConfig(
            base_dim=4, z_dim=4, dim_mult=(1, 2, 2, 2), num_res_blocks=1,
            latents_mean=(0.0, 0.0, 0.0, 0.0), latents_std=(1.0, 1.0, 1.0, 1.0),
        ),
    )  # fmt: skip
    kw.update(overrides)
    return CausalWanConfig(**kw)  # type: ignore[arg-type]


def wan_1_3b(**overrides: object) -> CausalWanConfig:
    """Wan 2.1 T2V 1.3B with Self-Forcing's sampling (30 x 1536, 12 heads of 128), global causal attention.

    The served checkpoints' settings are `presets.PRESETS`; this is the bare network for tests and tools.
    """
    return CausalWanConfig(**overrides)  # type: ignore[arg-type]


def longlive_1_3b(**overrides: object) -> CausalWanConfig:
    """The 1.3B network with LongLive 1.0's rolling window: 12 latent frames attended, 3 of them sinks."""
    kw: dict[str, object] = {"local_attn_size": 12, "sink_size": 3}
    kw.update(overrides)
    return CausalWanConfig(**kw)  # type: ignore[arg-type]
