"""Causal Wan's registry entry: `--model causal-wan[:VARIANT]` (Self-Forcing / CausVid / LongLive checkpoints)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from worldcast.models.causal_wan.options import OPTIONS
from worldcast.models.registry import LoadRequest, ModelFamily, ModelOption, ModelVariant
from worldcast.models.spec import ActionSpace, ConditioningSpec, TextConditioning

if TYPE_CHECKING:
    from worldcast.models.causal_wan.model import CausalWanModel

#: Keys every worldcast client may send; a text-to-video model accepts and ignores them (and has no mouse).
KEYS = ("w", "a", "s", "d", "space", "shift")
ACTIONS = ActionSpace(keys=KEYS, dim=1, key_labels=tuple((k, "ignored (text-to-video)") for k in KEYS))

#: Text-to-video: a prompt through umT5; no image.
CONDITIONING = ConditioningSpec(text=TextConditioning(), image=None)


def load(req: LoadRequest) -> CausalWanModel:
    """Build the variant: a checkpoint (`--weights`, through `factory.load`: the preset by file name, EMA, LoRA),
    the tiny random model, or random weights at the full 1.3B size (GPU checks).

    Raises:
        FileNotFoundError, WeightsError, PresetError: missing or malformed weights (the message names what).
    """
    from worldcast.models.causal_wan import factory

    if req.variant != "1.3b-random":
        if req.variant == "tiny":
            import logging

            logging.getLogger(__name__).warning(
                "causal-wan:tiny has RANDOM weights: it streams noise-like video (for trying the path)")
        return factory.load(req)
    import torch

    from worldcast.models.causal_wan.dit import CausalWanDiT
    from worldcast.models.causal_wan.loading import CausalWanParts
    from worldcast.models.causal_wan.model import CausalWanModel
    from worldcast.models.causal_wan.presets import PRESETS, resolve_preset
    from worldcast.models.causal_wan.text import TextEncoder
    from worldcast.models.causal_wan.vae import WanVAEDecoder

    preset = PRESETS["longlive"]
    if req.options.get("wan_preset") not in (None, "auto"):
        preset, _ = resolve_preset(str(req.options["wan_preset"]), None)
    cfg = preset.config()
    dtype = factory.serving_dtype(req.device)
    with torch.device(req.device):
        dit = CausalWanDiT(cfg).cast(dtype).eval()
        vae = WanVAEDecoder(cfg.vae).to(dtype=dtype).eval()
    text = TextEncoder.tiny_random(dim=cfg.text_dim, text_len=cfg.text_len)  # the prompt path, not umT5-XXL
    text = TextEncoder(text.model.to(req.device), text.tokenizer, text_len=cfg.text_len)
    return CausalWanModel(CausalWanParts(cfg=cfg, dit=dit, vae=vae, text=text), name="causal-wan:1.3b-random",
                          decode_frames_per_call=req.options.get("wan_decode_frames"),
                          **factory.parse_size(req.options.get("wan_size")))


FAMILY = ModelFamily(
    name="causal-wan",
    description="causal Wan 2.1 text-to-video (Self-Forcing / CausVid / LongLive lineage); actions are ignored",
    variants=(
        ModelVariant("1.3b", "a 1.3B checkpoint: --weights a diffusers folder (transformer/ vae/ text_encoder/ "
                     "tokenizer/), or a Self-Forcing / CausVid / LongLive .pt with --wan-base FOLDER (Wan 2.1's "
                     "release or its diffusers form); --wan-preset auto picks the checkpoint's settings from its "
                     "file name", needs_weights=True, frame_height=480, frame_width=832, fps=16,
                     conditioning=CONDITIONING, actions=ACTIONS),
        ModelVariant("tiny", "RANDOM weights at 64x64: streams noise-like video, for trying the whole path on a CPU",
                     random_weights=True, frame_height=64, frame_width=64, fps=16, conditioning=CONDITIONING,
                     actions=ACTIONS),
        ModelVariant("1.3b-random", "RANDOM weights at the full 1.3B architecture and 480x832 (GPU checks; "
                     "the prompt path uses a tiny text encoder)", random_weights=True, frame_height=480,
                     frame_width=832, fps=16, conditioning=CONDITIONING, actions=ACTIONS),
    ),
    default_variant="1.3b",
    options=tuple(ModelOption(o.name, o.help, default=o.default, choices=o.choices, type=o.type)  # type: ignore[arg-type]
                  for o in OPTIONS),
    factory="worldcast.models.causal_wan.family:load",
    checkpoint_check="worldcast.models.causal_wan.chain:checkpoint_models",
)
