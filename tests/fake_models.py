"""A FAKE third model family for contract tests: image-conditioned, no text, its own keys and mouse axis.

`PaletteWorld` is not a video model: it paints every pixel frame one flat colour, the starting image's
mean colour scaled by a brightness that its keys and its mouse axis move. That is enough to check,
through the real engine and transports, that a family the engine and sessions have never heard of is
served without special cases (it is a folder-and-registry-line away: `register_fake_family`):

- an image as the only conditioning (no text: `set_prompt` and directions are refused), encoded to
  a (3,) mean colour and kept in a declared prompt cache (`context_in_chunks=False`);
- actions whose per-latent-frame layout (`group_actions`: (F, 2)) differs from the per-pixel-frame
  vector (`spec.actions.dim` = 4), for the init path as for chunks (issue 17, item 8);
- state advanced only by `commit`: a cancelled chunk changes nothing.
"""

from __future__ import annotations

import io
import math

import numpy as np
import torch

from worldcast.models import registry
from worldcast.models.base import ChunkConditioning, Replace, StateUpdates, StateView, WorldModel
from worldcast.models.registry import LoadRequest, ModelFamily, ModelVariant
from worldcast.models.spec import (
    ActionSpace,
    Axis,
    Conditioning,
    ConditioningRequest,
    ConditioningSpec,
    ImageConditioning,
    PromptCacheSpec,
    TensorStateSpec,
    WorldModelSpec,
)

#: Brighter with "e", darker with "q"; the mouse's x ("yaw", relative) adds its counts x 0.01; "roll" is a
#: camera-pose angle (absolute, degrees, in radians to the model) in the action vector's last column.
ACTIONS = ActionSpace(keys=("q", "e"), axes=(Axis("yaw", scale=0.01, limit=0.5),
                                             Axis("roll", kind="absolute", range=(-90.0, 90.0), scale=math.pi / 180)),
                      dim=4, key_labels=(("q", "darker"), ("e", "brighter")), exclusive_groups=(("q", "e"),),
                      bindings=(("mouse.x", "yaw"),))
CONDITIONING = ConditioningSpec(
    text=None,
    image=ImageConditioning(required=True, default=None, max_bytes=64 * 1024, max_pixels=128 * 128),
    tensors=(("image", (3,), torch.float32),),
)
#: Brightness change per latent frame of a held key.
STEP = 0.1
SIZE = 16


class PaletteWorld(WorldModel):
    """FAKE image-conditioned model (see the module docstring). Frames 16x16 at 10 fps, chunks of 2 latent
    frames decoding to 1 + 2 pixel frames (first chunk) and 4 after."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = torch.device(device)
        self.spec = WorldModelSpec(
            name="fake-palette", frame_height=SIZE, frame_width=SIZE, fps=10, latent_frames_per_chunk=2,
            timesteps=(1.0, 0.5), latent_shape=(3, 1, 1),
            states=(PromptCacheSpec("image", shape=(3,)), TensorStateSpec("brightness", shape=(1,))),
            actions=ACTIONS, conditioning=CONDITIONING, pixel_frames_per_latent=2, first_latent_pixel_frames=1,
            initial_latent_frames=0, context_in_chunks=False)
        self.init_action_shapes: list[tuple[int, ...]] = []  #: `cond.action` shapes `init_state` saw

    def encode_conditioning(self, request: ConditioningRequest) -> Conditioning:
        assert request.image is not None and request.text is None
        return {"image": request.image.reshape(-1, 3).mean(0).astype(np.float32) / 255.0}

    def encode_action(self, keys: dict[str, bool], axes: dict[str, float]) -> np.ndarray:
        return np.array([keys.get("q", False), keys.get("e", False), axes.get("yaw", 0.0), axes.get("roll", 0.0)],
                        np.float32)

    def group_actions(self, actions: np.ndarray, *, first_latent: int, latent_frames: int) -> np.ndarray:
        """(F_pix, 4) -> (latent_frames, 2): per latent frame, the brightness change of its last pixel frame's
        keys and the sum of its pixel frames' yaw."""
        out = np.zeros((latent_frames, 2), np.float32)
        for i in range(latent_frames):
            a = self.spec.pixel_start(first_latent + i) - self.spec.pixel_start(first_latent)
            b = a + self.spec.pixel_count(first_latent + i)
            out[i, 0] = STEP * (actions[b - 1, 1] - actions[b - 1, 0])
            out[i, 1] = actions[a:b, 2].sum()
        return out

    def initial_frames(self, *, seed: int, context: Conditioning) -> np.ndarray:
        return np.zeros((0, SIZE, SIZE, 3), np.uint8)

    def init_state(self, frames: torch.Tensor, cond: ChunkConditioning, state: StateView) -> StateUpdates:
        self.init_action_shapes.append(tuple(cond.action.shape))
        return {"image": Replace(cond.context["image"]), "brightness": Replace(torch.ones(cond.batch, 1))}

    def _levels(self, cond: ChunkConditioning, state: StateView) -> torch.Tensor:
        """(B, F) brightness after each of the chunk's latent frames, kept within [0, 2]."""
        level, out = state.tensor("brightness")[:, 0], []
        for f in range(cond.action.shape[1]):
            level = (level + cond.action[:, f, 0] + cond.action[:, f, 1]).clamp(0, 2)
            out.append(level)
        return torch.stack(out, dim=1)

    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: ChunkConditioning, state: StateView) -> torch.Tensor:
        color = state.tensor("image")[:, None, :] * self._levels(cond, state)[..., None]  # (B, F, 3)
        return color[..., None, None].clamp(0, 1)  # (B, F, 3, 1, 1)

    def decode(self, x0: torch.Tensor, cond: ChunkConditioning, state: StateView) -> tuple[list[torch.Tensor],
                                                                                         StateUpdates]:
        out = []
        for b in range(x0.shape[0]):
            first = cond.frame_index_host[b][0]
            reps = [self.spec.pixel_count(first + i) for i in range(x0.shape[1])]
            rgb = (x0[b, :, :, 0, 0] * 255 + 0.5).to(torch.uint8).repeat_interleave(torch.tensor(reps), dim=0)
            out.append(rgb[:, None, None, :].expand(-1, SIZE, SIZE, 3).contiguous())
        return out, {}

    def commit(self, x0: torch.Tensor, cond: ChunkConditioning, state: StateView) -> StateUpdates:
        return {"brightness": Replace(self._levels(cond, state)[:, -1:])}


def load(req: LoadRequest) -> PaletteWorld:
    return PaletteWorld(req.device)


FAMILY = ModelFamily(
    name="fake-palette", description="FAKE: flat frames in a starting image's colour (contract tests)",
    variants=(ModelVariant("default", "the only variant", frame_height=SIZE, frame_width=SIZE, fps=10,
                           conditioning=CONDITIONING, actions=ACTIONS),),
    default_variant="default", factory="tests.fake_models:load")


def register_fake_family() -> ModelFamily:
    """Register the fake family beside the built-in ones (idempotent)."""
    return registry.register(FAMILY)


def png(rgb: tuple[int, int, int], size: tuple[int, int] = (8, 8), fmt: str = "PNG") -> bytes:
    """A flat image file of colour `rgb`, (width, height) `size`."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, rgb).save(buf, format=fmt)
    return buf.getvalue()
