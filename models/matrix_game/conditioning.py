"""The starting image: its preparation, the default picture, and the encoders `init_state` calls.

Matrix-Game 2.0 is conditioned on one image (the first frame), never on text:
- the VAE encoding of [image, black frames...] is concatenated to the noise of
  every latent frame (with a mask that is 1 on latent frame 0 only);
- the image's CLIP features (257 x 1280) are the cross-attention context.
The release computes both once per video (`Matrix-Game-2/inference.py`:
`vae.encode(cat([image, zeros]))`, `vae.clip.encode_video(image)`), from the
image center-cropped to 352:640 and resized, in [-1, 1].

The encoders themselves (the Wan 2.1 VAE encoder, the CLIP vision tower) are
separate modules; `MatrixGameModel` takes them as an `ImageEncoders` and calls them
on the device thread in `init_state`. `fake_encoders` stands in for them where the
real ones are not loaded (the tiny model, tests): FAKES, deterministic functions of
the image with the right shapes, not encoders.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

#: what a session without an image starts from (`default_image`), as the registry describes it
DEFAULT_IMAGE = "a procedural picture: sky over green ground, a road to the horizon"


@dataclass(frozen=True)
class ImageEncoders:
    """What `init_state` needs to turn a starting image into conditioning.

    Attributes:
        first_frame: (image, latent_frames K) -> (B, 16, K, h, w) normalised VAE latents of the
            video [image, 4 (K - 1) black frames] (the release's `img_cond`); image float (B, 3, H, W)
            in [-1, 1] at the model's frame size; h, w = H / 8, W / 8.
        clip: image float (B, 3, H, W) in [-1, 1] -> (B, 257, 1280) CLIP ViT-H/14 features
            (the release's `clip.encode_video(image)`; the encoder resizes to its own input size).
        name: what they are, for logs.
    """

    first_frame: Callable[[torch.Tensor, int], torch.Tensor]
    clip: Callable[[torch.Tensor], torch.Tensor]
    name: str = "encoders"


def fake_encoders(*, latent_channels: int = 16, image_tokens: int = 257, image_dim: int = 1280,
                  seed: int = 0) -> ImageEncoders:
    """FAKE image encoders: fixed random projections of the downsampled image (no VAE, no CLIP).

    Different images give different conditioning, the same image the same; latent frame 0
    differs from the later ones, which are all equal (like the VAE encoding of black frames
    after the image, past its receptive field). For the tiny model and tests only.
    """
    g = torch.Generator().manual_seed(seed)
    w_lat = torch.randn(latent_channels, 3, generator=g, dtype=torch.float64)
    b_lat = torch.randn(2, latent_channels, generator=g, dtype=torch.float64)
    w_clip = torch.randn(image_tokens, 3 * 16, image_dim, generator=g, dtype=torch.float64) * 0.2

    def first_frame(image: torch.Tensor, frames: int) -> torch.Tensor:
        B, _, H, W = image.shape
        x = F.avg_pool2d(image.double(), 8)  # (B, 3, H/8, W/8)
        z0 = torch.einsum("oc,bchw->bohw", w_lat.to(x.device), x) + b_lat[0].to(x.device)[:, None, None]
        zr = (0.1 * z0 + b_lat[1].to(x.device)[:, None, None])[:, :, None].expand(-1, -1, frames - 1, -1, -1)
        return torch.cat([z0[:, :, None], zr], dim=2).to(image.dtype)  # (B, C, K, H/8, W/8)

    def clip(image: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(image.double(), 4).flatten(1)  # (B, 48)
        return torch.einsum("bi,tid->btd", x, w_clip.to(x.device)).to(image.dtype)  # (B, L, image_dim)

    return ImageEncoders(first_frame=first_frame, clip=clip, name="fake (random projections)")


# -- preparing the image --------------------------------------------------------------------------


def prepare_image(rgb: np.ndarray, *, height: int, width: int) -> np.ndarray:
    """Center-crop a picture to the model's aspect ratio and resize it (antialiased bilinear).

    The release's `_resizecrop` then `v2.Resize((352, 640), antialias=True)` (`inference.py`).

    Args:
        rgb: uint8 (h, w, 3) RGB, any size >= 1 x 1.
        height, width: the model's frame size.

    Returns:
        uint8 (height, width, 3).

    Raises:
        ValueError: not a uint8 (h, w, 3) array.
    """
    if not isinstance(rgb, np.ndarray) or rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"image must be uint8 (h, w, 3) RGB, got {getattr(rgb, 'dtype', type(rgb))} "
                         f"{getattr(rgb, 'shape', '')}")
    h, w = rgb.shape[:2]
    if h == 0 or w == 0:
        raise ValueError("image is empty")
    if h / w > height / width:  # too tall: keep the width
        ch, cw = max(1, round(w * height / width)), w
    else:
        ch, cw = h, max(1, round(h * width / height))
    top, left = (h - ch) // 2, (w - cw) // 2
    crop = torch.from_numpy(np.ascontiguousarray(rgb[top:top + ch, left:left + cw])).permute(2, 0, 1)[None]
    out = F.interpolate(crop.float(), size=(height, width), mode="bilinear", antialias=True, align_corners=False)
    return out[0].permute(1, 2, 0).round().clamp(0, 255).to(torch.uint8).numpy()


def to_model_range(images: torch.Tensor) -> torch.Tensor:
    """uint8 or 0..255 float (B, H, W, 3) -> float32 (B, 3, H, W) in [-1, 1] (ToTensor + Normalize(0.5, 0.5))."""
    return images.to(torch.float32).permute(0, 3, 1, 2) / 127.5 - 1.0


def default_image(*, height: int, width: int) -> np.ndarray:
    """The picture a session starts from when it gives none: a sky over a plain with a road to the horizon.

    Procedural (no file): a vertical sky gradient, green ground below the horizon at 45 %
    height, a grey road narrowing to a vanishing point, dashed centre line. uint8 (H, W, 3).
    """
    y = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None]
    x = np.linspace(-1.0, 1.0, width, dtype=np.float32)[None, :]
    horizon = 0.45
    sky = np.stack([110 + 90 * y / horizon, 160 + 70 * y / horizon, 235 + 0 * y], -1) * np.ones_like(x)[..., None]
    depth = np.clip((y - horizon) / (1 - horizon), 1e-3, 1.0)  # 0 at the horizon, 1 at the bottom
    ground = np.stack([70 + 40 * depth, 120 + 50 * depth, 50 + 20 * depth], -1) * np.ones_like(x)[..., None]
    road = np.abs(x) < 0.05 + 0.55 * depth
    line = (np.abs(x) < 0.004 + 0.02 * depth) & (np.sin(12.0 / depth) > 0)
    img = np.where((y < horizon)[..., None], sky, ground)
    img = np.where((road & (y >= horizon))[..., None], np.array([95, 95, 100], np.float32), img)
    img = np.where((line & (y >= horizon))[..., None], np.array([235, 225, 120], np.float32), img)
    return np.clip(img, 0, 255).astype(np.uint8)
