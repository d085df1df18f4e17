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
- A chunk starts when an input arrives on an idle device (`early_start`).
  The grid makes a key press wait for the next chunk start, half a frame
  period on average. So when nothing is ready to run, a waiting session
  with a fresh input (an action, or a flush such as a new direction, since
  its last chunk began) starts its next chunk at once, provided (a) its
  previous frame is already due, i.e. the new chunk's frames would not be
  out before the previous frame's presentation time (now >= deadline -
  frame period - predicted chunk time), and (b) it delays no other
  session: every other waiting session's chunk starts after this one's
  predicted end. The chunk keeps its deadline on the grid, so presentation
  times (and the PTS the media clock derives from them) stay one frame
  period apart and strictly increasing: the frame rate stays honest, only
  the frame arrives sooner. A viewer sees the reaction to a key press up to
  about a frame period earlier, and frames arriving a little irregularly in
  wall time within their period. Under load (b) fails and the grid and
  deadlines rule as before.

One owner: the scheduler alone keeps each session's phase and denoising
step. The device worker reports what it observes of a session (`observe`:
active, flush epoch, input counter) and the runner carries out each plan
literally (`StepSchedulerOutput.preempted_session_ids`, `begin_chunk_ids`,
`steps`), reporting what each begun chunk was sampled under
(`StepRunnerOutput.began`).
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
    early_start: bool = True  #: start a chunk at once when a fresh input arrives on an idle device (module doc)

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
    early_starts: int = 0  #: chunks started at once on a fresh input (`early_start`)
    epoch: int = 0  #: the session's flush epoch, as last observed
    input_version: int = 0  #: the session's input counter, as last observed
    chunk_epoch: int = 0  #: the epoch the current (or last) chunk was sampled under
    chunk_input: int = 0  #: the input counter the current (or last) chunk was sampled at
    preempt: bool = False  #: the staged chunk must be dropped by the runner (next plan)


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
    early_starts: int = 0  #: chunks started at once on a fresh input


@dataclass
class StepScheduler:
    """Earliest-deadline-first step scheduler with cross-session batching."""

    config: SchedulerConfig
    cost: CostModel = field(default_factory=CostModel)
    _entries: dict[str, _Entry] = field(default_factory=dict)
    _grid_origin_s: float | None = None  #: a deadline on the shared grid (set by the first session)

    # -- membership and events ---------------------------------------------------------

    def add(self, session_id: str, *, epoch: int = 0, input_version: int = 0) -> None:
        """Register a session; its first step is its initial frame.

        Args:
            epoch, input_version: the session's flush epoch and input counter now (its first chunk
                is not "fresh" for inputs that came before it existed).
        """
        self._entries[session_id] = _Entry(epoch=epoch, input_version=input_version, chunk_epoch=epoch,
                                           chunk_input=input_version)

    def restore(self, session_id: str, schedule: SessionSchedule, *, epoch: int = 0, input_version: int = 0) -> None:
        """Register a session moved from another engine, with the schedule it had there (`schedule_of`,
        taken at a chunk boundary): its next deadline, counters and phase carry on unchanged, so its
        frames keep their presentation times. A target with no grid yet takes the session's deadline
        as its grid origin.

        Args:
            epoch, input_version: the session's flush epoch and input counter now (as `add`).

        Raises:
            ValueError: the schedule is mid-chunk (RUNNING).
        """
        if schedule.phase == Phase.RUNNING:
            raise ValueError(f"session {session_id} is mid-chunk; sessions move at a chunk boundary")
        self._entries[session_id] = _Entry(phase=schedule.phase, step=0, deadline_s=schedule.deadline_s,
                                           start_at_s=schedule.start_at_s, frames=schedule.frames,
                                           chunks=schedule.chunks, late_frames=schedule.late_frames,
                                           early_starts=schedule.early_starts, epoch=epoch,
                                           input_version=input_version, chunk_epoch=epoch,
                                           chunk_input=input_version)
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
        return SessionSchedule(e.phase, e.step, e.deadline_s, e.start_at_s, e.frames, e.chunks, e.late_frames,
                               e.early_starts)

    def observe(self, session_id: str, now_s: float, *, active: bool, epoch: int, input_version: int) -> None:
        """What the device worker sees of a session before each plan: whether it wants frames, its flush
        epoch and its input counter (`Conditioner`).

        An inactive session goes idle (its staged chunk is dropped); an idle one that becomes active
        starts a chunk now; a running chunk sampled under an older epoch is dropped and restarted now
        (a flush); a newer epoch or input counter on a waiting session is a fresh input (`early_start`).
        """
        e = self._entries[session_id]
        e.input_version = input_version
        if not active:
            self.set_active(session_id, False, now_s)
            e.epoch = epoch
            return
        self.set_active(session_id, True, now_s)
        if e.phase == Phase.RUNNING and epoch != e.chunk_epoch:
            self.restart_chunk(session_id, now_s)
        e.epoch = epoch

    def set_active(self, session_id: str, active: bool, now_s: float) -> bool:
        """Start or stop generating for a session.

        Returns:
            True if a staged chunk is to be dropped (it was running and is now idle); the next plan
            names it in `preempted_session_ids`.
        """
        e = self._entries[session_id]
        if not active:
            was_running = e.phase == Phase.RUNNING
            if e.phase != Phase.NEW:
                e.phase, e.step = Phase.IDLE, 0
            e.preempt |= was_running
            return was_running
        if e.phase == Phase.IDLE:
            self._rebase(e, now_s, start_now=True)
        return False

    def restart_chunk(self, session_id: str, now_s: float) -> bool:
        """Flush: drop the running chunk (if any) and start a new one now.

        Returns:
            True if a staged chunk is to be dropped (named in the next plan's `preempted_session_ids`).
        """
        e = self._entries[session_id]
        if e.phase in (Phase.NEW, Phase.IDLE):
            return False
        was_running = e.phase == Phase.RUNNING
        e.preempt |= was_running
        self._rebase(e, now_s, start_now=True)
        return was_running

    # -- planning ---------------------------------------------------------------------------

    def chunk_time_s(self, batch: int) -> float:
        """Predicted device time of one chunk at batch size `batch`, s (`CostModel.chunk_time_s`)."""
        return self.cost.chunk_time_s(batch, denoising_steps=self.config.denoising_steps)

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

    def _fresh(self, e: _Entry) -> bool:
        """A waiting session has had an input (or a flush) since its last chunk began."""
        return e.input_version != e.chunk_input or e.epoch != e.chunk_epoch

    def _due_s(self, e: _Entry, batch: int) -> float:
        """The earliest an early start may begin: the new chunk's frames are out no sooner than the previous
        frame's presentation time (`early_start`, condition (a))."""
        return e.deadline_s - self.config.frame_period_s - self.chunk_time_s(batch)

    def _early_starts(self, now_s: float, waiting: list[tuple[str, _Entry]]) -> list[tuple[str, _Entry]]:
        """Waiting sessions that start their chunk now on a fresh input (module doc, `early_start`)."""
        cands = [(sid, e) for sid, e in waiting if self._fresh(e)]
        cands = sorted(cands, key=lambda x: (x[1].deadline_s, x[0]))[: self.config.max_batch]
        cands = [(sid, e) for sid, e in cands if now_s >= self._due_s(e, len(cands))]
        if not cands:
            return []
        end = now_s + self.chunk_time_s(len(cands)) * self.config.safety + self.config.margin_s
        chosen = {sid for sid, _ in cands}
        if any(e.start_at_s < end for sid, e in waiting if sid not in chosen):
            return []  # it would delay another session's chunk: the grid rules
        return cands

    def schedule(self, now_s: float) -> StepSchedulerOutput:
        """Choose the next batch of steps.

        Returns:
            a plan; empty (with `next_wake_s`) when no step is ready. Either may name chunks the runner
            must drop first (`preempted_session_ids`).
        """
        ready: list[tuple[float, str, _Entry]] = []
        joinable: list[tuple[float, str, _Entry]] = []
        waiting: list[tuple[str, _Entry]] = []
        next_wake: float | None = None
        join_s = self.config.join_frames * self.config.frame_period_s if self.config.max_batch > 1 else 0.0
        preempted = [sid for sid, e in self._entries.items() if e.preempt]
        for sid in preempted:
            self._entries[sid].preempt = False
        for sid, e in self._entries.items():
            if e.phase == Phase.IDLE:
                continue
            if e.phase == Phase.WAITING and e.start_at_s > now_s:
                waiting.append((sid, e))
                wake = e.start_at_s
                if self.config.early_start and self._fresh(e) and (due := self._due_s(e, 1)) > now_s:
                    wake = min(wake, due)  # when its previous frame is due, it may start early
                next_wake = wake if next_wake is None else min(next_wake, wake)
                if e.start_at_s <= now_s + join_s:
                    joinable.append((e.deadline_s, sid, e))
                continue
            key = now_s - 1e9 if e.phase == Phase.NEW else e.deadline_s
            ready.append((key, sid, e))
        if not ready and self.config.early_start:
            early = self._early_starts(now_s, waiting)
            for sid, e in early:
                e.early_starts += 1
                if logger.isEnabledFor(logging.DEBUG):
                    logger.debug("StepScheduler: Session(%s) starts its chunk %.1f ms early on a fresh input", sid,
                                 (e.start_at_s - now_s) * 1e3)
            ready = [(e.deadline_s, sid, e) for sid, e in early]
            joinable = []
        if not ready:
            return StepSchedulerOutput.make_empty(next_wake, preempted)
        ready.sort(key=lambda x: (x[0], x[1]))
        kind = self._next_kind(ready[0][2])
        limit = 1 if kind == "init" else self.config.max_batch
        if kind == "denoise":
            ready += sorted(joinable, key=lambda x: (x[0], x[1]))
        batch = [(sid, e) for _, sid, e in ready if self._next_kind(e) == kind][:limit]
        begin = [sid for sid, e in batch if e.phase == Phase.WAITING]
        for sid, e in batch:
            if sid in begin:  # what the chunk will be sampled under, until the runner says exactly
                e.chunk_epoch, e.chunk_input = e.epoch, e.input_version
        return StepSchedulerOutput(
            kind=kind,
            session_ids=[sid for sid, _ in batch],
            begin_chunk_ids=begin,
            deadlines_s={sid: e.deadline_s for sid, e in batch},
            next_wake_s=None,
            steps={sid: (0 if sid in begin else e.step) for sid, e in batch} if kind == "denoise" else {},
            preempted_session_ids=preempted,
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
                if sid in plan.begin_chunk_ids:
                    e.step = 0
                    if (b := result.began.get(sid)) is not None:
                        e.chunk_epoch, e.chunk_input = b.epoch, b.input_version
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
        """Per session: phase, frames emitted, frames late, chunks started early on a fresh input."""
        return {
            sid: {"phase": float(e.phase), "frames": float(e.frames), "late_frames": float(e.late_frames),
                  "early_starts": float(e.early_starts)}
            for sid, e in self._entries.items()
        }

    @property
    def queue_depth(self) -> int:
        """Sessions with a step ready or a chunk staged."""
        return sum(1 for e in self._entries.values() if e.phase in (Phase.NEW, Phase.RUNNING))
