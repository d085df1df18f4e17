"""Causal Wan's registry entry: `--model causal-wan[:VARIANT]` (Self-Forcing / CausVid / LongLive checkpoints)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from worldcast.models.causal_wan.config import PRESETS
from worldcast.models.registry import LoadRequest, ModelFamily, ModelOption, ModelVariant
from worldcast.models.spec import ActionSpace, ConditioningSpec, TextConditioning

if TYPE_CHECKING:
    from worldcast.models.causal_wan.model import CausalWanModel

#: Keys every worldcast client may send; a text-to-video model accepts and ignores them (and has no mouse).
KEYS = ("w", "a", "s", "d", "space", "shift")
ACTIONS = ActionSpace(keys=KEYS, mouse=(), dim=1, key_labels=tuple((k, "ignored (text-to-video)") for k in KEYS))

#: Text-to-video: a prompt through umT5; no image.
CONDITIONING = ConditioningSpec(text=TextConditioning(), image=None)


def load(req: LoadRequest) -> CausalWanModel:
    """Build the variant: a checkpoint (`--weights`, with the preset and base folder options) or random weights.

    Raises:
        FileNotFoundError, WeightsError: missing or malformed weights (the message names what).
    """
    import torch

    from worldcast.models.causal_wan.loading import CausalWanParts, load_parts, tiny_parts
    from worldcast.models.causal_wan.model import CausalWanModel

    dtype = torch.bfloat16 if req.device.startswith("cuda") else torch.float32
    if req.variant == "tiny":
        import logging

        logging.getLogger(__name__).warning(
            "causal-wan:tiny has RANDOM weights: it streams noise-like video (for trying the path)")
        return CausalWanModel(tiny_parts(dtype=dtype, device=req.device), name="causal-wan:tiny")
    preset = req.options["wan_preset"]
    cfg = PRESETS[preset]()
    if req.variant == "1.3b-random":
        from worldcast.models.causal_wan.dit import CausalWanDiT
        from worldcast.models.causal_wan.text import TextEncoder
        from worldcast.models.causal_wan.vae import WanVAEDecoder

        with torch.device(req.device):
            dit = CausalWanDiT(cfg).cast(dtype).eval()
            vae = WanVAEDecoder(cfg.vae).to(dtype=dtype).eval()
        text = TextEncoder.tiny_random(dim=cfg.text_dim, text_len=cfg.text_len)  # the prompt path, not umT5-XXL
        text = TextEncoder(text.model.to(req.device), text.tokenizer, text_len=cfg.text_len)
        return CausalWanModel(CausalWanParts(cfg=cfg, dit=dit, vae=vae, text=text), name="causal-wan:1.3b-random")
    assert req.weights is not None
    parts = load_parts(req.weights, cfg=cfg, base_folder=req.options["wan_base"], dtype=dtype, device=req.device)
    return CausalWanModel(parts, name=f"causal-wan:{preset}")


FAMILY = ModelFamily(
    name="causal-wan",
    description="causal Wan 2.1 text-to-video (Self-Forcing / CausVid / LongLive lineage); actions are ignored",
    variants=(
        ModelVariant("1.3b", "a 1.3B checkpoint: --weights a diffusers folder (transformer/ vae/ text_encoder/ "
                     "tokenizer/) or a Self-Forcing .pt with --wan-base FOLDER", needs_weights=True,
                     frame_height=480, frame_width=832, fps=16, conditioning=CONDITIONING, actions=ACTIONS),
        ModelVariant("tiny", "RANDOM weights at 64x64: streams noise-like video, for trying the whole path on a CPU",
                     random_weights=True, frame_height=64, frame_width=64, fps=16, conditioning=CONDITIONING,
                     actions=ACTIONS),
        ModelVariant("1.3b-random", "RANDOM weights at the full 1.3B architecture and 480x832 (GPU checks; "
                     "the prompt path uses a tiny text encoder)", random_weights=True, frame_height=480,
                     frame_width=832, fps=16, conditioning=CONDITIONING, actions=ACTIONS),
    ),
    default_variant="1.3b",
    options=(
        ModelOption("wan-preset", "causal-wan: attention window, sinks and timesteps (default longlive-1.3b: 12 "
                    "latent frames attended, 3 sinks; wan-1.3b attends globally and cannot serve unbounded sessions)",
                    default="longlive-1.3b", choices=tuple(sorted(PRESETS))),
        ModelOption("wan-base", "causal-wan with a .pt DiT: the diffusers folder holding vae/, text_encoder/, "
                    "tokenizer/", type="path"),
    ),
    factory="worldcast.models.causal_wan.family:load",
)
