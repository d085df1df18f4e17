"""DeviceWorker: the one thread that owns a device and drives the StepScheduler.

The asyncio side (sessions, transport) never waits on the device: it adds
and removes sessions and wakes the worker; the worker calls back with
frames and errors from its own thread (callers marshal them to their loop).

Per iteration: tell the scheduler what each session's conditioner says
(`StepScheduler.observe`: pause, cancel, flush and new inputs take effect
here, at a step boundary), ask it for a plan, have `StepRunner`
(`engine/step_runner.py`) carry the plan out literally, report. The
scheduler is the one owner of every session's phase and step; the worker
keeps none.

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
  a suspect whose solo step overruns is ended; one whose solo step of the
  kind that overran (denoise or commit) runs in time is cleared. While any
  step has been running for `stall_factor` timeouts, the worker reports
  itself stalled (`/readyz` answers 503).
- commit steps decode a chunk's frames and hand them to `on_frames` (the
  runner calls it itself) before the commit forward that applies the
  chunk's state changes (so that forward is off the motion-to-photon
  path); if that forward then fails, the frames are already out and the
  session ends with an error as above.

One owner for engine state: the worker thread alone allocates and frees
state slots, adds and removes rollouts and scheduler entries (one removal
path, `_remove`, for a session that left, failed or was closed), and
updates the cost model. Other threads (the event loop: admission,
`/metrics`) call `add_session` / `remove_session` (queued under a lock,
with slots reserved so admission never over-commits) and read `snapshot`,
an immutable `EngineSnapshot` the worker publishes after every change.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from worldcast.engine import session_state
from worldcast.engine.admission import active_capacity
from worldcast.engine.cost_model import CostModel
from worldcast.engine.errors import StatePoolExhausted
from worldcast.engine.memory import MemoryReader, StatePlan, plan_state_memory, read_device_memory
from worldcast.engine.rollout import BatchCache, ChunkRollout, Conditioner, run_chunk_batch
from worldcast.engine.scripted import ScriptedConditioner
from worldcast.engine.state_pool import StatePool
from worldcast.engine.step_output import FrameOut, StepRunnerOutput, StepSchedulerOutput
from worldcast.engine.step_runner import StepRunner
from worldcast.engine.step_scheduler import SchedulerConfig, StepScheduler
from worldcast.engine.timing import DeviceTimer
from worldcast.engine.tuning.compiled import DEFAULT_BUCKETS, StepCompiler, configure_cache
from worldcast.engine.tuning.packages import PackageStore
from worldcast.engine.tuning.threads import ThreadChoice, available_cores, choose_threads, eligible_threads
from worldcast.engine.tuning.warmup import (
    build_graphs,
    ServedWay,
    WarmupReport,
    check_context,
    measure_buckets,
    measure_packages,
    measure_precisions,
    timed,
    use_way,
)
from worldcast.models.base import WorldModel, weights_digest
from worldcast.models.spec import dtype_from_name

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EngineConfig:
    """Settings of one device's engine."""

    #: state pool budget (KV rings and every other declared state), bytes; None: `memory_fraction` of the
    #: device's free memory after the weights are loaded (engine/memory.py)
    state_budget_bytes: int | None = None
    memory_fraction: float = 0.8  #: share of the free memory after the weights the state pool may take, (0, 1]
    max_slots: int = 64  #: most state slots allocated, however much memory is free
    max_batch: int = 8  #: most sessions per batched step (1 = no batching)
    torch_threads: int | None = None  #: intra-op CPU threads for torch (None: chosen by measurement at warm-up)
    reserved_cores: int = 1  #: cores left to the event loop, video encoders and prompt encoder when choosing threads
    idle_poll_s: float = 0.05  #: longest sleep when nothing is ready, s (sessions also wake the worker)
    step_timeout_s: float = 2.0  #: a step (or one session's part of it) longer than this is a timeout, s
    stall_factor: float = 5.0  #: a step running for this many timeouts marks the worker stalled
    target_utilization: float = 0.85  #: share of a chunk period a batched chunk may take (capacity, degraded)
    #: compute dtype ("float32", "bfloat16", ...; None: the fastest the model declares within its tolerance,
    #: measured at warm-up); default: $WORLDCAST_PRECISION if set, else None
    precision: str | None = field(default_factory=lambda: os.environ.get("WORLDCAST_PRECISION") or None)
    #: compile the model's steps at warm-up where measured faster (False: eager); default: False if
    #: $WORLDCAST_COMPILE is "0" (the test suite sets it; tests of compilation pass True), else True
    compile: bool = field(default_factory=lambda: os.environ.get("WORLDCAST_COMPILE", "1") != "0")
    compile_buckets: tuple[int, ...] = DEFAULT_BUCKETS  #: batch sizes that get a compiled graph
    #: compile with frozen weights: faster steps, but rebuilt at every start (not cacheable;
    #: `engine/tuning/compiled.py`)
    compile_freeze: bool = False
    compile_cache_dir: Path | None = None  #: compiled artifacts (None: $TORCHINDUCTOR_CACHE_DIR or ~/.cache/worldcast)
    #: serve compiled buckets from their ahead-of-time packages where found, checked and faster
    #: (`engine/tuning/packages.py`)
    use_packages: bool = True
    early_start: bool = True  #: start a chunk at once when an input arrives on an idle device
    #: an engine whose device loop has not come round for this long is `stalled`, s: it takes no new session
    #: and its sessions' users are told (`engine_stalled`). The loop comes round after every denoising step and
    #: at least every `idle_poll_s` when idle, so this bounds one step, not one chunk. Default 1.5 s: the
    #: longest regular step measured (BENCHMARKS.md: a whole bf16-eager CPU chunk 413 ms, tiny causal Wan
    #: 168 ms) with room to spare, and short enough that users hear of a hang within 2 s
    stall_after_s: float = 1.5
    #: a stalled engine still without progress after this long is killed and handled as lost (restarted), s.
    #: Default 30 s: well past the one step longer than `stall_after_s` ever measured (a 2.6 s commit step
    #: after a cold compile, BENCHMARKS.md) and the worker's own step watchdog (`stall_factor` x
    #: `step_timeout_s` = 10 s), and near what a restart costs (35 s measured)
    stall_kill_after_s: float = 30.0

    def __post_init__(self) -> None:
        if self.state_budget_bytes is not None and self.state_budget_bytes <= 0:
            raise ValueError("state_budget_bytes must be positive")
        if not 0 < self.memory_fraction <= 1:
            raise ValueError(f"memory_fraction must lie in (0, 1], got {self.memory_fraction}")
        if self.max_slots < 1:
            raise ValueError("max_slots must be >= 1")
        if self.step_timeout_s <= 0:
            raise ValueError("step_timeout_s must be positive")
        if not 0 < self.stall_after_s < self.stall_kill_after_s:
            raise ValueError("stall bounds must satisfy 0 < stall_after_s < stall_kill_after_s, got "
                             f"{self.stall_after_s} and {self.stall_kill_after_s}")
        if not self.compile_buckets or any(b < 1 for b in self.compile_buckets):
            raise ValueError("compile_buckets must be positive batch sizes")
        if self.precision is not None:
            dtype_from_name(self.precision)

def plan_engine_memory(model: WorldModel, config: EngineConfig,
                       memory_reader: MemoryReader = read_device_memory) -> StatePlan:
    """Size the state pool for `model` on its device (engine/memory.py), let the model fit its activations
    into what is left (`WorldModel.plan_activation_memory`), and log both.

    Called with the weights already on the device, so the reading is the memory free after them.

    Raises:
        DeviceTooSmall: not one session's state fits.
    """
    reading = memory_reader(model.device)
    plan = plan_state_memory(model.spec.states, state_budget_bytes=config.state_budget_bytes,
                             memory_fraction=config.memory_fraction, max_slots=config.max_slots, reading=reading)
    logger.info("DeviceWorker: %s", plan.describe())
    if plan.headroom_bytes is not None:
        line = model.plan_activation_memory(available_bytes=max(0, plan.headroom_bytes),
                                            max_batch=min(config.max_batch, plan.num_slots))
        if line:
            logger.info("DeviceWorker: %s", line)
    return plan


@dataclass(frozen=True)
class EngineSnapshot:
    """A consistent picture of the engine, published by the worker thread for other threads to read.

    Attributes:
        slots_total: state pool slots.
        slots_used: slots held by sessions.
        slot_bytes: bytes of one session's whole declared state.
        queue_depth: sessions with a step ready or a chunk staged.
        sessions: session id -> {"phase", "frames", "late_frames", "early_starts"} (the scheduler's view).
        cost: a copy of the cost model.
        steps_run: steps executed.
        warmup: what warm-up measured and chose (precision, compiled buckets; None before warm-up).
        weights_sha256: `models.base.weights_digest` of the weights as this engine serves them (after warm-up's
            dtype; None before a warm-up or `serve_way`: then they are as loaded). Recordings name it.
    """

    slots_total: int
    slots_used: int
    slot_bytes: int
    queue_depth: int = 0
    sessions: dict[str, dict[str, float]] = field(default_factory=dict)
    cost: CostModel = field(default_factory=CostModel)
    steps_run: int = 0
    warmup: WarmupReport | None = None
    weights_sha256: str | None = None

    @property
    def used_bytes(self) -> int:
        return self.slots_used * self.slot_bytes

    @property
    def budget_bytes(self) -> int:
        return self.slots_total * self.slot_bytes


class DeviceWorker:
    """Owns the model's device: a state pool, a scheduler and the thread that runs steps.

    Args:
        model: the world model (on its device).
        config: engine settings.
        on_frames: called from the worker thread with each step's frames.
        on_error: called from the worker thread with (session_id, reason) when a session fails.
        clock: monotonic clock in seconds: deadlines and presentation times (injectable for tests).
        perf_clock: monotonic clock in seconds that step timeouts and the stall watchdog measure
            (injectable, so tests can simulate an overrun without sleeping).
        memory_reader: reads the device's free memory (injectable; default `memory.read_device_memory`).
        cost: step costs measured before (a restarted engine process starts from its predecessor's);
            None: an empty cost model (`warmup` fills it).

    Raises:
        DeviceTooSmall: the device cannot hold one session's declared state (the message has the numbers).
    """

    def __init__(
        self,
        model: WorldModel,
        config: EngineConfig,
        *,
        on_frames: Callable[[list[FrameOut]], None],
        on_error: Callable[[str, str], None],
        clock: Callable[[], float] = time.monotonic,
        perf_clock: Callable[[], float] = time.monotonic,
        memory_reader: MemoryReader = read_device_memory,
        cost: CostModel | None = None,
    ) -> None:
        self.model = model
        self.config = config
        spec = model.spec
        self._memory_reader = memory_reader
        self.memory_plan = plan_engine_memory(model, config, memory_reader)
        self.pool = StatePool(spec.states, budget_bytes=self.memory_plan.budget_bytes, device=model.device)
        first = spec.chunk_pixel_frames(spec.initial_latent_frames)
        self.scheduler = StepScheduler(
            SchedulerConfig(
                frame_period_s=float(spec.frame_period),
                frames_per_chunk=spec.frames_per_chunk,
                denoising_steps=spec.denoising_steps,
                max_batch=config.max_batch,
                first_chunk_frames=first if first != spec.frames_per_chunk else None,
                early_start=config.early_start,
            ),
            cost if cost is not None else CostModel(),
        )
        self.rollouts: dict[str, ChunkRollout] = {}
        self.timer = DeviceTimer(model.device)
        self.perf_clock = perf_clock
        self.runner = StepRunner(self.rollouts, timeout_s=config.step_timeout_s, emit=on_frames, timer=self.timer,
                                 perf_clock=perf_clock)
        self._step_started: float | None = None  #: monotonic start of the step in flight (watchdog)
        #: the heartbeat: CLOCK_MONOTONIC s at which the device loop last came round (each step, each idle
        #: wait); written by the loop alone, so a loop stuck in a step (or a stopped process) stops beating
        self.beat_at_s = time.monotonic()
        self.on_frames, self.on_error, self.clock = on_frames, on_error, clock
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._woken = False  #: a `wake` since the loop's last poll began (under `_lock`)
        self._pending_add: list[ChunkRollout] = []
        self._pending_remove: list[str] = []
        #: sessions to capture at their next chunk boundary: (id, done callback, detach)
        self._pending_export: list[tuple[str, Callable[[bytes | None, str | None], None], bool]] = []
        #: moved sessions' captured state, applied with their pending add
        self._restores: dict[str, tuple[session_state.CapturedSession, Callable[[bytes], None] | None]] = {}
        self._reserved = 0  #: slots promised to queued adds (under `_lock`)
        self._stop = False
        self._thread: threading.Thread | None = None
        self.steps_run = 0
        self.last_error: str | None = None
        #: the intra-op thread count in use and how it was chosen (set by `choose_threads`)
        self.thread_choice: ThreadChoice | None = None
        #: wraps the model's step functions in compiled graphs (`engine/tuning/compiled.py`; used from `warmup`)
        self.compiler = StepCompiler(model.device, buckets=config.compile_buckets, enabled=config.compile,
                                     freeze=config.compile_freeze)
        self.warmup_report: WarmupReport | None = None
        #: `weights_digest` of the weights as served, once warm-up or `serve_way` chose their dtype
        self.weights_sha256: str | None = None
        #: called on the worker thread after every executed step (metrics)
        self.on_step: Callable[[StepSchedulerOutput, StepRunnerOutput], None] | None = None
        self.snapshot = EngineSnapshot(self.pool.num_slots, 0, self.pool.slot_bytes)
        self._publish()

    # -- calibration ---------------------------------------------------------------------------

    def _time_chunk(self, rollouts: list[ChunkRollout], *, observe: bool) -> float:
        """Run one chunk of `rollouts` as one batch; returns its duration, s (observed into the cost model)."""
        timer = DeviceTimer(self.model.device)
        t_chunk = time.perf_counter()
        run_chunk_batch(rollouts, BatchCache(), timer=timer)
        samples = timer.drain()
        if observe:
            for kind, batch, seconds in samples:
                self.scheduler.cost.observe(kind, batch, seconds)
        return time.perf_counter() - t_chunk

    def choose_threads(self) -> ThreadChoice:
        """Set torch's intra-op thread count: the configured one, else the fastest by measurement.

        On a CPU device each candidate count (1..cores) runs timed batch-1 chunks and
        the fastest of those leaving `EngineConfig.reserved_cores` free is kept (see
        `engine/tuning/threads.py`); on an accelerator the CPU only launches work, and the
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
        """Measure everything serving depends on, before serving (each phase logged as it runs):

        1. the thread count (`choose_threads`);
        2. the precision and whether steps run compiled (`engine/tuning/warmup.py`): every dtype the model
           declares, eager and compiled, at batch 1, quality-gated against the reference dtype;
           then the state pool is allocated anew if the chosen dtype changed the declared state;
        3. each batch bucket's compiled graphs, kept where measured faster than eager;
        4. the compiled buckets' ahead-of-time packages where built (`measure_packages`), checked against
           the graphs and served where faster;
        5. step costs: a few chunks at each batch size from 1 to 4 (or the pool's limit).

        Runs on the calling thread; call before `start` and before any session. Fills the cost model
        that admission and chunk start times rely on. Each batch size first runs one untimed chunk:
        a shape's first run pays one-time costs (kernel selection, allocator growth) that measured
        5-10x a normal step here and would otherwise hold the estimate high until that batch size
        next runs, which under admission may be never.
        """
        assert self._thread is None, "warmup before start"
        assert not self.rollouts and not self._pending_add, "warmup before any session"
        spec = self.model.spec
        phases: dict[str, float] = {}
        t0 = time.perf_counter()
        logger.info("DeviceWorker: warming up on %s: threads, precision (%s), compiled steps (%s), step costs",
                    self.model.device, self.config.precision or "measured", self.compiler.mode)
        done = timed(phases, "threads")
        self.choose_threads()
        done()
        cache_dir = configure_cache(self.config.compile_cache_dir) if self.compiler.mode != "eager" else None
        if cache_dir is not None:
            logger.info("DeviceWorker: compiled steps cached in %s", cache_dir)
        done = timed(phases, "precision")
        choice = measure_precisions(self.model, self.compiler, only=self.config.precision)
        done()
        logger.info("DeviceWorker: precision %s", choice.describe())
        spec = self.model.spec
        self._replan_pool(choice.dtype)
        done = timed(phases, "buckets")
        trial = next((t for t in choice.trials if t.dtype == choice.dtype), None)
        top = max(1, min(self.config.max_batch, self.pool.free_slots, max(self.compiler.buckets)))
        buckets = measure_buckets(self.model, self.compiler, max_batch=top,
                                  batch1=(trial.eager_s, trial.compiled_s) if trial and trial.eager_s else None)
        done()
        packages: tuple = ()
        if cache_dir is not None and self.config.use_packages and self.compiler.mode == "inductor":
            done = timed(phases, "packages")
            packages = measure_packages(self.model, self.compiler, PackageStore.in_cache(cache_dir))
            done()
        done = timed(phases, "costs")
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
        done()
        self.weights_sha256 = weights_digest(self.model)
        phases["total"] = time.perf_counter() - t0
        self.warmup_report = WarmupReport(precision=choice, compile_mode=self.compiler.mode, buckets=buckets,
                                          phases_s=phases, cache_dir=None if cache_dir is None else str(cache_dir),
                                          failed=self.compiler.failed, packages=packages)
        self._publish()
        logger.info("DeviceWorker: %s", self.warmup_report.describe())
        cap = self.active_capacity(self.config.target_utilization)
        logger.info("DeviceWorker: warmed up; chunk time %.1f ms at batch 1 (chunk period %.1f ms, budget %.1f ms "
                    "at %.0f %% utilization when shared); carries %d session(s) generating at once%s",
                    self.scheduler.chunk_time_s(1) * 1e3, float(spec.chunk_period) * 1e3,
                    float(spec.chunk_period) * self.config.target_utilization * 1e3,
                    self.config.target_utilization * 100, cap,
                    "" if cap else " -- DEGRADED: one session at a time, below real time")

    def _replan_pool(self, dtype: str) -> None:
        """Size and allocate the state pool anew if the served dtype changed the declared state
        (`plan_engine_memory` on the memory free once the old pool is gone). Before any session only."""
        spec = self.model.spec
        if tuple(self.pool.states.values()) == spec.states:
            return
        del self.pool  # its memory back before the device's free memory is read again
        if self.model.device.type == "cuda":
            torch.cuda.empty_cache()
        self.memory_plan = plan_engine_memory(self.model, self.config, self._memory_reader)
        self.pool = StatePool(spec.states, budget_bytes=self.memory_plan.budget_bytes, device=self.model.device)
        logger.info("DeviceWorker: state pool reallocated for %s: %d slots of %d B", dtype,
                    self.pool.num_slots, self.pool.slot_bytes)

    def resume(self, report: WarmupReport | None) -> None:
        """A restarted engine's start: take its predecessor's thread count (`EngineConfig.torch_threads`)
        and the way it served (`ServedWay` of its `WarmupReport`: dtype and compiled buckets) without
        measuring; the compiled buckets' graphs are built (or loaded from the on-disk cache) now, one
        chunk each, so nothing compiles while serving. The cost model is the predecessor's (`cost`), and
        so is the published warm-up report (what /metrics exports).

        Runs on the calling thread; call before `start` and before any session.
        """
        assert self._thread is None and not self.rollouts, "resume before start and before any session"
        t0 = time.perf_counter()
        self.choose_threads()
        served = ServedWay.from_report(report)
        if served is None:
            return
        self.serve_way(served)
        self.warmup_report = report
        self._publish()
        packaged = self.compiler.package_buckets()
        logger.info("DeviceWorker: resumed serving %s, steps %s, in %.1f s (the predecessor's choice)", served.dtype,
                    f"compiled at batch {list(self.compiler.enabled_buckets())}"
                    f"{f' (packages at {list(packaged)})' if packaged else ''}"
                    if self.compiler.enabled_buckets() else "eager", time.perf_counter() - t0)

    def serve_way(self, served: ServedWay) -> None:
        """Serve as `served` says (dtype, compiled buckets, packages) without measuring: the compiled buckets'
        graphs are built (or loaded from the on-disk cache) now, one chunk each. Used by `resume` and by
        `worldcast replay` (`sessions/replay.py`), which must compute as the recorded server did.

        Runs on the calling thread; call before `start` and before any session.
        """
        cache_dir = None
        if self.compiler.mode != "eager" and served.compiled_buckets:
            cache_dir = configure_cache(self.config.compile_cache_dir)
        use_way(self.model, self.compiler, dtype_from_name(served.dtype), compiled=False)
        self.weights_sha256 = weights_digest(self.model)
        self._replan_pool(served.dtype)
        buckets = tuple(b for b in served.compiled_buckets if b in self.compiler.buckets)
        if self.compiler.mode != "eager" and buckets and self.compiler.steps:
            for b in buckets:
                build_graphs(self.model, self.compiler, b, sorted(buckets), check_context(self.model)).close()
            self.compiler.enable(buckets)
            if cache_dir is not None and served.package_buckets and self.config.use_packages:
                # checked and timed by the predecessor's warm-up; keys include the weights, so a hit is the same code
                store = PackageStore.in_cache(cache_dir)
                found = self.compiler.load_packages(store, self.model.device, served.package_buckets)
                self.compiler.use_packages(found)

    def active_capacity(self, target_utilization: float) -> int:
        """Most sessions that can generate at once with a batched chunk taking at most
        `target_utilization` of a chunk period, by the measured step costs (see `admission.active_capacity`).

        Reads the published snapshot's copy of the cost model: safe from any thread.
        """
        spec = self.model.spec
        cost = self.snapshot.cost
        steps = self.scheduler.config.denoising_steps
        return active_capacity(lambda b: cost.chunk_time_s(b, denoising_steps=steps),
                               chunk_period_s=float(spec.chunk_period),
                               target_utilization=target_utilization,
                               max_batch=min(self.config.max_batch, self.pool.num_slots))

    @property
    def degraded(self) -> bool:
        """Whether the measured costs say the device cannot carry even one session in real time
        (its chunk at batch 1 takes longer than a chunk period; see `admission.active_capacity`)."""
        return self.active_capacity(self.config.target_utilization) == 0

    # -- control (any thread) -------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self.beat_at_s = time.monotonic()
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
        over = self.perf_clock() - started - self.config.stall_factor * self.config.step_timeout_s
        return max(0.0, over)

    @property
    def free_slots(self) -> int:
        """State slots neither held nor promised to a queued session, counting those whose removal is queued
        as free (any thread)."""
        with self._lock:
            return self._free_slots_locked()

    def _free_slots_locked(self) -> int:
        """Free slots (under `_lock`): a slot whose session's removal is queued is free already, since the
        worker applies removals before adds (`_apply_pending`; a removal drops the adds queued before it at
        once, `remove_session`). Without this, a session created right after
        another was deleted was refused here ("all N state slots in use") while the server, which had counted
        the slot free at the delete, had already answered 201 (issue 31, item 4)."""
        leaving = sum(1 for sid in set(self._pending_remove) if self.pool.holds(sid))
        return self.pool.num_slots - self.pool.used_slots - self._reserved + leaving

    def add_session(self, session_id: str, conditioner: Conditioner, *, seed: int,
                    state: bytes | session_state.CapturedSession | None = None,
                    on_restored: Callable[[bytes | None, str | None], None] | None = None,
                    verify: bool = False) -> None:
        """Reserve a state slot and start generating for `session_id` (the worker allocates it).

        Args:
            state: a session moved from another engine: its bytes from `export_session` there
                (`engine/session_state.py`), or those bytes parsed; its slot, rollout, RNG and schedule carry on
                from them.
            on_restored: with `state`, called on the worker thread once the restore is done, before any
                step: `(captured, None)` where it succeeded, `(None, reason)` where it failed (the session
                is then gone from this engine and `on_error` is not called for it).
            verify: `captured` is the state captured again right after the restore (a move's check: equal
                bytes); without it, None.

        Raises:
            StatePoolExhausted: no free slot.
            SessionStateError: `state` is not a state of this engine's model.
        """
        captured = (state if isinstance(state, session_state.CapturedSession) or state is None
                    else session_state.parse(state, self.model.spec))
        with self._wake:
            if self._free_slots_locked() < 1:
                raise StatePoolExhausted(f"all {self.pool.num_slots} state slots in use "
                                         f"({self.pool.slot_bytes} B of declared state per session)")
            self._reserved += 1
            self._pending_add.append(ChunkRollout(session_id, self.model, self.pool, conditioner, seed=seed))
            if captured is not None:
                self._restores[session_id] = (captured, on_restored, verify)
            self._wake.notify_all()

    def export_session(self, session_id: str, done: Callable[[bytes | None, str | None], None], *,
                       detach: bool = True) -> None:
        """Capture a session's whole state at its next chunk boundary (`engine/session_state.py`).

        `done(state, None)` is called on the worker thread once captured, or `done(None, reason)` for
        an unknown session; with `detach` the session then leaves this engine (its slot freed) and
        generates nothing more here. Keep `done` quick: it runs between two steps.
        """
        with self._wake:
            self._pending_export.append((session_id, done, detach))
            self._wake.notify_all()

    def remove_session(self, session_id: str) -> None:
        """Stop generating for `session_id` and free its slot (idempotent).

        An add of it still queued is dropped now (its `on_restored` is not called: the handle that removes a
        session fails its own wait), so an add queued after this removal, of the same id (a world put back:
        `SessionManager.rewind`), is the one the worker starts, whichever of its passes sees the two.
        """
        with self._wake:
            kept = [r for r in self._pending_add if r.session_id != session_id]
            self._reserved -= len(self._pending_add) - len(kept)
            self._pending_add = kept
            self._restores.pop(session_id, None)
            self._pending_remove.append(session_id)
            self._wake.notify_all()

    def wake(self) -> None:
        """Ask the worker to re-poll sessions now (a new action, flush, cancel or resume); any thread.

        Wakes that arrive before the worker's next poll cost it one pass together (an IDLE session's action
        calls it twice: its state change, then its input), and one that arrives during a pass is not lost:
        the worker polls again instead of sleeping.
        """
        with self._wake:
            self._woken = True
            self._wake.notify_all()

    # -- the loop (worker thread) ----------------------------------------------------------------

    @property
    def on_frames(self) -> Callable[[list[FrameOut]], None]:
        """Called on the worker thread with each step's frames; the step runner calls it itself as soon as a
        commit step has decoded them, before the commit forward (`engine/rollout.py` `finalize_batch`)."""
        return self._on_frames

    @on_frames.setter
    def on_frames(self, hook: Callable[[list[FrameOut]], None]) -> None:
        self._on_frames = hook
        self.runner.emit = hook

    def _publish(self) -> None:
        """Publish a consistent `EngineSnapshot` (worker thread, or before it starts)."""
        self.snapshot = EngineSnapshot(
            slots_total=self.pool.num_slots, slots_used=self.pool.used_slots, slot_bytes=self.pool.slot_bytes,
            queue_depth=self.scheduler.queue_depth, sessions=self.scheduler.stats(),
            cost=self.scheduler.cost.copy(), steps_run=self.steps_run, warmup=self.warmup_report,
            weights_sha256=self.weights_sha256)

    def _remove(self, session_id: str) -> None:
        """The one way a session leaves the engine: rollout, scheduler entry, suspect mark, slot."""
        r = self.rollouts.pop(session_id, None)
        self.scheduler.remove(session_id)
        self.runner.suspects.pop(session_id, None)
        if r is not None:
            r.close()
        else:
            self.pool.free(session_id)

    def _apply_pending(self) -> None:
        calls: list[Callable[[], None]] = []  #: move callbacks, run once the lock is released
        with self._lock:
            adds, self._pending_add = self._pending_add, []
            removes, self._pending_remove = self._pending_remove, []
            if not adds and not removes and not self._pending_export:
                return
            for sid in removes:  # first: `add_session` counted their slots free
                self._remove(sid)
            for r in adds:
                self._reserved -= 1
                restore = self._restores.pop(r.session_id, None)  # (an add queued now came after any removal)
                r.slot = self.pool.allocate(r.session_id)  # reserved: cannot be exhausted
                self.rollouts[r.session_id] = r
                if restore is None:
                    c = r.conditioner
                    self.scheduler.add(r.session_id, epoch=c.current_epoch(), input_version=c.input_version())
                else:
                    calls += self._restore(r, *restore)
            calls += self._run_exports()
        self._publish()
        for call in calls:
            call()

    def _restore(self, r: ChunkRollout, captured: session_state.CapturedSession,
                 on_restored: Callable[[bytes | None, str | None], None] | None,
                 verify: bool) -> list[Callable[[], None]]:
        """A moved session's state into its new slot (worker thread); a failure ends only that session.
        Returns the callbacks to run after the lock."""
        try:
            session_state.restore(r, captured)
            c = r.conditioner
            self.scheduler.restore(r.session_id, captured.schedule, epoch=c.current_epoch(),
                                   input_version=c.input_version())
            if on_restored is None:
                return []
            blob = session_state.capture(r, self.scheduler.schedule_of(r.session_id)) if verify else None
            return [lambda: on_restored(blob, None)]
        except Exception as e:  # noqa: BLE001 - isolated to the moved session
            logger.warning("Session(%s): restoring its moved state failed: %r", r.session_id, e)
            self._remove(r.session_id)
            sid, reason = r.session_id, f"restoring its moved state failed: {e}"
            if on_restored is not None:
                return [lambda: on_restored(None, reason)]
            return [lambda: self.on_error(sid, reason)]

    def _run_exports(self) -> list[Callable[[], None]]:
        """Capture (and detach) the sessions asked for that are between chunks now; the rest wait for
        their commit (under `_lock`). Returns the callbacks to run after the lock."""
        waiting, calls = [], []
        for sid, done, detach in self._pending_export:
            r = self.rollouts.get(sid)
            if r is None:
                calls.append(lambda d=done, s=sid: d(None, f"no session {s} on this engine"))
            elif r.staged is not None:
                waiting.append((sid, done, detach))
            else:
                try:
                    blob = session_state.capture(r, self.scheduler.schedule_of(sid))
                except Exception as e:  # noqa: BLE001 - reported to the caller; the session stays
                    calls.append(lambda d=done, why=f"capturing its state failed: {e}": d(None, why))
                    continue
                if detach:
                    self._remove(sid)
                calls.append(lambda d=done, b=blob: d(b, None))
        self._pending_export = waiting
        return calls

    def _poll_sessions(self, now_s: float) -> None:
        """Tell the scheduler what each session's conditioner says now (pause, cancel, flush and new inputs
        take effect here, at a step boundary); the scheduler decides, the runner drops what it names."""
        for sid, r in self.rollouts.items():
            c = r.conditioner
            self.scheduler.observe(sid, now_s, active=c.wants_frames(), epoch=c.current_epoch(),
                                   input_version=c.input_version())

    def _loop(self) -> None:
        if self.thread_choice is not None:
            torch.set_num_threads(self.thread_choice.threads)
        elif self.config.torch_threads:
            torch.set_num_threads(self.config.torch_threads)
        logger.info("DeviceWorker: started on %s", self.model.device)
        try:
            while True:
                self.beat_at_s = time.monotonic()  # the heartbeat: only this loop writes it
                with self._lock:
                    if self._stop:
                        break
                    self._woken = False  # wakes from here on are seen by the poll below, or prevent the wait
                self._apply_pending()
                now = self.clock()
                self._poll_sessions(now)
                plan = self.scheduler.schedule(now)
                if plan.is_empty:
                    self.runner.preempt(plan.preempted_session_ids)
                    timeout = self.config.idle_poll_s
                    if plan.next_wake_s is not None:
                        timeout = min(timeout, max(0.0, plan.next_wake_s - now))
                    with self._wake:
                        if not (self._stop or self._woken or self._pending_add or self._pending_remove
                                or self._pending_export):
                            self._wake.wait(timeout)
                    continue
                self._step_started = self.perf_clock()
                try:
                    result = self.runner.execute(plan, now)
                finally:
                    self._step_started = None
                self.steps_run += 1
                self.scheduler.update_from_output(plan, result, self.clock())
                for sid, reason in result.failed.items():
                    with self._lock:  # pool changes under the lock: `add_session` counts slots with it
                        self._remove(sid)
                    self.on_error(sid, reason)
                self._publish()
                if self.on_step is not None:
                    self.on_step(plan, result)
                if result.frames:
                    self.on_frames(result.frames)
        except BaseException as e:  # noqa: BLE001 - a dead worker is reported through /readyz
            self.last_error = repr(e)
            logger.exception("DeviceWorker: died")
            raise
        finally:
            logger.info("DeviceWorker: stopped")
