"""ChunkRollout: the runtime-owned loop state of one session's video.

A session's rollout is `init` (commit its initial latent frames, if the
model starts from a picture, and its prompt's caches), then for each chunk:
`begin_chunk` (sample the freshest actions and prompt, draw noise), one
`step` per denoising step, and `finalize` (decode and emit the frames, then
the commit pass that writes the chunk's state). Everything a chunk changes
is staged in `StagedChunk` until `finalize` applies it to the session's
slot of the `StatePool` as one transaction; `abort_chunk` drops it and
leaves every kind of the session's state byte-identical.

A conditioning change (a new prompt) is its own transaction: before the
first step of the next chunk the model re-caches (`WorldModel.set_prompt`;
LongLive's recache) and the result is applied at once, so a later abort of
that chunk keeps the new conditioning. The encoded conditioning is a dict of
named arrays (`models/spec.py` `Conditioning`) the rollout moves to the
device and stacks per batch without interpreting it.

Latent and pixel frames: a chunk of `latent_frames_per_chunk` latent frames
decodes to `spec.chunk_pixel_frames(first_latent)` pixel frames, each
published with its own presentation time (one frame period apart).

The batched forms `denoise_batch` and `finalize_batch` run one step for
several sessions in one forward; `step` and `finalize` are the batch-of-one
case. A `BatchCache` keeps per-chunk batch inputs (conditioning, slot
indices, the batch's latents) across the steps of a chunk, so a step
uploads nothing and stacks nothing while the batch is unchanged.

The rollout keeps no step counter of its own: which denoising step a
session runs is the step scheduler's (`StepSchedulerOutput.steps`), and the
runner passes it in.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from worldcast.engine.errors import StepFailed
from worldcast.engine.state_pool import PoolView, StatePool
from worldcast.engine.step_output import ChunkBatches, ChunkRecord, FrameOut
from worldcast.engine.timing import DeviceTimer
from worldcast.models.base import ChunkConditioning, StateUpdates, WorldModel, select_rows
from worldcast.models.spec import Conditioning

logger = logging.getLogger(__name__)


@dataclass
class ChunkInputs:
    """Conditioning sampled at the start of a chunk.

    Attributes:
        actions: float32 (F_pix, A) action vector per pixel frame of the chunk.
        context: the session's encoded conditioning ({name: array}, `spec.conditioning.tensors`).
        action_seq: seq of the newest action included (-1: none).
        epoch: the session's flush epoch when sampled.
        context_version: bumped by the session on every conditioning change (a model with a
            prompt cache re-caches when it differs from the one committed).
        input_version: the session's input counter when sampled (`Conditioner.input_version`).
    """

    actions: np.ndarray
    context: Conditioning
    action_seq: int
    epoch: int
    context_version: int = 0
    input_version: int = 0


class Conditioner(Protocol):
    """What a rollout needs from its session (`engine/conditioner.py` `SessionConditioner`; warm-up's
    `engine/scripted.py`).

    Called on the device thread; implementations must be thread-safe and quick.
    """

    def sample_chunk(self, frames: int) -> ChunkInputs:
        """The freshest actions for the next `frames` pixel frames and the current conditioning."""
        ...

    def current_epoch(self) -> int:
        """The flush epoch; a chunk sampled under an older epoch is stale."""
        ...

    def wants_frames(self) -> bool:
        """Whether the session should be generating now (active, not paused or cancelled)."""
        ...

    def input_version(self) -> int:
        """A counter bumped by every input the user sent (an action); a chunk sampled at an older
        value has not seen the newest input (a chunk may then start early: `engine/step_scheduler.py`)."""
        ...


@dataclass
class StagedChunk:
    """A chunk in flight; nothing here touches the session's state until commit."""

    serial: int  #: the rollout's chunk counter (identifies the chunk in a `BatchCache`)
    x_t: torch.Tensor  #: (F, C, h, w) current noisy latents
    noise: torch.Tensor  #: (F, C, h, w) the chunk's initial noise (`ChunkConditioning.noise`)
    inputs: ChunkInputs  #: conditioning sampled at chunk start
    action: torch.Tensor  #: the chunk's actions as `group_actions` laid them out (e.g. (F, A')), on the device
    #: {name: (*shape)} the encoded conditioning on the device ({} when the spec says `context_in_chunks=False`
    #: and the conditioning did not change)
    context: dict[str, torch.Tensor]
    latent_indices: list[int]  #: absolute latent index of each of the chunk's F frames
    pixel_indices: list[int]  #: absolute index of each pixel frame the chunk decodes to
    deadline_s: float  #: presentation time of the first pixel frame, s (monotonic)
    began_s: float  #: when the chunk began, s (monotonic)
    needs_prompt_switch: bool = False  #: re-cache for a new conditioning before the first step
    cached_version: int = -1  #: the conditioning version the session's caches held when the chunk began
    denoise_s: float = 0.0  #: time spent on its denoising steps, s
    frames: list[FrameOut] | None = None  #: decoded frames, once `finalize_batch` has decoded (and emitted) them
    #: (batch, row, lock_step) of each denoising step run so far (`ChunkBatches.denoise`)
    denoised_at: list[tuple[int, int, bool]] = field(default_factory=list)
    decode_updates: StateUpdates = field(default_factory=dict)  #: the decoder's staged state changes


@dataclass
class ChunkRollout:
    """Loop state of one session: its state slot, latent-frame counter, conditioning version, staged chunk."""

    session_id: str
    model: WorldModel
    pool: StatePool
    conditioner: Conditioner
    seed: int = 0
    slot: int = -1
    next_latent: int = 0  #: absolute index of the next latent frame to generate
    context_version: int = -1  #: version of the conditioning the session's caches were built for
    staged: StagedChunk | None = None
    generator: torch.Generator | None = None
    _serial: int = 0
    draws: int = 0  #: noise draws since the last committed chunk (`ChunkRecord.draws`)
    last_commit: tuple[int, int] = (1, 0)  #: (batch, row) of the last commit pass (`ChunkBatches.previous_commit`)

    def __post_init__(self) -> None:
        if self.generator is None:
            self.generator = torch.Generator(device=self.model.device)
        self.generator.manual_seed(self.seed)

    # -- lifecycle -----------------------------------------------------------------

    def view(self) -> PoolView:
        return self.pool.view((self.slot,))

    def init(self, now_s: float) -> list[FrameOut]:
        """Allocate the state slot (if not yet held) and commit the initial latent frames and conditioning caches.

        Returns:
            the initial pixel frames (none for a model that starts from noise), presented now.

        Raises:
            StatePoolExhausted: no free slot.
        """
        if self.slot < 0:
            self.slot = self.pool.allocate(self.session_id)
        m, spec = self.model, self.model.spec
        n_lat = spec.initial_latent_frames
        n_pix = spec.pixel_start(n_lat)
        inputs = self.conditioner.sample_chunk(max(1, n_pix))
        image = m.initial_frames(seed=self.seed, context=inputs.context)  # (n_pix, H, W, 3)
        dev = m.device
        # no action made the initial picture: zero actions, laid out as every chunk's are (group_actions)
        acts = m.group_actions(np.zeros((n_pix, spec.actions.dim), np.float32), first_latent=0, latent_frames=n_lat)
        cond = ChunkConditioning(
            action=torch.from_numpy(np.ascontiguousarray(acts, dtype=np.float32)).to(dev)[None],
            context={k: v[None] for k, v in context_tensors(inputs.context, dev).items()},
            frame_index=torch.arange(n_lat, dtype=torch.int64, device=dev)[None],
            frame_index_host=(tuple(range(n_lat)),),
        )
        view = self.view()
        updates = m.init_state(torch.from_numpy(np.ascontiguousarray(image)).to(dev)[None], cond, view)
        self.pool.apply(view, updates)
        self.next_latent = n_lat
        record = ChunkRecord(first_latent=0, draws=0, cached_version=self.context_version,
                             context_version=inputs.context_version, actions=None)
        self.context_version = inputs.context_version
        return [FrameOut(self.session_id, i, image[i], now_s, -1, inputs.epoch, chunk=record if i == 0 else None)
                for i in range(n_pix)]

    def begin_chunk(self, now_s: float, deadline_s: float) -> None:
        """Stage a new chunk with the freshest conditioning and fresh noise."""
        m, spec = self.model, self.model.spec
        F = spec.latent_frames_per_chunk
        first = self.next_latent
        p0 = spec.pixel_start(first)
        n_pix = spec.chunk_pixel_frames(first)
        inputs = self.conditioner.sample_chunk(n_pix)
        acts = m.group_actions(np.asarray(inputs.actions, dtype=np.float32), first_latent=first, latent_frames=F)
        noise = torch.randn((F, *spec.latent_shape), generator=self.generator, device=m.device)
        self.draws += 1
        switch = inputs.context_version != self.context_version
        context = context_tensors(inputs.context, m.device) if spec.context_in_chunks or switch else {}
        self._serial += 1
        self.staged = StagedChunk(
            serial=self._serial,
            x_t=noise,
            noise=noise,
            inputs=inputs,
            action=torch.from_numpy(np.ascontiguousarray(acts, dtype=np.float32)).to(m.device),
            context=context,
            latent_indices=list(range(first, first + F)),
            pixel_indices=list(range(p0, p0 + n_pix)),
            deadline_s=deadline_s,
            began_s=now_s,
            needs_prompt_switch=switch,
            cached_version=self.context_version,
        )

    def abort_chunk(self) -> None:
        """Drop the staged chunk; persistent state is untouched."""
        self.staged = None

    def close(self) -> None:
        """Free the state slot (idempotent)."""
        self.staged = None
        self.pool.free(self.session_id)
        self.slot = -1

    # -- single-session forms ----------------------------------------------------------

    def step(self, index: int) -> None:
        """Run denoising step `index` (0-based) of the staged chunk."""
        denoise_batch([self], [index])

    def finalize(self, now_s: float) -> list[FrameOut]:
        """Commit the staged chunk and return its frames."""
        return finalize_batch([self], now_s)


# -- batches -------------------------------------------------------------------------------------


@dataclass
class _Batch:
    """Per-chunk inputs of one batch of rollouts, reused by every step while the batch is unchanged."""

    cond: ChunkConditioning
    view: PoolView
    x: torch.Tensor | None = None  #: (B, F, C, h, w) the batch's current latents (rows are the staged x_t)


class BatchCache:
    """Per-chunk batch inputs, keyed by the batch's (session, chunk) pairs; a few batches kept.

    Built once per chunk and batch composition: the stacked conditioning, the
    slot index tensor, the model's per-chunk memo (attention masks), and the
    batch's latents, which the steps update in place of re-stacking.
    """

    def __init__(self, capacity: int = 4) -> None:
        self.capacity = capacity
        self._batches: OrderedDict[tuple[tuple[str, int], ...], _Batch] = OrderedDict()
        self._timesteps: dict[tuple[str, tuple[float, ...]], torch.Tensor] = {}

    def timesteps(self, model: WorldModel) -> torch.Tensor:
        """float32 (S + 1,) the spec's flow times then 0, on the model's device (uploaded once)."""
        key = (str(model.device), model.spec.timesteps)
        if key not in self._timesteps:
            self._timesteps[key] = torch.tensor([*model.spec.timesteps, 0.0], dtype=torch.float32,
                                                device=model.device)
        return self._timesteps[key]

    def get(self, rollouts: list[ChunkRollout]) -> _Batch:
        st = [r.staged for r in rollouts]
        assert all(s is not None for s in st), "every rollout in a batch needs a staged chunk"
        key = tuple((r.session_id, s.serial) for r, s in zip(rollouts, st, strict=True))  # type: ignore[union-attr]
        b = self._batches.get(key)
        if b is None:
            m = rollouts[0].model
            dev = m.device
            in_chunks = m.spec.context_in_chunks
            context = ({k: torch.stack([s.context[k] for s in st]) for k in st[0].context}  # type: ignore[union-attr]
                       if in_chunks else {})
            cond = ChunkConditioning(
                action=torch.stack([s.action for s in st]),  # type: ignore[union-attr]
                context=context,
                frame_index=torch.tensor([s.latent_indices for s in st], dtype=torch.int64, device=dev),  # type: ignore[union-attr]
                frame_index_host=tuple(tuple(s.latent_indices) for s in st),  # type: ignore[union-attr]
                noise=torch.stack([s.noise for s in st]),  # type: ignore[union-attr]
            )
            b = _Batch(cond=cond, view=rollouts[0].pool.view(tuple(r.slot for r in rollouts)))
            self._batches[key] = b
            while len(self._batches) > self.capacity:
                self._batches.popitem(last=False)
        else:
            self._batches.move_to_end(key)
        return b

    def clear(self) -> None:
        self._batches.clear()


def _latents(batch: _Batch, st: list[StagedChunk]) -> torch.Tensor:
    """The batch's current latents: its own tensor while every row is still the staged x_t."""
    x = batch.x
    if x is not None and all(s.x_t.data_ptr() == x[i].data_ptr() for i, s in enumerate(st)):
        return x
    return torch.stack([s.x_t for s in st])


def _noise_fn(rollouts: list[ChunkRollout], shape: tuple[int, ...]) -> Callable[[], torch.Tensor]:
    def draw() -> torch.Tensor:
        return torch.stack([torch.randn(shape, generator=r.generator, device=r.model.device) for r in rollouts])
    return draw


def context_tensors(context: Conditioning, device: torch.device) -> dict[str, torch.Tensor]:
    """An encoded conditioning's arrays as tensors on `device` (shapes and dtypes kept)."""
    return {k: torch.from_numpy(np.ascontiguousarray(v)).to(device) for k, v in context.items()}


def switch_prompt(r: ChunkRollout) -> None:
    """Re-cache `r`'s state for the conditioning of its staged chunk, and apply it at once (its own transaction).

    Raises:
        whatever the model's `set_prompt` raises (nothing is applied then).
    """
    s = r.staged
    assert s is not None
    m = r.model
    cond = ChunkConditioning(action=s.action[None], context={k: v[None] for k, v in s.context.items()},
                             frame_index=torch.tensor([s.latent_indices], dtype=torch.int64, device=m.device),
                             frame_index_host=(tuple(s.latent_indices),), noise=s.noise[None])
    view = r.view()
    updates = m.set_prompt(cond, view)
    r.pool.apply(view, updates)
    r.context_version = s.inputs.context_version
    s.needs_prompt_switch = False


def denoise_batch(rollouts: list[ChunkRollout], steps: list[int], cache: BatchCache | None = None) -> None:
    """One denoising step for each rollout, in one batched forward (after any pending conditioning re-cache).

    Args:
        rollouts: each with a staged chunk.
        steps: the denoising step (0-based, < spec.denoising_steps) each rollout runs, as the
            scheduler planned it; chunks may be at different steps (flow times are per sample).

    Nothing here syncs the host with the device; non-finite values are caught
    once per chunk, in `finalize_batch`.
    """
    if len(steps) != len(rollouts):
        raise ValueError(f"{len(steps)} step indices for {len(rollouts)} rollouts")
    for r in rollouts:
        if r.staged is not None and r.staged.needs_prompt_switch:
            switch_prompt(r)
    cache = cache or BatchCache()
    m = rollouts[0].model
    st: list[StagedChunk] = [r.staged for r in rollouts]  # type: ignore[misc]
    batch = cache.get(rollouts)
    ts = cache.timesteps(m)
    if any(not 0 <= k < m.spec.denoising_steps for k in steps):
        raise ValueError(f"denoising step indices {steps} outside 0..{m.spec.denoising_steps - 1}")
    lock_step = all(k == steps[0] for k in steps)
    if lock_step:  # the usual case: views of the uploaded table
        t, t_next = ts[steps[0]].expand(len(st)), ts[steps[0] + 1].expand(len(st))
    else:
        idx = torch.tensor(steps, dtype=torch.int64).to(m.device, non_blocking=True)
        t, t_next = ts[idx], ts[idx + 1]
    t0 = time.perf_counter()
    x_t = _latents(batch, st)
    x0 = m.denoise(x_t, t, batch.cond, batch.view)
    x_next = m.sampler_step(x_t, x0, t, t_next, _noise_fn(rollouts, tuple(x_t.shape[1:])))
    dt = time.perf_counter() - t0
    batch.x = x_next
    for i, s in enumerate(st):
        s.x_t = x_next[i]
        s.denoise_s += dt
        s.denoised_at.append((len(st), i, lock_step))


def finalize_batch(
    rollouts: list[ChunkRollout], now_s: float, emit: Callable[[list[FrameOut]], None] | None = None,
    cache: BatchCache | None = None,
) -> list[FrameOut]:
    """Finish each rollout's chunk (its last denoising step done): decode its frames, then commit (apply the
    chunk's state changes).

    Frames are decoded before the commit forward and handed to `emit` at
    once, so the state-writing forward is off the motion-to-photon path. A
    chunk whose frames were emitted keeps them (`StagedChunk.frames`) and its
    decoder's staged state: if the commit fails and the batch is re-run per
    session, nothing is decoded or emitted twice. Session state changes only
    after every forward of the batch has succeeded.

    Non-finite latents are checked here, once per chunk, with the host copy of
    the decoded frames (the one sync of a chunk).

    Args:
        emit: called with the newly decoded frames (a non-empty list) before the commit forward (None: only
            returned).

    Returns:
        the frames of all committed chunks, in batch order.

    Raises:
        StepFailed: some session's chunk is NaN/Inf (nothing is emitted or applied).
    """
    cache = cache or BatchCache()
    m = rollouts[0].model
    spec = m.spec
    st: list[StagedChunk] = [r.staged for r in rollouts]  # type: ignore[misc]
    assert all(s is not None for s in st), "finalize needs a staged chunk"
    batch = cache.get(rollouts)
    x0 = _latents(batch, st)  # (B, F, C, h, w): x_t at t=0 is x0
    todo = [i for i, s in enumerate(st) if s.frames is None]
    if todo:
        all_rows = len(todo) == len(st)
        sub = x0 if all_rows else x0[todo]
        sub_cond = batch.cond if all_rows else _rows_cond(batch.cond, todo)
        sub_view = batch.view if all_rows else rollouts[0].pool.view(tuple(rollouts[i].slot for i in todo))
        finite = torch.isfinite(sub.flatten(1)).all(dim=1)
        t0 = time.perf_counter()
        images, dec_updates = m.decode(sub, sub_cond, sub_view)
        host = [im.cpu().numpy() for im in images]  # the chunk's one host sync
        decode_s = time.perf_counter() - t0
        bad = [rollouts[todo[j]].session_id for j, ok in enumerate(finite.cpu().tolist()) if not ok]
        if bad:
            raise StepFailed(f"non-finite latents in sessions {bad}")
        period = float(spec.frame_period)
        fresh: list[FrameOut] = []
        for j, i in enumerate(todo):
            r, s = rollouts[i], st[i]
            if host[j].shape[0] != len(s.pixel_indices):
                raise StepFailed(f"{type(m).__name__}.decode gave {host[j].shape[0]} frames for a chunk of "
                                 f"{len(s.pixel_indices)} pixel frames")
            timings = {
                "queue": max(0.0, (now_s - s.began_s) - s.denoise_s) * 1e3,  # waiting between its steps
                "denoise": s.denoise_s * 1e3,
                "decode": decode_s * 1e3,
            }
            record = ChunkRecord(first_latent=s.latent_indices[0], draws=r.draws, cached_version=s.cached_version,
                                 context_version=s.inputs.context_version,
                                 actions=np.asarray(s.inputs.actions, dtype=np.float32),
                                 batches=ChunkBatches(r.last_commit, tuple(s.denoised_at), (len(todo), j)))
            s.frames = [FrameOut(r.session_id, idx, host[j][f], s.deadline_s + f * period, s.inputs.action_seq,
                                 s.inputs.epoch, dict(timings), chunk=record if f == 0 else None)
                        for f, idx in enumerate(s.pixel_indices)]
            s.decode_updates = select_rows(dec_updates, [j]) if dec_updates else {}
            fresh += s.frames
        if emit is not None and fresh:
            emit(fresh)
    updates = m.commit(x0, batch.cond, batch.view)
    # Everything computed: now apply, as one transaction per batch.
    rollouts[0].pool.apply(batch.view, updates)
    frames: list[FrameOut] = []
    for i, (r, s) in enumerate(zip(rollouts, st, strict=True)):
        assert s.frames is not None
        if s.decode_updates:
            r.pool.apply(r.view(), s.decode_updates)
        r.next_latent = s.latent_indices[-1] + 1
        r.staged = None
        r.draws = 0
        r.last_commit = (len(rollouts), i)
        frames += s.frames
    return frames


def _rows_cond(cond: ChunkConditioning, rows: list[int]) -> ChunkConditioning:
    return ChunkConditioning(action=cond.action[rows], context={k: v[rows] for k, v in cond.context.items()},
                             frame_index=cond.frame_index[rows],
                             frame_index_host=tuple(cond.frame_index_host[i] for i in rows),
                             noise=None if cond.noise is None else cond.noise[rows])


def run_chunk_batch(rollouts: list[ChunkRollout], cache: BatchCache | None = None, *, now_s: float = 0.0,
                    timer: DeviceTimer | None = None) -> list[FrameOut]:
    """One whole chunk of `rollouts` as one batch, outside the scheduler (warm-up, benchmarks, checks):
    begin, each denoising step in turn, finalize.

    Args:
        timer: records each denoise step and the commit step (decode + commit pass) as a
            ("denoise" | "commit", batch, seconds) sample (None: not timed).

    Returns:
        the chunk's frames, in batch order.
    """
    cache = cache or BatchCache()
    for r in rollouts:
        r.begin_chunk(now_s, now_s)
    for k in range(rollouts[0].model.spec.denoising_steps):
        token = timer.start() if timer is not None else None
        denoise_batch(rollouts, [k] * len(rollouts), cache)
        if timer is not None:
            timer.stop(token, "denoise", len(rollouts))
    token = timer.start() if timer is not None else None
    frames = finalize_batch(rollouts, now_s, cache=cache)
    if timer is not None:
        timer.stop(token, "commit", len(rollouts))
    return frames
