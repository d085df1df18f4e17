"""A user's image -> Matrix-Game 2.0's first frame: center crop to the aspect, resize, scale to [-1, 1].

The release (`Matrix-Game-2/inference.py`, `InteractiveGameInference._resizecrop` and
`frame_process`) crops the largest centered box of the target aspect 352:640, keeping the
full width when the image is taller than that aspect and the full height otherwise, with the
box side truncated to an integer and the box corners rounded by PIL (`Image.crop` rounds
half to even); then torchvision's `v2.Resize((352, 640), antialias=True)` on the PIL image,
which is PIL's bilinear resize (antialiased when shrinking); then `ToTensor` (/ 255) and
`Normalize(0.5, 0.5)`: x / 127.5 - 1. Pillow does the resize here too, so the pixels are the
release's exactly.
"""

from __future__ import annotations

import numpy as np
import torch

RELEASE_HEIGHT = 352  #: the release's frame height in pixels (44 latent rows)
RELEASE_WIDTH = 640  #: the release's frame width in pixels (80 latent columns)


def crop_box(height: int, width: int, *, target_height: int, target_width: int) -> tuple[int, int, int, int]:
    """The release's centered crop of an (height, width) image to the target aspect: (left, top, right, bottom).

    Pixel coordinates as PIL takes them (right/bottom exclusive), after PIL's rounding. An image so
    narrow (or so flat) that the release's box would be empty keeps at least one pixel of it, centred
    (the release would resize an empty crop to black).
    """
    if height / width > target_height / target_width:  # taller than the target: keep the width
        new_w = width
        new_h = int(new_w * target_height / target_width)
    else:
        new_h = height
        new_w = int(new_h * target_width / target_height)
    box = ((width - new_w) / 2, (height - new_h) / 2, (width + new_w) / 2, (height + new_h) / 2)
    left, top, right, bottom = (int(round(v)) for v in box)  # PIL Image._crop: map(int, map(round, box))
    if right <= left:  # degenerate aspect: keep the centre column
        left = min(max(0, (width - 1) // 2), width - 1)
        right = left + 1
    if bottom <= top:
        top = min(max(0, (height - 1) // 2), height - 1)
        bottom = top + 1
    return left, top, right, bottom


def fit_image(image: np.ndarray, *, height: int = RELEASE_HEIGHT, width: int = RELEASE_WIDTH) -> np.ndarray:
    """Center-crop an RGB image to height:width and resize it to (height, width), as the release does.

    Args:
        image: uint8 (H, W, 3) RGB, any size (H, W >= 1).
        height, width: the model's frame size in pixels (352 x 640 for the release).

    Returns:
        uint8 (height, width, 3) RGB, a new C-contiguous array.

    Raises:
        ValueError: not a uint8 (H, W, 3) array with H, W >= 1, or a target size < 1.
    """
    from PIL import Image

    if not isinstance(image, np.ndarray) or image.dtype != np.uint8:
        raise ValueError(f"image must be a uint8 numpy array, got {type(image).__name__} "
                         f"{getattr(image, 'dtype', '')}".rstrip())
    if image.ndim != 3 or image.shape[2] != 3 or image.shape[0] < 1 or image.shape[1] < 1:
        raise ValueError(f"image must be (H, W, 3) RGB, got shape {image.shape}")
    if height < 1 or width < 1:
        raise ValueError(f"target size must be positive, got {height}x{width}")
    h, w = image.shape[:2]
    box = crop_box(h, w, target_height=height, target_width=width)
    pil = Image.fromarray(np.ascontiguousarray(image)).crop(box)  # uint8 (H, W, 3): mode RGB
    return np.array(pil.resize((width, height), resample=Image.Resampling.BILINEAR), dtype=np.uint8)  # a copy


def image_to_tensor(frames: np.ndarray | torch.Tensor) -> torch.Tensor:
    """uint8 RGB frames -> float32 in [-1, 1], channels first: (H, W, 3) -> (1, 3, H, W), (B, H, W, 3) -> (B, 3, H, W).

    The release's `ToTensor` then `Normalize([0.5] * 3, [0.5] * 3)`: (x / 255 - 0.5) / 0.5.

    Raises:
        ValueError: not uint8, or not (..., H, W, 3) with 3 or 4 dimensions.
    """
    if isinstance(frames, np.ndarray) and not frames.flags.writeable:
        frames = frames.copy()  # torch warns on read-only arrays
    t = torch.as_tensor(frames)
    if t.dtype != torch.uint8:
        raise ValueError(f"frames must be uint8, got {t.dtype}")
    if t.dim() == 3:
        t = t[None]
    if t.dim() != 4 or t.shape[-1] != 3:
        raise ValueError(f"frames must be (H, W, 3) or (B, H, W, 3), got shape {tuple(t.shape)}")
    x = t.permute(0, 3, 1, 2).to(torch.float32) / 255.0
    return (x - 0.5) / 0.5
