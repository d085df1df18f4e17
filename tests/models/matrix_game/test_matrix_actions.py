"""The action path: the release's controls per variant, and which pixel frames each latent frame sees."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from worldcast.models.matrix_game.action import action_windows, pad_first_chunk
from worldcast.models.matrix_game.config import tiny
from worldcast.models.matrix_game.controls import CAM_VALUE, GTA_DRIVE, MOUSE_SCALE, TEMPLERUN, UNIVERSAL, Controls


def _mouse(c: Controls, dx: float, dy: float) -> dict[str, float]:
    """The axis values the engine gives a model for wire mouse counts (dx, dy) in one pixel frame."""
    space = c.action_space(history_pixel_frames=0)
    return space.axis_values({a.name: v for a, v in zip(space.mouse, (dx, dy)) if a is not None}, {}, 1)


def test_matrix_universal_controls_keys_camera_keys_and_mouse() -> None:
    v = UNIVERSAL.encode({"w": True, "a": True}, {})
    assert v.dtype == np.float32 and v.tolist() == [1, 0, 1, 0, 0, 0]
    assert UNIVERSAL.encode({"w": True, "s": True}, {})[:4].tolist() == [1, 0, 0, 0], "w wins over s"
    look = UNIVERSAL.encode({"i": True, "l": True}, {})
    assert look[4:].tolist() == pytest.approx([CAM_VALUE, CAM_VALUE]), "i: pitch up, l: yaw right (0.1 each)"
    m = UNIVERSAL.encode({}, _mouse(UNIVERSAL, 8.0, 4.0))  # right and down
    assert m[4:].tolist() == pytest.approx([-4 * MOUSE_SCALE, 8 * MOUSE_SCALE])
    clipped = UNIVERSAL.encode({}, _mouse(UNIVERSAL, 1e6, -1e6))
    assert clipped[4:].tolist() == pytest.approx([CAM_VALUE, CAM_VALUE]), "clipped"
    assert UNIVERSAL.encode({"x": True, "space": True}, {}).tolist() == [0] * 6, "unknown keys ignored"
    with pytest.raises(ValueError, match="finite"):
        UNIVERSAL.encode({}, {"yaw": float("nan")})


def test_matrix_gta_and_templerun_controls_follow_the_release() -> None:
    assert GTA_DRIVE.dim == 4 and GTA_DRIVE.mouse == () and _mouse(GTA_DRIVE, 50.0, 0.0) == {}
    gta = GTA_DRIVE.encode({"w": True, "a": True}, _mouse(GTA_DRIVE, 50.0, 0.0))
    assert gta.tolist() == pytest.approx([1, 0, 0, -CAM_VALUE]), \
        "a steers on the yaw column; GTA takes no wire mouse"
    assert TEMPLERUN.dim == 7
    assert TEMPLERUN.encode({}, {}).tolist() == [1, 0, 0, 0, 0, 0, 0], "no key: 'still'"
    assert TEMPLERUN.encode({"z": True}, {}).tolist() == [0, 0, 0, 1, 0, 0, 0], "z: turn left"
    assert TEMPLERUN.encode({"d": True, "w": True}, {}).tolist() == [0, 1, 0, 0, 0, 0, 0], "one-hot: w first"


def _reference_windows(rows: torch.Tensor, j: int, W: int = 12) -> torch.Tensor:
    """Latent frame j's rows by the release's rule: pixel frames [4j - 12, 4j), below 0 -> pixel frame 0."""
    return torch.stack([rows[max(p, 0)] for p in range(4 * j - W, 4 * j)])


def test_matrix_windows_cover_the_twelve_pixel_frames_before_each_latent_frame() -> None:
    """Chunk by chunk (9 then 12 pixel frames, history carried as the model carries it), every latent
    frame's window equals the release's rule on the whole session's rows."""
    a = tiny().action
    assert a is not None
    P = 1 + 4 * 11  # 4 chunks of 3 latent frames
    rows = torch.arange(P * a.action_dim, dtype=torch.float32).view(P, a.action_dim)
    history = torch.zeros(1, 9, a.action_dim)
    for c0 in (0, 3, 6, 9):
        p0, p1 = (0, 9) if c0 == 0 else (4 * c0 - 3, 4 * c0 + 9)
        chunk = rows[p0:p1]
        if c0 == 0:
            chunk = pad_first_chunk(chunk, missing=3)
        win = action_windows(history, chunk[None], torch.tensor([c0 == 0]), a, frames=3)
        assert win.keyboard is not None and win.mouse is not None
        got = torch.cat([win.keyboard, win.mouse], dim=-1)[0]  # (3, 12, A)
        for i in range(3):
            torch.testing.assert_close(got[i], _reference_windows(rows, c0 + i), rtol=0, atol=0)
        history = chunk[-9:][None]  # what commit keeps: the chunk's last 9 pixel frames
    assert win.keyboard.shape[-1] == a.keyboard_dim_in and win.mouse.shape[-1] == a.mouse_dim_in
