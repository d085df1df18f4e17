"""StepRunner: carries out a `StepSchedulerOutput` on the device, literally, isolating failures per session.

The runner keeps no phase or step of its own: it drops the chunks the plan
preempts, begins the chunks it names, runs each session's named denoising
step (`StepSchedulerOutput.steps`) or the commit, and reports what it did
(`StepRunnerOutput`: frames, failures, measured costs, what each begun
chunk was sampled under). The failure and timeout policy is described in
`engine/device_worker.py`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from worldcast.engine.rollout import BatchCache, ChunkRollout, denoise_batch, finalize_batch
from worldcast.engine.step_output import BegunChunk, FrameOut, StepKind, StepRunnerOutput, StepSchedulerOutput
from worldcast.engine.timing import DeviceTimer

logger = logging.getLogger(__name__)


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
        emit: publishes a commit step's frames as soon as they are decoded, before the commit
            forward that applies the chunk's state (None: they are returned in
            `StepRunnerOutput.frames`). The device worker sets it to its `on_frames`.
        timer: measures each group's device time (None: one for the rollouts' device).
        perf_clock: the wall clock timeouts are measured on, s (injectable for tests).
    """

    def __init__(self, rollouts: dict[str, ChunkRollout], *, timeout_s: float = 2.0,
                 emit: Callable[[list[FrameOut]], None] | None = None, timer: DeviceTimer | None = None,
                 perf_clock: Callable[[], float] = time.perf_counter) -> None:
        self.rollouts = rollouts
        self.perf_clock = perf_clock
        self.timeout_s = timeout_s
        self.emit = emit
        self.timer = timer
        self.cache = BatchCache()
        #: sessions of an overrunning batch -> the kind of step that overran; they run alone until a step of that
        #: kind runs alone in time (a commit in time says nothing of a denoise step: with one denoising step a
        #: chunk, a suspect would otherwise be cleared by its commit and batched again, overrunning forever)
        self.suspects: dict[str, str] = {}

    def preempt(self, session_ids: list[str]) -> None:
        """Drop the staged chunks of `session_ids`, as a plan says (their persistent state is untouched)."""
        for sid in session_ids:
            if (r := self.rollouts.get(sid)) is not None:
                r.abort_chunk()

    def _run(self, plan: StepSchedulerOutput, ids: list[str], now_s: float,
             began: dict[str, BegunChunk]) -> list[FrameOut]:
        rs = [self.rollouts[sid] for sid in ids]
        if plan.kind == "init":
            return [f for r in rs for f in r.init(now_s)]
        if plan.kind == "denoise":
            for r in rs:
                if r.session_id in plan.begin_chunk_ids and r.session_id not in began:
                    t0 = self.perf_clock()
                    r.begin_chunk(now_s, plan.deadlines_s[r.session_id])
                    assert r.staged is not None
                    began[r.session_id] = BegunChunk(r.staged.inputs.epoch, r.staged.inputs.input_version)
                    if (dt := self.perf_clock() - t0) > self.timeout_s:
                        r.abort_chunk()
                        raise _SessionTimeout(r.session_id, f"sampling conditioning took {dt * 1e3:.0f} ms, "
                                              f"over the {self.timeout_s * 1e3:.0f} ms step timeout")
            denoise_batch(rs, [plan.steps[sid] for sid in ids], self.cache)
            return []
        frames = finalize_batch(rs, now_s, emit=self.emit, cache=self.cache)
        return [] if self.emit is not None else frames

    def _run_group(self, plan: StepSchedulerOutput, ids: list[str], now_s: float,
                   failed: dict[str, str], timer: DeviceTimer, began: dict[str, BegunChunk]) -> list[FrameOut]:
        """Run `ids` as one batch; on failure, each alone. Records failures in `failed`, begun chunks in `began`
        (a chunk begun before a batch failed is not begun again when its session re-runs alone)."""
        assert plan.kind is not None
        rerun = plan.kind == "commit" and any(
            (st := self.rollouts[sid].staged) is not None and st.frames is not None for sid in ids)
        t0 = self.perf_clock()
        token = timer.start()
        try:
            frames = self._run(plan, ids, now_s, began)
        except _SessionTimeout as e:
            failed[e.session_id] = f"{plan.kind} step timed out: {e}"
            rest = [sid for sid in ids if sid != e.session_id]
            return self._run_group(plan, rest, now_s, failed, timer, began) if rest else []
        except Exception as e:  # noqa: BLE001 - any step error is isolated below
            if len(ids) == 1:
                logger.warning("Session(%s): %s step failed: %r", ids[0], plan.kind, e)
                failed[ids[0]] = f"{plan.kind} step failed: {e}"
                return []
            return [f for sid in ids for f in self._run_group(plan, [sid], now_s, failed, timer, began)]
        dt = self.perf_clock() - t0
        if dt <= self.timeout_s:
            for sid in ids:
                if self.suspects.get(sid) == plan.kind:
                    del self.suspects[sid]
            if not rerun:  # a clean run of exactly this batch (a re-run commit skips its decode: no measure)
                timer.stop(token, plan.kind, len(ids))
            return frames
        if len(ids) == 1 and ids[0] in self.suspects:
            del self.suspects[ids[0]]
            failed[ids[0]] = f"{plan.kind} step timed out: {dt * 1e3:.0f} ms alone, over {self.timeout_s * 1e3:.0f} ms"
            logger.warning("Session(%s): %s", ids[0], failed[ids[0]])
            return []
        logger.warning("%s step of %d session(s) took %.0f ms (timeout %.0f ms): running them alone next",
                       plan.kind, len(ids), dt * 1e3, self.timeout_s * 1e3)
        # the step finished: keep its results, isolate its sessions from now on
        self.suspects.update({sid: plan.kind for sid in ids})
        return frames

    def execute(self, plan: StepSchedulerOutput, now_s: float) -> StepRunnerOutput:
        """Carry out one plan literally: drop the chunks it preempts, then run its step (suspects alone, the
        rest as one batch)."""
        self.preempt(plan.preempted_session_ids)
        t0 = time.perf_counter()
        ids = [sid for sid in plan.session_ids if sid in self.rollouts]
        timer = self.timer or DeviceTimer(next(iter(self.rollouts.values())).model.device if self.rollouts
                                          else torch.device("cpu"))
        self.timer = timer
        failed: dict[str, str] = {}
        began: dict[str, BegunChunk] = {}
        groups = [[sid] for sid in ids if sid in self.suspects]
        if rest := [sid for sid in ids if sid not in self.suspects]:
            groups.append(rest)
        frames = [f for g in groups for f in self._run_group(plan, g, now_s, failed, timer, began)]
        frames = [f for f in frames if f.session_id not in failed]
        by_session: dict[str, int] = {}
        for f in frames:
            by_session[f.session_id] = by_session.get(f.session_id, 0) + 1
        samples: list[tuple[StepKind, int, float]] = [(k, b, s) for k, b, s in timer.poll()]  # type: ignore[misc]
        return StepRunnerOutput(step_time_s=time.perf_counter() - t0, frames=frames, failed=failed,
                                cost_samples=samples, frames_by_session=by_session,
                                began={sid: b for sid, b in began.items() if sid not in failed})
