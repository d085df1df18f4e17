"""StepScheduler: which sessions' steps run next on the device, by deadline.

Synchronous, no I/O, no wall clock: `schedule(now_s)` returns a plan and
`update_from_output(plan, result, now_s)` takes what the runner measured,
so the policy is testable with a fake clock. The device worker
(`engine/device_worker.py`) drives it.

Policy:
- Every chunk has a deadline, the presentation time of its first frame.
  Steps run earliest-deadline-first (EDF; Liu & Layland 1973).
- A chunk starts as late as it safely can: at its deadline minus the
  predicted chunk time (from the `CostModel`) times a safety factor, so it
  samples the freshest actions.
- Ready steps of the same kind from different sessions run as one batch,
  up to `max_batch` (1 turns batching off). Flow times differ per sample.
  A chunk due to start within `join_frames` frame periods starts early to
  join a denoise batch, so sessions fall into step with each other instead
  of each paying a batch-of-one forward.
- Chunk deadlines of all sessions lie on one grid of chunk periods
  (`align_to_grid`): a new, resumed or rebased session's first deadline is
  rounded up to the next grid point, so sessions are due together and
  their steps batch in lock step instead of drifting out of phase into
  batches of one (which costs nearly twice the device time per frame).
  A flush still starts its chunk at once; only its deadline is on the grid.
- A session that falls behind by more than `max_lateness_frames` frames is
  rebased: its next deadline moves to now plus one chunk time, so lateness
  never accumulates into a backlog, and under overload every session slows
  by a similar share (EDF serves the most overdue first).
"""

from __future__ import annotations

import enum
import logging
import math
from dataclasses import dataclass, field

from worldcast.engine.cost_model import CostModel
from worldcast.engine.step_output import StepKind, StepRunnerOutput, StepSchedulerOutput

logger = logging.getLogger(__name__)


class Phase(enum.IntEnum):
    """Where a session's rollout is."""

    NEW = 0  #: needs its initial frame committed
    WAITING = 1  #: between chunks; the next one starts at `start_at_s`
    RUNNING = 2  #: a chunk is staged; `step` denoising steps done
    IDLE = 3  #: not generating (paused, cancelled or inactive)


@dataclass(frozen=True)
class SchedulerConfig:
    """StepScheduler settings."""

    frame_period_s: float  #: seconds per pixel frame (1 / fps)
    frames_per_chunk: int  #: pixel frames per chunk (a steady-state chunk)
    denoising_steps: int  #: denoising steps per chunk
    first_chunk_frames: int | None = None  #: pixel frames of a session's first chunk (None: frames_per_chunk)
    max_batch: int = 8  #: most sessions in one batched step; 1 disables batching
    safety: float = 1.3  #: multiplier on the predicted chunk time when choosing a start time
    margin_s: float = 0.005  #: extra lead time before a deadline, s
    max_lateness_frames: float = 1.0  #: lateness (in frames) beyond which a session is rebased
    join_frames: float = 0.5  #: a waiting chunk due to start within this many frame periods joins a batch now
    align_to_grid: bool = True  #: put every session's chunk deadlines on one shared grid of chunk periods

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        if self.frames_per_chunk < 1 or (self.first_chunk_frames is not None and self.first_chunk_frames < 1):
            raise ValueError("chunks must hold at least one pixel frame")

    def chunk_frames(self, chunks_done: int) -> int:
        """Pixel frames of a session's chunk after `chunks_done` committed chunks."""
        if chunks_done == 0 and self.first_chunk_frames is not None:
            return self.first_chunk_frames
        return self.frames_per_chunk


@dataclass
class _Entry:
    phase: Phase = Phase.NEW
    step: int = 0  #: denoising steps done in the staged chunk
    deadline_s: float = 0.0  #: presentation time of the next (or current) chunk's first frame
    start_at_s: float = 0.0  #: when the next chunk should begin
    frames: int = 0  #: pixel frames emitted
    chunks: int = 0  #: chunks committed
    late_frames: int = 0  #: frames committed after their presentation time + one period


@dataclass(frozen=True)
class SessionSchedule:
    """A read-only copy of one session's schedule (see `StepScheduler.schedule_of`)."""

    phase: Phase
    step: int  #: denoising steps done in the staged chunk
    deadline_s: float  #: presentation time of the next (or current) chunk's first frame, s
    start_at_s: float  #: when the next chunk should begin, s
    frames: int  #: pixel frames emitted
    chunks: int  #: chunks committed
    late_frames: int  #: frames committed more than one frame period after their presentation time


@dataclass
class StepScheduler:
    """Earliest-deadline-first step scheduler with cross-session batching."""

    config: SchedulerConfig
    cost: CostModel = field(default_factory=CostModel)
    _entries: dict[str, _Entry] = field(default_factory=dict)
    _grid_origin_s: float | None = None  #: a deadline on the shared grid (set by the first session)

    # -- membership and events ---------------------------------------------------------

    def add(self, session_id: str) -> None:
        """Register a session; its first step is its initial frame."""
        self._entries[session_id] = _Entry()

    def restore(self, session_id: str, schedule: SessionSchedule) -> None:
        """Register a session moved from another engine, with the schedule it had there (`schedule_of`,
        taken at a chunk boundary): its next deadline, counters and phase carry on unchanged, so its
        frames keep their presentation times. A target with no grid yet takes the session's deadline
        as its grid origin.

        Raises:
            ValueError: the schedule is mid-chunk (RUNNING).
        """
        if schedule.phase == Phase.RUNNING:
            raise ValueError(f"session {session_id} is mid-chunk; sessions move at a chunk boundary")
        self._entries[session_id] = _Entry(phase=schedule.phase, step=0, deadline_s=schedule.deadline_s,
                                           start_at_s=schedule.start_at_s, frames=schedule.frames,
                                           chunks=schedule.chunks, late_frames=schedule.late_frames)
        if self._grid_origin_s is None and schedule.phase == Phase.WAITING and self.config.align_to_grid:
            self._grid_origin_s = schedule.deadline_s

    def remove(self, session_id: str) -> None:
        self._entries.pop(session_id, None)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._entries

    def phase(self, session_id: str) -> Phase:
        return self._entries[session_id].phase

    def steps_done(self, session_id: str) -> int:
        return self._entries[session_id].step

    def schedule_of(self, session_id: str) -> SessionSchedule:
        """A copy of the session's schedule (raises KeyError for an unknown session)."""
        e = self._entries[session_id]
        return SessionSchedule(e.phase, e.step, e.deadline_s, e.start_at_s, e.frames, e.chunks, e.late_frames)

    def set_active(self, session_id: str, active: bool, now_s: float) -> bool:
        """Start or stop generating for a session.

        Returns:
            True if a staged chunk must be dropped (it was running and is now idle).
        """
        e = self._entries[session_id]
        if not active:
            was_running = e.phase == Phase.RUNNING
            if e.phase != Phase.NEW:
                e.phase, e.step = Phase.IDLE, 0
            return was_running
        if e.phase == Phase.IDLE:
            self._rebase(e, now_s, start_now=True)
        return False

    def restart_chunk(self, session_id: str, now_s: float) -> bool:
        """Flush: drop the running chunk (if any) and start a new one now.

        Returns:
            True if a staged chunk must be dropped.
        """
        e = self._entries[session_id]
        if e.phase in (Phase.NEW, Phase.IDLE):
            return False
        was_running = e.phase == Phase.RUNNING
        self._rebase(e, now_s, start_now=True)
        return was_running

    # -- planning ---------------------------------------------------------------------------

    def chunk_time_s(self, batch: int) -> float:
        """Predicted device time of one chunk at batch size `batch`, s."""
        c = self.config
        return c.denoising_steps * self.cost.predict("denoise", batch) + self.cost.predict("commit", batch)

    def _active_count(self) -> int:
        return max(1, sum(1 for e in self._entries.values() if e.phase in (Phase.WAITING, Phase.RUNNING)))

    def _on_grid(self, t_s: float) -> float:
        """The first grid point at or after `t_s` (`t_s` itself when not aligning)."""
        if not self.config.align_to_grid:
            return t_s
        if self._grid_origin_s is None:
            self._grid_origin_s = t_s
            return t_s
        period = self.config.frame_period_s * self.config.frames_per_chunk
        k = math.ceil((t_s - self._grid_origin_s) / period - 1e-9)
        return self._grid_origin_s + k * period

    def _rebase(self, e: _Entry, now_s: float, *, start_now: bool) -> None:
        lead = self.chunk_time_s(min(self._active_count(), self.config.max_batch)) * self.config.safety
        e.phase, e.step = Phase.WAITING, 0
        e.deadline_s = self._on_grid(now_s + lead + self.config.margin_s)
        e.start_at_s = now_s if start_now else e.deadline_s - lead - self.config.margin_s

    def _next_kind(self, e: _Entry) -> StepKind:
        if e.phase == Phase.NEW:
            return "init"
        if e.phase == Phase.RUNNING and e.step >= self.config.denoising_steps:
            return "commit"
        return "denoise"

    def schedule(self, now_s: float) -> StepSchedulerOutput:
        """Choose the next batch of steps.

        Returns:
            a plan; empty (with `next_wake_s`) when no step is ready.
        """
        ready: list[tuple[float, str, _Entry]] = []
        joinable: list[tuple[float, str, _Entry]] = []
        next_wake: float | None = None
        join_s = self.config.join_frames * self.config.frame_period_s if self.config.max_batch > 1 else 0.0
        for sid, e in self._entries.items():
            if e.phase == Phase.IDLE:
                continue
            if e.phase == Phase.WAITING and e.start_at_s > now_s:
                next_wake = e.start_at_s if next_wake is None else min(next_wake, e.start_at_s)
                if e.start_at_s <= now_s + join_s:
                    joinable.append((e.deadline_s, sid, e))
                continue
            key = now_s - 1e9 if e.phase == Phase.NEW else e.deadline_s
            ready.append((key, sid, e))
        if not ready:
            return StepSchedulerOutput.make_empty(next_wake)
        ready.sort(key=lambda x: (x[0], x[1]))
        kind = self._next_kind(ready[0][2])
        limit = 1 if kind == "init" else self.config.max_batch
        if kind == "denoise":
            ready += sorted(joinable, key=lambda x: (x[0], x[1]))
        batch = [(sid, e) for _, sid, e in ready if self._next_kind(e) == kind][:limit]
        return StepSchedulerOutput(
            kind=kind,
            session_ids=[sid for sid, _ in batch],
            begin_chunk_ids=[sid for sid, e in batch if e.phase == Phase.WAITING],
            deadlines_s={sid: e.deadline_s for sid, e in batch},
            next_wake_s=None,
        )

    def update_from_output(self, plan: StepSchedulerOutput, result: StepRunnerOutput, now_s: float) -> None:
        """Advance the sessions of `plan` by what the runner did; record the step's cost."""
        if plan.kind is None:
            return
        ok = [sid for sid in plan.session_ids if sid not in result.failed and sid in self._entries]
        for kind, batch, seconds in result.cost_samples:  # each group as it actually ran
            self.cost.observe(kind, batch, seconds)
        c = self.config
        for sid in ok:
            e = self._entries[sid]
            if plan.kind == "init":
                e.frames += result.frames_by_session.get(sid, 0)
                self._rebase(e, now_s, start_now=False)
            elif plan.kind == "denoise":
                e.phase = Phase.RUNNING
                e.step += 1
            else:  # commit
                n = c.chunk_frames(e.chunks)
                e.chunks += 1
                e.frames += n
                if now_s > e.deadline_s + c.frame_period_s:
                    e.late_frames += n
                e.deadline_s += n * c.frame_period_s
                e.step = 0
                e.phase = Phase.WAITING
                if now_s > e.deadline_s + c.max_lateness_frames * c.frame_period_s:
                    self._rebase(e, now_s, start_now=True)
                else:
                    lead = self.chunk_time_s(min(self._active_count(), c.max_batch)) * c.safety + c.margin_s
                    e.start_at_s = e.deadline_s - lead
        for sid in result.failed:
            self.remove(sid)

    # -- introspection ----------------------------------------------------------------------------

    def stats(self) -> dict[str, dict[str, float]]:
        """Per session: phase, frames emitted, frames late."""
        return {
            sid: {"phase": float(e.phase), "frames": float(e.frames), "late_frames": float(e.late_frames)}
            for sid, e in self._entries.items()
        }

    @property
    def queue_depth(self) -> int:
        """Sessions with a step ready or a chunk staged."""
        return sum(1 for e in self._entries.values() if e.phase in (Phase.NEW, Phase.RUNNING))
