"""Reading the committed release fixtures and building our model with the same weights and inputs.

The fixtures (`tests/data/matrix_game/*.safetensors`, written by `make_fixtures.py` from the release's
own pipeline) hold the inputs and outputs of every denoising call; the weights are regenerated from
the release's key names and shapes (`tiny_weights.seeded_state`) and loaded through our key table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from tests.models.matrix_game.tiny_weights import seeded_state
from worldcast.engine.state_pool import StatePool
from worldcast.models.base import ChunkConditioning
from worldcast.models.causal_wan.config import WanVAEConfig
from worldcast.models.causal_wan.loading import load_state_strict
from worldcast.models.causal_wan.vae import WanVAEDecoder
from worldcast.models.matrix_game.conditioning import ImageEncoders
from worldcast.models.matrix_game.config import MatrixGameConfig
from worldcast.models.matrix_game.controls import TEMPLERUN, UNIVERSAL
from worldcast.models.matrix_game.dit import MatrixGameDiT
from worldcast.models.matrix_game.loading import MatrixGameParts, release_state
from worldcast.models.matrix_game.model import MatrixGameModel

DATA = Path(__file__).resolve().parents[2] / "data" / "matrix_game"
NAMES = ("universal", "keyboard_only")
TINY_VAE = WanVAEConfig(base_dim=4, z_dim=16, dim_mult=(1, 2, 2, 2), num_res_blocks=1,
                        latents_mean=(0.0,) * 16, latents_std=(1.0,) * 16)


@dataclass
class ReleaseFixture:
    name: str
    meta: dict[str, str]
    config: dict
    run: dict
    tensors: dict[str, torch.Tensor]

    @property
    def steps(self) -> int:
        return len(self.run["denoising_step_list"])

    @property
    def chunks(self) -> int:
        return self.run["latent_frames"] // self.run["num_frame_per_block"]

    @property
    def keys(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(v) for k, v in json.loads(self.meta["keys"]).items()}

    def our_config(self) -> MatrixGameConfig:
        h, w = self.run["latent_hw"]
        return MatrixGameConfig.from_release(
            self.config, self.run, cond_latent_frames=self.run["cond_latent_frames"],
            image_tokens=self.run["image_tokens"], frame_height=8 * h, frame_width=8 * w, vae=TINY_VAE)

    def pixel_actions(self) -> torch.Tensor:
        """(P, A) [keyboard | mouse] per pixel frame, as the release's conditions hold them."""
        cols = [self.tensors["keyboard_cond"][0]]
        if "mouse_cond" in self.tensors:
            cols.append(self.tensors["mouse_cond"][0])
        return torch.cat(cols, dim=1)


def load(name: str) -> ReleaseFixture:
    path = DATA / f"{name}.safetensors"
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    return ReleaseFixture(name=name, meta=meta, config=json.loads(meta["config"]), run=json.loads(meta["run"]),
                          tensors=tensors)


def build_model(fx: ReleaseFixture, *, seed: int = 0) -> MatrixGameModel:
    """Our model in float64 with the fixture's weights (through the key table) and its image conditioning."""
    cfg = fx.our_config()
    dit = MatrixGameDiT(cfg).double()
    state = release_state(seeded_state(fx.keys, seed=fx.run["weight_seed"]), cfg, what=f"fixture {fx.name}")
    load_state_strict(dit, state, what=f"fixture {fx.name}")
    lat, clip = fx.tensors["image_latent"], fx.tensors["visual_context"]

    def first_frame(image: torch.Tensor, frames: int) -> torch.Tensor:
        assert frames == lat.shape[2], f"the fixture holds {lat.shape[2]} first-frame latent frames"
        return lat.expand(image.shape[0], -1, -1, -1, -1)

    encoders = ImageEncoders(first_frame=first_frame, clip=lambda image: clip.expand(image.shape[0], -1, -1),
                             name=f"fixture {fx.name}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vae = WanVAEDecoder(cfg.vae).double()
    controls = UNIVERSAL if cfg.action is not None and cfg.action.enable_mouse else TEMPLERUN
    return MatrixGameModel(MatrixGameParts(cfg=cfg, dit=dit.eval(), vae=vae.eval(), encoders=encoders),
                           controls=controls, name=f"matrix-game-2:fixture-{fx.name}")


def chunk_cond(model: MatrixGameModel, rows: torch.Tensor, c0: int) -> ChunkConditioning:
    """One session's conditioning of the chunk from latent frame c0: its pixel rows grouped by the model."""
    spec = model.spec
    F = spec.latent_frames_per_chunk
    pix = rows[spec.pixel_start(c0):spec.pixel_start(c0 + F)].numpy()
    act = torch.from_numpy(model.group_actions(np.ascontiguousarray(pix), first_latent=c0, latent_frames=F))[None]
    fi = tuple(range(c0, c0 + F))
    return ChunkConditioning(action=act, context={}, frame_index=torch.tensor([fi]),
                             frame_index_host=(fi,))


@dataclass
class Rollout:
    """Our served path driven with the fixture's inputs: the x0 of every denoising call, the final pool."""

    x0: list[torch.Tensor]  #: per call (1, 16, 3, h, w), the release's layout
    pool: StatePool
    slot: int


def run_ours(model: MatrixGameModel, fx: ReleaseFixture, *, rows: torch.Tensor | None = None) -> Rollout:
    """Init, then each chunk: denoise at the fixture's recorded inputs, commit our x0, on a real StatePool."""
    spec = model.spec
    pool = StatePool(spec.states, budget_bytes=spec.state_bytes_per_session())
    slot = pool.allocate("fixture")
    view = pool.view((slot,))
    image = torch.zeros(1, spec.frame_height, spec.frame_width, 3)  # the fixture's encoders ignore the pixels
    init = ChunkConditioning(action=torch.zeros(1, 0, spec.actions.dim), context={"image": image},
                             frame_index=torch.zeros(1, 0, dtype=torch.int64), frame_index_host=((),))
    pool.apply(view, model.init_state(torch.zeros(1, 0, *image.shape[1:], dtype=torch.uint8), init, view))
    rows = fx.pixel_actions() if rows is None else rows
    out, n = [], 0
    for c in range(fx.chunks):
        cond = chunk_cond(model, rows, c * spec.latent_frames_per_chunk)
        x0 = None
        for _ in range(fx.steps):
            x_t = fx.tensors[f"call.{n}.x_t"].permute(0, 2, 1, 3, 4)  # (1, F, 16, h, w)
            t = fx.tensors[f"call.{n}.t"][:, 0] / 1000.0
            x0 = model.denoise(x_t, t, cond, view)
            out.append(x0.permute(0, 2, 1, 3, 4))
            n += 1
        assert x0 is not None
        pool.apply(view, model.commit(x0, cond, view))
    return Rollout(x0=out, pool=pool, slot=slot)


def ring_frames(pool: StatePool, slot: int, name: str, layer: int, frames: list[int]) -> tuple[torch.Tensor,
                                                                                               torch.Tensor]:
    """k, v of `frames` (in order) from a ring of one slot: (len(frames) * tokens, H, d) frame-major."""
    ts = pool.tensors[name]
    held = ts["frame"][slot].tolist()
    T = pool.states[name].tokens_per_frame  # type: ignore[attr-defined]
    pos = [held.index(f) for f in frames]
    k = torch.cat([ts["k"][slot, layer, p * T:(p + 1) * T] for p in pos])
    v = torch.cat([ts["v"][slot, layer, p * T:(p + 1) * T] for p in pos])
    return k, v
