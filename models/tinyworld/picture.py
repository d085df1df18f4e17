"""What a person sees in TinyWorld's frames: texture, objects, and how far the camera moved.

Three measurements of uint8 RGB frames, used by the play test (`playtest.py`, part of
`evaluate.py`: is the world alive, does it answer every key). Each masks the player marker, a
cross fixed at the centre of the view that never moves with the world (`world.render_view`).

- texture: mean |Laplacian| of luminance (ITU-R BT.601 weights), in levels of 0..255;
  a flat field scores about 0, the simulator's worlds 2-12.
- object share: the share of pixels nearer the theme's object colour than the segment
  between its low and high terrain colours (`world.PALETTES`); the simulator's worlds show
  about 2-7 %.
- camera shift: phase correlation (Kuglin & Hines 1975) of two frames' luminance under a Hann
  window, the marker's square filled by interpolating each row across it, so that the static
  cross does not pull the peak to zero; integer pixels, the camera's displacement (the view's
  content moves the other way).
"""

from __future__ import annotations

import numpy as np

from worldcast.models.tinyworld import world

#: Half side of the square around the view's centre that hides the player marker (the cross is 6 px wide).
MARKER_HALF = 4


def marker_mask(view: int = 64) -> np.ndarray:
    """bool (view, view): True outside the marker's square."""
    m = np.ones((view, view), bool)
    c = view // 2
    m[c - MARKER_HALF : c + MARKER_HALF, c - MARKER_HALF : c + MARKER_HALF] = False
    return m


def luminance(frames: np.ndarray) -> np.ndarray:
    """uint8 (..., H, W, 3) RGB -> float32 (..., H, W) luminance, BT.601 weights."""
    f = frames.astype(np.float32)
    return 0.299 * f[..., 0] + 0.587 * f[..., 1] + 0.114 * f[..., 2]


def texture(frames: np.ndarray) -> np.ndarray:
    """Mean |Laplacian| of luminance outside the marker: uint8 (..., H, W, 3) -> float32 (...)."""
    y = luminance(frames)
    lap = (y[..., :-2, 1:-1] + y[..., 2:, 1:-1] + y[..., 1:-1, :-2] + y[..., 1:-1, 2:]
           - 4 * y[..., 1:-1, 1:-1])
    keep = marker_mask(frames.shape[-2])[1:-1, 1:-1]
    return np.abs(lap)[..., keep].mean(-1)


def object_share(frames: np.ndarray, theme: str) -> np.ndarray:
    """Share of pixels (outside the marker) nearer `theme`'s object colour than its terrain colour segment.

    Args:
        frames: uint8 (..., H, W, 3).
        theme: one of `world.THEMES` (KeyError otherwise).

    Returns:
        float64 (...) in [0, 1].
    """
    lo, hi, ob = (np.asarray(c, np.float32) for c in world.PALETTES[theme])
    f = frames.astype(np.float32)
    d = hi - lo
    along = np.clip(((f - lo) @ d) / float(d @ d), 0.0, 1.0)
    to_terrain = ((f - (lo + along[..., None] * d)) ** 2).sum(-1)
    to_object = ((f - ob) ** 2).sum(-1)
    return (to_object < to_terrain)[..., marker_mask(frames.shape[-2])].mean(-1)


def _fill_marker(y: np.ndarray) -> np.ndarray:
    """Luminance (H, W) with the marker's square replaced, row by row, by a ramp between its two sides."""
    y = y.copy()
    c = y.shape[-1] // 2
    left, right = c - MARKER_HALF - 1, c + MARKER_HALF
    w = (np.arange(left + 1, right) - left) / (right - left)
    rows = slice(c - MARKER_HALF, c + MARKER_HALF)
    y[rows, left + 1 : right] = y[rows, left : left + 1] * (1 - w) + y[rows, right : right + 1] * w
    return y


def _hann(n: int) -> np.ndarray:
    return np.outer(np.hanning(n), np.hanning(n)).astype(np.float32)


def camera_shift(a: np.ndarray, b: np.ndarray) -> tuple[tuple[int, int], float]:
    """The camera's displacement from frame `a` to frame `b`, by phase correlation.

    Args:
        a, b: uint8 (H, W, 3) frames of one session (square, H = W).

    Returns:
        ((dx, dy), peak): the displacement in whole pixels (+x right, +y down; up to half the
        view either way) and the correlation peak in (0, 1] (near 1 for a clean translation of a
        textured picture, small when the frames share little).
    """
    n = a.shape[0]
    win = _hann(n)
    spectra = []
    for fr in (a, b):
        y = _fill_marker(luminance(fr))
        spectra.append(np.fft.fft2((y - y.mean()) * win))
    cross = spectra[1] * np.conj(spectra[0])
    cross /= np.abs(cross) + 1e-9
    r = np.fft.ifft2(cross).real
    iy, ix = np.unravel_index(int(np.argmax(r)), r.shape)
    sy = iy - n if iy > n // 2 else iy
    sx = ix - n if ix > n // 2 else ix
    return (int(-sx), int(-sy)), float(r.max())
