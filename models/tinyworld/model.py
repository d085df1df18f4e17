"""TinyWorldModel: the `WorldModel` contract over TinyWorld's network and weights."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from worldcast.kernels.ring_attention import RingBatch, ring_attention
from worldcast.models.base import ChunkConditioning, Replace, RingWrite, StateUpdates, StateView, WorldModel
from worldcast.models.spec import AttentionRingSpec, Conditioning, ConditioningRequest, TensorStateSpec, WorldModelSpec
from worldcast.models.tinyworld import world
from worldcast.models.tinyworld.family import ACTIONS, CONDITIONING
from worldcast.models.tinyworld.network import (
    FrameAutoencoder,
    TinyWorldConfig,
    TinyWorldDenoiser,
    alibi_slopes,
)
from worldcast.models.tinyworld.prompts import PromptEncoder

logger = logging.getLogger(__name__)

#: The shipped weights.
DEFAULT_WEIGHTS = Path(__file__).parent / "weights" / "tinyworld.safetensors"

#: Frames per second the model was trained to depict (camera speeds are per frame).
FPS = 20
#: Denoising steps' flow times.
TIMESTEPS = (1.0, 0.5)


def make_spec(cfg: TinyWorldConfig, *, dtype: torch.dtype = torch.float32) -> WorldModelSpec:
    """The declared geometry and per-session state of TinyWorld with config `cfg`.

    State: "kv", the self-attention ring (sink + rolling window of frames), and
    "prev", the last committed latent (each frame is predicted as a change to it).
    One latent frame per pixel frame, one per chunk; the init step commits the
    initial picture as latent frame 0. Conditioning: a text prompt, encoded as
    "prompt" float32 (prompt_dim,), a sentence embedding, part of every chunk.
    """
    latent = (cfg.latent_channels, cfg.latent_size, cfg.latent_size)
    return WorldModelSpec(
        name=f"tinyworld-w{cfg.width}l{cfg.layers}",
        frame_height=cfg.frame_size,
        frame_width=cfg.frame_size,
        fps=FPS,
        latent_frames_per_chunk=1,
        timesteps=TIMESTEPS,
        latent_shape=latent,
        states=(
            AttentionRingSpec("kv", layers=cfg.layers, heads=cfg.heads, head_dim=cfg.head_dim,
                              tokens_per_frame=cfg.tokens_per_frame, window_frames=cfg.window_frames,
                              sink_frames=cfg.sink_frames, dtype=dtype),
            TensorStateSpec("prev", shape=latent, dtype=dtype),
        ),
        actions=ACTIONS,
        conditioning=dataclasses.replace(CONDITIONING, tensors=(("prompt", (cfg.prompt_dim,), torch.float32),)),
        default_prompt="a green meadow",
    )


def save_weights(
    path: Path, cfg: TinyWorldConfig, ae: FrameAutoencoder, net: TinyWorldDenoiser, theme_prompts: torch.Tensor
) -> None:
    """Write the autoencoder, denoiser and theme prompt centroids to one safetensors file."""
    tensors = {f"ae.{k}": v.detach().contiguous() for k, v in ae.state_dict().items()}
    tensors |= {f"net.{k}": v.detach().contiguous() for k, v in net.state_dict().items()}
    tensors["theme_prompts"] = theme_prompts.contiguous()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={"config": json.dumps(cfg.__dict__)})


class TinyWorldModel(WorldModel):
    """The embedded default world model.

    Args:
        cfg: network config.
        ae, net: the trained modules (moved to `device`, eval mode).
        theme_prompts: float32 (len(world.THEMES), prompt_dim) mean caption
            embedding per theme; picks the initial frame's theme for a prompt.
        prompt_encoder: shared sentence encoder (created if None).
    """

    def __init__(
        self,
        cfg: TinyWorldConfig,
        ae: FrameAutoencoder,
        net: TinyWorldDenoiser,
        theme_prompts: torch.Tensor,
        *,
        device: str | torch.device = "cpu",
        prompt_encoder: PromptEncoder | None = None,
    ) -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        # channels-last convolutions: the MLP's depthwise conv reads the token grid (B*F, g, g, hidden)
        # as an NHWC view with no copy, and oneDNN runs NHWC convs without reordering their input
        self.ae = ae.to(self.device).eval().to(memory_format=torch.channels_last)
        self.net = net.to(self.device).eval()
        for blk in self.net.blocks:
            blk.dw.to(memory_format=torch.channels_last)
        self.theme_prompts = theme_prompts.float().cpu().numpy()
        self.spec = make_spec(cfg)
        self.prompts = prompt_encoder or PromptEncoder()
        self._maps: dict[int, world.WorldMap] = {}
        self._slopes: torch.Tensor | None = None  #: ALiBi slopes on the device (a constant)

    @classmethod
    def from_pretrained(cls, path: str | Path | None = None, *, device: str | torch.device = "cpu") -> TinyWorldModel:
        """Load weights written by `save_weights` (the shipped file by default).

        Raises:
            FileNotFoundError: no weights at `path`.
        """
        path = Path(path) if path is not None else DEFAULT_WEIGHTS
        if not path.exists():
            raise FileNotFoundError(f"TinyWorld weights not found at {path}; train them with "
                                    "python -m worldcast.models.tinyworld.train")
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            cfg = TinyWorldConfig(**json.loads(f.metadata()["config"]))
        sd = load_file(str(path))
        ae, net = FrameAutoencoder(cfg), TinyWorldDenoiser(cfg)
        ae.load_state_dict({k[3:]: v for k, v in sd.items() if k.startswith("ae.")})
        net.load_state_dict({k[4:]: v for k, v in sd.items() if k.startswith("net.")})
        logger.info("TinyWorldModel: loaded %s (%d params)", path, net.num_params())
        return cls(cfg, ae, net, sd["theme_prompts"], device=device)

    # -- conditioning --------------------------------------------------------------

    def encode_prompt(self, text: str) -> np.ndarray:
        """Prompt text -> float32 (prompt_dim,) sentence embedding."""
        return self.prompts.encode(text)

    def encode_conditioning(self, request: ConditioningRequest) -> Conditioning:
        """{"prompt": float32 (prompt_dim,)}: the request's prompt (or the default one) embedded."""
        return {"prompt": self.encode_prompt(request.text or self.spec.default_prompt)}

    def encode_action(self, keys: dict[str, bool], mouse: tuple[float, float]) -> np.ndarray:
        return world.action_vector(keys, mouse)

    def theme_for(self, prompt_embedding: np.ndarray) -> str:
        """The simulator theme whose captions lie nearest to `prompt_embedding` (cosine)."""
        return world.THEMES[int(np.argmax(self.theme_prompts @ prompt_embedding))]

    def initial_frames(self, *, seed: int, context: Conditioning) -> np.ndarray:
        """uint8 (1, 64, 64, 3): the simulator's view at the origin of world `seed`, in the prompt's theme."""
        prompt = context["prompt"]
        if seed not in self._maps:
            if len(self._maps) > 64:
                self._maps.clear()
            self._maps[seed] = world.WorldMap.generate(seed)
        return world.render_view(self._maps[seed], self.theme_for(prompt), 0, 0, view=self.cfg.frame_size)[None]

    # -- frames <-> latents ---------------------------------------------------------------

    @torch.no_grad()
    def encode_frames(self, frames: torch.Tensor) -> torch.Tensor:
        B, Fr = frames.shape[:2]
        img = frames.to(self.device).flatten(0, 1).permute(0, 3, 1, 2).float() / 255.0
        return self.ae.encode(img).reshape(B, Fr, *self.spec.latent_shape)

    @torch.no_grad()
    def decode_latents(self, x0: torch.Tensor) -> torch.Tensor:
        """Latents (B, F, C, h, w) -> uint8 (B, F, H, W, 3) RGB frames."""
        B, Fr = x0.shape[:2]
        img = self.ae.decode(x0.flatten(0, 1).contiguous(memory_format=torch.channels_last)).clamp(0, 1)
        img = (img * 255 + 0.5).to(torch.uint8).permute(0, 2, 3, 1)
        return img.reshape(B, Fr, *img.shape[1:])

    @torch.no_grad()
    def decode(self, x0: torch.Tensor, cond: ChunkConditioning, state: StateView) -> tuple[list[torch.Tensor],
                                                                                         StateUpdates]:
        """Decode each latent frame to one pixel frame; the autoencoder keeps no state."""
        return list(self.decode_latents(x0).unbind(0)), {}

    # -- denoise / commit ------------------------------------------------------------------

    def _attend(self, cond: ChunkConditioning, state: StateView):  # type: ignore[no-untyped-def]
        """The pass's self-attention over the sessions' rings, read in place (built once per chunk)."""
        attend = cond.memo.get("attend")
        if attend is None:
            k_pool, v_pool, ring_frame = state.ring("kv")
            if self._slopes is None or self._slopes.device != k_pool.device:
                self._slopes = alibi_slopes(self.cfg.heads).to(k_pool.device)
            batch = RingBatch(ring_frame, state.slots, state.slots_host, cond.frame_index,
                              self.cfg.tokens_per_frame, self.cfg.window_frames, self.cfg.sink_frames, self._slopes)

            def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
                return ring_attention(q, k, v, k_pool[:, layer], v_pool[:, layer], batch)

            cond.memo["attend"] = attend
        return attend

    def _prompt(self, cond: ChunkConditioning, frames: int) -> torch.Tensor:
        return cond.context["prompt"][:, None].expand(-1, frames, -1)  # (B, F, P)

    @torch.no_grad()
    def init_state(self, frames: torch.Tensor, cond: ChunkConditioning, state: StateView) -> StateUpdates:
        """Commit the initial picture as latent frame 0: its keys and values, and it as `prev`."""
        z = self.encode_frames(frames)  # (B, 1, C, h, w)
        zeros = torch.zeros(z.shape[:2], device=z.device)
        _, kv = self.net(z, z, zeros, cond.action, self._prompt(cond, 1), self._attend(cond, state), kv_only=True)
        return {"kv": RingWrite(cond.frame_index, [k for k, _ in kv], [v for _, v in kv]), "prev": Replace(z[:, -1])}

    @torch.no_grad()
    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: ChunkConditioning, state: StateView) -> torch.Tensor:
        assert x_t.shape[1] == 1, "TinyWorld generates one frame per chunk"
        prev = state.tensor("prev")[:, None]  # (B, 1, C, h, w)
        tt = t[:, None].expand(-1, x_t.shape[1])
        x0, _ = self.net(x_t, prev, tt, cond.action, self._prompt(cond, x_t.shape[1]), self._attend(cond, state))
        return x0

    @torch.no_grad()
    def commit(self, x0: torch.Tensor, cond: ChunkConditioning, state: StateView) -> StateUpdates:
        """The clean pass at flow time 0: the chunk's keys and values, and its last latent as `prev`."""
        prev = state.tensor("prev")[:, None]
        zeros = torch.zeros(x0.shape[:2], device=x0.device)
        _, kv = self.net(x0, prev, zeros, cond.action, self._prompt(cond, x0.shape[1]), self._attend(cond, state),
                         kv_only=True)
        return {"kv": RingWrite(cond.frame_index, [k for k, _ in kv], [v for _, v in kv]), "prev": Replace(x0[:, -1])}
