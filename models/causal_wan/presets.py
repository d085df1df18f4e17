"""The published causal Wan 2.1 checkpoints' settings, one preset each, as their own code runs them.

- `self-forcing`: global attention over its 21-frame horizon, then a rolling 21-frame window, no sinks;
  steps 1000 750 500 250 (shift 5, warped); `generator_ema` (Self-Forcing `configs/self_forcing_dmd.yaml`,
  README `inference.py --use_ema`).
- `causvid`: the same attention; steps 1000 757 522 (shift 8, not warped); `generator` (CausVid
  `configs/wan_causal_dmd.yaml`, `minimal_inference/autoregressive_inference.py`).
- `longlive`: 12 frames attended, 3 of them sinks (global sink); Self-Forcing's steps; `generator` with the
  rank-256 LoRA (alpha 256) merged (LongLive 1.0 `configs/longlive_inference.yaml`).

All three: 3 latent frames per chunk, the commit pass at timestep 0
(`context_noise: 0`), the prompt re-cached on a switch as LongLive's
`_recache_after_switch` does (models/causal_wan/recache.py).

The long-session policy of Self-Forcing and CausVid. Both were trained on
21-latent-frame (5 s) clips with global causal attention, and their own code
cannot go past that: the KV cache is allocated at 32760 tokens (21 x 1560)
and global attention never evicts, so frame 21 fails. Within the horizon
these presets compute exactly the reference's global attention (a window of
21 frames is every frame so far). Past it, the window rolls: each chunk sees
its 3 frames plus the 18 before, no sinks (Self-Forcing's own rolling code
path, run with `local_attn_size=21, sink_size=0`, is the fixture this is
checked against). Because Wan's RoPE is relative in time, a rolled chunk sees
exactly the relative frame offsets (0..20) and the amount of context of the
horizon's last chunk, which is what it was trained on; sinks would add
offsets never seen in training. What that cannot show is whether generated
content drifts over minutes: that needs the real weights on a GPU
(`gpu_check.py --long-session`). README.md of this folder records the
measurement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from worldcast.models.causal_wan.config import CausalWanConfig

#: Latent frames Self-Forcing and CausVid were trained on (`image_or_video_shape: [1, 21, 16, 60, 104]`).
TRAINED_HORIZON_FRAMES = 21


@dataclass(frozen=True)
class WanPreset:
    """One checkpoint family's inference settings, as its own code uses them.

    Attributes:
        name: the `--wan-preset` value.
        description: one line for `--help` and logs.
        source: the reference files (repository, commit, file) the numbers come from.
        overrides: `CausalWanConfig` fields that differ from the Wan 2.1 1.3B defaults.
        ema: whether the reference runs the checkpoint's EMA weights (`generator_ema`) by default.
        lora_alpha_over_rank: the LoRA scaling alpha / r of the reference config (None: no LoRA).
        lora_file: the LoRA's file name beside the base checkpoint in the published layout (None: none).
        file_hints: lower-case fragments of the published checkpoint's file or folder names.
    """

    name: str
    description: str
    source: str
    overrides: dict[str, object] = field(default_factory=dict)
    ema: bool = False
    lora_alpha_over_rank: float | None = None
    lora_file: str | None = None
    file_hints: tuple[str, ...] = ()

    def config(self, **overrides: object) -> CausalWanConfig:
        """The preset's `CausalWanConfig` (network sizes of Wan 2.1 1.3B unless overridden)."""
        kw = dict(self.overrides)
        kw.update(overrides)
        return CausalWanConfig(**kw)  # type: ignore[arg-type]


PRESETS: dict[str, WanPreset] = {
    p.name: p
    for p in (
        WanPreset(
            name="self-forcing",
            description="Self-Forcing DMD: global causal attention over its 21-frame horizon, then a rolling "
                        "21-frame window; 4 warped steps, shift 5; EMA weights",
            source="guandeh17/Self-Forcing@33593df configs/self_forcing_dmd.yaml (denoising_step_list, "
                   "warp_denoising_step, timestep_shift 5, num_frame_per_block 3, image_or_video_shape 21 frames), "
                   "configs/default_config.yaml (context_noise 0), README.md (inference.py --use_ema)",
            overrides={"local_attn_size": TRAINED_HORIZON_FRAMES, "sink_size": 0,
                       "denoising_steps": (1000, 750, 500, 250), "timestep_shift": 5.0, "warp_denoising_step": True},
            ema=True,
            file_hints=("self_forcing", "self-forcing"),
        ),
        WanPreset(
            name="causvid",
            description="CausVid DMD: global causal attention over its 21-frame horizon, then a rolling 21-frame "
                        "window; steps 1000/757/522, shift 8, not warped",
            source="tianweiy/CausVid@ca21150 configs/wan_causal_dmd.yaml (denoising_step_list 1000 757 522 0, "
                   "timestep_shift 8, warp_denoising_step false, num_frame_per_block 3), "
                   "causvid/models/wan/causal_inference.py (the trailing 0 removed; commit pass at 0)",
            overrides={"local_attn_size": TRAINED_HORIZON_FRAMES, "sink_size": 0,
                       "denoising_steps": (1000, 757, 522), "timestep_shift": 8.0, "warp_denoising_step": False},
            file_hints=("causvid", "autoregressive_checkpoint"),
        ),
        WanPreset(
            name="longlive",
            description="LongLive 1.0: 12 latent frames attended, 3 of them sinks; 4 warped steps, shift 5; "
                        "base weights with the rank-256 LoRA merged",
            source="NVlabs/LongLive@2462895 configs/longlive_inference.yaml (local_attn_size 12, sink_size 3, "
                   "global_sink true, adapter rank 256 alpha 256, generator_ckpt longlive_base.pt, lora_ckpt "
                   "lora.pt), utils/lora_utils.py (PEFT LoRA on every Linear of the attention blocks)",
            overrides={"local_attn_size": 12, "sink_size": 3,
                       "denoising_steps": (1000, 750, 500, 250), "timestep_shift": 5.0, "warp_denoising_step": True},
            lora_alpha_over_rank=1.0,
            lora_file="lora.pt",
            file_hints=("longlive",),
        ),
    )
}

#: Older `--wan-preset` names, accepted with a warning.
ALIASES = {"longlive-1.3b": "longlive", "wan-1.3b": "self-forcing"}

#: `--wan-preset` value that picks the preset from the checkpoint's published file names.
AUTO = "auto"


class PresetError(ValueError):
    """No preset could be chosen (an unknown name, or `auto` without a recognisable checkpoint name)."""


def resolve_preset(name: str, weights: Path | None) -> tuple[WanPreset, str]:
    """The preset to serve `weights` with, and why it was chosen (for the start-up log).

    Args:
        name: a preset name, an alias, or `auto` (match the checkpoint's path against each preset's
            `file_hints`: the published names `self_forcing_dmd.pt`, `autoregressive_checkpoint/model.pt`,
            `longlive_base.pt`).
        weights: the checkpoint path (file or folder), or None.

    Raises:
        PresetError: an unknown name; `auto` with no hint or with hints of two presets in the path.
    """
    if name in ALIASES:
        return PRESETS[ALIASES[name]], f"--wan-preset {name} is the old name of {ALIASES[name]}"
    if name in PRESETS:
        return PRESETS[name], f"--wan-preset {name}"
    if name != AUTO:
        raise PresetError(f"unknown causal-wan preset {name!r}; choose one of {sorted(PRESETS)} or {AUTO!r}")
    path = str(weights).lower() if weights is not None else ""
    hits = [p for p in PRESETS.values() if any(h in path for h in p.file_hints)]
    if len(hits) == 1:
        return hits[0], f"auto: {weights} names a {hits[0].name} checkpoint"
    which = " and ".join(p.name for p in hits) if hits else "no preset"
    raise PresetError(f"--wan-preset auto: {weights} matches {which} by name; say which checkpoint it is with "
                      f"--wan-preset {{{','.join(sorted(PRESETS))}}}")
