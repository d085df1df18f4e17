"""The real image encoders behind `conditioning.ImageEncoders`: the Wan 2.1 VAE encoder and the CLIP tower.

`release_encoders(folder)` loads the release's files (`loading_encoders.load_wan_vae`,
`load_image_encoder`) and returns, beside the `ImageEncoders` `MatrixGameModel.init_state`
calls, the VAE *decoder* from the same `Wan2.1_VAE.pth`. `random_encoders()` builds the same
modules at full size with random weights (the GPU check's full-size model: real shapes and
cost, meaningless pictures).

`first_frame(image, K)` is the release's `img_cond` (`Matrix-Game-2/inference.py`): the VAE
encoding of [image, 4 (K - 1) zero (mid-grey) frames]; latent frames from the encoder's
`condition_horizon()` on do not depend on the image, so the table `first_frame_condition`
builds (its first `horizon + 1` frames) is cut or extended with its last frame to K.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from worldcast.models.causal_wan.config import WanVAEConfig
from worldcast.models.causal_wan.vae import WanVAEDecoder
from worldcast.models.matrix_game.conditioning import ImageEncoders
from worldcast.models.matrix_game.image_encoder import ClipImageEncoder, ClipVisionConfig
from worldcast.models.matrix_game.loading_encoders import load_image_encoder, load_wan_vae
from worldcast.models.matrix_game.vae_encoder import MASK_CHANNELS, WanVAEEncoder, first_frame_condition


@dataclass
class EncoderParts:
    """The image encoders and the VAE decoder that goes with them."""

    encoders: ImageEncoders
    vae_decoder: WanVAEDecoder | None


def image_encoders(vae: WanVAEEncoder, clip: ClipImageEncoder, *, name: str) -> ImageEncoders:
    """`ImageEncoders` over a loaded VAE encoder and CLIP tower (both run in their own dtype)."""

    @torch.no_grad()
    def first_frame(image: torch.Tensor, frames: int) -> torch.Tensor:
        table = first_frame_condition(vae, image.to(vae.dtype))[:, MASK_CHANNELS:]  # (B, 16, S + 1, h, w)
        if table.shape[2] >= frames:
            return table[:, :, :frames]
        pad = table[:, :, -1:].expand(-1, -1, frames - table.shape[2], -1, -1)  # image-independent frames
        return torch.cat([table, pad], dim=2)

    @torch.no_grad()
    def clip_features(image: torch.Tensor) -> torch.Tensor:
        return clip(image.to(clip.dtype))  # (B, 257, 1280)

    return ImageEncoders(first_frame=first_frame, clip=clip_features, name=name)


def release_encoders(folder: str | Path, *, dtype: torch.dtype, device: str | torch.device) -> EncoderParts:
    """The release's `Wan2.1_VAE.pth` (encoder and decoder) and CLIP `.pth` under `folder`.

    Raises:
        FileNotFoundError, WeightsError: a missing file, or keys that do not match (named).
    """
    folder = Path(folder)
    vae = load_wan_vae(folder, decoder=True, dtype=dtype, device=device)
    clip = load_image_encoder(folder, dtype=dtype, device=device)
    return EncoderParts(image_encoders(vae.encoder, clip, name=f"release encoders ({folder})"), vae.decoder)


def random_encoders(*, dtype: torch.dtype, device: str | torch.device, seed: int = 0) -> EncoderParts:
    """RANDOM-WEIGHT encoders at full size (Wan 2.1 VAE encoder, ViT-H/14 to its penultimate layer)."""
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        vae = WanVAEEncoder(WanVAEConfig()).to(dtype=dtype).eval()
        clip = ClipImageEncoder(ClipVisionConfig(), init_weights=False).to(dtype=dtype).eval()
    return EncoderParts(image_encoders(vae, clip, name="random full-size encoders"), None)
