"""The causal Wan family's factory: a load request (variant, weights, device, options) -> `CausalWanModel`.

Shaped as `models/registry.py` expects (`factory(LoadRequest) -> WorldModel`): `request` needs
`variant` ("tiny" for random weights, anything else for a checkpoint), `weights`, `device` and
`options` (keys are `options.OPTIONS`' dests). Every choice it makes for the user (the preset and why,
EMA or not, the LoRA file, the dtype) is logged, and the model's `source` says it again for the dry run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from worldcast.models.causal_wan.loading import load_parts, tiny_parts
from worldcast.models.causal_wan.model import CausalWanModel
from worldcast.models.causal_wan.presets import resolve_preset

log = logging.getLogger(__name__)


class LoadRequestLike(Protocol):
    """The fields of the registry's `LoadRequest` this factory reads."""

    variant: str
    weights: Path | None
    device: str
    options: Mapping[str, Any]


def serving_dtype(device: str) -> torch.dtype:
    """bf16 on CUDA (the references' inference dtype), float32 on the CPU."""
    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def load(request: LoadRequestLike) -> CausalWanModel:
    """Load the causal Wan model a request asks for.

    Raises:
        PresetError: no preset could be chosen. WeightsError: a checkpoint that does not fit (keys named).
        FileNotFoundError: a missing path. ValueError: contradictory options (--ema with --no-ema).
    """
    opts = request.options
    dtype = serving_dtype(request.device)
    frames = opts.get("wan_decode_frames")
    size = parse_size(opts.get("wan_size"))
    if request.variant == "tiny":
        parts = tiny_parts(dtype=dtype, device=request.device)
        return CausalWanModel(parts, name="causal-wan:tiny", decode_frames_per_call=frames, **size)
    if request.weights is None:
        raise ValueError("causal-wan needs --weights (a diffusers folder or a Self-Forcing / CausVid / LongLive .pt)")
    weights = Path(request.weights)
    preset, why = resolve_preset(str(opts.get("wan_preset") or "auto"), weights)
    log.info("causal-wan: preset %s (%s): %s [%s]", preset.name, why, preset.description, preset.source)
    if opts.get("ema") and opts.get("no_ema"):
        raise ValueError("--ema and --no-ema contradict each other")
    ema = True if opts.get("ema") else False if opts.get("no_ema") else None
    lora = opts.get("lora")
    if lora is None and preset.lora_file is not None and weights.is_file():
        beside = weights.parent / preset.lora_file
        if beside.is_file():
            lora = beside
            log.info("causal-wan: merging %s (the %s preset's LoRA, found beside the base checkpoint)", lora,
                     preset.name)
        else:
            log.warning("causal-wan: the %s preset merges a LoRA (%s) but none was given or found beside %s; "
                        "serving the base weights alone", preset.name, preset.lora_file, weights)
    alpha = opts.get("lora_alpha")
    if alpha is None and lora is not None and preset.lora_alpha_over_rank not in (None, 1.0):
        log.warning("causal-wan: the preset's LoRA scale %s needs --lora-alpha", preset.lora_alpha_over_rank)
    parts = load_parts(weights, cfg=preset.config(), base_folder=opts.get("wan_base"), ema=ema,
                       default_ema=preset.ema, lora=lora, lora_alpha=alpha, dtype=dtype, device=request.device)
    return CausalWanModel(parts, name=f"causal-wan:{preset.name}", decode_frames_per_call=frames, **size)


def parse_size(value: object) -> dict[str, int]:
    """"480x832" -> {"height": 480, "width": 832}; None -> {} (the config's size).

    Raises:
        ValueError: not HEIGHTxWIDTH with positive integers.
    """
    if value is None:
        return {}
    h, sep, w = str(value).lower().partition("x")
    if not sep or not h.isdigit() or not w.isdigit() or int(h) <= 0 or int(w) <= 0:
        raise ValueError(f"--wan-size {value!r}: expected HEIGHTxWIDTH, e.g. 480x832")
    return {"height": int(h), "width": int(w)}
