"""The release's controls per variant: wire keys and mouse counts -> the model's action vector.

A pixel frame's action vector is [keyboard | mouse]:
- keyboard: multi-hot over the variant's keys in the release's order (templerun:
  one-hot with index 0 "still" when no key is held);
- mouse: camera deltas per pixel frame, [pitch (up +), yaw (right +)] (the release's
  `CAMERA_VALUE_MAP`: "i" up [0.1, 0], "j" left [0, -0.1]).

Sources (SkyworkAI/Matrix-Game, `Matrix-Game-2/pipeline/causal_inference.py`
`get_current_action`, and `utils/conditions.py`): universal keys w s a d
(forward, back, left, right) and camera keys i k j l at 0.1; GTA drive keys w s,
steering with a d on the yaw column at 0.1 (no wire mouse); Temple Run keys
w jump, s slide, z turn left, c turn right, a left side, d right side, q (none
held) still. The release's interfaces send 0.1 per frame for a camera move, so a
wire mouse maps to the same columns at `MOUSE_SCALE` per count (ours: 20 counts in
one pixel frame = one camera key) and is clipped at 0.1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from worldcast.models.spec import ActionSpace, Axis

CAM_VALUE = 0.1  #: the release's camera step per pixel frame (`CAM_VALUE`)
MOUSE_SCALE = CAM_VALUE / 20  #: ours: model units per mouse count (20 counts in a frame = one camera key)


@dataclass(frozen=True)
class Controls:
    """How wire input becomes one variant's action vector per pixel frame.

    Attributes:
        keyboard: per keyboard column, the wire key that sets it (None: set only when no
            keyboard key is held, templerun's "still").
        mouse_columns: names of the mouse columns after the keyboard ones, e.g. ("pitch", "yaw").
        camera_keys: (key, column name, value) added to a mouse column while the key is held.
        mouse: the relative axes the wire mouse [dx, dy] feeds, in order (name = a mouse column; scale per count).
            They declare no limit: `encode` clips each column's sum of camera keys and mouse to `CAM_VALUE`.
        labels: (key, what it does).
        exclusive: groups of keys of which only the first held (in group order) is applied.
    """

    keyboard: tuple[str | None, ...]
    mouse_columns: tuple[str, ...] = ()
    camera_keys: tuple[tuple[str, str, float], ...] = ()
    mouse: tuple[Axis, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    exclusive: tuple[tuple[str, ...], ...] = ()

    def __post_init__(self) -> None:
        for _, col, _ in self.camera_keys:
            if col not in self.mouse_columns:
                raise ValueError(f"camera key column {col!r} not in {self.mouse_columns}")
        for ax in self.mouse:
            if ax.name not in self.mouse_columns:
                raise ValueError(f"mouse axis {ax.name!r} not in {self.mouse_columns}")

    @property
    def keys(self) -> tuple[str, ...]:
        """Every wire key this variant understands, keyboard keys first."""
        return tuple(k for k in self.keyboard if k is not None) + tuple(k for k, _, _ in self.camera_keys)

    @property
    def keyboard_dim(self) -> int:
        return len(self.keyboard)

    @property
    def dim(self) -> int:
        return len(self.keyboard) + len(self.mouse_columns)

    def action_space(self, *, history_pixel_frames: int) -> ActionSpace:
        """The declared action space (CONTRACT.md `ActionSpace`)."""
        return ActionSpace(keys=self.keys, axes=self.mouse, dim=self.dim, key_labels=self.labels,
                           exclusive_groups=self.exclusive, history_pixel_frames=history_pixel_frames,
                           bindings=tuple(zip(("mouse.x", "mouse.y"), (ax.name for ax in self.mouse))))

    def encode(self, keys: dict[str, bool], axes: dict[str, float]) -> np.ndarray:
        """Held keys and the mouse axes' values (model units: counts x scale) of one pixel frame -> float32 (dim,)
        [keyboard | mouse].

        Unknown keys are ignored. In an exclusive group only the first held key counts. Each mouse
        column is the sum of its camera keys and scaled mouse counts, clipped to its limit
        (`CAM_VALUE` where only keys feed it).

        Raises:
            ValueError: a non-finite axis value.
        """
        if not all(math.isfinite(v) for v in axes.values()):
            raise ValueError(f"axis values must be finite, got {axes!r}")
        held = {k for k, down in keys.items() if down}
        for group in self.exclusive:
            first = next((k for k in group if k in held), None)
            held -= set(group) - {first}
        out = np.zeros(self.dim, np.float32)
        for i, k in enumerate(self.keyboard):
            out[i] = 1.0 if k is not None and k in held else 0.0
        if None in self.keyboard and not out[: self.keyboard_dim].any():
            out[self.keyboard.index(None)] = 1.0
        kd = self.keyboard_dim
        for key, col, value in self.camera_keys:
            if key in held:
                out[kd + self.mouse_columns.index(col)] += value
        for ax in self.mouse:
            out[kd + self.mouse_columns.index(ax.name)] += axes.get(ax.name, 0.0)
        out[kd:] = np.clip(out[kd:], -CAM_VALUE, CAM_VALUE)
        return out


UNIVERSAL = Controls(
    keyboard=("w", "s", "a", "d"),
    mouse_columns=("pitch", "yaw"),
    camera_keys=(("i", "pitch", CAM_VALUE), ("k", "pitch", -CAM_VALUE), ("j", "yaw", -CAM_VALUE),
                 ("l", "yaw", CAM_VALUE)),
    mouse=(Axis("yaw", scale=MOUSE_SCALE, label="turn"),
           Axis("pitch", scale=-MOUSE_SCALE, label="look up and down")),  # dy > 0: down
    labels=(("w", "forward"), ("s", "back"), ("a", "left"), ("d", "right"), ("i", "look up"),
            ("k", "look down"), ("j", "look left"), ("l", "look right")),
    exclusive=(("w", "s"), ("a", "d"), ("i", "k"), ("j", "l")),
)

GTA_DRIVE = Controls(
    keyboard=("w", "s"),
    mouse_columns=("pitch", "yaw"),
    camera_keys=(("a", "yaw", -CAM_VALUE), ("d", "yaw", CAM_VALUE)),
    labels=(("w", "forward"), ("s", "back"), ("a", "steer left"), ("d", "steer right")),
    exclusive=(("w", "s"), ("a", "d")),
)

TEMPLERUN = Controls(
    keyboard=(None, "w", "s", "z", "c", "a", "d"),
    labels=(("w", "jump"), ("s", "slide"), ("z", "turn left"), ("c", "turn right"), ("a", "left side"),
            ("d", "right side")),
    exclusive=(("w", "s", "z", "c", "a", "d"),),
)

CONTROLS = {"tiny": UNIVERSAL, "universal": UNIVERSAL, "universal-random": UNIVERSAL, "gta-drive": GTA_DRIVE,
            "templerun": TEMPLERUN}
