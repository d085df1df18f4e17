"""TinyWorld: the embedded default world model (see weights/MODEL_CARD.md)."""

from __future__ import annotations

from typing import Any

__all__ = ["TinyWorldModel"]


def __getattr__(name: str) -> Any:  # lazy: the registry imports `family` without loading the network code
    if name == "TinyWorldModel":
        from worldcast.models.tinyworld.model import TinyWorldModel

        return TinyWorldModel
    raise AttributeError(name)
