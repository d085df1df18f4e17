"""MatrixGameModel: the `WorldModel` contract over the Matrix-Game 2.0 DiT, its VAE decoder and image encoders.

Declared per-session state (`models/spec.py`), all held by the engine's pool,
staged with the chunk and committed or dropped with it:
- "kv": the DiT's self-attention ring (`sink_size` sinks, 0 in every release config, and a window
  of `local_attn_size - sink_size - 3` committed latent frames: 3 universal / templerun, 1 GTA),
  post-RoPE keys;
- "mouse_kv": per action block, the mouse attention's keys/values, one per
  (latent frame, token) (absent without a mouse); never a sink, a window of `local_attn_size - 3`
  (`MatrixGameConfig.action_window_frames`, as the release's action module);
- "keyboard_kv": per action block, the keyboard attention's, one per latent frame (the same rule);
- "cross": the image's cross-attention cache (blocks, K/V, 257, heads, head dim);
- "image_latent": the first-frame conditioning, `cond_latent_frames` latent frames
  of the VAE encoding of [image, black frames] (later frames reuse the last);
- "action_history": the last 9 pixel frames' action vectors of earlier chunks
  (latent frame j sees pixel frames [4j - 12, 4j));
- "vae.NN": the VAE decoder's causal-conv cache.

Conditioning: an image, no text (`conditioning` below). `encode_conditioning`
crops and resizes it (event-loop worker thread); `init_state` runs the image
encoders on the device thread and fills "cross" and "image_latent". A chunk is 3
latent frames (9 pixel frames first, then 12); the sampler is the release's
(Self-Forcing's): x0 prediction, fresh noise to the next warped timestep, a commit
pass at timestep 0 that writes every cache.

The encoded conditioning is {"image": uint8 (H, W, 3)}, the release's crop and
resize of the session's image (`preprocess.fit_image`), or the family's procedural
default picture when a session gives none.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from worldcast.kernels.ring_attention import RingBatch
from worldcast.models.base import (
    ChunkConditioning,
    NoiseFn,
    Replace,
    RingWrite,
    StateUpdates,
    StateView,
    WorldModel,
    renoise_update,
)
from worldcast.models.causal_wan.model import stream_decode
from worldcast.models.causal_wan.sampler import flow_to_x0
from worldcast.models.errors import ConditioningError
from worldcast.models.matrix_game.action import ActionWindows, action_windows, pad_first_chunk
from worldcast.models.matrix_game.attention import RingActionAttention, RingSelfAttention
from worldcast.models.matrix_game.conditioning import DEFAULT_IMAGE, default_image, to_model_range
from worldcast.models.matrix_game.controls import Controls
from worldcast.models.matrix_game.dit import MatrixGameOutput
from worldcast.models.matrix_game.loading import MatrixGameParts
from worldcast.models.matrix_game.preprocess import fit_image
from worldcast.models.spec import (
    AttentionRingSpec,
    Conditioning,
    ConditioningRequest,
    ConditioningSpec,
    ImageConditioning,
    PrecisionSpec,
    PromptCacheSpec,
    StateSpec,
    TensorStateSpec,
    WorldModelSpec,
)

logger = logging.getLogger(__name__)


class MatrixGameModel(WorldModel):
    """Matrix-Game 2.0 (image + keyboard/mouse to video) served by the engine.

    Args:
        parts: the loaded DiT, VAE decoder and image encoders (`loading.load_parts` / `tiny_parts`).
        controls: the variant's keys and mouse (`controls.CONTROLS[variant]`); its vector layout must
            match the action module (keyboard columns, then mouse columns).
        name: the served model's name, e.g. "matrix-game-2:universal".

    Raises:
        ValueError: controls that do not fit the action module, or a config without a bounded window.
    """

    def __init__(self, parts: MatrixGameParts, *, controls: Controls, name: str) -> None:
        cfg = parts.cfg
        a = cfg.action
        if a is None:
            raise ValueError(f"{name}: a config without an action module is not an interactive world model")
        if controls.keyboard_dim != (a.keyboard_dim_in if a.enable_keyboard else 0) or controls.dim != a.action_dim:
            kd, md = (a.keyboard_dim_in if a.enable_keyboard else 0), (a.mouse_dim_in if a.enable_mouse else 0)
            raise ValueError(f"{name}: controls give {controls.keyboard_dim} keyboard + "
                             f"{controls.dim - controls.keyboard_dim} mouse columns, the action module takes "
                             f"{kd} + {md}")
        if cfg.window_frames <= 0:
            raise ValueError(f"{name}: local_attn_size {cfg.local_attn_size} leaves no committed frame in view")
        self.cfg, self.dit, self.vae, self.encoders, self.controls = cfg, parts.dit, parts.vae, parts.encoders, controls
        self.device = next(self.dit.parameters()).device
        self.dtype = self.dit.dtype
        H, W = cfg.frame_height, cfg.frame_width
        h, w = cfg.latent_size()
        T = cfg.tokens_per_frame()
        self._tokens_per_frame = T
        n_act = len(self.dit.action_blocks)
        ring = dict(window_frames=cfg.window_frames, sink_frames=cfg.sink_size, dtype=self.dtype)
        # the action caches never keep a sink (the release's action module): `cfg.action_window_frames`
        action_ring = dict(window_frames=cfg.action_window_frames, sink_frames=0, dtype=self.dtype)
        states: list[StateSpec] = [
            AttentionRingSpec("kv", layers=cfg.layers, heads=cfg.heads, head_dim=cfg.head_dim, tokens_per_frame=T,
                              **ring)]  # type: ignore[arg-type]
        if a.enable_mouse:
            states.append(AttentionRingSpec("mouse_kv", layers=n_act, heads=a.heads, head_dim=a.head_dim,
                                            tokens_per_frame=T, **action_ring))  # type: ignore[arg-type]
        if a.enable_keyboard:
            states.append(AttentionRingSpec("keyboard_kv", layers=n_act, heads=a.heads, head_dim=a.head_dim,
                                            tokens_per_frame=1, **action_ring))  # type: ignore[arg-type]
        self._vae_names = [f"vae.{i:02d}" for i in range(len(self.vae.cache_spec(H, W)))]
        states += [
            PromptCacheSpec("cross", shape=(cfg.layers, 2, cfg.image_tokens, cfg.heads, cfg.head_dim),
                            dtype=self.dtype),
            TensorStateSpec("image_latent", shape=(cfg.cond_latent_frames, cfg.out_channels, h, w), dtype=self.dtype),
            TensorStateSpec("action_history", shape=(cfg.history_pixel_frames, a.action_dim), dtype=torch.float32),
            *(TensorStateSpec(n, shape=shape, dtype=dt)
              for n, (shape, dt) in zip(self._vae_names, self.vae.cache_spec(H, W), strict=True)),
        ]
        self.conditioning = ConditioningSpec(text=None, image=ImageConditioning(required=False, default=DEFAULT_IMAGE),
                                             tensors=(("image", (H, W, 3), torch.uint8),))
        self.action_space = controls.action_space(history_pixel_frames=cfg.history_pixel_frames)
        self.spec = WorldModelSpec(
            name=name, frame_height=H, frame_width=W, fps=cfg.fps, latent_frames_per_chunk=cfg.frames_per_chunk,
            timesteps=cfg.flow_times, latent_shape=(cfg.out_channels, h, w), states=tuple(states),
            actions=self.action_space, conditioning=self.conditioning,
            pixel_frames_per_latent=cfg.vae.temporal_stride, first_latent_pixel_frames=1, initial_latent_frames=0,
            commit_timestep=cfg.context_noise / cfg.num_train_timesteps, context_in_chunks=False,
            precisions=PrecisionSpec(dtypes=(self.dtype,)),  # the DiT's own dtype, nothing to choose; eager steps
        )  # fmt: skip

    # -- conditioning (event loop worker threads) ------------------------------------------------

    def encode_conditioning(self, request: ConditioningRequest) -> Conditioning:
        """The session's image, cropped and resized as the release does (`preprocess.fit_image`):
        {"image": uint8 (H, W, 3)} (the default picture if none).

        Raises:
            ConditioningError: text given (this model takes none), or an image that is not uint8 (h, w, 3).
        """
        if request.text:
            raise ConditioningError("text", "Matrix-Game 2.0 is conditioned on an image and actions, not on text")
        if request.image is None:
            return {"image": self._default_image()}
        try:
            return {"image": fit_image(request.image, height=self.spec.frame_height, width=self.spec.frame_width)}
        except ValueError as e:
            raise ConditioningError("image", str(e)) from e

    def _default_image(self) -> np.ndarray:
        return default_image(height=self.spec.frame_height, width=self.spec.frame_width)

    def encode_action(self, keys: dict[str, bool], axes: dict[str, float]) -> np.ndarray:
        """float32 (dim,) [keyboard | mouse] of one pixel frame (`controls.Controls.encode`)."""
        return self.controls.encode(keys, axes)

    def group_actions(self, actions: np.ndarray, *, first_latent: int, latent_frames: int) -> np.ndarray:
        """A chunk's per-pixel-frame actions (F_pix, A) -> the 4 * F rows its windows are cut from.

        Later chunks' rows are returned as they are (12 pixel frames); a session's first chunk
        (9 pixel frames) is left-padded with copies of pixel frame 0, as the release pads
        (`action.action_windows` takes it from there with the history state).

        Raises:
            ValueError: not (chunk_pixel_frames(first_latent), dim) rows.
        """
        spec = self.spec
        F = latent_frames
        if F == 0:  # the init step: no latent frame of its own (initial_latent_frames 0)
            return np.zeros((0, spec.actions.dim), np.float32)
        want = spec.pixel_start(first_latent + F) - spec.pixel_start(first_latent)
        if actions.shape != (want, spec.actions.dim):
            raise ValueError(f"a chunk from latent frame {first_latent} has {want} pixel frames of {spec.actions.dim} "
                             f"action values, got {actions.shape}")
        rows = torch.from_numpy(np.ascontiguousarray(actions, dtype=np.float32))
        if first_latent == 0:
            rows = pad_first_chunk(rows, missing=F * spec.pixel_frames_per_latent - want)
        return rows.numpy()

    def initial_frames(self, *, seed: int, context: Conditioning) -> np.ndarray:
        """None: the first chunk generates latent frame 0 (the image's) with the rest (initial_latent_frames 0)."""
        return np.zeros((0, self.spec.frame_height, self.spec.frame_width, 3), np.uint8)

    # -- helpers -----------------------------------------------------------------------------------

    @staticmethod
    def _image(cond: ChunkConditioning) -> torch.Tensor:
        """(B, H, W, 3) uint8 the sessions' images (their encoded conditioning)."""
        return cond.context["image"]

    def _first(self, cond: ChunkConditioning) -> tuple[int, ...]:
        if cond.frame_index_host:
            return tuple(f[0] for f in cond.frame_index_host)
        return tuple(int(f) for f in cond.frame_index[:, 0].tolist())

    def _memo(self, cond: ChunkConditioning, key: str, make: Any) -> Any:
        v = cond.memo.get("mg/" + key)
        if v is None:
            v = cond.memo["mg/" + key] = make()
        return v

    def _attend(self, cond: ChunkConditioning, state: StateView) -> RingSelfAttention:
        def make() -> RingSelfAttention:
            k_pool, v_pool, ring_frame = state.ring("kv")
            batch = RingBatch(ring_frame, state.slots, state.slots_host, cond.frame_index, self._tokens_per_frame,
                              self.cfg.window_frames, self.cfg.sink_size)
            return RingSelfAttention(k_pool, v_pool, batch)
        return self._memo(cond, "attend", make)

    def _action_attend(self, cond: ChunkConditioning, state: StateView) -> RingActionAttention:
        a = self.cfg.action
        assert a is not None
        return self._memo(cond, "action_attend", lambda: RingActionAttention(
            state.ring("mouse_kv") if a.enable_mouse else None,
            state.ring("keyboard_kv") if a.enable_keyboard else None,
            state.slots_host, self._first(cond), window=self.cfg.action_window_frames, sinks=0))

    def _cross(self, cond: ChunkConditioning, state: StateView) -> list[tuple[torch.Tensor, torch.Tensor]]:
        def make() -> list[tuple[torch.Tensor, torch.Tensor]]:
            c = state.tensor("cross")  # (B, layers, 2, L, H, hd)
            return [(c[:, i, 0], c[:, i, 1]) for i in range(self.cfg.layers)]
        return self._memo(cond, "cross", make)

    def _cond_latents(self, cond: ChunkConditioning, state: StateView) -> torch.Tensor:
        """(B, 20, F, h, w) [mask | first-frame latent] of the chunk's frames (the release's `cond_concat`)."""
        def make() -> torch.Tensor:
            lat = state.tensor("image_latent")  # (B, K, 16, h, w)
            K = lat.shape[1]
            idx = cond.frame_index.clamp(max=K - 1)  # frames past the kept ones reuse the last (image-independent)
            z = torch.stack([lat[b, idx[b]] for b in range(lat.shape[0])])  # (B, F, 16, h, w)
            B, Fn, _, h, w = z.shape
            mask = (cond.frame_index == 0).to(z.dtype)[:, :, None, None, None].expand(B, Fn, self.cfg.mask_channels,
                                                                                   h, w)
            return torch.cat([mask, z], dim=2).permute(0, 2, 1, 3, 4)  # (B, 20, F, h, w)
        return self._memo(cond, "cond", make)

    def _rows(self, cond: ChunkConditioning, state: StateView) -> tuple[ActionWindows, torch.Tensor]:
        """The chunk's action windows, and the rows [history | chunk] (B, 9 + 12, A) the history is cut from."""
        a = self.cfg.action
        assert a is not None

        def make() -> tuple[ActionWindows, torch.Tensor]:
            history = state.tensor("action_history")  # (B, 9, A)
            first = cond.frame_index[:, 0] == 0
            chunk = cond.action.to(torch.float32)
            win = action_windows(history, chunk, first, a, frames=cond.frame_index.shape[1])
            rows = torch.cat([torch.where(first.view(-1, 1, 1), chunk[:, :1].expand_as(history), history), chunk], 1)
            return win, rows
        return self._memo(cond, "rows", make)

    def _forward(self, x: torch.Tensor, t: torch.Tensor, cond: ChunkConditioning, state: StateView, *,
                 kv_only: bool = False) -> MatrixGameOutput:
        windows, _ = self._rows(cond, state)
        return self.dit(x.permute(0, 2, 1, 3, 4), self._cond_latents(cond, state), t, cond.frame_index[:, 0],
                        self._cross(cond, state), self._attend(cond, state), windows=windows,
                        action_attn=self._action_attend(cond, state), kv_only=kv_only)

    def _image_state(self, cond: ChunkConditioning) -> StateUpdates:
        """"cross" and "image_latent" from the sessions' images, through the image encoders."""
        cfg = self.cfg
        image = to_model_range(self._image(cond)).to(self.device)  # (B, 3, H, W) in [-1, 1]
        B = image.shape[0]
        h, w = cfg.latent_size()
        lat = self.encoders.first_frame(image, cfg.cond_latent_frames)
        if tuple(lat.shape) != (B, cfg.out_channels, cfg.cond_latent_frames, h, w):
            raise ValueError(f"{self.encoders.name}: first-frame latents {tuple(lat.shape)}, expected "
                             f"{(B, cfg.out_channels, cfg.cond_latent_frames, h, w)}")
        clip = self.encoders.clip(image)
        if tuple(clip.shape) != (B, cfg.image_tokens, cfg.image_dim):
            raise ValueError(f"{self.encoders.name}: CLIP features {tuple(clip.shape)}, expected "
                             f"{(B, cfg.image_tokens, cfg.image_dim)}")
        cross = self.dit.cross_kv(clip)
        return {"cross": Replace(torch.stack([torch.stack([k, v], 1) for k, v in cross], 1)),
                "image_latent": Replace(lat.permute(0, 2, 1, 3, 4).to(self.dtype))}

    # -- device work (device thread) -----------------------------------------------------------------

    @torch.no_grad()
    def init_state(self, frames: torch.Tensor, cond: ChunkConditioning, state: StateView) -> StateUpdates:
        """A new session: its image's cross-attention cache and first-frame latents (rings start empty)."""
        return self._image_state(cond)

    @torch.no_grad()
    def set_prompt(self, cond: ChunkConditioning, state: StateView) -> StateUpdates:
        """A new image mid-session: re-encode it (cross cache and first-frame latents); the rings keep
        the frames already generated (the release has no such switch; this is the plain choice)."""
        return self._image_state(cond)

    @torch.no_grad()
    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: ChunkConditioning, state: StateView) -> torch.Tensor:
        tw = t * self.cfg.num_train_timesteps  # Wan's scale
        out = self._forward(x_t, tw, cond, state)
        assert out.flow is not None
        x = x_t.permute(0, 2, 1, 3, 4)
        return flow_to_x0(out.flow, x, tw, num_train_timesteps=self.cfg.num_train_timesteps).permute(0, 2, 1, 3, 4)

    def sampler_step(self, x_t: torch.Tensor, x0: torch.Tensor, t: torch.Tensor, t_next: torch.Tensor,
                     noise: NoiseFn) -> torch.Tensor:
        """The release's step (Self-Forcing's): re-noise the x0 prediction to t_next with fresh noise."""
        return renoise_update(x0, t_next, noise)

    @torch.no_grad()
    def decode(self, x0: torch.Tensor, cond: ChunkConditioning, state: StateView) -> tuple[list[torch.Tensor],
                                                                                         StateUpdates]:
        return stream_decode(self.vae, self._vae_names, x0, cond, state)

    @torch.no_grad()
    def commit(self, x0: torch.Tensor, cond: ChunkConditioning, state: StateView) -> StateUpdates:
        """The clean pass at the context noise: every cache's keys and values, and the action history."""
        B, Fn = cond.frame_index.shape
        t = torch.full((B,), self.cfg.context_noise, dtype=torch.float32, device=x0.device)
        out = self._forward(x0, t, cond, state, kv_only=True)
        updates: StateUpdates = {"kv": RingWrite(cond.frame_index, [k for k, _ in out.kv], [v for _, v in out.kv])}
        a = self.cfg.action
        assert a is not None
        if a.enable_mouse:
            mk = [akv.mouse for akv in out.action_kv]  # each (B, S, F, H, d)
            updates["mouse_kv"] = RingWrite(cond.frame_index,
                                            [k.transpose(1, 2).flatten(1, 2) for k, _ in mk],  # type: ignore[misc]
                                            [v.transpose(1, 2).flatten(1, 2) for _, v in mk])  # type: ignore[misc]
        if a.enable_keyboard:
            kk = [akv.keyboard for akv in out.action_kv]  # each (B, F, H, d)
            updates["keyboard_kv"] = RingWrite(cond.frame_index, [k for k, _ in kk],  # type: ignore[misc]
                                               [v for _, v in kk])  # type: ignore[misc]
        _, rows = self._rows(cond, state)
        updates["action_history"] = Replace(rows[:, -self.cfg.history_pixel_frames:])
        return updates
