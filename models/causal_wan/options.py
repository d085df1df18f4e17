"""The causal Wan family's own command-line options, as plain data (no argparse here).

Each entry has the fields of `models/registry.py`'s `ModelOption` (name, help, default, choices, type:
str | path | int | float | flag), so the family's registry entry can list them as they are; until the
registry lands, `transport/cli.py` adds them to `serve` from this table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worldcast.models.causal_wan.presets import ALIASES, AUTO, PRESETS


@dataclass(frozen=True)
class WanOption:
    """One `--NAME` flag of the family (the fields of the registry's `ModelOption`)."""

    name: str
    help: str
    default: Any = None
    choices: tuple[str, ...] | None = None
    type: str = "str"  #: str | path | int | float | flag

    @property
    def dest(self) -> str:
        """The option's key in `LoadRequest.options` (argparse's dest)."""
        return self.name.replace("-", "_")


def _preset_help() -> str:
    rows = "; ".join(f"{p.name}: {p.description}" for p in PRESETS.values())
    return (f"causal-wan: the checkpoint's inference settings (window, sinks, steps, EMA, LoRA), as its own code "
            f"runs it. {AUTO} (default) picks the preset from the published file names (self_forcing*.pt, "
            f"CausVid's autoregressive_checkpoint/model.pt, longlive_base.pt) and refuses if it cannot tell. {rows}")


OPTIONS: tuple[WanOption, ...] = (
    WanOption("wan-preset", _preset_help(), default=AUTO, choices=(AUTO, *PRESETS, *ALIASES)),
    WanOption("wan-base", "causal-wan with a .pt DiT: the folder with the VAE and umT5, either Wan 2.1's release "
              "(Wan-AI/Wan2.1-T2V-1.3B: Wan2.1_VAE.pth, models_t5_umt5-xxl-enc-bf16.pth, google/umt5-xxl/) or "
              "its diffusers form (Wan2.1-T2V-1.3B-Diffusers: vae/, text_encoder/, tokenizer/)", type="path"),
    WanOption("ema", "causal-wan: serve the checkpoint's EMA weights (generator_ema); default: as the preset's "
              "reference does (self-forcing: yes, where the file has them; causvid, longlive: no)", type="flag"),
    WanOption("no-ema", "causal-wan: serve the checkpoint's generator weights, not its EMA ones", type="flag"),
    WanOption("lora", "causal-wan: a PEFT LoRA file merged into the DiT at load (LongLive's lora.pt; default for "
              "the longlive preset: lora.pt beside the base checkpoint, if there)", type="path"),
    WanOption("lora-alpha", "causal-wan: the LoRA's alpha (scale alpha / rank); default: the preset's (LongLive "
              "1.0: alpha = rank = 256, scale 1)", type="float"),
    WanOption("wan-size", "causal-wan: the frame size HEIGHTxWIDTH (default 480x832, what Wan 2.1 1.3B and its "
              "causal descendants were trained at; each side a multiple of 16)"),
    WanOption("wan-decode-frames", "causal-wan: latent frames per VAE decoder pass, 1..3 (default: the most that "
              "fit in the memory left after the state pool, logged at start-up)", type="int"),
)


def option(name: str) -> WanOption:
    """The option called `name` (KeyError if none)."""
    for o in OPTIONS:
        if o.name == name:
            return o
    raise KeyError(name)
