"""Measure after how many latent frames the VAE encoding of [image, black frames] stops depending on the image.

    python -m tests.models.matrix_game.receptive_field     # about 40 s on 2 cores

Matrix-Game 2.0 conditions every latent frame on `vae.encode(cat([image, zeros]))` (the release's
`inference.py`); `MatrixGameConfig.cond_latent_frames` keeps that many frames per session and reuses
the last. This encodes two random images followed by black frames with diffusers' `AutoencoderKLWan`
(the Wan 2.1 encoder architecture: base 96 -> here 4 channels, the same depth and temporal strides,
random weights, float64) and prints the first latent frame from which the two encodings are bitwise
equal (and equal to every later frame). Not part of the test suite (diffusers is a test dependency).
"""

from __future__ import annotations

import torch


def first_image_independent_frame(latent_frames: int = 40, *, seed: int = 0) -> int:
    from diffusers import AutoencoderKLWan

    torch.manual_seed(seed)
    vae = AutoencoderKLWan(base_dim=4, z_dim=4, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                           temperal_downsample=[False, True, True]).double().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in vae.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.3)
        z = []
        for _ in range(2):
            image = torch.randn(1, 3, 1, 16, 16, generator=g, dtype=torch.float64)
            video = torch.cat([image, torch.zeros(1, 3, 4 * (latent_frames - 1), 16, 16, dtype=torch.float64)], 2)
            z.append(vae.encode(video).latent_dist.mean[0])  # (C, latent_frames, 2, 2)
    same = [bool(torch.equal(z[0][:, j], z[1][:, j])) and bool(torch.equal(z[0][:, j], z[0][:, -1]))
            for j in range(latent_frames)]
    first = next(j for j in range(latent_frames) if all(same[j:]))
    if first >= latent_frames - 2:
        raise RuntimeError(f"not converged within {latent_frames} latent frames")
    return first


if __name__ == "__main__":
    print(f"latent frames >= {first_image_independent_frame()} do not depend on the image")
