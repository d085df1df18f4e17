"""STAND-INS for the types CONTRACT.md (issue 17) adds to `models/spec.py` and `models/registry.py`.

This branch starts before the lead lands them; these frozen dataclasses have the same names,
fields and defaults so `family.py` and `model.py` read as they will after the merge. At the
merge: delete this file and import the real ones (one import line in each of `family.py`,
`controls.py` and `model.py`). Nothing else in the tree imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class TextConditioning:
    max_chars: int = 500
    required: bool = False


@dataclass(frozen=True)
class ImageConditioning:
    required: bool = True
    default: str | None = None
    max_bytes: int = 8 * 2**20
    max_pixels: int = 4096 * 4096
    formats: tuple[str, ...] = ("png", "jpeg")


@dataclass(frozen=True)
class ConditioningSpec:
    text: TextConditioning | None = TextConditioning()
    image: ImageConditioning | None = None
    tensors: tuple[tuple[str, tuple[int, ...], torch.dtype], ...] = ()


@dataclass(frozen=True)
class ConditioningRequest:
    text: str | None = None
    image: np.ndarray | None = None


@dataclass(frozen=True)
class MouseAxis:
    name: str
    scale: float
    limit: float | None = None


@dataclass(frozen=True)
class ActionSpace:
    keys: tuple[str, ...]
    mouse: tuple[MouseAxis, ...] = ()
    dim: int = 8
    key_labels: tuple[tuple[str, str], ...] = ()
    exclusive_groups: tuple[tuple[str, ...], ...] = ()
    history_pixel_frames: int = 0


@dataclass(frozen=True)
class ModelOption:
    name: str
    help: str
    default: Any = None
    choices: tuple[str, ...] | None = None
    type: str = "str"


@dataclass(frozen=True)
class ModelVariant:
    name: str
    description: str
    needs_weights: bool = False
    random_weights: bool = False
    frame_height: int = 0
    frame_width: int = 0
    fps: int = 0
    conditioning: ConditioningSpec = field(default_factory=ConditioningSpec)
    actions: ActionSpace | None = None


@dataclass(frozen=True)
class LoadRequest:
    variant: str
    weights: Path | None
    device: str
    options: Mapping[str, Any]


@dataclass(frozen=True)
class ModelFamily:
    name: str
    description: str
    variants: tuple[ModelVariant, ...]
    default_variant: str
    options: tuple[ModelOption, ...] = ()
    factory: str = ""


class ConditioningError(ValueError):
    """Conditioning a model refuses (`models/errors.py` after the merge): the field and the reason."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason
