"""TinyWorldModel: the `WorldModel` contract over TinyWorld's network and weights."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from worldcast.kernels.frame_attention import FrameAgeBias
from worldcast.models.base import ChunkConditioning, KVView, WorldModel
from worldcast.models.spec import ActionSpace, KVGeometry, WorldModelSpec
from worldcast.models.tinyworld import world
from worldcast.models.tinyworld.network import (
    FrameAutoencoder,
    TinyWorldConfig,
    TinyWorldDenoiser,
    frame_age_bias_lazy,
)
from worldcast.models.tinyworld.prompts import PromptEncoder

logger = logging.getLogger(__name__)

#: The shipped weights.
DEFAULT_WEIGHTS = Path(__file__).parent / "weights" / "tinyworld.safetensors"

#: Frames per second the model was trained to depict (camera speeds are per frame).
FPS = 20
#: Denoising steps' flow times.
TIMESTEPS = (1.0, 0.5)


def make_spec(cfg: TinyWorldConfig) -> WorldModelSpec:
    """The declared geometry of TinyWorld with config `cfg`."""
    return WorldModelSpec(
        name=f"tinyworld-w{cfg.width}l{cfg.layers}",
        frame_height=cfg.frame_size,
        frame_width=cfg.frame_size,
        fps=FPS,
        frames_per_chunk=1,
        timesteps=TIMESTEPS,
        latent_shape=(cfg.latent_channels, cfg.latent_size, cfg.latent_size),
        kv=KVGeometry(
            layers=cfg.layers,
            heads=cfg.heads,
            head_dim=cfg.head_dim,
            tokens_per_frame=cfg.tokens_per_frame,
            window_frames=cfg.window_frames,
            sink_frames=cfg.sink_frames,
        ),
        actions=ActionSpace(keys=world.KEYS, mouse_axes=2, dim=world.ACTION_DIM),
        prompt_dim=cfg.prompt_dim,
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
        self.ae = ae.to(self.device).eval()
        self.net = net.to(self.device).eval()
        self.theme_prompts = theme_prompts.float().cpu().numpy()
        self.spec = make_spec(cfg)
        self.prompts = prompt_encoder or PromptEncoder()
        self._maps: dict[int, world.WorldMap] = {}

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
        return self.prompts.encode(text)

    def encode_action(self, keys: dict[str, bool], mouse: tuple[float, float]) -> np.ndarray:
        return world.action_vector(keys, mouse)

    def theme_for(self, prompt_embedding: np.ndarray) -> str:
        """The simulator theme whose captions lie nearest to `prompt_embedding` (cosine)."""
        return world.THEMES[int(np.argmax(self.theme_prompts @ prompt_embedding))]

    def initial_frame(self, *, seed: int, prompt_embedding: np.ndarray) -> np.ndarray:
        if seed not in self._maps:
            if len(self._maps) > 64:
                self._maps.clear()
            self._maps[seed] = world.WorldMap.generate(seed)
        return world.render_view(self._maps[seed], self.theme_for(prompt_embedding), 0, 0, view=self.cfg.frame_size)

    # -- frames <-> latents ---------------------------------------------------------------

    @torch.no_grad()
    def encode_frames(self, frames: torch.Tensor) -> torch.Tensor:
        B, Fr = frames.shape[:2]
        img = frames.to(self.device).flatten(0, 1).permute(0, 3, 1, 2).float() / 255.0
        return self.ae.encode(img).reshape(B, Fr, *self.spec.latent_shape)

    @torch.no_grad()
    def decode(self, x0: torch.Tensor) -> torch.Tensor:
        B, Fr = x0.shape[:2]
        img = self.ae.decode(x0.flatten(0, 1)).clamp(0, 1)
        img = (img * 255 + 0.5).to(torch.uint8).permute(0, 2, 3, 1)
        return img.reshape(B, Fr, *img.shape[1:])

    # -- denoise / commit ------------------------------------------------------------------

    def _bias(self, cond: ChunkConditioning, cache: KVView) -> FrameAgeBias:
        T = self.cfg.tokens_per_frame
        q_frame = cond.frame_index.repeat_interleave(T, dim=1)  # (B, F*T)
        k_frame = torch.cat([cache.k_frame, q_frame], dim=1)
        k_valid = torch.cat([cache.k_valid, torch.ones_like(q_frame, dtype=torch.bool)], dim=1)
        return frame_age_bias_lazy(q_frame, k_frame, k_valid, cfg=self.cfg)

    @torch.no_grad()
    def denoise(
        self, x_t: torch.Tensor, prev: torch.Tensor, t: torch.Tensor, cond: ChunkConditioning, cache: KVView
    ) -> torch.Tensor:
        assert x_t.shape[1] == 1, "TinyWorld generates one frame per chunk"
        tt = t[:, None].expand(-1, x_t.shape[1])
        x0, _ = self.net(x_t, prev[:, None], tt, cond.action, cond.prompt, cache.kv, self._bias(cond, cache))
        return x0

    @torch.no_grad()
    def commit(
        self, x0: torch.Tensor, prev: torch.Tensor, cond: ChunkConditioning, cache: KVView
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        zeros = torch.zeros(x0.shape[:2], device=x0.device)
        _, kv = self.net(x0, prev[:, None], zeros, cond.action, cond.prompt, cache.kv, self._bias(cond, cache),
                         kv_only=True)
        return kv
