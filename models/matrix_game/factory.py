"""Building a `MatrixGameModel` from a registry load request (`family.FAMILY.factory`).

Real variants need the release download (`huggingface-cli download Skywork/Matrix-Game-2.0
--local-dir FOLDER`, then `--weights FOLDER`): the variant's DiT (`loading.load_dit`), the VAE
decoder and the image encoders. The encoders (Wan 2.1 VAE encoder, CLIP) come from
`loading_encoders.load_image_encoders(folder, dtype=, device=) -> ImageEncoders`, the encoder
modules' loader; until it exists the factory says so.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import torch

from worldcast.models.causal_wan.loading import WeightsError
from worldcast.models.causal_wan.vae import WanVAEDecoder
from worldcast.models.matrix_game._contract import LoadRequest
from worldcast.models.matrix_game.conditioning import ImageEncoders
from worldcast.models.matrix_game.controls import CONTROLS
from worldcast.models.matrix_game.loading import load_parts, tiny_parts
from worldcast.models.matrix_game.model import MatrixGameModel


def _dtype(request: LoadRequest) -> torch.dtype:
    choice = str(request.options.get("dtype", "auto"))
    if choice == "auto":
        return torch.bfloat16 if str(request.device).startswith("cuda") else torch.float32
    if choice not in ("float32", "bfloat16"):
        raise ValueError(f"dtype {choice!r}: choose auto, float32 or bfloat16")
    return getattr(torch, choice)


def release_encoders(folder: Path, *, dtype: torch.dtype, device: str) -> ImageEncoders:
    """The image encoders from the release's files, through the encoder modules' loader.

    Raises:
        WeightsError: the loader is not there (`loading_encoders.load_image_encoders`).
    """
    try:
        mod = importlib.import_module("worldcast.models.matrix_game.loading_encoders")
        load = mod.load_image_encoders
    except (ImportError, AttributeError) as e:
        raise WeightsError("matrix-game-2 needs the image encoders' loader "
                           "(models/matrix_game/loading_encoders.py: load_image_encoders)") from e
    return load(folder, dtype=dtype, device=device)  # type: ignore[no-any-return]


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
    else:
        if request.weights is None:
            raise ValueError(f"matrix-game-2:{v} needs --weights FOLDER "
                             "(huggingface-cli download Skywork/Matrix-Game-2.0 --local-dir FOLDER)")
        folder = Path(request.weights)
        enc = encoders or release_encoders(folder, dtype=dtype, device=request.device)
        parts = load_parts(folder, v, encoders=enc, vae=vae, dtype=dtype, device=request.device)
    return MatrixGameModel(parts, controls=CONTROLS[v], name=f"matrix-game-2:{v}")
