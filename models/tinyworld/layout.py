"""TinyWorld's interface: the worlds its prompts name and the layout of its action vector.

Shared by the served model and by the simulator it was trained on (`world.py` imports these), so serving needs
nothing of the simulator: a test keeps `world.py` out of what serving imports.
"""

from __future__ import annotations

import numpy as np

#: Theme names, in the order of the model's theme statistics.
THEMES: tuple[str, ...] = ("meadow", "snow", "desert", "night", "lava", "ocean")

#: Key order of the action vector: keys held, then the mouse's pan (`action_vector`).
KEYS: tuple[str, ...] = ("w", "a", "s", "d", "space", "shift")

#: Dimension of the action vector: six keys plus mouse dx, dy.
ACTION_DIM = len(KEYS) + 2

#: Mouse counts per pixel of camera pan, and the pan clip (pixels per frame).
MOUSE_COUNTS_PER_PX = 4.0
MAX_PAN_PX = 4


def action_vector(
    keys: dict[str, bool] | None = None, mouse: tuple[float, float] = (0.0, 0.0)
) -> np.ndarray:
    """Build the model's action vector.

    Args:
        keys: held keys by name (any of `KEYS`); missing keys are up.
        mouse: accumulated mouse movement (dx, dy) in counts since the last frame.

    Returns:
        float32 array of shape (ACTION_DIM,): six key states in {0, 1}, then
        mouse dx and dy in pixels of pan (counts / MOUSE_COUNTS_PER_PX,
        clipped to +-MAX_PAN_PX), divided by MAX_PAN_PX so they lie in [-1, 1].
    """
    keys = keys or {}
    out = np.zeros(ACTION_DIM, dtype=np.float32)
    for i, k in enumerate(KEYS):
        out[i] = 1.0 if keys.get(k, False) else 0.0
    for j, m in enumerate(mouse):
        px = float(np.clip(np.round(m / MOUSE_COUNTS_PER_PX), -MAX_PAN_PX, MAX_PAN_PX))
        out[len(KEYS) + j] = px / MAX_PAN_PX
    return out
