"""TinyWorld: the embedded default world model (see weights/MODEL_CARD.md)."""

from worldcast.models.tinyworld.model import TinyWorldModel

__all__ = ["TinyWorldModel"]
