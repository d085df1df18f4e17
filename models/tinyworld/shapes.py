"""What the new content looks like, measured from pictures: whole objects and the terrain's structure.

Measures that a world of blobs, bands or flat fields fails while the simulator passes against itself, used by
`evaluate3.py` (model against simulator, the same measure on both):

- objects: connected components of the object mask (`picture.object_share`'s test per pixel, the marker masked)
  that do not touch the view's border (whole objects), per frame; their median area (pixels) and median
  roundness 4 pi area / perimeter^2 (1 for a disc, less for a blob or a streak; the perimeter counted as the
  pixel edges between object and not);
- terrain structure function: E[(y(x + d) - y(x))^2] of luminance at d = 2, 4, 8, 16 px along rows and columns,
  over pairs where neither pixel is object or marker: how the terrain varies with distance (flat: 0; noise: flat
  in d; the simulator's smooth hills: rising with d).
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from worldcast.models.tinyworld import picture, world

#: Distances (px) of the structure function.
DISTANCES = (2, 4, 8, 16)


def object_masks(frames: np.ndarray, theme: str) -> np.ndarray:
    """bool (N, S, S): pixels nearer the world's object colour than its terrain colours (the marker False)."""
    lo, hi, ob = (np.asarray(c, np.float32) for c in world.PALETTES[theme])
    f = frames.astype(np.float32)
    d = hi - lo
    along = np.clip(((f - lo) @ d) / float(d @ d), 0.0, 1.0)
    to_terrain = ((f - (lo + along[..., None] * d)) ** 2).sum(-1)
    to_object = ((f - ob) ** 2).sum(-1)
    return (to_object < to_terrain) & picture.marker_mask(frames.shape[-2])[None]


def objects(frames: np.ndarray, theme: str) -> dict[str, float]:
    """Whole objects of uint8 (N, S, S, 3) frames: per frame (mean), median area (px), median roundness."""
    masks = object_masks(frames, theme)
    areas, rounds, counts = [], [], []
    for m in masks:
        lab, n = ndimage.label(m)
        count = 0
        for i, sl in enumerate(ndimage.find_objects(lab), start=1):
            if sl is None:
                continue
            r, c = sl
            if r.start == 0 or c.start == 0 or r.stop == m.shape[0] or c.stop == m.shape[1]:
                continue  # cut by the border: not whole
            blob = lab[sl] == i
            area = int(blob.sum())
            if area < 3:
                continue  # a stray pixel is no object
            p = np.pad(blob, 1)
            perim = int((p[1:] != p[:-1]).sum() + (p[:, 1:] != p[:, :-1]).sum())
            areas.append(area)
            rounds.append(4 * np.pi * area / perim ** 2)
            count += 1
        counts.append(count)
    return {"per_frame": float(np.mean(counts)), "median_area_px": float(np.median(areas)) if areas else 0.0,
            "median_roundness": float(np.median(rounds)) if rounds else 0.0}


def structure_function(frames: np.ndarray, theme: str) -> dict[str, float]:
    """E[(y(x + d) - y(x))^2] of luminance (levels^2) over terrain pixel pairs, at each of `DISTANCES`."""
    y = picture.luminance(frames).astype(np.float64)
    terrain = ~object_masks(frames, theme) & picture.marker_mask(frames.shape[-2])[None]
    out = {}
    for d in DISTANCES:
        dh = (y[:, :, d:] - y[:, :, :-d]) ** 2
        mh = terrain[:, :, d:] & terrain[:, :, :-d]
        dv = (y[:, d:] - y[:, :-d]) ** 2
        mv = terrain[:, d:] & terrain[:, :-d]
        n = mh.sum() + mv.sum()
        out[str(d)] = float(((dh * mh).sum() + (dv * mv).sum()) / max(n, 1))
    return out


def ratios(model: dict[str, float], sim: dict[str, float]) -> dict[str, float]:
    """model / simulator per key (a simulator value of 0 gives inf unless the model's is 0 too)."""
    return {k: (model[k] / sim[k] if sim[k] else (1.0 if model[k] == 0 else float("inf"))) for k in sim}
