"""Building a `MatrixGameModel` from a registry load request (`family.FAMILY.factory`).

Real variants need the release download (`huggingface-cli download Skywork/Matrix-Game-2.0
--local-dir FOLDER`, then `--weights FOLDER`): the variant's DiT (`loading.load_dit`), and
`Wan2.1_VAE.pth` (VAE encoder and decoder) and the CLIP `.pth` beside them
(`encoders.release_encoders`). `universal-random` is the universal architecture at the release's
geometry with random weights everywhere (the GPU check's full-size model).
"""

from __future__ import annotations

from pathlib import Path

import torch

from worldcast.models.causal_wan.vae import WanVAEDecoder
from worldcast.models.matrix_game.conditioning import ImageEncoders
from worldcast.models.matrix_game.controls import CONTROLS
from worldcast.models.matrix_game.loading import MatrixGameParts, load_parts, tiny_parts
from worldcast.models.matrix_game.model import MatrixGameModel
from worldcast.models.registry import LoadRequest


def _dtype(request: LoadRequest) -> torch.dtype:
    choice = str(request.options.get("dtype", "auto"))
    if choice == "auto":
        return torch.bfloat16 if str(request.device).startswith("cuda") else torch.float32
    if choice not in ("float32", "bfloat16"):
        raise ValueError(f"dtype {choice!r}: choose auto, float32 or bfloat16")
    return getattr(torch, choice)


def load_model(request: LoadRequest, *, encoders: ImageEncoders | None = None,
               vae: WanVAEDecoder | None = None) -> MatrixGameModel:
    """The model of `request.variant` on `request.device`.

    Args:
        request: variant, weights folder, device, options ("dtype").
        encoders, vae: parts already loaded (tests, or a caller with its own); default: from the
            weights folder.

    Raises:
        ValueError: an unknown variant, or a real variant without weights.
        WeightsError, FileNotFoundError: see `loading.load_dit`.
    """
    v = request.variant
    if v not in CONTROLS:
        raise ValueError(f"unknown matrix-game-2 variant {v!r}; known: {sorted(CONTROLS)}")
    dtype = _dtype(request)
    if v == "tiny":
        parts = tiny_parts(dtype=dtype, device=request.device)
    elif v == "universal-random":
        parts = random_parts(dtype=dtype, device=request.device)
    else:
        if request.weights is None:
            raise ValueError(f"matrix-game-2:{v} needs --weights FOLDER "
                             "(huggingface-cli download Skywork/Matrix-Game-2.0 --local-dir FOLDER)")
        folder = Path(request.weights)
        if encoders is None:
            from worldcast.models.matrix_game.encoders import release_encoders

            loaded = release_encoders(folder, dtype=dtype, device=request.device)
            encoders, vae = loaded.encoders, vae or loaded.vae_decoder
        parts = load_parts(folder, v, encoders=encoders, vae=vae, dtype=dtype, device=request.device)
    return MatrixGameModel(parts, controls=CONTROLS[v], name=f"matrix-game-2:{v}")


def random_parts(*, dtype: torch.dtype, device: str) -> MatrixGameParts:
    """RANDOM weights at the universal model's full size and the release's 352x640 (GPU checks)."""
    from worldcast.models.matrix_game.config import universal
    from worldcast.models.matrix_game.dit import MatrixGameDiT
    from worldcast.models.matrix_game.encoders import random_encoders

    cfg = universal()
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(0)
        dit = MatrixGameDiT(cfg).cast(dtype).eval()
        dec = WanVAEDecoder(cfg.vae).to(dtype=dtype).eval()
    return MatrixGameParts(cfg=cfg, dit=dit, vae=dec, encoders=random_encoders(dtype=dtype, device=device).encoders)
