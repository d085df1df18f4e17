"""The procedural world TinyWorld learns to imitate.

A deterministic, seedable, top-down 2-D world: a toroidal terrain map much
larger than the 64x64 view, coloured by one of six themes, with scattered
objects (trees, rocks, stars, ...). The camera moves with the held keys and
pans with the mouse, so movement reveals content the model has never seen in
the current view: a world model has to imagine it, not copy it.

Everything here is NumPy and does no I/O; it is the ground truth for training
(`train.py`) and evaluation (`evaluate.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# the model's interface, shared with serving (re-exported here for the simulator's users)
from worldcast.models.tinyworld.layout import (  # noqa: F401
    ACTION_DIM,
    KEYS,
    MAX_PAN_PX,
    MOUSE_COUNTS_PER_PX,
    THEMES,
    action_vector,
)

#: Per theme: (low terrain RGB, high terrain RGB, object RGB), uint8 values.
PALETTES: dict[str, tuple[tuple[int, int, int], ...]] = {
    "meadow": ((40, 110, 35), (150, 200, 70), (20, 60, 20)),
    "snow": ((170, 190, 215), (250, 250, 255), (90, 110, 140)),
    "desert": ((190, 140, 70), (245, 215, 150), (120, 160, 60)),
    "night": ((8, 10, 40), (45, 50, 100), (240, 235, 170)),
    "lava": ((50, 10, 5), (230, 80, 10), (255, 220, 60)),
    "ocean": ((10, 60, 140), (60, 170, 210), (240, 240, 230)),
}

#: Camera speed in pixels per frame for a held movement key (doubled by shift).
WALK_PX = 2
#: Largest camera displacement in one frame, pixels per axis.
MAX_STEP_PX = 8


def camera_step(action: np.ndarray) -> tuple[int, int]:
    """Camera displacement (dx, dy) in pixels for one frame under `action`.

    W/S move up/down, A/D left/right by WALK_PX (2x with shift); mouse pans
    add on top. Each axis is clipped to +-MAX_STEP_PX.
    """
    w, a, s, d, _space, shift = (float(x) for x in action[: len(KEYS)])
    speed = WALK_PX * (2 if shift > 0.5 else 1)
    dx = (d - a) * speed + round(float(action[len(KEYS)]) * MAX_PAN_PX)
    dy = (s - w) * speed + round(float(action[len(KEYS) + 1]) * MAX_PAN_PX)
    return (
        int(np.clip(round(dx), -MAX_STEP_PX, MAX_STEP_PX)),
        int(np.clip(round(dy), -MAX_STEP_PX, MAX_STEP_PX)),
    )


def _smooth_noise(rng: np.random.Generator, size: int, cells: int) -> np.ndarray:
    """Tileable value noise: a (cells, cells) random grid, bicubic-ish upsampled.

    Returns float32 (size, size) in [0, 1], periodic in both axes.
    """
    grid = rng.random((cells, cells)).astype(np.float32)
    scale = size // cells
    t = (np.arange(size, dtype=np.float32) % scale) / scale
    t = t * t * (3 - 2 * t)  # smoothstep
    i0 = np.arange(size) // scale
    i1 = (i0 + 1) % cells
    rows0, rows1 = grid[i0], grid[i1]  # (size, cells)
    a = rows0[:, i0] * (1 - t)[None, :] + rows0[:, i1] * t[None, :]
    b = rows1[:, i0] * (1 - t)[None, :] + rows1[:, i1] * t[None, :]
    return a * (1 - t)[:, None] + b * t[:, None]


@dataclass(frozen=True)
class WorldMap:
    """One seed's terrain: height field and object mask, toroidal.

    Attributes:
        height: float32 (S, S) in [0, 1], terrain height.
        objects: float32 (S, S) in [0, 1], object coverage (soft-edged discs).
    """

    height: np.ndarray
    objects: np.ndarray

    @property
    def size(self) -> int:
        return int(self.height.shape[0])

    @classmethod
    def generate(cls, seed: int, *, size: int = 256) -> WorldMap:
        """Generate the map of `seed` deterministically (size must be a multiple of 32)."""
        assert size % 32 == 0, f"map size {size} must be a multiple of 32"
        rng = np.random.default_rng(seed)
        h = 0.65 * _smooth_noise(rng, size, 8) + 0.35 * _smooth_noise(rng, size, 16)
        h = (h - h.min()) / max(float(h.max() - h.min()), 1e-6)
        obj = np.zeros((size, size), dtype=np.float32)
        off = np.arange(-7, 8)
        for _ in range(int(size * size / 900)):
            cx, cy = (int(v) for v in rng.integers(0, size, size=2))
            r = 2.0 + 3.0 * rng.random()
            d = np.sqrt(off[:, None] ** 2 + off[None, :] ** 2).astype(np.float32)
            disc = np.clip(r + 0.5 - d, 0.0, 1.0)
            rows, cols = (cy + off) % size, (cx + off) % size
            obj[np.ix_(rows, cols)] = np.maximum(obj[np.ix_(rows, cols)], disc)
        return cls(height=h.astype(np.float32), objects=obj)


def _view(field: np.ndarray, x: int, y: int, view: int) -> np.ndarray:
    s = field.shape[0]
    return field[np.ix_((np.arange(view) + y) % s, (np.arange(view) + x) % s)]


def object_view(world: WorldMap, x: int, y: int, *, view: int = 64) -> np.ndarray:
    """The object coverage of the view at (x, y) (`render_view`'s), float32 (view, view) in [0, 1]."""
    return _view(world.objects, x, y, view)


def render_view(
    world: WorldMap, theme: str, x: int, y: int, *, view: int = 64, space: bool = False
) -> np.ndarray:
    """Render the view whose top-left corner is at map position (x, y).

    Args:
        world: the map.
        theme: one of `THEMES`.
        x, y: camera position in map pixels (any integers; the map wraps).
        view: side of the square view, pixels.
        space: whether the space key is held (the player marker lights up).

    Returns:
        uint8 array (view, view, 3), RGB.

    Raises:
        KeyError: unknown theme.
    """
    lo, hi, ob = (np.asarray(c, dtype=np.float32) for c in PALETTES[theme])
    h = _view(world.height, x, y, view)[..., None]
    o = object_view(world, x, y, view=view)[..., None]
    img = lo * (1 - h) + hi * h
    img = img * (1 - o) + ob * o
    # The player marker: a small cross at the centre, white, or gold while space is held.
    c = view // 2
    marker = np.array((255, 215, 0) if space else (255, 255, 255), dtype=np.float32)
    img[c - 1 : c + 1, c - 3 : c + 3] = marker
    img[c - 3 : c + 3, c - 1 : c + 1] = marker
    return np.clip(img + 0.5, 0, 255).astype(np.uint8)


@dataclass
class WorldState:
    """Camera state of one simulated session."""

    world: WorldMap
    theme: str
    x: int = 0
    y: int = 0


def step(state: WorldState, action: np.ndarray, *, view: int = 64) -> np.ndarray:
    """Apply one frame's action to `state` (in place) and render the new view.

    Args:
        state: camera state, advanced by `camera_step(action)`.
        action: float32 (ACTION_DIM,) from `action_vector`.

    Returns:
        uint8 (view, view, 3) frame after the move.
    """
    dx, dy = camera_step(action)
    state.x += dx
    state.y += dy
    return render_view(state.world, state.theme, state.x, state.y, view=view, space=action[4] > 0.5)


def random_actions(rng: np.random.Generator, n: int) -> np.ndarray:
    """A plausible player's action sequence: held-key segments, still spells, mouse flicks.

    Segments last 3-16 frames; about 25 % are still (no key), shift is held in
    about 20 % of moving segments, space in about 15 %, and mouse pans in
    about 20 %.

    Returns:
        float32 (n, ACTION_DIM).
    """
    out = np.zeros((n, ACTION_DIM), dtype=np.float32)
    i = 0
    while i < n:
        length = int(rng.integers(3, 17))
        seg = np.zeros(ACTION_DIM, dtype=np.float32)
        if rng.random() > 0.25:
            k = int(rng.integers(0, 4))
            seg[k] = 1.0
            if rng.random() < 0.3 and k in (0, 2):  # diagonal: add A or D
                seg[1 if rng.random() < 0.5 else 3] = 1.0
            seg[5] = 1.0 if rng.random() < 0.2 else 0.0
        seg[4] = 1.0 if rng.random() < 0.15 else 0.0
        if rng.random() < 0.2:
            seg[6:8] = rng.integers(-MAX_PAN_PX, MAX_PAN_PX + 1, size=2) / MAX_PAN_PX
        out[i : i + length] = seg
        i += length
    return out


def theme_statistics(frame: np.ndarray) -> np.ndarray:
    """Theme features of a frame: its mean RGB in [0, 1], float32 (3,)."""
    return frame.reshape(-1, 3).mean(axis=0).astype(np.float32) / 255.0


def theme_centroids(*, seeds: range = range(900_000, 900_016)) -> np.ndarray:
    """Mean theme features per theme over simulator frames: float32 (len(THEMES), 3)."""
    rng = np.random.default_rng(0)
    cents = np.zeros((len(THEMES), 3), dtype=np.float32)
    for ti, theme in enumerate(THEMES):
        feats = []
        for seed in seeds:
            w = WorldMap.generate(seed, size=128)
            x, y = (int(v) for v in rng.integers(0, 128, size=2))
            feats.append(theme_statistics(render_view(w, theme, x, y)))
        cents[ti] = np.mean(feats, axis=0)
    return cents


def classify_theme(frame: np.ndarray, centroids: np.ndarray) -> int:
    """Index into THEMES of the nearest theme centroid to `frame`'s statistics."""
    f = theme_statistics(frame)
    return int(np.argmin(((centroids - f[None]) ** 2).sum(axis=1)))
