"""The world-model interface the engine drives, and the state updates models return.

A `WorldModel` holds no per-session state. Every call gets a batch of
sessions' declared state (`StateView`, read in place from the engine's
pool) and returns what the call would change as `StateUpdate`s; the engine
stages those and applies them when the chunk commits, so a failed or
cancelled chunk never advances a session.

Conditioning: `encode_conditioning` turns a user's request (text, image)
into named arrays the engine carries without interpreting them.

One session's life, as the engine drives it (`engine/rollout.py`):
    init_state            commit the initial latent frames (if any) and the conditioning's caches
    per chunk:
      [set_prompt]        when the prompt changed: re-cache (its own transaction)
      denoise + sampler_step, once per timestep
      decode              frames out (and the decoder's own state)
      commit              the pass at `spec.commit_timestep` that writes the chunk's KV

Precision and compiled steps (chosen by the engine at warm-up, `engine/tuning/warmup.py`):
`set_precision` switches the compute dtype among `spec.precisions.dtypes`
(weights converted once per dtype, never cast per call); `compile_steps`
routes the model's hot pure-tensor functions through the engine's compiler
(`StepWrap`). Both are optional: a model that declares one dtype and no
compilable steps runs as it is.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from worldcast.models.errors import ConditioningError
from worldcast.models.spec import Conditioning, ConditioningRequest, WorldModelSpec

# -- state updates (returned by the model, applied by the engine) -------------------------------


@dataclass
class RingWrite:
    """New keys and values of an `AttentionRingSpec` state, for latent frames `frames`.

    Attributes:
        frames: int64 (B, F) absolute latent frame of each written frame (host or device).
        k, v: per layer (B, F * tokens_per_frame, heads, head_dim), frame-major tokens.
    """

    frames: torch.Tensor
    k: list[torch.Tensor]
    v: list[torch.Tensor]


@dataclass
class FrameWrite:
    """New entries of a `FrameRingSpec` state for latent frames `frames`: data (B, F, *frame_shape)."""

    frames: torch.Tensor
    data: torch.Tensor


@dataclass
class Replace:
    """A `TensorStateSpec` state's new value, whole: data (B, *shape)."""

    data: torch.Tensor


@dataclass
class MemoryWrite:
    """Cells of a `WorldMemorySpec` state written in place: one chunk's view of the world.

    Attributes:
        cells: int64 (B, K) flat cell index (row * side + column) of each written cell; a row's cells are
            distinct (the pool writes them with one indexed copy).
        values: uint8 (B, K, channels) what each cell now shows.
        tags: int32 (B, K) which ground each cell now holds (the model's code; 0: nothing).
    """

    cells: torch.Tensor
    values: torch.Tensor
    tags: torch.Tensor


StateUpdate = RingWrite | FrameWrite | Replace | MemoryWrite
#: {state name: its update}; states not named are unchanged.
StateUpdates = dict[str, StateUpdate]


def select_rows(updates: StateUpdates, rows: list[int]) -> StateUpdates:
    """The updates of batch rows `rows` only (views where the rows are one contiguous run)."""
    def take(x: torch.Tensor) -> torch.Tensor:
        if rows == list(range(rows[0], rows[-1] + 1)):
            return x[rows[0]:rows[-1] + 1]
        return x[rows]

    out: StateUpdates = {}
    for name, u in updates.items():
        if isinstance(u, RingWrite):
            out[name] = RingWrite(take(u.frames), [take(k) for k in u.k], [take(v) for v in u.v])
        elif isinstance(u, FrameWrite):
            out[name] = FrameWrite(take(u.frames), take(u.data))
        elif isinstance(u, MemoryWrite):
            out[name] = MemoryWrite(take(u.cells), take(u.values), take(u.tags))
        else:
            out[name] = Replace(take(u.data))
    return out


# -- what the model reads -------------------------------------------------------------------------


class StateView(Protocol):
    """A batch of sessions' declared state, as the engine's pool lends it to a model call.

    Attention rings and world memory are read in place (`ring` and `memory` give the pool's own
    tensors and the batch's slots); other state is handed over per batch.
    """

    @property
    def batch(self) -> int:
        """B, sessions in the batch."""
        ...

    @property
    def slots(self) -> torch.Tensor:
        """int64 (B,) each session's slot on the device."""
        ...

    @property
    def slots_host(self) -> tuple[int, ...]:
        """The same slots on the host."""
        ...

    def ring(self, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """An `AttentionRingSpec` state of every slot: (k, v, frame) with k, v
        (S, layers, L, heads, head_dim) and frame int64 (S, P), the pool's own tensors (index them with
        `slots`; never write to them)."""
        ...

    def memory(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """A `WorldMemorySpec` state of every slot: (canvas uint8 (S, side, side, channels), tag int32
        (S, side, side)), the pool's own tensors (index them with `slots`; never write to them)."""
        ...

    def tensor(self, name: str) -> torch.Tensor:
        """A `TensorStateSpec` state of the batch: (B, *shape) (a view for one session, else a gathered copy)."""
        ...

    def frames(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """A `FrameRingSpec` state of the batch: (data (B, P, *frame_shape), frame int64 (B, P))."""
        ...


@dataclass
class ChunkConditioning:
    """Conditioning of one chunk of a batch of sessions (built once per chunk, reused by every step).

    Attributes:
        action: float32 (B, ...) each session's actions, as `WorldModel.group_actions` laid them out
            (e.g. (B, F, A') per latent frame).
        context: {name: (B, *shape)} each session's encoded conditioning, by the names and shapes of
            `spec.conditioning.tensors`; {} in a chunk of a model whose spec says `context_in_chunks=False`
            (it keeps what it derives, e.g. a prompt cache, in declared state).
        frame_index: int64 (B, F) absolute latent frame index of each of the chunk's frames.
        frame_index_host: the same on the host (for decisions that must not sync with the device).
        noise: float32 (B, F, C, h, w) each session's initial noise for the chunk, as `begin_chunk` drew it
            from the session's generator (None in an init step, which draws none). Every step and the
            commit see the same; a model whose commit depends on it (TinyWorld's draw noise) reads it here,
            since a chunk's steps and its commit may run in different batches.
        memo: per-chunk values a model derives once and reuses across steps (e.g. attention masks);
            valid while the batch and the chunk are unchanged.
    """

    action: torch.Tensor
    context: dict[str, torch.Tensor]
    frame_index: torch.Tensor
    frame_index_host: tuple[tuple[int, ...], ...] = ()
    noise: torch.Tensor | None = None
    memo: dict[str, object] = field(default_factory=dict)

    @property
    def batch(self) -> int:
        return int(self.frame_index.shape[0])


#: Draws fresh Gaussian noise shaped like the batch's latents, each session from its own generator.
NoiseFn = Callable[[], torch.Tensor]

#: A pure-tensor step function a model may have compiled: every argument a tensor whose dim 0 is the
#: batch, returning a tensor or a tuple of tensors whose dim 0 is the batch; no side effects, no host
#: syncs, no Python state read that changes between calls (so a compiled graph may replace it and a
#: batch may be padded to a compiled size by repeating its last row).
StepFn = Callable[..., Any]
#: The engine's compiler: (step name, function) -> a callable with the same contract (`engine/tuning/compiled.py`).
StepWrap = Callable[[str, StepFn], StepFn]


class WorldModel(abc.ABC):
    """A causal video world model: batched denoise, sampler step, decode, commit; no session state.

    Subclasses set `spec` and `device` and implement the abstract methods.
    Latents are (B, F, C, h, w) with (C, h, w) = spec.latent_shape, F latent frames.
    """

    spec: WorldModelSpec
    device: torch.device
    #: whether `load_encoders` uses only the CPU (no device an engine measures at its warm-up), so the server
    #: may run it beside engine processes' warm-ups
    encoders_on_cpu: bool = False

    # -- precision and compiled steps (warm-up, before any session) -----------------------------

    @property
    def precision(self) -> torch.dtype:
        """The dtype the model computes in now (the reference, `spec.precisions.dtypes[0]`, until
        `set_precision`)."""
        return getattr(self, "_precision", self.spec.precisions.reference)

    def set_precision(self, dtype: torch.dtype) -> None:
        """Compute in `dtype` from now on; the engine calls it at warm-up, before any session exists.

        A model that declares more than one dtype overrides this: weights are converted once per
        dtype (and kept), inputs cast at the entry of its step functions, latents returned in
        float32; the state's declared dtypes may follow (`spec` is then replaced, and the engine
        allocates its pool from the new one). The default supports the reference dtype only.

        Raises:
            ValueError: `dtype` is not one of `spec.precisions.dtypes`.
        """
        if dtype not in self.spec.precisions.dtypes:
            raise ValueError(f"{self.spec.name} runs in {list(self.spec.precisions.dtypes)}, not {dtype}")
        if dtype != self.spec.precisions.reference:
            raise NotImplementedError(f"{type(self).__name__} declares {dtype} but does not implement set_precision")
        self._precision = dtype

    def compile_steps(self, wrap: StepWrap | None) -> tuple[str, ...]:
        """Route the model's hot step functions through `wrap` (None: back to eager).

        A model that has pure-tensor step functions (`StepFn`) calls `wrap(name, fn)` for each
        and uses what it returns from then on, in the current and every later precision. The
        default has none.

        Returns:
            the names of the wrapped step functions (() when there are none).
        """
        return ()

    # -- conditioning (event loop or device thread) ------------------------------------------

    @abc.abstractmethod
    def encode_conditioning(self, request: ConditioningRequest) -> Conditioning:
        """A session's conditioning request -> its encoding, {name: array} as `spec.conditioning.tensors` declares.

        The request has passed `spec.conditioning.validate`; a missing prompt means the
        default prompt, a missing image the model's declared default image. May be slow
        (a text encoder, an image resize); runs on a worker thread, never the device thread.

        Raises:
            ConditioningError: input the model refuses (names the field and the reason).
        """

    def load_encoders(self) -> None:
        """Load what `encode_conditioning` needs (a text encoder, say), so no user's first request pays
        for it. The session manager calls it once at start, on a worker thread: beside engine processes'
        warm-ups where `encoders_on_cpu`, else after the warm-ups. The default encodes the default
        conditioning, where the model has one.

        Raises:
            whatever `encode_conditioning` raises (an install problem: the encoder is missing).
        """
        try:
            self.spec.conditioning.validate(ConditioningRequest())
        except ConditioningError:
            return  # the model needs an image and has no default one: nothing to load without one
        self.encode_conditioning(ConditioningRequest())

    @abc.abstractmethod
    def encode_action(self, keys: dict[str, bool], axes: dict[str, float]) -> np.ndarray:
        """One pixel frame's actions -> float32 (spec.actions.dim,).

        Args:
            keys: every declared key -> whether it is held.
            axes: every declared axis -> its value for this frame, model units (scaled and clipped:
                `ActionSpace.axis_values`); an axis left out is at rest.
        """

    def action_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """The least and greatest value of each element of an action vector the live path can make: float32
        (spec.actions.dim,) each.

        What replay checks a log's action vectors against (`sessions/replay.py`). The default evaluates
        `encode_action` at rest, with each key alone and all keys, and with each axis and all axes at their
        extents (`Axis.extent`), with and without all keys, and takes the elementwise least and greatest: a bound
        for an encoding monotone in each input. A model whose encoding is not overrides it.
        """
        space = self.spec.actions
        none = {k: False for k in space.keys}
        every = {k: True for k in space.keys}
        rest = {a.name: a.model_value(a.rest) if a.kind == "absolute" else 0.0 for a in space.axes}
        key_sets = [none, every, *({**none, k: True} for k in space.keys)]
        axis_sets = [rest]
        for end in (0, 1):
            axis_sets.append({a.name: a.extent()[end] for a in space.axes})
            axis_sets += [{**rest, a.name: a.extent()[end]} for a in space.axes]
        rows = np.stack([np.asarray(self.encode_action(k, a), np.float32) for k in key_sets for a in axis_sets])
        return rows.min(0), rows.max(0)

    def group_actions(self, actions: np.ndarray, *, first_latent: int, latent_frames: int) -> np.ndarray:
        """Per-pixel-frame actions of `latent_frames` latent frames from `first_latent` -> the model's layout.

        Args:
            actions: float32 (F_pix, spec.actions.dim), F_pix = the pixel frames those latent frames decode to.

        Returns:
            float32 array, the same shape for every chunk of a session (the default: (latent_frames, dim),
            the last pixel frame's action of each latent frame); stacked per batch into
            `ChunkConditioning.action`.
        """
        spec = self.spec
        ends = [spec.pixel_start(first_latent + i + 1) - spec.pixel_start(first_latent) - 1
                for i in range(latent_frames)]
        return actions[ends]

    @abc.abstractmethod
    def initial_frames(self, *, seed: int, context: Conditioning) -> np.ndarray:
        """The picture a session starts from: uint8 (spec.pixel_start(spec.initial_latent_frames), H, W, 3)
        RGB pixel frames (none when `initial_latent_frames` is 0); `context` is the session's encoding."""

    # -- device work (device thread) -----------------------------------------------------------

    @abc.abstractmethod
    def init_state(self, frames: torch.Tensor, cond: ChunkConditioning, state: StateView) -> StateUpdates:
        """A new session's first updates: its initial latent frames and prompt caches.

        Args:
            frames: uint8 (B, n, H, W, 3) the initial pixel frames (n may be 0).
            cond: conditioning of the initial latent frames (frame_index (B, initial_latent_frames)).
            state: the new sessions' (empty) state.
        """

    def set_prompt(self, cond: ChunkConditioning, state: StateView) -> StateUpdates:
        """Re-cache for a new conditioning (`cond.context`) before the next chunk (`cond.frame_index`).

        Models whose conditioning is ordinary per-chunk input need nothing (the default).
        """
        return {}

    @abc.abstractmethod
    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: ChunkConditioning, state: StateView) -> torch.Tensor:
        """One denoising step's prediction of the clean chunk.

        Args:
            x_t: (B, F, C, h, w) noisy latents at flow time `t`.
            t: float32 (B,) each session's flow time in (0, 1].

        Returns:
            (B, F, C, h, w) predicted clean latents x0.
        """

    def sampler_step(self, x_t: torch.Tensor, x0: torch.Tensor, t: torch.Tensor, t_next: torch.Tensor,
                     noise: NoiseFn) -> torch.Tensor:
        """The sampler's move from flow time t to t_next (t_next = 0 after the last step returns x0).

        The default is the deterministic rectified-flow step (`rectified_flow_update`).
        """
        return rectified_flow_update(x_t, x0, t, t_next)

    @abc.abstractmethod
    def decode(self, x0: torch.Tensor, cond: ChunkConditioning, state: StateView) -> tuple[list[torch.Tensor],
                                                                                         StateUpdates]:
        """Latents (B, F, C, h, w) -> per session uint8 (F_pix_b, H, W, 3) RGB pixel frames, and the
        decoder's own state updates (e.g. its causal-conv cache)."""

    @abc.abstractmethod
    def commit(self, x0: torch.Tensor, cond: ChunkConditioning, state: StateView) -> StateUpdates:
        """The pass at `spec.commit_timestep` over the finished chunk: what it writes to the session's state."""

    def plan_activation_memory(self, *, available_bytes: int, max_batch: int) -> str | None:
        """Fit the model's activation memory into `available_bytes` (device memory left after the weights and
        the state pool) for batches of up to `max_batch` sessions, e.g. by choosing how many frames a decoder
        pass takes. Called once by the engine at start-up; returns a line for the start-up log (None: nothing
        to plan, the default)."""
        return None


def rectified_flow_update(x_t: torch.Tensor, x0: torch.Tensor, t: torch.Tensor, t_next: torch.Tensor) -> torch.Tensor:
    """Deterministic rectified-flow (DDIM-like) step from flow time t to t_next < t.

    With x_t = (1 - t) x0 + t eps, the implied noise is eps = (x_t - (1 - t) x0) / t,
    and x_{t_next} = (1 - t_next) x0 + t_next eps (Liu et al. 2022, "Flow
    Straight and Fast"; Song et al. 2021, DDIM). t_next = 0 returns x0.

    Args:
        x_t: (B, ...) latents; x0: (B, ...) predicted clean latents;
        t, t_next: float32 (B,) flow times.
    """
    shape = (-1,) + (1,) * (x_t.dim() - 1)
    t = t.reshape(shape).clamp_min(1e-6)
    t_next = t_next.reshape(shape)
    eps = (x_t - (1 - t) * x0) / t
    return (1 - t_next) * x0 + t_next * eps


def renoise_update(x0: torch.Tensor, t_next: torch.Tensor, noise: NoiseFn) -> torch.Tensor:
    """Self-Forcing's stochastic step: re-noise the clean prediction to t_next with fresh noise.

    x_{t_next} = (1 - t_next) x0 + t_next eps', eps' ~ N(0, I) drawn anew
    (Huang et al. 2025, "Self Forcing", `pipeline/causal_inference.py`:
    `scheduler.add_noise(x0, randn, t_next)`). t_next = 0 returns x0 exactly (noise is
    still drawn, so a session's generator advances the same way whatever its step).

    Args:
        x0: (B, ...) predicted clean latents; t_next: float32 (B,) flow times.
        noise: draws (B, ...) fresh noise from each session's own generator.
    """
    shape = (-1,) + (1,) * (x0.dim() - 1)
    tn = t_next.reshape(shape).to(x0.dtype)
    return (1 - tn) * x0 + tn * noise()


def weights_digest(model: object) -> str:
    """sha256 (hex) of a model's weights as they are served: every parameter and buffer of the `torch.nn.Module`s
    it holds as attributes, by attribute and tensor name, with dtype and shape, after the served dtype is applied
    (`set_precision`). What recordings name and `worldcast replay` checks (`sessions/recording.py`); the engine
    that serves the model computes it (`engine/device_worker.py`), since an engine process holds its own copy.

    Takes about a second a GB of weights on a CPU (a device's weights are copied to the host first).
    """
    h = hashlib.sha256()
    for attr in sorted(vars(model)):
        mod = getattr(model, attr)
        if not isinstance(mod, torch.nn.Module):
            continue
        for name, t in sorted(mod.state_dict().items()):
            x = t.detach().to("cpu").contiguous()
            h.update(f"{attr}.{name}:{x.dtype}:{tuple(x.shape)}".encode())
            h.update(x.reshape(-1).view(torch.uint8).numpy().tobytes() if x.numel() else b"")
    return h.hexdigest()
