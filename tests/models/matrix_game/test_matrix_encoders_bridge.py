"""`encoders.image_encoders` gives `MatrixGameModel` what `conditioning.ImageEncoders` promises, from the real
(tiny) Wan VAE encoder and CLIP tower: the release's first-frame table without its mask channels, cut or
extended (with its image-independent last frame) to the K latent frames asked for, and the CLIP features."""

from __future__ import annotations

import torch

from worldcast.models.matrix_game.encoders import image_encoders
from worldcast.models.matrix_game.image_encoder import ClipImageEncoder, tiny_clip_config
from worldcast.models.matrix_game.vae_encoder import (
    MASK_CHANNELS,
    WanVAEEncoder,
    first_frame_condition,
    tiny_vae_config,
)


def test_matrix_encoders_bridge_shapes_and_values() -> None:
    torch.manual_seed(0)
    vae = WanVAEEncoder(tiny_vae_config()).double().eval()
    clip = ClipImageEncoder(tiny_clip_config()).double().eval()
    enc = image_encoders(vae, clip, name="tiny")
    image = torch.rand(2, 3, 32, 48, dtype=torch.float64) * 2 - 1
    table = first_frame_condition(vae, image)[:, MASK_CHANNELS:]  # (B, z, S + 1, h, w)
    S1 = table.shape[2]
    short = enc.first_frame(image, 2)
    assert torch.equal(short, table[:, :, :2])
    long = enc.first_frame(image, S1 + 3)
    assert long.shape[2] == S1 + 3 and torch.equal(long[:, :, :S1], table)
    assert all(torch.equal(long[:, :, S1 + i], table[:, :, -1]) for i in range(3))
    assert not torch.equal(enc.first_frame(-image, 2), short)  # the image reaches the latents
    feats = enc.clip(image)
    assert feats.shape[0] == 2 and feats.shape[1] == clip.cfg.tokens and torch.equal(feats, clip(image))
