"""TinyWorld's registry entry: `--model tinyworld` (the embedded default model)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from worldcast.models.registry import LoadRequest, ModelFamily, ModelVariant
from worldcast.models.spec import ActionSpace, ConditioningSpec, MouseAxis, TextConditioning
from worldcast.models.tinyworld import world

if TYPE_CHECKING:
    from worldcast.models.tinyworld.model import TinyWorldModel

#: TinyWorld's actions: the camera moves with W/A/S/D (2 px a frame, doubled with shift) and pans with the
#: mouse (`world.action_vector`: MOUSE_COUNTS_PER_PX counts per pixel, clipped to MAX_PAN_PX per frame).
ACTIONS = ActionSpace(
    keys=world.KEYS,
    mouse=(MouseAxis("pan_x", scale=1 / world.MOUSE_COUNTS_PER_PX, limit=world.MAX_PAN_PX),
           MouseAxis("pan_y", scale=1 / world.MOUSE_COUNTS_PER_PX, limit=world.MAX_PAN_PX)),
    dim=world.ACTION_DIM,
    key_labels=(("w", "up"), ("a", "left"), ("s", "down"), ("d", "right"), ("space", "light the marker"),
                ("shift", "faster")),
)

#: A text prompt (its sentence embedding picks the world's theme); no image.
CONDITIONING = ConditioningSpec(text=TextConditioning(), image=None)


def load(req: LoadRequest) -> TinyWorldModel:
    """The shipped weights (or `--weights`, a file `train.py` wrote) on `req.device`."""
    from worldcast.models.tinyworld.model import TinyWorldModel

    return TinyWorldModel.from_pretrained(req.weights, device=req.device)


FAMILY = ModelFamily(
    name="tinyworld",
    description="the embedded TinyWorld: a top-down world at 64x64, 20 fps; W/A/S/D and the mouse move the camera",
    variants=(ModelVariant("default", "the shipped weights (models/tinyworld/weights), or --weights FILE from "
                           "train.py", frame_height=64, frame_width=64, fps=20, conditioning=CONDITIONING,
                           actions=ACTIONS),),
    default_variant="default",
    factory="worldcast.models.tinyworld.family:load",
)
