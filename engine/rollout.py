"""ChunkRollout: the runtime-owned loop state of one session's video.

A session's rollout is `init` (commit the first frame), then for each chunk:
`begin_chunk` (sample the freshest actions and prompt, draw noise), one
`step` per denoising step, and `finalize` (decode and emit the frames, then
commit the chunk's keys and values to the KV pool). Everything a chunk changes is staged in
`StagedChunk` until `finalize`; `abort_chunk` drops it and leaves the
session's persistent state (KV slot, last latent, frame counter)
byte-identical to before the chunk began.

The batched forms `denoise_batch` and `finalize_batch` run one step for
several sessions in one forward; `step` and `finalize` are the batch-of-one
case.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from worldcast.engine.errors import StepFailed
from worldcast.engine.kv_pool import KVPool
from worldcast.engine.step_output import FrameOut
from worldcast.models.base import ChunkConditioning, WorldModel, rectified_flow_update

logger = logging.getLogger(__name__)


@dataclass
class ChunkInputs:
    """Conditioning sampled at the start of a chunk.

    Attributes:
        actions: float32 (F, A) action vector per frame.
        prompt: float32 (P,) prompt embedding.
        action_seq: seq of the newest action included (-1: none).
        epoch: the session's flush epoch when sampled.
    """

    actions: np.ndarray
    prompt: np.ndarray
    action_seq: int
    epoch: int


class Conditioner(Protocol):
    """What a rollout needs from its session (implemented in `sessions/`).

    Called on the device thread; implementations must be thread-safe and quick.
    """

    def sample_chunk(self, frames: int) -> ChunkInputs:
        """The freshest actions for the next `frames` frames and the current prompt."""
        ...

    def current_epoch(self) -> int:
        """The flush epoch; a chunk sampled under an older epoch is stale."""
        ...

    def wants_frames(self) -> bool:
        """Whether the session should be generating now (active, not paused or cancelled)."""
        ...


@dataclass
class StagedChunk:
    """A chunk in flight; nothing here touches the session until commit."""

    x_t: torch.Tensor  #: (F, C, h, w) current noisy latents
    inputs: ChunkInputs  #: conditioning sampled at chunk start
    action: torch.Tensor  #: (F, A) on device
    prompt: torch.Tensor  #: (F, P) on device
    frame_indices: list[int]  #: absolute indices of the chunk's frames
    deadline_s: float  #: presentation time of the first frame, s (monotonic)
    began_s: float  #: when the chunk began, s (monotonic)
    step: int = 0  #: denoising steps done
    x0: torch.Tensor | None = None  #: (F, C, h, w) latest clean prediction
    denoise_s: float = 0.0  #: device time spent on its denoising steps, s
    frames: list[FrameOut] | None = None  #: decoded frames, once `finalize_batch` has decoded (and emitted) them


@dataclass
class ChunkRollout:
    """Loop state of one session: KV slot, last committed latent, frame counter, staged chunk."""

    session_id: str
    model: WorldModel
    pool: KVPool
    conditioner: Conditioner
    seed: int = 0
    slot: int = -1
    prev: torch.Tensor | None = None  #: (C, h, w) last committed latent
    next_frame: int = 0  #: absolute index of the next frame to generate
    staged: StagedChunk | None = None
    generator: torch.Generator = field(default_factory=torch.Generator)

    def __post_init__(self) -> None:
        self.generator.manual_seed(self.seed)

    # -- lifecycle -----------------------------------------------------------------

    def init(self, now_s: float) -> list[FrameOut]:
        """Allocate the KV slot (if not yet held) and commit the initial frame (index 0).

        Returns:
            the initial frame, presented now.

        Raises:
            KVPoolExhausted: no free slot.
        """
        if self.slot < 0:
            self.slot = self.pool.allocate(self.session_id)
        m = self.model
        inputs = self.conditioner.sample_chunk(1)
        image = m.initial_frame(seed=self.seed, prompt_embedding=inputs.prompt)
        z = m.encode_frames(torch.from_numpy(image)[None, None])  # (1, 1, C, h, w)
        cond = self._cond([inputs.actions[:1] * 0], [inputs.prompt], [[0]])
        kv = m.commit(z, z[:, 0], cond, self.pool.view([self.slot]))
        self.pool.append(self.slot, [0], [(k[0], v[0]) for k, v in kv])
        self.prev = z[0, 0]
        self.next_frame = 1
        return [FrameOut(self.session_id, 0, image, now_s, -1, inputs.epoch)]

    def begin_chunk(self, now_s: float, deadline_s: float) -> None:
        """Stage a new chunk with the freshest conditioning and fresh noise."""
        F = self.model.spec.frames_per_chunk
        inputs = self.conditioner.sample_chunk(F)
        noise = torch.randn((F, *self.model.spec.latent_shape), generator=self.generator).to(self.model.device)
        self.staged = StagedChunk(
            x_t=noise,
            inputs=inputs,
            action=torch.from_numpy(np.ascontiguousarray(inputs.actions, dtype=np.float32)).to(self.model.device),
            prompt=torch.from_numpy(np.asarray(inputs.prompt, dtype=np.float32)).to(self.model.device)[None]
            .expand(F, -1),
            frame_indices=list(range(self.next_frame, self.next_frame + F)),
            deadline_s=deadline_s,
            began_s=now_s,
        )

    def abort_chunk(self) -> None:
        """Drop the staged chunk; persistent state is untouched."""
        self.staged = None

    def close(self) -> None:
        """Free the KV slot (idempotent)."""
        self.staged = None
        self.pool.free(self.session_id)
        self.slot = -1

    @property
    def steps_done(self) -> int:
        return self.staged.step if self.staged is not None else 0

    # -- single-session forms ----------------------------------------------------------

    def step(self) -> None:
        """Run one denoising step of the staged chunk."""
        denoise_batch([self])

    def finalize(self, now_s: float) -> list[FrameOut]:
        """Commit the staged chunk and return its frames."""
        return finalize_batch([self], now_s)

    # -- helpers -----------------------------------------------------------------------------

    def _cond(self, actions: list, prompts: list, frames: list[list[int]]) -> ChunkConditioning:
        dev = self.model.device
        a = torch.as_tensor(np.stack(actions), dtype=torch.float32, device=dev)
        p = torch.as_tensor(np.stack(prompts), dtype=torch.float32, device=dev)[:, None].expand(-1, a.shape[1], -1)
        return ChunkConditioning(action=a, prompt=p, frame_index=torch.tensor(frames, device=dev))


def _batch_cond(rollouts: list[ChunkRollout]) -> ChunkConditioning:
    st = [r.staged for r in rollouts]
    assert all(s is not None for s in st), "every rollout in a batch needs a staged chunk"
    return ChunkConditioning(
        action=torch.stack([s.action for s in st]),  # type: ignore[union-attr]
        prompt=torch.stack([s.prompt for s in st]),  # type: ignore[union-attr]
        frame_index=torch.tensor([s.frame_indices for s in st], device=rollouts[0].model.device),  # type: ignore[union-attr]
    )


def _check_finite(rollouts: list[ChunkRollout], x: torch.Tensor) -> None:
    bad = ~torch.isfinite(x.flatten(1)).all(dim=1)
    if bool(bad.any()):
        ids = [r.session_id for r, b in zip(rollouts, bad.tolist(), strict=True) if b]
        raise StepFailed(f"non-finite latents in sessions {ids}")


def denoise_batch(rollouts: list[ChunkRollout]) -> None:
    """One denoising step for each rollout, in one batched forward.

    Each rollout's chunk may be at a different step (flow times are per sample).

    Raises:
        StepFailed: the output of some session is NaN/Inf (nothing is updated).
    """
    m = rollouts[0].model
    ts = m.spec.timesteps
    st = [r.staged for r in rollouts]
    x_t = torch.stack([s.x_t for s in st])  # type: ignore[union-attr]  (B, F, C, h, w)
    prev = torch.stack([r.prev for r in rollouts])  # type: ignore[misc]  (B, C, h, w)
    t = torch.tensor([ts[s.step] for s in st], device=m.device)  # type: ignore[union-attr]
    t_next = torch.tensor([ts[s.step + 1] if s.step + 1 < len(ts) else 0.0 for s in st], device=m.device)  # type: ignore[union-attr]
    cache = rollouts[0].pool.view([r.slot for r in rollouts])
    t0 = time.perf_counter()
    x0 = m.denoise(x_t, prev, t, _batch_cond(rollouts), cache)
    x_next = rectified_flow_update(x_t, x0, t, t_next)
    _check_finite(rollouts, x_next)
    dt = time.perf_counter() - t0
    for i, s in enumerate(st):
        s.x_t, s.x0 = x_next[i], x0[i]  # type: ignore[union-attr]
        s.step += 1  # type: ignore[union-attr]
        s.denoise_s += dt  # type: ignore[union-attr]


def finalize_batch(
    rollouts: list[ChunkRollout], now_s: float, emit: Callable[[list[FrameOut]], None] | None = None
) -> list[FrameOut]:
    """Finish each rollout's chunk: decode its frames, then commit (KV append, last latent, frame counter).

    Frames are decoded before the commit forward and handed to `emit` at
    once, so the KV-writing forward is off the motion-to-photon path. A
    chunk whose frames were emitted keeps them (`StagedChunk.frames`): if
    the commit fails and the batch is re-run per session, nothing is
    decoded or emitted twice. Session state changes only after every
    forward of the batch has succeeded.

    Args:
        emit: called with the newly decoded frames before the commit forward (None: only returned).

    Returns:
        the frames of all committed chunks, in batch order.
    """
    m = rollouts[0].model
    st = [r.staged for r in rollouts]
    assert all(s is not None and s.step == m.spec.denoising_steps for s in st), "finalize before last step"
    x0 = torch.stack([s.x_t for s in st])  # type: ignore[union-attr]  (B, F, C, h, w): x_t at t=0 is x0
    todo = [i for i, s in enumerate(st) if s.frames is None]  # type: ignore[union-attr]
    if todo:
        t0 = time.perf_counter()
        images = m.decode(x0 if len(todo) == len(st) else x0[todo]).cpu().numpy()  # (b, F, H, W, 3); no copy when all
        decode_s = time.perf_counter() - t0
        period = float(m.spec.frame_period)
        fresh: list[FrameOut] = []
        for j, i in enumerate(todo):
            r, s = rollouts[i], st[i]
            assert s is not None
            timings = {
                "queue": max(0.0, (now_s - s.began_s) - s.denoise_s) * 1e3,  # waiting between its steps
                "denoise": s.denoise_s * 1e3,
                "decode": decode_s * 1e3,
            }
            s.frames = [FrameOut(r.session_id, idx, images[j, f], s.deadline_s + f * period, s.inputs.action_seq,
                                 s.inputs.epoch, dict(timings)) for f, idx in enumerate(s.frame_indices)]
            fresh += s.frames
        if emit is not None:
            emit(fresh)
    prev = torch.stack([r.prev for r in rollouts])  # type: ignore[misc]
    kv = m.commit(x0, prev, _batch_cond(rollouts), rollouts[0].pool.view([r.slot for r in rollouts]))
    # Everything computed: now apply, session by session.
    frames: list[FrameOut] = []
    for i, (r, s) in enumerate(zip(rollouts, st, strict=True)):
        assert s is not None and s.frames is not None
        r.pool.append(r.slot, s.frame_indices, [(k[i], v[i]) for k, v in kv])
        r.prev = x0[i, -1]
        r.next_frame = s.frame_indices[-1] + 1
        r.staged = None
        frames += s.frames
    return frames
