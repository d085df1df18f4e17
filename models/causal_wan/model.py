"""CausalWanModel: the `WorldModel` contract over the causal Wan DiT, its VAE decoder and umT5.

Declared per-session state (`models/spec.py`), all held by the engine's pool:
- "kv": the self-attention ring, `sink_size` sink latent frames plus a rolling
  window of `kv_recent_frames` (LongLive's `sink_size` / `local_attn_size`),
  post-RoPE keys at absolute positions, read in place by `kernels/ring_attention.py`;
- "cross": the prompt's cross-attention cache (layers, K/V, text_len, heads, head_dim),
  replaced on every prompt change;
- "latents": the last `local_attn_size - sink_size` committed latents and the
  sinks', which a prompt switch re-runs (LongLive's recache, `recache.py`);
- "vae.NN": the VAE decoder's causal-conv cache, one tensor per cached conv
  (the last 2 input frames each), advanced by every decoded chunk.

A chunk is 3 latent frames (Self-Forcing's `num_frame_per_block`); latent
frame 0 decodes to 1 pixel frame and later ones to 4, so a session's first
chunk is 9 pixel frames and every later one 12. The sampler is Self-Forcing's:
predict x0, then re-noise it to the next timestep with fresh noise from the
session's own generator; the finished chunk is run once more at the context
noise timestep (0) to write its keys and values; each step's time embedding
and noise level come from the reference's table (`schedule.py`): the engine's
flow times are the noise levels, mapped back to the embedding timesteps here.
The video is text-to-video:
actions are accepted (the same keys as every worldcast model) and ignored.

`causal-wan:tiny` (random weights) runs the whole path on a CPU and makes
noise-like video; real checkpoints load through `loading.load_parts`.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import torch

from worldcast.kernels.ring_attention import RingBatch, ring_attention
from worldcast.models.base import (
    ChunkConditioning,
    FrameWrite,
    NoiseFn,
    Replace,
    RingWrite,
    StateUpdates,
    StateView,
    WorldModel,
    renoise_update,
)
from worldcast.models.causal_wan.config import CausalWanConfig
from worldcast.models.causal_wan.family import ACTIONS, CONDITIONING
from worldcast.models.causal_wan.loading import CausalWanParts
from worldcast.models.causal_wan.recache import recache_kv, recache_plan
from worldcast.models.causal_wan.sampler import x0_from_sigma
from worldcast.models.causal_wan.vae import WanVAEDecoder, decoder_activation_bytes, frames_to_uint8
from worldcast.models.spec import (
    AttentionRingSpec,
    Conditioning,
    ConditioningRequest,
    FrameRingSpec,
    PrecisionSpec,
    PromptCacheSpec,
    TensorStateSpec,
    WorldModelSpec,
)

logger = logging.getLogger(__name__)



class _RingAttend:
    """The DiT's self-attention backend over the engine's ring (`SelfAttentionBackend`)."""

    def __init__(self, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: RingBatch) -> None:
        self.k_pool, self.v_pool, self.batch = k_pool, v_pool, batch

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return ring_attention(q, k, v, self.k_pool[:, layer], self.v_pool[:, layer], self.batch)


class CausalWanModel(WorldModel):
    """Causal Wan 2.1 (Self-Forcing / CausVid / LongLive) served by the engine.

    Args:
        parts: the loaded DiT, VAE decoder and text encoder (`loading.load_parts` / `tiny_parts`).
        name: the served model's name (e.g. "causal-wan:tiny").
        height, width: pixel frame size (defaults: the config's).

        decode_frames_per_call: latent frames per VAE decoder pass (None: chosen from the memory left
            after the state pool, `plan_activation_memory`; all of a chunk's frames until then).

    Raises:
        ValueError: the config attends globally without a bound (a session's KV would grow without
            limit), or the frame size does not tile.
    """

    def __init__(self, parts: CausalWanParts, *, name: str, height: int | None = None,
                 width: int | None = None, decode_frames_per_call: int | None = None) -> None:
        cfg = parts.cfg
        if cfg.local_attn_size == -1:
            raise ValueError(f"{name}: unbounded global attention keeps every latent frame, so a session's KV would "
                             "grow without limit; serve a preset (self-forcing and causvid: global over their "
                             "21-frame horizon, then a rolling window; longlive: 12 frames, 3 sinks)")
        if decode_frames_per_call is not None and not 1 <= decode_frames_per_call <= cfg.frames_per_chunk:
            raise ValueError(f"decode_frames_per_call must lie in 1..{cfg.frames_per_chunk}")
        self.cfg: CausalWanConfig = cfg
        self.source = parts.source
        self.decode_frames_per_call = decode_frames_per_call
        self._decode_fixed = decode_frames_per_call is not None
        self.dit, self.vae, self.text = parts.dit, parts.vae, parts.text
        self.device = next(self.dit.parameters()).device
        self.dtype = self.dit.dtype
        H, W = height or cfg.frame_height, width or cfg.frame_width
        h, w = cfg.latent_size(H, W)
        T = cfg.tokens_per_frame(H, W)
        self._tokens_per_frame = T
        self._vae_names = [f"vae.{i:02d}" for i in range(len(self.vae.cache_spec(H, W)))]
        lat_dtype = self.dtype if self.dtype == torch.float64 else torch.float32
        self._sigmas = torch.tensor(cfg.flow_times, dtype=torch.float64, device=self.device)
        self._embed_t = torch.tensor(cfg.timesteps, dtype=torch.float64, device=self.device)
        states = (
            AttentionRingSpec("kv", layers=cfg.layers, heads=cfg.heads, head_dim=cfg.head_dim, tokens_per_frame=T,
                              window_frames=cfg.kv_recent_frames, sink_frames=cfg.sink_size, dtype=self.dtype),
            PromptCacheSpec("cross", shape=(cfg.layers, 2, cfg.text_len, cfg.heads, cfg.head_dim), dtype=self.dtype),
            FrameRingSpec("latents", frame_shape=(cfg.out_channels, h, w),
                          window_frames=cfg.local_attn_size - cfg.sink_size, sink_frames=cfg.sink_size,
                          dtype=lat_dtype),
            *(TensorStateSpec(n, shape=shape, dtype=dt)
              for n, (shape, dt) in zip(self._vae_names, self.vae.cache_spec(H, W), strict=True)),
        )
        self.spec = WorldModelSpec(
            name=name, frame_height=H, frame_width=W, fps=cfg.fps,
            latent_frames_per_chunk=cfg.frames_per_chunk, timesteps=cfg.flow_times,
            latent_shape=(cfg.out_channels, h, w), states=states,
            actions=ACTIONS,
            conditioning=dataclasses.replace(CONDITIONING,
                                             tensors=(("text", (cfg.text_len, cfg.text_dim), torch.float32),)),
            default_prompt="a drone flight over a misty forest",
            pixel_frames_per_latent=cfg.vae.temporal_stride, first_latent_pixel_frames=1,
            initial_latent_frames=0, commit_timestep=cfg.context_noise / cfg.num_train_timesteps,
            context_in_chunks=False,
            precisions=PrecisionSpec(dtypes=(self.dtype,)),  # the DiT's own dtype (bfloat16 on CUDA), nothing to choose
        )

    # -- conditioning ----------------------------------------------------------------------------

    def encode_prompt(self, text: str) -> np.ndarray:
        """umT5 encoding, zero-padded to text_len: float32 (text_len, text_dim)."""
        return self.text.encode([text])[0].float().cpu().numpy()

    def encode_conditioning(self, request: ConditioningRequest) -> Conditioning:
        """{"text": float32 (text_len, text_dim)}: the prompt (or the default one) through umT5."""
        return {"text": self.encode_prompt(request.text or self.spec.default_prompt)}

    def encode_action(self, keys: dict[str, bool], axes: dict[str, float]) -> np.ndarray:
        return np.zeros(1, np.float32)  # text-to-video: actions do not condition the picture

    def initial_frames(self, *, seed: int, context: Conditioning) -> np.ndarray:
        return np.zeros((0, self.spec.frame_height, self.spec.frame_width, 3), np.uint8)  # starts from noise

    # -- helpers ---------------------------------------------------------------------------------

    def _attend(self, cond: ChunkConditioning, state: StateView) -> _RingAttend:
        attend = cond.memo.get("attend")
        if attend is None:
            k_pool, v_pool, ring_frame = state.ring("kv")
            batch = RingBatch(ring_frame, state.slots, state.slots_host, cond.frame_index, self._tokens_per_frame,
                              self.cfg.kv_recent_frames, self.cfg.sink_size)
            attend = cond.memo["attend"] = _RingAttend(k_pool, v_pool, batch)
        return attend  # type: ignore[return-value]

    def _cross(self, cond: ChunkConditioning, state: StateView) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer the batch's cross-attention (K, V) (B, text_len, H, hd), read once per chunk."""
        cross = cond.memo.get("cross")
        if cross is None:
            c = state.tensor("cross")  # (B, layers, 2, Lc, H, hd): views for one or consecutive slots
            cross = cond.memo["cross"] = [(c[:, i, 0], c[:, i, 1]) for i in range(self.cfg.layers)]
        return cross  # type: ignore[return-value]

    def _timesteps(self, sigma: torch.Tensor) -> torch.Tensor:
        """Noise levels (B,) (the engine's flow times: this schedule's sigmas) -> embedding timesteps (B,),
        float64, by the nearest schedule step (no host sync)."""
        idx = (sigma.to(torch.float64)[:, None] - self._sigmas[None]).abs().argmin(dim=1)
        return self._embed_t[idx]

    @staticmethod
    def _wan(x: torch.Tensor) -> torch.Tensor:
        return x.permute(0, 2, 1, 3, 4)  # (B, F, C, h, w) <-> (B, C, F, h, w)

    def _kv_pass(self, x0: torch.Tensor, cond: ChunkConditioning, state: StateView,
                 cross: list[tuple[torch.Tensor, torch.Tensor]]) -> RingWrite:
        """The commit pass at the context-noise timestep: the frames' post-RoPE keys and values."""
        t = torch.full((x0.shape[0],), self.cfg.context_noise, dtype=torch.float32, device=x0.device)
        out = self.dit(self._wan(x0), t, cond.frame_index[:, 0], cross, self._attend(cond, state), kv_only=True)
        return RingWrite(cond.frame_index, [k for k, _ in out.kv], [v for _, v in out.kv])

    @staticmethod
    def _cross_tensor(cross: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        return torch.stack([torch.stack([k, v], 1) for k, v in cross], 1)  # (B, layers, 2, Lc, H, hd)

    # -- device work ------------------------------------------------------------------------------

    @torch.no_grad()
    def init_state(self, frames: torch.Tensor, cond: ChunkConditioning, state: StateView) -> StateUpdates:
        """A new session: its prompt's cross-attention cache (the rings start empty, the decoder at zero)."""
        cross = self.dit.cross_kv(cond.context["text"].to(self.dtype))
        return {"cross": Replace(self._cross_tensor(cross))}

    @torch.no_grad()
    def set_prompt(self, cond: ChunkConditioning, state: StateView) -> StateUpdates:
        """Re-cache for a new prompt before the chunk at `cond.frame_index`: LongLive's `_recache_after_switch`.

        The cross-attention cache is replaced, and the frames `recache.recache_plan` names are re-run
        at the context-noise timestep under the new prompt as one block, attending each other and
        (in steady state) the sinks' old keys and values; the ring positions that later chunks read
        are rewritten. One session per call (the engine re-caches sessions one at a time); reads the
        ring's frame indices on the host: a prompt switch syncs once, never inside a chunk's steps.
        """
        assert cond.batch == 1, "set_prompt re-caches one session at a time"
        cfg = self.cfg
        cross = self.dit.cross_kv(cond.context["text"].to(self.dtype))
        updates: StateUpdates = {"cross": Replace(self._cross_tensor(cross))}
        nxt = cond.frame_index_host[0][0] if cond.frame_index_host else int(cond.frame_index[0, 0])
        plan = recache_plan(nxt, local_attn_size=cfg.local_attn_size, sink_size=cfg.sink_size)
        if plan is None:
            return updates
        data, lat_frames = state.frames("latents")  # (1, P, C, h, w), (1, P)
        held = {int(f): p for p, f in enumerate(lat_frames[0].tolist()) if f >= 0}
        missing = [f for f in plan.frames if f not in held]
        assert not missing, f"latent frames {missing} are not held for the re-cache"
        x0 = data[:, [held[f] for f in plan.frames]].to(self.dtype).permute(0, 2, 1, 3, 4)  # (1, C, F_r, h, w)
        prefix = None
        T = self._tokens_per_frame
        if plan.keep_sinks:
            k_pool, v_pool, ring_frame = state.ring("kv")
            slot = state.slots_host[0]
            pos = {int(f): p for p, f in enumerate(ring_frame[slot].tolist()) if f >= 0}
            tok = torch.cat([torch.arange(pos[f] * T, (pos[f] + 1) * T) for f in plan.sink_frames]).to(self.device)
            prefix = [(k_pool[slot, layer, tok][None], v_pool[slot, layer, tok][None]) for layer in range(cfg.layers)]
        kv = recache_kv(self.dit, x0, plan.frames, cross, prefix)
        # write back only the frames the ring keeps (the others would collide on its positions)
        keep = [i for i, f in enumerate(plan.frames) if f < cfg.sink_size or f >= nxt - cfg.kv_recent_frames]
        tok_idx = torch.cat([torch.arange(i * T, (i + 1) * T) for i in keep]).to(self.device)
        frames = torch.tensor([[plan.frames[i] for i in keep]], dtype=torch.int64, device=self.device)
        updates["kv"] = RingWrite(frames, [k[:, tok_idx] for k, _ in kv], [v[:, tok_idx] for _, v in kv])
        logger.debug("causal-wan: recached latent frames %d..%d under a new prompt (%s sinks)", plan.frames[0],
                     plan.frames[-1], "old" if plan.keep_sinks else "new")
        return updates

    @torch.no_grad()
    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: ChunkConditioning, state: StateView) -> torch.Tensor:
        tw = self._timesteps(t)
        x = self._wan(x_t)
        out = self.dit(x, tw, cond.frame_index[:, 0], self._cross(cond, state), self._attend(cond, state))
        return self._wan(x0_from_sigma(out.flow, x, t))

    def sampler_step(self, x_t: torch.Tensor, x0: torch.Tensor, t: torch.Tensor, t_next: torch.Tensor,
                     noise: NoiseFn) -> torch.Tensor:
        """Self-Forcing: re-noise the x0 prediction to t_next with fresh noise (x0 itself after the last step)."""
        return renoise_update(x0, t_next, noise)

    @torch.no_grad()
    def decode(self, x0: torch.Tensor, cond: ChunkConditioning, state: StateView) -> tuple[list[torch.Tensor],
                                                                                         StateUpdates]:
        """Stream-decode each session's chunk with its decoder cache (see `stream_decode`)."""
        return stream_decode(self.vae, self._vae_names, x0, cond, state, frames_per_call=self.decode_frames_per_call)

    def plan_activation_memory(self, *, available_bytes: int, max_batch: int) -> str:
        """Choose latent frames per VAE decoder pass so a batch's decode fits `available_bytes` (the memory
        left after the weights and the state pool); a flag's choice (`decode_frames_per_call`) is kept.

        The estimate is `vae.decoder_activation_bytes` (the largest live tensors of one pass) per session.
        Returns the line the engine logs.
        """
        H, W = self.spec.frame_height, self.spec.frame_width
        per = {f: decoder_activation_bytes(self.vae, H, W, latent_frames=f)
               for f in range(1, self.cfg.frames_per_chunk + 1)}
        if not self._decode_fixed:
            fits = [f for f, b in per.items() if b * max_batch <= available_bytes]
            self.decode_frames_per_call = max(fits) if fits else 1
        f = self.decode_frames_per_call or self.cfg.frames_per_chunk
        need = per[f] * max_batch
        how = "set by flag" if self._decode_fixed else "chosen from memory"
        warn = "" if need <= available_bytes else " -- OVER the memory left: decoding may run out of memory"
        return (f"VAE decode: {f} latent frame(s) per decoder pass ({how}); about {need / 2**30:.2f} GiB of "
                f"activations for a batch of {max_batch}, {available_bytes / 2**30:.2f} GiB left after the state "
                f"pool{warn}")

    @torch.no_grad()
    def commit(self, x0: torch.Tensor, cond: ChunkConditioning, state: StateView) -> StateUpdates:
        """The clean pass at the context noise: the chunk's keys and values, and its latents for a later recache."""
        return {"kv": self._kv_pass(x0, cond, state, self._cross(cond, state)),
                "latents": FrameWrite(cond.frame_index, x0.float())}


def stream_decode(vae: WanVAEDecoder, names: list[str], x0: torch.Tensor, cond: ChunkConditioning,
                  state: StateView, *, frames_per_call: int | None = None) -> tuple[list[torch.Tensor], StateUpdates]:
    """Decode a batch's chunks with each session's causal-conv cache, the cache held as declared state.

    First chunks (latent frame 0 decoded alone first: 9 pixel frames from 3 latent frames) and later
    ones (12) run as separate batches, since the decoder's `first_chunk` is per call. Shared by the
    families that decode with the Wan 2.1 VAE (causal Wan, Matrix-Game 2.0).

    Args:
        vae: the Wan 2.1 VAE decoder. names: the declared state names of its cache tensors, in
            `vae.cache_spec` order. x0: (B, F, C, h, w) normalised latents.
        cond: the chunk's conditioning (frame indices tell first chunks apart). state: the batch's state.
        frames_per_call: latent frames per decoder pass (None: all of a chunk's at once); fewer bound the
            activation memory and give the same frames.

    Returns:
        per session uint8 (F_pix_b, H, W, 3) RGB frames, and the new cache tensors (`Replace` each).
    """
    B = x0.shape[0]
    first = [(cond.frame_index_host[b][0] if cond.frame_index_host else int(cond.frame_index[b, 0])) == 0
             for b in range(B)]
    frames: list[torch.Tensor | None] = [None] * B
    new_cache: list[list[torch.Tensor]] = [[] for _ in names]
    order: list[int] = []
    for is_first in (True, False):
        rows = [b for b in range(B) if first[b] == is_first]
        if not rows:
            continue
        sub = x0 if len(rows) == B else x0[rows]
        cache = None if is_first else [
            (t if len(rows) == B else t[rows]) for t in (state.tensor(n) for n in names)]
        out, c = vae.decode_chunk(sub.permute(0, 2, 1, 3, 4), cache, first_chunk=is_first,
                                  frames_per_call=frames_per_call)
        pix = frames_to_uint8(out)  # (b, T_pix, H, W, 3)
        for j, b in enumerate(rows):
            frames[b] = pix[j]
        for i, t in enumerate(c):
            new_cache[i].append(t)
        order += rows
    inv = [order.index(b) for b in range(B)]
    updates: StateUpdates = {n: Replace(torch.cat(parts)[inv] if len(parts) > 1 else parts[0])
                             for n, parts in zip(names, new_cache, strict=True)}
    return [f for f in frames if f is not None], updates
