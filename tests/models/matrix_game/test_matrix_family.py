"""The family's registry declaration matches what its factory builds."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

from worldcast.models.matrix_game.family import FAMILY
from worldcast.models.registry import LoadRequest


def test_matrix_family_declares_the_release_variants() -> None:
    names = [v.name for v in FAMILY.variants]
    assert names == ["tiny", "universal", "gta-drive", "templerun", "universal-random"]
    assert FAMILY.default_variant == "universal"
    for v in FAMILY.variants:
        assert v.conditioning.text is None and v.conditioning.image is not None
        assert v.conditioning.tensors == (("image", (v.frame_height, v.frame_width, 3), torch.uint8),)
        assert v.actions is not None and v.actions.history_pixel_frames == 9 and v.fps == 12  # the release plays its motion at 12 fps
        random = v.name in ("tiny", "universal-random")
        assert v.needs_weights == (not random) and v.random_weights == random
        if v.name != "tiny":
            assert (v.frame_height, v.frame_width) == (352, 640)
    by = {v.name: v for v in FAMILY.variants}
    assert [a.name for a in by["universal"].actions.mouse] == ["yaw", "pitch"]  # type: ignore[union-attr]
    assert by["gta-drive"].actions.mouse == (None, None) and by["templerun"].actions.dim == 7  # type: ignore[union-attr]


def test_matrix_factory_builds_what_the_family_declares() -> None:
    module, func = FAMILY.factory.split(":")
    load = getattr(importlib.import_module(module), func)
    v = next(v for v in FAMILY.variants if v.name == "tiny")
    m = load(LoadRequest(variant="tiny", weights=None, device="cpu", options={"dtype": "auto"}))
    assert (m.spec.frame_height, m.spec.frame_width, m.spec.fps) == (v.frame_height, v.frame_width, v.fps)
    assert m.action_space == v.actions and m.conditioning == v.conditioning
    assert m.spec.actions.keys == v.actions.keys and m.spec.actions.dim == v.actions.dim  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="needs --weights FOLDER"):
        load(LoadRequest(variant="universal", weights=None, device="cpu", options={}))
    with pytest.raises(ValueError, match="unknown matrix-game-2 variant"):
        load(LoadRequest(variant="minecraft", weights=Path("."), device="cpu", options={}))
