"""TinyWorld's registry entry: `--model tinyworld` (the embedded default model)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from worldcast.models.registry import LoadRequest, ModelFamily, ModelVariant
from worldcast.models.spec import ActionSpace, Axis, ConditioningSpec, TextConditioning
from worldcast.models.tinyworld import layout

if TYPE_CHECKING:
    from worldcast.models.tinyworld.model import TinyWorldModel
    from worldcast.models.tinyworld.model3 import TinyWorld3Model

#: Stick deflection past which a stick holds the key of its direction (`TinyWorldModel.encode_action`).
STICK_PRESS = 0.5

#: TinyWorld's actions: the camera moves with W/A/S/D (2 px a frame, doubled with shift) and pans with the
#: mouse (`layout.action_vector`: MOUSE_COUNTS_PER_PX counts per pixel, clipped to MAX_PAN_PX per frame). A gamepad
#: (the W3C standard mapping) drives the same: the left stick or the d-pad walks (a stick past STICK_PRESS holds
#: the key of its direction: the model was trained on keys held or not), the right stick pans up to MAX_PAN_PX a
#: frame, the right trigger runs (shift), button A (0) lights the marker (space).
ACTIONS = ActionSpace(
    keys=layout.KEYS,
    axes=(Axis("pan_x", scale=1 / layout.MOUSE_COUNTS_PER_PX, limit=layout.MAX_PAN_PX, label="pan right"),
          Axis("pan_y", scale=1 / layout.MOUSE_COUNTS_PER_PX, limit=layout.MAX_PAN_PX, label="pan down"),
          Axis("move_x", kind="absolute", range=(-1.0, 1.0), label="walk right (stick)"),
          Axis("move_y", kind="absolute", range=(-1.0, 1.0), label="walk down (stick)"),
          Axis("look_x", kind="absolute", range=(-1.0, 1.0), scale=layout.MAX_PAN_PX, limit=layout.MAX_PAN_PX,
               label="pan right (stick)"),
          Axis("look_y", kind="absolute", range=(-1.0, 1.0), scale=layout.MAX_PAN_PX, limit=layout.MAX_PAN_PX,
               label="pan down (stick)"),
          Axis("run", kind="absolute", range=(0.0, 1.0), label="faster (trigger)")),
    dim=layout.ACTION_DIM,
    key_labels=(("w", "up"), ("a", "left"), ("s", "down"), ("d", "right"), ("space", "light the marker"),
                ("shift", "faster")),
    bindings=(("mouse.x", "pan_x"), ("mouse.y", "pan_y"),
              ("gamepad.axis.0", "move_x"), ("gamepad.axis.1", "move_y"),
              ("gamepad.axis.2", "look_x"), ("gamepad.axis.3", "look_y"),
              ("gamepad.button.7", "run"), ("gamepad.button.0", "space"),
              ("gamepad.button.12", "w"), ("gamepad.button.13", "s"), ("gamepad.button.14", "a"),
              ("gamepad.button.15", "d")),
)

#: A text prompt (its sentence embedding picks the world's theme); no image.
CONDITIONING = ConditioningSpec(text=TextConditioning(), image=None)


def load(req: LoadRequest) -> TinyWorldModel | TinyWorld3Model:
    """The variant's shipped weights (or `--weights`, a file `train.py` wrote; for "3", `train3.py`'s, with its
    `start/` folder of starting images beside it) on `req.device`."""
    if req.variant == "3":
        from worldcast.models.tinyworld.model3 import TinyWorld3Model

        return TinyWorld3Model.from_pretrained(req.weights, device=req.device)
    from worldcast.models.tinyworld.model import TinyWorldModel

    return TinyWorldModel.from_pretrained(req.weights, device=req.device)


FAMILY = ModelFamily(
    name="tinyworld",
    description="the embedded TinyWorld: a top-down world at 64x64, 20 fps; W/A/S/D and the mouse (or a gamepad) "
                "move the camera",
    variants=(ModelVariant("default", "the shipped weights (models/tinyworld/weights), or --weights FILE from "
                           "train.py", frame_height=64, frame_width=64, fps=20, conditioning=CONDITIONING,
                           actions=ACTIONS),
              ModelVariant("3", "TinyWorld 3: a learned motion head and a flow painter, every pixel after the "
                           "shipped starting image carried over or sampled (models/tinyworld/weights/"
                           "tinyworld3.safetensors, or --weights FILE from train3.py)", frame_height=64,
                           frame_width=64, fps=20, conditioning=CONDITIONING, actions=ACTIONS),),
    default_variant="default",
    factory="worldcast.models.tinyworld.family:load",
)
