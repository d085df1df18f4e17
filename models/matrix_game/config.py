"""Hyperparameters of Matrix-Game 2.0: the only source of them.

`MatrixGameConfig` describes the causal DiT (Wan 2.1 1.3B blocks with image
cross-attention and an action module in some blocks), its rollout (chunk,
window, denoising steps) and its geometry. `ActionConfig` is the action
module (the release's `action_config`). Presets, each from the release's own
files (SkyworkAI/Matrix-Game, `Matrix-Game-2/configs/distilled_model/<mode>/config.json`
and `configs/inference_yaml/inference_<mode>.yaml`):

| preset | keyboard dims | mouse | window (local_attn_size) | denoising steps |
|---|---|---|---|---|
| `universal()` | 4 | yes | 6 | [1000, 666, 333] |
| `gta_drive()` | 2 | yes | 4 | [1000, 666, 333] |
| `templerun()` | 7 | no | 6 | [1000, 750, 500, 250] |
| `tiny()` | 4 | yes | 6 | [1000, 666, 333] (random weights, CPU-sized) |

All: 30 blocks of width 1536 (12 heads of 128), action module in blocks
0..14, in_dim 36 (16 noise + 4 mask + 16 first-frame latent channels), CLIP
image features (257 x 1280) through an MLP into the cross-attention, no text,
3 latent frames per chunk, warped timesteps with shift 5, context noise 0,
sink 0, 352 x 640 pixels (44 x 80 latents, 880 tokens per latent frame).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from worldcast.models.causal_wan.config import CausalWanConfig, WanVAEConfig


def warped_timesteps(steps: tuple[int, ...], shift: float, *, num_train_timesteps: int = 1000) -> tuple[float, ...]:
    """Self-Forcing's warped denoising timesteps, in Wan's [0, num_train_timesteps] scale, in float64.

    The scheduler's 1000-entry table `timesteps[i] = 1000 * shifted(sigma_i)`, `sigma_i =
    linspace(1, 0, 1001)[i]`, indexed at `1000 - step`: the warped timestep of step k is
    `1000 * shifted(k / 1000)` with shifted(s) = shift s / (1 + (shift - 1) s) (SD3's shift, Esser et al.
    2024). Matrix-Game 2.0's pipeline warps its steps so; its parity fixtures were made in float64, where
    the noise level at a timestep is the timestep / 1000 (causal Wan's `schedule.FlowSchedule` reproduces
    the references' float32 table, whose nearest entry differs in the last bits).

    Raises:
        ValueError: a step outside [0, num_train_timesteps] or a shift <= 0.
    """
    if shift <= 0:
        raise ValueError(f"shift must be positive, got {shift}")
    out = []
    for k in steps:
        if not 0 <= k <= num_train_timesteps:
            raise ValueError(f"denoising step {k} outside [0, {num_train_timesteps}]")
        sigma = k / num_train_timesteps
        out.append(num_train_timesteps * shift * sigma / (1.0 + (shift - 1.0) * sigma))
    return tuple(out)


@dataclass(frozen=True)
class ActionConfig:
    """The action module (release `action_config`; `wan/modules/action_module.py` `ActionModule`)."""

    blocks: tuple[int, ...] = tuple(range(15))  #: DiT blocks that hold an action module
    enable_keyboard: bool = True  #: keyboard branch present
    enable_mouse: bool = True  #: mouse branch present
    heads: int = 16  #: attention heads of both branches [heads_num]
    hidden_size: int = 128  #: width of one keyboard row's embedding
    keyboard_dim_in: int = 4  #: keyboard vector length per pixel frame
    keyboard_hidden_dim: int = 1024  #: keyboard attention width (heads x 64)
    mouse_dim_in: int = 2  #: mouse vector length per pixel frame
    mouse_hidden_dim: int = 1024  #: mouse MLP / attention width (heads x 64)
    mouse_qk_dim_list: tuple[int, int, int] = (8, 28, 28)  #: head dims rotated by (frame, row, column) position
    rope_dim_list: tuple[int, int, int] = (8, 28, 28)  #: in the release's config; its code uses mouse_qk_dim_list
    rope_theta: float = 256.0  #: RoPE base of both branches
    vae_time_compression_ratio: int = 4  #: pixel frames per latent frame
    windows_size: int = 3  #: latent frames of actions each latent frame sees (x 4 pixel frames)
    qk_norm: bool = True  #: RMSNorm (no gain applied, as the release) on q and k per head
    qkv_bias: bool = False  #: biases on the q/k/v/output projections of the attention

    def __post_init__(self) -> None:
        if not self.enable_keyboard and not self.enable_mouse:
            raise ValueError("an action module needs the keyboard or the mouse branch")
        for name in ("keyboard_hidden_dim", "mouse_hidden_dim"):
            if getattr(self, name) % self.heads:
                raise ValueError(f"{name} {getattr(self, name)} must divide by heads {self.heads}")
        hd = self.head_dim
        if self.enable_keyboard and self.keyboard_hidden_dim // self.heads != hd:
            raise ValueError("keyboard and mouse attention must share one head dim (one RoPE table)")
        if sum(self.mouse_qk_dim_list) != hd or any(d % 2 for d in self.mouse_qk_dim_list):
            raise ValueError(f"mouse_qk_dim_list {self.mouse_qk_dim_list} must be even parts summing to head dim {hd}")

    @property
    def head_dim(self) -> int:
        """Head dim of the action attention (64 in the release; the release hard-codes it for its RoPE)."""
        width = self.mouse_hidden_dim if self.enable_mouse else self.keyboard_hidden_dim
        return width // self.heads

    @property
    def window_pixel_frames(self) -> int:
        """Pixel frames of actions one latent frame sees: vae_time_compression_ratio x windows_size (12)."""
        return self.vae_time_compression_ratio * self.windows_size

    @property
    def action_dim(self) -> int:
        """Length of the action vector per pixel frame: [keyboard | mouse]."""
        return (self.keyboard_dim_in if self.enable_keyboard else 0) + (self.mouse_dim_in if self.enable_mouse else 0)


@dataclass(frozen=True)
class MatrixGameConfig:
    """The Matrix-Game 2.0 causal DiT, its rollout and its geometry.

    Timesteps are in Wan's scale [0, num_train_timesteps] (1000 x flow time).
    """

    dim: int = 1536  #: model width D
    ffn_dim: int = 8960  #: FFN hidden width
    freq_dim: int = 256  #: timestep sinusoid length
    heads: int = 12  #: self/cross-attention heads
    layers: int = 30  #: transformer blocks
    in_channels: int = 36  #: noise (16) + mask (4) + first-frame latent (16) [in_dim]
    out_channels: int = 16  #: latent channels out [out_dim]
    mask_channels: int = 4  #: channels of the first-frame mask (1 at latent frame 0, else 0)
    patch: tuple[int, int, int] = (1, 2, 2)  #: (t, h, w) latent cells per token
    eps: float = 1e-6  #: LayerNorm / RMSNorm epsilon of the blocks
    cross_attn_norm: bool = True  #: affine LayerNorm before cross-attention
    qk_norm: bool = True  #: RMSNorm over all heads on q and k
    image_dim: int = 1280  #: CLIP feature width (the release hard-codes `MLPProj(1280, dim)`)
    image_tokens: int = 257  #: CLIP tokens per image (ViT-H/14 at 224: 16 x 16 patches + class token)
    action: ActionConfig | None = field(default_factory=ActionConfig)  #: the action module (None: no actions)
    frames_per_chunk: int = 3  #: latent frames denoised together [num_frame_per_block]
    local_attn_size: int = 6  #: latent frames every attention sees, the chunk's own included
    sink_size: int = 0  #: attention-sink frames (0 in every release config)
    denoising_steps: tuple[int, ...] = (1000, 666, 333)  #: [denoising_step_list]
    timestep_shift: float = 5.0  #: flow-matching shift of the warp
    warp_denoising_step: bool = True  #: map the steps through the shifted schedule
    num_train_timesteps: int = 1000
    context_noise: float = 0.0  #: timestep of the commit pass
    #: latent frames of the first-frame conditioning kept per session: the VAE encoding of
    #: [image, black frames...] stops depending on the image after a finite number of latent frames
    #: (the causal encoder's receptive field: 29 for the Wan 2.1 encoder, measured by
    #: tests/models/matrix_game/receptive_field.py), so frames past the last kept one reuse it.
    cond_latent_frames: int = 30
    #: pixel frames per second (Hz) the video is served at: the rate the release plays its motion at. The
    #: release writes every video it generates at 12 fps (`Matrix-Game-2/utils/visualize.py` `process_video`,
    #: `fps = 12`, which `inference.py` and `inference_streaming.py` call), and its benchmark action scripts
    #: hold each action for 12 pixel frames (`utils/conditions.py` `combine_data`, `selections = [12]`: one
    #: second at 12 fps). The "25 FPS" of the README ("real-time[25fps]") and of the paper (He et al. 2025,
    #: arXiv:2508.13009, abstract: "at an ultra-fast speed of 25 FPS") is generation throughput on one H100,
    #: not a playback rate: served at 25 the same motion plays about twice as fast as the authors show it.
    #: (FastVideo's preset says 25; worldcast served 25 until issue 31.)
    fps: int = 12
    frame_height: int = 352  #: pixels
    frame_width: int = 640  #: pixels
    vae: WanVAEConfig = field(default_factory=WanVAEConfig)  #: the VAE decoder

    def __post_init__(self) -> None:
        if self.dim % self.heads or (self.dim // self.heads) % 2:
            raise ValueError(f"dim {self.dim} must divide by heads {self.heads} into an even head dim")
        if self.in_channels != 2 * self.out_channels + self.mask_channels:
            raise ValueError(f"in_channels {self.in_channels} must be noise + mask + image latent "
                             f"({self.out_channels} + {self.mask_channels} + {self.out_channels})")
        if self.sink_size < 0 or self.local_attn_size < self.sink_size + self.frames_per_chunk:
            raise ValueError(f"local_attn_size {self.local_attn_size} must cover sink_size + frames_per_chunk "
                             "(a global window cannot be served: its state would grow without bound)")
        if self.action is not None and any(not 0 <= b < self.layers for b in self.action.blocks):
            raise ValueError(f"action blocks {self.action.blocks} outside 0..{self.layers - 1}")
        if self.action is not None and self.action.vae_time_compression_ratio != self.vae.temporal_stride:
            raise ValueError("the action module's time compression must equal the VAE's temporal stride")
        if self.cond_latent_frames < 1:
            raise ValueError("cond_latent_frames must be >= 1")
        _ = self.wan  # validates the shared block settings and the frame size
        _ = self.timesteps

    # -- the causal Wan pieces this model is built from ---------------------------------------

    @property
    def wan(self) -> CausalWanConfig:
        """The causal Wan config of the shared blocks, head and RoPE (`models/causal_wan`)."""
        return CausalWanConfig(
            dim=self.dim, ffn_dim=self.ffn_dim, freq_dim=self.freq_dim, text_dim=self.image_dim, heads=self.heads,
            layers=self.layers, in_channels=self.in_channels, out_channels=self.out_channels, patch=self.patch,
            eps=self.eps, cross_attn_norm=self.cross_attn_norm, qk_norm=self.qk_norm,
            text_len=self.image_tokens, frames_per_chunk=self.frames_per_chunk,
            local_attn_size=self.local_attn_size, sink_size=self.sink_size, denoising_steps=self.denoising_steps,
            timestep_shift=self.timestep_shift, warp_denoising_step=self.warp_denoising_step,
            num_train_timesteps=self.num_train_timesteps, context_noise=self.context_noise, fps=self.fps,
            frame_height=self.frame_height, frame_width=self.frame_width, vae=self.vae,
        )  # fmt: skip

    # -- derived geometry ---------------------------------------------------------------------

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    @property
    def window_frames(self) -> int:
        """Committed latent frames a chunk sees: local_attn_size - sink_size - frames_per_chunk (3 universal).

        The release keeps `local_attn_size` frames in each cache and attends to all of them, the
        chunk's own included (`CausalWanSelfAttention`, `ActionModule` KV-cache branches).
        """
        return self.local_attn_size - self.sink_size - self.frames_per_chunk

    @property
    def action_window_frames(self) -> int:
        """Committed latent frames the action module's mouse and keyboard caches show a chunk:
        local_attn_size - frames_per_chunk, with no sink whatever `sink_size` says.

        The release's `ActionModule.forward` (`Matrix-Game-2/wan/modules/action_module.py`, both KV-cache
        branches) sets `sink_size = 0` and attends to the last `local_attn_size` frames of each cache, the
        chunk's own included; only the DiT's self-attention keeps `sink_size` frames.
        """
        return self.local_attn_size - self.frames_per_chunk

    @property
    def timesteps(self) -> tuple[float, ...]:
        """Denoising timesteps of one chunk, descending, in [0, num_train_timesteps]."""
        if self.warp_denoising_step:
            return warped_timesteps(self.denoising_steps, self.timestep_shift,
                                    num_train_timesteps=self.num_train_timesteps)
        return tuple(float(s) for s in self.denoising_steps)

    @property
    def flow_times(self) -> tuple[float, ...]:
        return tuple(t / self.num_train_timesteps for t in self.timesteps)

    def latent_size(self, height: int | None = None, width: int | None = None) -> tuple[int, int]:
        """Latent (h, w) of a pixel frame size (default: the config's)."""
        return self.wan.latent_size(height or self.frame_height, width or self.frame_width)

    def tokens_per_frame(self, height: int | None = None, width: int | None = None) -> int:
        """Tokens per latent frame (880 at 352 x 640)."""
        return self.wan.tokens_per_frame(height or self.frame_height, width or self.frame_width)

    @property
    def history_pixel_frames(self) -> int:
        """Pixel frames of earlier chunks a chunk's actions reach back to (9 for the release).

        Latent frame j sees pixel frames [4j - 12, 4j); a chunk from latent frame c0 (> 0) starts
        at pixel frame 4c0 - 3, so it needs the 9 pixel frames before it.
        """
        if self.action is None:
            return 0
        r = self.vae.temporal_stride
        return self.action.window_pixel_frames - (r - 1)

    # -- the release's own config files -----------------------------------------------------------

    @classmethod
    def from_release(cls, config: dict[str, Any], inference: dict[str, Any] | None = None,
                     **overrides: Any) -> MatrixGameConfig:
        """A config from the release's `config.json` (and optionally its inference yaml, as a dict).

        Raises:
            ValueError: a config this implementation does not run (not i2v, a patch other than
                (1, 2, 2), text conditioning).
        """
        if config.get("model_type", "i2v") != "i2v":
            raise ValueError(f"model_type {config.get('model_type')!r}: only the i2v models are Matrix-Game 2.0")
        kw: dict[str, Any] = dict(
            dim=int(config["dim"]), ffn_dim=int(config["ffn_dim"]), freq_dim=int(config["freq_dim"]),
            heads=int(config["num_heads"]), layers=int(config["num_layers"]), in_channels=int(config["in_dim"]),
            out_channels=int(config["out_dim"]), eps=float(config.get("eps", 1e-6)),
            local_attn_size=int(config["local_attn_size"]), sink_size=int(config.get("sink_size", 0)),
        )  # fmt: skip
        a = config.get("action_config") or {}
        if a:
            kw["action"] = ActionConfig(
                blocks=tuple(int(b) for b in a["blocks"]), enable_keyboard=bool(a.get("enable_keyboard", True)),
                enable_mouse=bool(a.get("enable_mouse", True)), heads=int(a["heads_num"]),
                hidden_size=int(a["hidden_size"]), keyboard_dim_in=int(a.get("keyboard_dim_in", 4)),
                keyboard_hidden_dim=int(a.get("keyboard_hidden_dim", 1024)),
                mouse_dim_in=int(a.get("mouse_dim_in", 2)), mouse_hidden_dim=int(a.get("mouse_hidden_dim", 1024)),
                mouse_qk_dim_list=tuple(a.get("mouse_qk_dim_list", (8, 28, 28))),  # type: ignore[arg-type]
                rope_dim_list=tuple(a.get("rope_dim_list", (8, 28, 28))),  # type: ignore[arg-type]
                rope_theta=float(a.get("rope_theta", 256)),
                vae_time_compression_ratio=int(a.get("vae_time_compression_ratio", 4)),
                windows_size=int(a.get("windows_size", 3)), qk_norm=bool(a.get("qk_norm", True)),
                qkv_bias=bool(a.get("qkv_bias", False)),
            )  # fmt: skip
            if tuple(a.get("patch_size", (1, 2, 2))) != (1, 2, 2):
                raise ValueError(f"action patch_size {a['patch_size']} is not (1, 2, 2)")
        else:
            kw["action"] = None
        if inference:
            kw["denoising_steps"] = tuple(int(s) for s in inference["denoising_step_list"])
            kw["warp_denoising_step"] = bool(inference.get("warp_denoising_step", True))
            kw["frames_per_chunk"] = int(inference.get("num_frame_per_block", 3))
            kw["context_noise"] = float(inference.get("context_noise", 0))
            kw["timestep_shift"] = float((inference.get("model_kwargs") or {}).get("timestep_shift", 5.0))
        kw.update(overrides)
        return cls(**kw)


# -- presets (the release's numbers) ----------------------------------------------------------


def universal(**overrides: Any) -> MatrixGameConfig:
    """`configs/distilled_model/universal` + `inference_universal.yaml`: keyboard 4 (w s a d), mouse 2, window 6."""
    return MatrixGameConfig(**overrides)


def gta_drive(**overrides: Any) -> MatrixGameConfig:
    """`configs/distilled_model/gta_drive` + `inference_gta_drive.yaml`: keyboard 2 (w s), mouse 2, window 4."""
    kw: dict[str, Any] = {"action": ActionConfig(keyboard_dim_in=2), "local_attn_size": 4}
    kw.update(overrides)
    return MatrixGameConfig(**kw)


def templerun(**overrides: Any) -> MatrixGameConfig:
    """`configs/distilled_model/templerun` + `inference_templerun.yaml`: keyboard 7, no mouse, 4 steps."""
    kw: dict[str, Any] = {"action": ActionConfig(keyboard_dim_in=7, enable_mouse=False),
                          "denoising_steps": (1000, 750, 500, 250)}
    kw.update(overrides)
    return MatrixGameConfig(**kw)


def tiny(**overrides: Any) -> MatrixGameConfig:
    """A random-weight config for CPU tests and serving: the universal layout, shrunk.

    3 blocks of width 32 (2 heads of 16), action module in blocks 0 and 1 (2 heads of 64, the
    release's head dim, which its action RoPE hard-codes), keyboard rows embedded to 16,
    64 x 112 pixels (4 x 7 = 28 tokens per latent frame), a 4-stage VAE decoder of base width 4,
    first-frame conditioning kept for 4 latent frames. Its video is noise-like: nothing is trained.
    """
    kw: dict[str, Any] = dict(
        dim=32, ffn_dim=64, freq_dim=32, heads=2, layers=3,
        action=ActionConfig(blocks=(0, 1), heads=2, hidden_size=16, keyboard_hidden_dim=128, mouse_hidden_dim=128),
        cond_latent_frames=4, frame_height=64, frame_width=112,
        vae=WanVAEConfig(base_dim=4, z_dim=16, dim_mult=(1, 2, 2, 2), num_res_blocks=1,
                         latents_mean=(0.0,) * 16, latents_std=(1.0,) * 16),
    )  # fmt: skip
    kw.update(overrides)
    return MatrixGameConfig(**kw)


PRESETS = {"tiny": tiny, "universal": universal, "universal-random": universal, "gta-drive": gta_drive,
           "templerun": templerun}


def with_geometry(cfg: MatrixGameConfig, *, height: int, width: int) -> MatrixGameConfig:
    """`cfg` at another frame size (must tile by 16 pixels)."""
    return replace(cfg, frame_height=height, frame_width=width)
