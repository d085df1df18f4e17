"""DeviceWorker: the one thread that owns a device and drives the StepScheduler.

The asyncio side (sessions, transport) never waits on the device: it adds
and removes sessions and wakes the worker; the worker calls back with
frames and errors from its own thread (callers marshal them to their loop).

Per iteration: poll each session's conditioner (pause, cancel, flush take
effect here, at a step boundary), ask the scheduler for a plan, run it with
`StepRunner`, report.

Failure policy (`StepRunner`):
- exception or NaN/Inf: if a batched step raises, every session of the
  batch is re-run alone (nothing was applied: steps are transactional); a
  session that fails alone is ended with an error (`on_error`), the others
  keep their results and their deadlines.
- timeout (`EngineConfig.step_timeout_s`): a running kernel cannot be
  preempted, so a timeout is detected when the step returns. A session
  whose own share of a step (sampling its conditioning) overran, or whose
  step alone overran, is ended with an error. When a batched forward
  overruns, its sessions become suspects: their next steps run alone, and
  a suspect whose solo step overruns is ended; one that runs in time is
  cleared. While any step has been running for `stall_factor` timeouts,
  the worker reports itself stalled (`/readyz` answers 503).
- commit steps decode and publish a chunk's frames before its KV-writing
  forward (so that forward is off the motion-to-photon path); if that
  forward then fails, the frames are already out and the session ends with
  an error as above.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from worldcast.engine.admission import active_capacity
from worldcast.engine.cost_model import CostModel
from worldcast.engine.errors import KVPoolExhausted
from worldcast.engine.kv_pool import KVPool
from worldcast.engine.rollout import ChunkRollout, Conditioner, denoise_batch, finalize_batch
from worldcast.engine.scripted import ScriptedConditioner
from worldcast.engine.step_output import FrameOut, StepRunnerOutput, StepSchedulerOutput
from worldcast.engine.step_scheduler import Phase, SchedulerConfig, StepScheduler
from worldcast.engine.threads import ThreadChoice, available_cores, choose_threads, eligible_threads
from worldcast.models.base import WorldModel

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineConfig:
    """Settings of one device's engine."""

    kv_budget_bytes: int = 256 * 1024 * 1024  #: KV pool budget, bytes
    max_batch: int = 8  #: most sessions per batched step (1 = no batching)
    torch_threads: int | None = None  #: intra-op CPU threads for torch (None: chosen by measurement at warm-up)
    reserved_cores: int = 1  #: cores left to the event loop, video encoders and prompt encoder when choosing threads
    idle_poll_s: float = 0.05  #: longest sleep when nothing is ready, s (sessions also wake the worker)
    step_timeout_s: float = 2.0  #: a step (or one session's part of it) longer than this is a timeout, s
    stall_factor: float = 5.0  #: a step running for this many timeouts marks the worker stalled

    def __post_init__(self) -> None:
        if self.kv_budget_bytes <= 0:
            raise ValueError("kv_budget_bytes must be positive")
        if self.step_timeout_s <= 0:
            raise ValueError("step_timeout_s must be positive")


class _SessionTimeout(Exception):
    """One session's own part of a step overran the step timeout."""

    def __init__(self, session_id: str, message: str) -> None:
        super().__init__(message)
        self.session_id = session_id


class StepRunner:
    """Executes a `StepSchedulerOutput` on the device, isolating failures per session.

    Args:
        rollouts: the device's rollouts by session id.
        timeout_s: step timeout, s (see the module docstring for the policy).
        emit: publishes a commit step's frames as soon as they are decoded, before the
            KV-writing forward (None: they are returned in `StepRunnerOutput.frames`).
    """

    def __init__(self, rollouts: dict[str, ChunkRollout], *, timeout_s: float = 2.0,
                 emit: Callable[[list[FrameOut]], None] | None = None) -> None:
        self.rollouts = rollouts
        self.timeout_s = timeout_s
        self.emit = emit
        self.suspects: set[str] = set()  #: sessions of an overrunning batch; they run alone until cleared

    def _run(self, plan: StepSchedulerOutput, ids: list[str], now_s: float) -> list[FrameOut]:
        rs = [self.rollouts[sid] for sid in ids]
        if plan.kind == "init":
            return [f for r in rs for f in r.init(now_s)]
        if plan.kind == "denoise":
            for r in rs:
                if r.staged is None:
                    t0 = time.perf_counter()
                    r.begin_chunk(now_s, plan.deadlines_s[r.session_id])
                    if (dt := time.perf_counter() - t0) > self.timeout_s:
                        r.abort_chunk()
                        raise _SessionTimeout(r.session_id, f"sampling conditioning took {dt * 1e3:.0f} ms, "
                                              f"over the {self.timeout_s * 1e3:.0f} ms step timeout")
            denoise_batch(rs)
            return []
        frames = finalize_batch(rs, now_s, emit=self.emit)
        return [] if self.emit is not None else frames

    def _run_group(self, plan: StepSchedulerOutput, ids: list[str], now_s: float,
                   failed: dict[str, str]) -> list[FrameOut]:
        """Run `ids` as one batch; on failure, each alone. Records failures in `failed`."""
        t0 = time.perf_counter()
        try:
            frames = self._run(plan, ids, now_s)
        except _SessionTimeout as e:
            failed[e.session_id] = f"{plan.kind} step timed out: {e}"
            rest = [sid for sid in ids if sid != e.session_id]
            return self._run_group(plan, rest, now_s, failed) if rest else []
        except Exception as e:  # noqa: BLE001 - any step error is isolated below
            if len(ids) == 1:
                logger.warning("Session(%s): %s step failed: %r", ids[0], plan.kind, e)
                failed[ids[0]] = f"{plan.kind} step failed: {e}"
                return []
            return [f for sid in ids for f in self._run_group(plan, [sid], now_s, failed)]
        dt = time.perf_counter() - t0
        if dt <= self.timeout_s:
            self.suspects.difference_update(ids)
            return frames
        if len(ids) == 1 and ids[0] in self.suspects:
            self.suspects.discard(ids[0])
            failed[ids[0]] = f"{plan.kind} step timed out: {dt * 1e3:.0f} ms alone, over {self.timeout_s * 1e3:.0f} ms"
            logger.warning("Session(%s): %s", ids[0], failed[ids[0]])
            return []
        logger.warning("%s step of %d session(s) took %.0f ms (timeout %.0f ms): running them alone next",
                       plan.kind, len(ids), dt * 1e3, self.timeout_s * 1e3)
        self.suspects.update(ids)  # the step finished: keep its results, isolate its sessions from now on
        return frames

    def execute(self, plan: StepSchedulerOutput, now_s: float) -> StepRunnerOutput:
        """Run one planned step: suspects alone, the rest as one batch."""
        t0 = time.perf_counter()
        ids = [sid for sid in plan.session_ids if sid in self.rollouts]
        failed: dict[str, str] = {}
        groups = [[sid] for sid in ids if sid in self.suspects]
        if rest := [sid for sid in ids if sid not in self.suspects]:
            groups.append(rest)
        frames = [f for g in groups for f in self._run_group(plan, g, now_s, failed)]
        frames = [f for f in frames if f.session_id not in failed]
        return StepRunnerOutput(step_time_s=time.perf_counter() - t0, frames=frames, failed=failed)


class DeviceWorker:
    """Owns the model's device: a KV pool, a scheduler and the thread that runs steps.

    Args:
        model: the world model (on its device).
        config: engine settings.
        on_frames: called from the worker thread with each step's frames.
        on_error: called from the worker thread with (session_id, reason) when a session fails.
        clock: monotonic clock in seconds (injectable for tests).
    """

    def __init__(
        self,
        model: WorldModel,
        config: EngineConfig,
        *,
        on_frames: Callable[[list[FrameOut]], None],
        on_error: Callable[[str, str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model
        self.config = config
        spec = model.spec
        self.pool = KVPool(spec.kv, budget_bytes=config.kv_budget_bytes, device=model.device)
        self.scheduler = StepScheduler(
            SchedulerConfig(
                frame_period_s=float(spec.frame_period),
                frames_per_chunk=spec.frames_per_chunk,
                denoising_steps=spec.denoising_steps,
                max_batch=config.max_batch,
            ),
            CostModel(),
        )
        self.rollouts: dict[str, ChunkRollout] = {}
        self.runner = StepRunner(self.rollouts, timeout_s=config.step_timeout_s, emit=self._emit)
        self._step_started: float | None = None  #: monotonic start of the step in flight (watchdog)
        self.on_frames, self.on_error, self.clock = on_frames, on_error, clock
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._pending_add: list[ChunkRollout] = []
        self._pending_remove: list[str] = []
        self._stop = False
        self._thread: threading.Thread | None = None
        self.steps_run = 0
        self.last_error: str | None = None
        #: the intra-op thread count in use and how it was chosen (set by `choose_threads`)
        self.thread_choice: ThreadChoice | None = None
        #: called on the worker thread after every executed step (metrics)
        self.on_step: Callable[[StepSchedulerOutput, StepRunnerOutput], None] | None = None

    # -- calibration ---------------------------------------------------------------------------

    def _time_chunk(self, rollouts: list[ChunkRollout], *, observe: bool) -> float:
        """Run one chunk of `rollouts` as one batch; returns its duration, s (observed into the cost model)."""
        spec = self.model.spec
        t_chunk = time.perf_counter()
        for r in rollouts:
            r.begin_chunk(0.0, 0.0)
        for _ in range(spec.denoising_steps):
            t0 = time.perf_counter()
            denoise_batch(rollouts)
            if observe:
                self.scheduler.cost.observe("denoise", len(rollouts), time.perf_counter() - t0)
        t0 = time.perf_counter()
        finalize_batch(rollouts, 0.0)
        if observe:
            self.scheduler.cost.observe("commit", len(rollouts), time.perf_counter() - t0)
        return time.perf_counter() - t_chunk

    def choose_threads(self) -> ThreadChoice:
        """Set torch's intra-op thread count: the configured one, else the fastest by measurement.

        On a CPU device each candidate count (1..cores) runs timed batch-1 chunks and
        the fastest of those leaving `EngineConfig.reserved_cores` free is kept (see
        `engine/threads.py`); on an accelerator the CPU only launches work, and the
        eligible count is used without timing. Runs on the calling thread, before `start`.
        """
        cores = available_cores()
        eligible = eligible_threads(cores, self.config.reserved_cores)
        if self.config.torch_threads:
            torch.set_num_threads(self.config.torch_threads)
            choice = ThreadChoice(threads=self.config.torch_threads, chunk_s={}, eligible=eligible, measured=False)
        elif self.model.device.type != "cpu":
            torch.set_num_threads(eligible)
            choice = ThreadChoice(threads=eligible, chunk_s={}, eligible=eligible, measured=False)
        else:
            r = ChunkRollout("__threads", self.model, self.pool, ScriptedConditioner(self.model.spec), seed=0)
            try:
                r.init(0.0)
                choice = choose_threads(lambda: self._time_chunk([r], observe=False), cores=cores,
                                        reserved_cores=self.config.reserved_cores)
            finally:
                r.close()
        self.thread_choice = choice
        logger.info("DeviceWorker: %s", choice.describe())
        return choice

    def warmup(self, *, chunks: int = 3) -> None:
        """Choose the thread count (`choose_threads`), then measure step costs before serving:
        a few chunks at each batch size from 1 to 4 (or the pool's limit).

        Runs on the calling thread; call before `start`. Fills the cost model
        that admission and chunk start times rely on. Each batch size first
        runs one untimed chunk: a shape's first run pays one-time costs
        (kernel selection, allocator growth) that measured 5-10x a normal
        step here and would otherwise hold the estimate high until that batch
        size next runs, which under admission may be never.
        """
        assert self._thread is None, "warmup before start"
        self.choose_threads()
        spec = self.model.spec
        for batch in range(1, max(1, min(self.config.max_batch, self.pool.free_slots, 4)) + 1):
            rs = [ChunkRollout(f"__warmup{i}", self.model, self.pool, ScriptedConditioner(spec), seed=i)
                  for i in range(batch)]
            try:
                for r in rs:
                    r.init(0.0)
                for chunk in range(chunks + 1):
                    self._time_chunk(rs, observe=chunk > 0)
            finally:
                for r in rs:
                    r.close()
        logger.info("DeviceWorker: warmed up; chunk time %.1f ms at batch 1",
                    self.scheduler.chunk_time_s(1) * 1e3)

    def active_capacity(self, target_utilization: float) -> int:
        """Most sessions that can generate at once with a batched chunk taking at most
        `target_utilization` of a chunk period, by the measured step costs (see `admission.active_capacity`)."""
        spec = self.model.spec
        return active_capacity(self.scheduler.chunk_time_s, chunk_period_s=float(spec.frame_period) *
                               spec.frames_per_chunk, target_utilization=target_utilization,
                               max_batch=min(self.config.max_batch, self.pool.num_slots))

    # -- control (any thread) -------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="worldcast-device-worker", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the thread and wait for it (idempotent)."""
        with self._wake:
            self._stop = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def stalled_s(self) -> float:
        """How long the step in flight has run past `stall_factor` step timeouts, s (0: not stalled)."""
        started = self._step_started
        if started is None:
            return 0.0
        over = time.monotonic() - started - self.config.stall_factor * self.config.step_timeout_s
        return max(0.0, over)

    def add_session(self, session_id: str, conditioner: Conditioner, *, seed: int) -> None:
        """Reserve a KV slot and start generating for `session_id`.

        Raises:
            KVPoolExhausted: no free slot.
        """
        with self._wake:
            if self.pool.free_slots < 1:
                raise KVPoolExhausted(f"all {self.pool.num_slots} KV slots in use")
            r = ChunkRollout(session_id, self.model, self.pool, conditioner, seed=seed)
            r.slot = self.pool.allocate(session_id)
            self._pending_add.append(r)
            self._wake.notify_all()

    def remove_session(self, session_id: str) -> None:
        """Stop generating for `session_id` and free its slot (idempotent)."""
        with self._wake:
            self._pending_remove.append(session_id)
            self._wake.notify_all()

    def wake(self) -> None:
        """Ask the worker to re-poll sessions now (a new action, flush, cancel or resume)."""
        with self._wake:
            self._wake.notify_all()

    # -- the loop (worker thread) ----------------------------------------------------------------

    def _emit(self, frames: list[FrameOut]) -> None:
        """Publish frames decoded mid-step (the commit forward follows)."""
        if frames:
            self.on_frames(frames)

    def _apply_pending(self) -> None:
        with self._lock:
            adds, self._pending_add = self._pending_add, []
            removes, self._pending_remove = self._pending_remove, []
            for r in adds:
                self.rollouts[r.session_id] = r
                self.scheduler.add(r.session_id)
            for sid in removes:
                r = self.rollouts.pop(sid, None)
                self.scheduler.remove(sid)
                if r is not None:
                    r.close()
                else:
                    self.pool.free(sid)

    def _poll_sessions(self, now_s: float) -> None:
        for sid, r in self.rollouts.items():
            c = r.conditioner
            if not c.wants_frames():
                if self.scheduler.set_active(sid, False, now_s):
                    r.abort_chunk()
                continue
            self.scheduler.set_active(sid, True, now_s)
            if r.staged is not None and r.staged.inputs.epoch != c.current_epoch():
                self.scheduler.restart_chunk(sid, now_s)
                r.abort_chunk()
            elif r.staged is None and self.scheduler.phase(sid) == Phase.RUNNING:
                self.scheduler.restart_chunk(sid, now_s)

    def _loop(self) -> None:
        if self.thread_choice is not None:
            torch.set_num_threads(self.thread_choice.threads)
        elif self.config.torch_threads:
            torch.set_num_threads(self.config.torch_threads)
        logger.info("DeviceWorker: started on %s", self.model.device)
        try:
            while True:
                with self._lock:
                    if self._stop:
                        break
                self._apply_pending()
                now = self.clock()
                self._poll_sessions(now)
                plan = self.scheduler.schedule(now)
                if plan.is_empty:
                    timeout = self.config.idle_poll_s
                    if plan.next_wake_s is not None:
                        timeout = min(timeout, max(0.0, plan.next_wake_s - now))
                    with self._wake:
                        if not self._stop and not self._pending_add and not self._pending_remove:
                            self._wake.wait(timeout)
                    continue
                self._step_started = time.monotonic()
                try:
                    result = self.runner.execute(plan, now)
                finally:
                    self._step_started = None
                self.steps_run += 1
                self.scheduler.update_from_output(plan, result, self.clock())
                if self.on_step is not None:
                    self.on_step(plan, result)
                for sid, reason in result.failed.items():
                    r = self.rollouts.pop(sid, None)
                    if r is not None:
                        r.close()
                    self.on_error(sid, reason)
                if result.frames:
                    self.on_frames(result.frames)
        except BaseException as e:  # noqa: BLE001 - a dead worker is reported through /readyz
            self.last_error = repr(e)
            logger.exception("DeviceWorker: died")
            raise
        finally:
            logger.info("DeviceWorker: stopped")
