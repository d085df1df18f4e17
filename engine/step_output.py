"""The contract between the StepScheduler and the StepRunner: plain dataclasses.

The scheduler decides (`StepSchedulerOutput`), the runner executes on the
device and reports (`StepRunnerOutput`). Session IDs and numbers only; no
tensors cross this line. The scheduler is the one owner of every session's
phase and denoising step: the runner carries a plan out literally (drops the
chunks it names, begins the chunks it names, runs each session's named step)
and keeps no count of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

#: Kinds of step: "init" commits a session's initial latent frames and prompt caches; "denoise" runs one
#: denoising step of the current chunk; "commit" decodes a finished chunk's
#: frames, publishes them, then appends the chunk to the KV cache.
StepKind = Literal["init", "denoise", "commit"]


@dataclass
class StepSchedulerOutput:
    """One scheduling decision: which step runs next, for which sessions."""

    kind: StepKind | None  #: the step kind of this batch; None when nothing is ready
    session_ids: list[str]  #: sessions in the batch, earliest deadline first
    begin_chunk_ids: list[str]  #: sessions in the batch starting a new chunk with this step (sample, draw noise)
    deadlines_s: dict[str, float]  #: session id -> presentation time of its chunk's first frame, s (monotonic)
    next_wake_s: float | None  #: when an idle runner should ask again, s (monotonic); None = on event
    #: session id -> the denoising step it runs, 0-based (denoise steps only)
    steps: dict[str, int] = field(default_factory=dict)
    #: sessions whose staged chunk the runner drops before this step (flush, cancel, pause: their
    #: persistent state is untouched); may be set on an otherwise empty plan
    preempted_session_ids: list[str] = field(default_factory=list)

    @classmethod
    def make_empty(cls, next_wake_s: float | None = None,
                   preempted_session_ids: list[str] | None = None) -> StepSchedulerOutput:
        return cls(kind=None, session_ids=[], begin_chunk_ids=[], deadlines_s={}, next_wake_s=next_wake_s,
                   preempted_session_ids=list(preempted_session_ids or []))

    @property
    def is_empty(self) -> bool:
        return not self.session_ids


@dataclass(frozen=True)
class ChunkBatches:
    """Where a chunk's forwards ran: each as (batch size, the session's row in it). A batched forward's kernels
    may sum in another order at another batch size, so replaying a session exactly runs each forward at the
    recorded size and row (`sessions/replay.py`); a session that always ran alone has all (1, 0).

    Attributes:
        previous_commit: (batch, row) of the commit pass that wrote the session's previous chunk (it runs after
            that chunk's frames, and so its record, are out; (1, 0) after the initial frames).
        denoise: per denoising step of this chunk, (batch, row, lock_step): lock_step False when the batch's
            sessions were at different denoising steps (their flow times gathered per row).
        decode: (batch, row) of the decode pass that made this chunk's frames.
    """

    previous_commit: tuple[int, int]
    denoise: tuple[tuple[int, int, bool], ...]
    decode: tuple[int, int]

    @property
    def alone(self) -> bool:
        """Every forward ran at batch 1."""
        return (self.previous_commit[0] == 1 and self.decode[0] == 1
                and all(b == 1 for b, _, _ in self.denoise))


@dataclass(frozen=True)
class ChunkRecord:
    """What made a chunk's frames, beyond the session's seed and model: enough to generate them again exactly
    (`worldcast replay`, `sessions/recording.py`). Carried by the first frame of each committed chunk.

    Attributes:
        first_latent: absolute index of the chunk's first latent frame (0 with `actions` None: the initial frames).
        draws: noise draws since the previous committed chunk, this one's included: a chunk begun and then
            dropped (preempted for a fresher input) drew its noise from the session's generator too.
        cached_version: the conditioning version the session's caches held when the chunk began (-1: none yet).
        context_version: the conditioning version the chunk sampled.
        actions: float32 (F_pix, A): the action vector of each of its pixel frames as sampled (None: initial
            frames, made by no action).
        batches: where its forwards ran in their batches (None: the initial frames, made alone).
    """

    first_latent: int
    draws: int
    cached_version: int
    context_version: int
    actions: np.ndarray | None
    batches: ChunkBatches | None = None


@dataclass
class FrameOut:
    """One generated frame, ready for a session's sinks.

    Attributes:
        session_id: owner.
        frame_index: absolute index in the session (0 = initial frame).
        image: uint8 (H, W, 3) RGB.
        present_at_s: intended presentation time, s on the engine's monotonic clock.
        action_seq: seq of the last action applied in this frame (-1: none yet).
        epoch: flush epoch of the conditioning it was generated under.
        timings_ms: per-stage times of its chunk up to publication, ms: queue (waiting between its
            steps), denoise (its denoising steps), decode (latents to pixels), and ipc (from an engine
            process to the server: pipe and shared-memory copy; absent in-process). The state-applying
            commit forward runs after the frame is published and is not on its path.
        chunk: on the first frame of each committed chunk (and of the initial frames), what made it
            (`ChunkRecord`); None on the others.
        lost: its pixels never reached the server (an engine process's frame ring was full: `image` is empty,
            uint8 (0, 0, 3)); it is told anyway, so a recording keeps its chunk record and its place.
    """

    session_id: str
    frame_index: int
    image: np.ndarray
    present_at_s: float
    action_seq: int
    epoch: int
    timings_ms: dict[str, float] = field(default_factory=dict)
    chunk: ChunkRecord | None = None
    lost: bool = False


@dataclass(frozen=True)
class BegunChunk:
    """What a chunk that began in a step was sampled under (the scheduler tells a stale chunk by it)."""

    epoch: int  #: the session's flush epoch when its conditioning was sampled
    input_version: int  #: the session's input counter then (`Conditioner.input_version`)


@dataclass
class StepRunnerOutput:
    """What executing one `StepSchedulerOutput` produced."""

    step_time_s: float  #: wall time of the step on the host, s
    frames: list[FrameOut]  #: frames of chunks committed by this step (not yet published)
    failed: dict[str, str]  #: session id -> reason, for sessions whose step failed (others unaffected)
    #: (kind, batch size, seconds) of each batch that ran cleanly, as it actually ran (a batch split
    #: after a failure reports its parts; a failed or overrunning group reports nothing); device time
    #: on an accelerator (CUDA events, reported once complete, possibly a later step), else wall time
    cost_samples: list[tuple[StepKind, int, float]] = field(default_factory=list)
    #: pixel frames produced per session (init steps; commit steps may emit before returning)
    frames_by_session: dict[str, int] = field(default_factory=dict)
    #: session id -> what its chunk was sampled under, for the chunks that began in this step
    began: dict[str, BegunChunk] = field(default_factory=dict)

    @classmethod
    def make_empty(cls) -> StepRunnerOutput:
        return cls(step_time_s=0.0, frames=[], failed={})
