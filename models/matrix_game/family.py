"""The Matrix-Game 2.0 family's registry declaration (CONTRACT.md `ModelFamily`), as data.

`--model matrix-game-2:VARIANT`; the factory builds the model lazily
(`factory.load_model`). Geometry, frame rate and action history come from the
presets (`config.py`, the release's numbers); keys and mouse from `controls.py`.
"""

from __future__ import annotations

import torch

from worldcast.models.matrix_game.conditioning import DEFAULT_IMAGE
from worldcast.models.matrix_game.config import PRESETS
from worldcast.models.matrix_game.controls import CONTROLS
from worldcast.models.registry import ModelFamily, ModelOption, ModelVariant
from worldcast.models.spec import ConditioningSpec, ImageConditioning

_DESCRIPTIONS = {
    "tiny": "RANDOM weights and fake image encoders at 64x112 (CPU): the whole path, noise-like video",
    "universal": "the universal model (base_distilled_model): walk w s a d, look with the mouse or i k j l",
    "gta-drive": "GTA driving (gta_distilled_model): w s drive, a d steer",
    "templerun": "Temple Run (templerun_distilled_model): w jump, s slide, z c turn, a d side; keyboard only",
    "universal-random": "RANDOM weights at the universal model's full size and 352x640, encoders included (GPU "
                        "checks; far too slow for a CPU)",
}
_RANDOM = ("tiny", "universal-random")


def _variant(name: str) -> ModelVariant:
    cfg = PRESETS[name]()
    H, W = cfg.frame_height, cfg.frame_width
    return ModelVariant(
        name=name, description=_DESCRIPTIONS[name], needs_weights=name not in _RANDOM, random_weights=name in _RANDOM,
        frame_height=H, frame_width=W, fps=cfg.fps,
        conditioning=ConditioningSpec(text=None, image=ImageConditioning(required=False, default=DEFAULT_IMAGE),
                                      tensors=(("image", (H, W, 3), torch.uint8),)),
        actions=CONTROLS[name].action_space(history_pixel_frames=cfg.history_pixel_frames),
    )  # fmt: skip


FAMILY = ModelFamily(
    name="matrix-game-2",
    description="Matrix-Game 2.0 (Skywork): image + keyboard/mouse to video, causal Wan 2.1 1.3B with action modules",
    variants=tuple(_variant(n) for n in ("tiny", "universal", "gta-drive", "templerun", "universal-random")),
    default_variant="universal",
    options=(ModelOption("dtype", "weight dtype (auto: bfloat16 on CUDA, float32 on CPU)", default="auto",
                         choices=("auto", "float32", "bfloat16")),),
    factory="worldcast.models.matrix_game.factory:load_model",
)
