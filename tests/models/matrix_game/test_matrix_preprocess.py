"""The release's first-frame geometry: centered crop to 352:640 (PIL rounding), bilinear resize, [-1, 1]."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from worldcast.models.matrix_game.preprocess import crop_box, fit_image, image_to_tensor


def test_matrix_crop_box_keeps_the_long_side_and_rounds_like_pil() -> None:
    # wider than 352:640: full height, width int(90 * 640 / 352) = 163, box (3.5, 0, 166.5, 90);
    # PIL rounds half to even
    assert crop_box(90, 170, target_height=352, target_width=640) == (4, 0, 166, 90)
    # taller: full width, height int(61 * 352 / 640) = 33, box (0, 43.5, 61, 76.5) -> (0, 44, 61, 76)
    assert crop_box(120, 61, target_height=352, target_width=640) == (0, 44, 61, 76)
    assert crop_box(352, 640, target_height=352, target_width=640) == (0, 0, 640, 352)
    # 16:9 is a little taller than 352:640 (0.5625 > 0.55): 704 of 720 rows kept
    assert crop_box(720, 1280, target_height=352, target_width=640) == (0, 8, 1280, 712)


def test_matrix_fit_image_geometry_and_content() -> None:
    img = np.zeros((100, 400, 3), np.uint8)
    img[:, 200:] = 255  # right half white: the centered crop keeps both halves equally
    out = fit_image(img)
    assert out.shape == (352, 640, 3) and out.dtype == np.uint8 and out.flags.c_contiguous
    assert out[:, :300].max() == 0 and out[:, 340:].min() == 255
    assert fit_image(img, height=32, width=48).shape == (32, 48, 3)


def test_matrix_image_to_tensor_scales_to_minus_one_one() -> None:
    frames = np.array([[[0, 255, 51]]], np.uint8)
    x = image_to_tensor(frames)
    assert x.shape == (1, 3, 1, 1) and x.dtype == torch.float32
    assert torch.allclose(x.flatten(), torch.tensor([-1.0, 1.0, -0.6]), atol=1e-6)
    assert image_to_tensor(np.zeros((2, 4, 5, 3), np.uint8)).shape == (2, 3, 4, 5)


@pytest.mark.parametrize(
    "bad, match",
    [
        (np.zeros((10, 10, 3), np.float32), "uint8"),
        (np.zeros((10, 10), np.uint8), r"\(H, W, 3\)"),
        (np.zeros((10, 10, 4), np.uint8), r"\(H, W, 3\)"),
        (np.zeros((0, 10, 3), np.uint8), r"\(H, W, 3\)"),
        ([[1, 2, 3]], "uint8 numpy array"),
    ],
)
def test_matrix_fit_image_refuses_bad_input(bad: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        fit_image(bad)  # type: ignore[arg-type]


def test_matrix_image_to_tensor_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="uint8"):
        image_to_tensor(np.zeros((4, 4, 3), np.float32))
    with pytest.raises(ValueError, match="B, H, W, 3"):
        image_to_tensor(np.zeros((4, 4, 2), np.uint8))


@pytest.mark.parametrize("shape", [(4000, 1), (1, 4000), (4, 1), (1, 4)])
def test_matrix_fit_image_keeps_a_pixel_of_extreme_aspect_ratios(shape: tuple[int, int]) -> None:
    """The release's box would be empty (and resize to black): at least the centre pixel is kept."""
    img = np.full((*shape, 3), 200, np.uint8)
    out = fit_image(img, height=64, width=112)
    assert out.shape == (64, 112, 3) and out.min() == 200
