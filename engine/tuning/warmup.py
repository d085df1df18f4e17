"""Warm-up measurements: the served precision, the compiled steps, and what each costs.

The device worker (`DeviceWorker.warmup`) runs, before `/readyz` says ready:

1. threads (`engine/tuning/threads.py`);
2. precision and compiled steps at batch 1 (`measure_precisions`): for each
   dtype the model declares (`spec.precisions`), the weights are converted
   once (`WorldModel.set_precision`), the same scripted session (seed,
   noise, actions and conditioning fixed) runs `check_chunks` chunks eager,
   then timed chunks; where steps compile, the same again with compiled
   steps (the first compiled chunk builds, or loads from the on-disk cache,
   the batch-1 graphs). Frames of every way are compared with the reference
   dtype's eager frames (worst frame PSNR), and `engine/tuning/precision.py`
   chooses;
3. the other batch buckets (`measure_buckets`), for the chosen dtype when
   its steps run compiled: each bucket's graph is built, then a chunk at
   that batch is timed compiled and eager (interleaved) and the bucket is
   served compiled only where that is faster;
4. ahead-of-time packages (`measure_packages`), where `python -m
   worldcast.engine.tuning.precompile` built them for the served way: a bucket's
   packages (every step's) are loaded, their frames checked against its
   graphs' (`spec.precisions.min_psnr_db`, over `check_chunks` chunks),
   then a chunk is timed from each (interleaved) and the packages serve
   where faster; none found is one log line saying how to build them;
5. the cost model (chunks at each batch size, `DeviceWorker.warmup`).

Chunk times are taken with `timing.work_clock` (thread CPU time on a
one-thread CPU): the choice is about the model's arithmetic, not about what
else the machine is doing. Every phase is logged as it starts and ends.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from worldcast.engine.rollout import BatchCache, ChunkRollout, run_chunk_batch
from worldcast.engine.scripted import ScriptedConditioner
from worldcast.engine.state_pool import StatePool
from worldcast.engine.timing import work_clock
from worldcast.engine.tuning.compiled import StepCompiler
from worldcast.engine.tuning.packages import PackageStore
from worldcast.engine.tuning.precision import MIN_GAIN, PrecisionChoice, Trial, choose, min_psnr_db, worth_compiling
from worldcast.models.base import WorldModel
from worldcast.models.errors import ConditioningError
from worldcast.models.spec import Conditioning, ConditioningRequest, dtype_from_name, dtype_name

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BucketTiming:
    """One batch bucket's chunk, eager and compiled, and how it is served.

    Attributes:
        batch: the bucket's batch size.
        eager_s, compiled_s: chunk time each way, s (compiled None: its graph failed).
        compiled: whether the bucket is served from its graphs.
    """

    batch: int
    eager_s: float
    compiled_s: float | None
    compiled: bool


@dataclass(frozen=True)
class PackageTiming:
    """One batch bucket's chunk from its graphs and from its ahead-of-time packages (`engine/tuning/packages.py`).

    Attributes:
        batch: the bucket's batch size.
        graphs_s, packages_s: chunk time each way, s.
        psnr_db: the packages' worst frame against the graphs' frame (same sessions, seeds and inputs), dB.
        served: whether the bucket is served from its packages.
    """

    batch: int
    graphs_s: float
    packages_s: float | None
    psnr_db: float
    served: bool


@dataclass(frozen=True)
class WarmupReport:
    """What warm-up measured and chose (published in `EngineSnapshot.warmup`, exported at /metrics).

    Attributes:
        precision: the served dtype and every dtype's measurements.
        compile_mode: "inductor", "cudagraphs" or "eager" (`engine/tuning/compiled.py`).
        buckets: per batch bucket, eager and compiled chunk times (batch 1 included).
        phases_s: wall time of each warm-up phase, s ("threads", "precision", "buckets", "costs", "total").
        cache_dir: where compiled artifacts are cached (None: nothing compiled).
        failed: step name -> bucket -> why its graph was dropped.
        packages: per bucket whose ahead-of-time packages were found, graphs against packages.
    """

    precision: PrecisionChoice
    compile_mode: str = "eager"
    buckets: tuple[BucketTiming, ...] = ()
    phases_s: dict[str, float] = field(default_factory=dict)
    cache_dir: str | None = None
    failed: dict[str, dict[int, str]] = field(default_factory=dict)
    packages: tuple[PackageTiming, ...] = ()

    @property
    def compiled_buckets(self) -> tuple[int, ...]:
        return tuple(b.batch for b in self.buckets if b.compiled)

    @property
    def package_buckets(self) -> tuple[int, ...]:
        return tuple(p.batch for p in self.packages if p.served)

    def describe(self) -> str:
        """One log line."""
        buckets = ", ".join(f"{b.batch}: eager {b.eager_s * 1e3:.1f} / compiled "
                            f"{'-' if b.compiled_s is None else f'{b.compiled_s * 1e3:.1f}'} ms"
                            f"{' (served compiled)' if b.compiled else ''}" for b in self.buckets)
        phases = ", ".join(f"{k} {v:.1f} s" for k, v in self.phases_s.items())
        packages = ", ".join(f"{p.batch}: graphs {p.graphs_s * 1e3:.1f} / packages "
                             f"{'-' if p.packages_s is None else f'{p.packages_s * 1e3:.1f}'} ms, "
                             f"{p.psnr_db:.1f} dB{' (served from packages)' if p.served else ''}"
                             for p in self.packages)
        return (f"serving {self.precision.dtype}, steps {self.compile_mode if self.compiled_buckets else 'eager'}"
                f"{f' at batch {list(self.compiled_buckets)}' if self.compiled_buckets else ''}; "
                f"chunk by bucket: {buckets or 'not measured'}; "
                f"{f'packages by bucket: {packages}; ' if packages else ''}warm-up {phases}")


@dataclass(frozen=True)
class ServedWay:
    """How an engine serves: what a restarted engine takes from its predecessor (`DeviceWorker.resume`).

    Attributes:
        dtype: the served dtype's name ("float32", "bfloat16", ...).
        compiled_buckets: batch buckets served from compiled graphs (empty: eager).
        package_buckets: those of them served from ahead-of-time packages.
    """

    dtype: str
    compiled_buckets: tuple[int, ...] = ()
    package_buckets: tuple[int, ...] = ()

    @classmethod
    def from_report(cls, report: WarmupReport | None) -> ServedWay | None:
        """The way a warm-up chose (None: no warm-up ran)."""
        if report is None:
            return None
        return cls(report.precision.dtype, report.compiled_buckets, report.package_buckets)


def _sync(model: WorldModel) -> None:
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)


def check_context(model: WorldModel) -> Conditioning:
    """The conditioning quality checks run under: the model's default (its default prompt or image), else
    zeros of the declared shapes (a model that needs an image it has no default for)."""
    from worldcast.engine.scripted import zero_context

    try:
        model.spec.conditioning.validate(ConditioningRequest())
        return model.encode_conditioning(ConditioningRequest())
    except ConditioningError:
        return zero_context(model.spec)


class ChunkRunner:
    """`batch` scripted sessions of `model` in a pool of their own, run one chunk at a time (warm-up only).

    Every session holds the model's first key (so the checks cover motion) under `context`; session i
    is seeded with i, so two runners of the same model and batch start from identical state and noise.
    """

    def __init__(self, model: WorldModel, *, batch: int, context: Conditioning | None = None) -> None:
        spec = model.spec
        self.model = model
        self.pool = StatePool(spec.states, budget_bytes=spec.state_bytes_per_session() * batch, device=model.device)
        keys = spec.actions.keys[:1]
        action = model.encode_action({keys[0]: True} if keys else {}, {})
        self.rollouts = [ChunkRollout(f"__warmup{i}", model, self.pool,
                                      ScriptedConditioner(spec, action=action, context=context), seed=i)
                         for i in range(batch)]
        self.cache = BatchCache()
        for r in self.rollouts:
            r.init(0.0)

    def chunk(self) -> list[np.ndarray]:
        """Run one chunk; its frames (uint8 (H, W, 3) each, session by session)."""
        return [f.image for f in run_chunk_batch(self.rollouts, self.cache)]

    def time_chunks(self, chunks: int) -> float:
        """Median time of `chunks` chunks, s (`timing.work_clock`)."""
        clock = work_clock(self.model.device)
        samples = []
        for _ in range(chunks):
            _sync(self.model)
            t0 = clock()
            self.chunk()
            _sync(self.model)
            samples.append(clock() - t0)
        return statistics.median(samples)

    def close(self) -> None:
        for r in self.rollouts:
            r.close()


def use_way(model: WorldModel, compiler: StepCompiler, dtype: torch.dtype, *, compiled: bool | tuple[int, ...]) -> None:
    """Run `model` in `dtype`, its steps compiled (True: at batch 1; a tuple: at those buckets) or eager."""
    compiler.select(dtype)  # first: changing precision may wrap that dtype's steps (made now, or kept)
    model.set_precision(dtype)
    model.compile_steps(compiler.wrap)
    compiler.enable(compiled if isinstance(compiled, tuple) else (1,) if compiled else ())


def _check(model: WorldModel, context: Conditioning, chunks: int) -> list[np.ndarray]:
    """The quality check's frames: `chunks` chunks of one fixed scripted session."""
    return _timed_check(model, context, chunks, None)[0]


def _timed_check(model: WorldModel, context: Conditioning, chunks: int,
                 clock: Callable[[], float] | None) -> tuple[list[np.ndarray], float]:
    """The quality check's frames, and its warm chunk time on `clock`, s (0.0 without a clock).

    The warm chunk time is the fastest chunk after the first: a dtype's first chunk pays its first-call
    costs (kernel selection and weight prepacking in oneDNN, allocations), which differ between dtypes
    (a bfloat16 check measured 3.2x float32's on an AVX-512 CPU whose warm bfloat16 chunk is the faster),
    so only warm chunks compare dtypes. With one chunk it is that chunk's time.
    """
    runner = ChunkRunner(model, batch=1, context=context)
    frames: list[np.ndarray] = []
    times: list[float] = []
    try:
        for _ in range(chunks):
            _sync(model)
            t0 = clock() if clock is not None else 0.0
            frames += runner.chunk()
            _sync(model)
            times.append(clock() - t0 if clock is not None else 0.0)
    finally:
        runner.close()
    return frames, min(times[1:] or times)


def measure_precisions(model: WorldModel, compiler: StepCompiler, *, repeats: int = 5,
                       only: str | None = None) -> PrecisionChoice:
    """Measure every declared dtype at batch 1, eager and compiled, and choose (`engine/tuning/precision.py`).

    Per dtype: weights converted, the quality check run eager, then (where steps compile, and the dtype's
    warm eager chunk in that check was not far slower than the reference's: `precision.worth_compiling`,
    `_timed_check`) the batch-1 graphs
    built and the check run again compiled. Then every way that ran times `repeats` chunks in
    interleaved rounds (each way once per round), so a drift in the machine's speed touches all alike;
    the median is kept. Leaves the model in the chosen dtype with its steps wrapped by `compiler`, batch 1
    compiled when the choice is. A dtype whose conversion or chunk raises is recorded as failed.

    Args:
        model: the model (no sessions may run on it now).
        compiler: wraps the model's steps (mode "eager": nothing compiles).
        repeats: timed chunks per way.
        only: a dtype name to serve without measuring the others (eager and compiled are still measured).

    Raises:
        ValueError: `only` names a dtype the model does not declare.
        Exception: whatever the reference dtype's eager chunk raises (nothing can be served then).
    """
    spec = model.spec.precisions
    names = [dtype_name(d) for d in spec.dtypes]
    if only is not None and only not in names:
        raise ValueError(f"{model.spec.name} runs in {names}, not {only!r}")
    dtypes = [dtype_from_name(only)] if only is not None else list(spec.dtypes)
    use_way(model, compiler, dtypes[0], compiled=False)
    compiles = compiler.mode != "eager" and bool(compiler.steps)
    if len(dtypes) == 1 and not compiles:
        return PrecisionChoice(dtype=dtype_name(dtypes[0]), compiled=False, measured=False,
                               min_psnr_db=spec.min_psnr_db,
                               reason="set by configuration" if only else "the model's only dtype")
    context = check_context(model)
    reference: list[np.ndarray] | None = None
    found: dict[str, dict[str, object]] = {}  #: dtype name -> Trial fields found so far
    ways: list[tuple[torch.dtype, bool]] = []  #: (dtype, compiled) that ran and were checked
    clock = work_clock(model.device)
    for dt in dtypes:
        name = dtype_name(dt)
        logger.info("warm-up: %s: converting the weights, checking its frames eager", name)
        try:
            use_way(model, compiler, dt, compiled=False)
            frames, warm_s = _timed_check(model, context, spec.check_chunks, clock)
        except Exception as e:  # noqa: BLE001 - a dtype this machine cannot run is not chosen
            if reference is None:
                raise  # the reference dtype must run: nothing can be served otherwise
            logger.warning("warm-up: %s failed: %r", name, e)
            found[name] = {"error": f"{type(e).__name__}: {e}"[:200]}
            continue
        if reference is None:
            reference, reference_warm_s = frames, warm_s
        found[name] = {"psnr_db": math.inf if frames is reference else min_psnr_db(frames, reference)}
        ways.append((dt, False))
        if not compiles:
            continue
        if frames is not reference and reference_warm_s > 0 and not worth_compiling(warm_s, reference_warm_s):
            why = f"warm eager chunk {warm_s / reference_warm_s:.1f}x the reference's"
            logger.info("warm-up: %s: no graphs built (%s: compiling cannot make it the fastest)", name, why)
            found[name]["compile_skipped"] = why
            continue
        logger.info("warm-up: %s: building (or loading from the cache) the batch-1 graphs of %s", name,
                    ", ".join(compiler.steps))
        t0, failures = time.perf_counter(), compiler.failure_count()
        try:
            use_way(model, compiler, dt, compiled=True)
            with compiler.compiling([1]):
                cframes = _check(model, context, spec.check_chunks)
            if compiler.failure_count() == failures:
                found[name]["compiled_psnr_db"] = min_psnr_db(cframes, reference)
                ways.append((dt, True))
        except Exception as e:  # noqa: BLE001 - compilation failed: this dtype runs eager
            logger.warning("warm-up: %s compiled steps failed: %r", name, e)
        logger.info("warm-up: %s: batch-1 graphs %s in %.1f s", name,
                    "ready" if (dt, True) in ways else "FAILED (eager)", time.perf_counter() - t0)
    logger.info("warm-up: timing %d ways of running a chunk, %d interleaved rounds", len(ways), repeats)
    runners = {}
    for dt, compiled in ways:
        use_way(model, compiler, dt, compiled=compiled)
        runners[dt, compiled] = ChunkRunner(model, batch=1, context=context)
        runners[dt, compiled].chunk()  # untimed: caches and allocator settle
    samples: dict[tuple[torch.dtype, bool], list[float]] = {w: [] for w in ways}
    try:
        for _ in range(repeats):
            for dt, compiled in ways:
                use_way(model, compiler, dt, compiled=compiled)
                samples[dt, compiled].append(runners[dt, compiled].time_chunks(1))
    finally:
        for r in runners.values():
            r.close()
    trials = []
    for dt in dtypes:
        name = dtype_name(dt)
        f = found.get(name, {})
        eager = samples.get((dt, False))
        comp = samples.get((dt, True))
        trials.append(Trial(name, statistics.median(eager) if eager else None,
                            statistics.median(comp) if comp else None,
                            float(f.get("psnr_db", math.inf)),  # type: ignore[arg-type]
                            float(f.get("compiled_psnr_db", math.inf)),  # type: ignore[arg-type]
                            f.get("error"), f.get("compile_skipped")))  # type: ignore[arg-type]
    choice = choose(trials, min_psnr_db=spec.min_psnr_db)
    use_way(model, compiler, dtype_from_name(choice.dtype), compiled=choice.compiled)
    return choice


def build_graphs(model: WorldModel, compiler: StepCompiler, batch: int, buckets: Sequence[int],
                 context: Conditioning) -> ChunkRunner:
    """Build (or load from the cache) the graphs of the steps at `batch`: a `ChunkRunner` of `batch` sessions
    made and run one chunk while `buckets` compile, so both ways a step is called are traced (a commit from
    `init`, whose `prev` is the encoded picture in float32, and from a chunk, whose `prev` is the state's
    dtype). A way left untraced would be a recompile when a session first calls it, and the bucket would
    run eager from then on (`CompiledStep`), unlike what warm-up measured and a replay reproduces.

    Returns the runner, one chunk in (the caller closes it).
    """
    with compiler.compiling(buckets):
        runner = ChunkRunner(model, batch=batch, context=context)
        try:
            runner.chunk()
        except BaseException:
            runner.close()
            raise
    return runner


def measure_buckets(model: WorldModel, compiler: StepCompiler, *, max_batch: int, repeats: int = 3,
                    batch1: tuple[float, float | None] | None = None) -> tuple[BucketTiming, ...]:
    """Build each bucket's graphs (up to `max_batch`) and serve it compiled where its chunk is faster.

    Buckets are measured smallest first; batch 1 keeps what `measure_precisions` chose (`batch1`: its
    eager and compiled chunk times). The model's dtype and steps are as `measure_precisions` left them.
    """
    out: list[BucketTiming] = []
    on = set(compiler.enabled_buckets())
    if batch1 is not None:
        out.append(BucketTiming(1, batch1[0], batch1[1], 1 in on))
    if 1 not in on:  # the steps run eager at batch 1: larger buckets are not tried
        return tuple(out)
    context = check_context(model)
    for b in compiler.buckets:
        if b == 1 or b > max_batch:
            continue
        logger.info("warm-up: building (or loading) the batch-%d graphs", b)
        runner = build_graphs(model, compiler, b, sorted(on | {b}), context)
        try:
            eager_s: list[float] = []
            comp_s: list[float] = []
            for _ in range(repeats):  # interleaved, so a drift in the machine's speed touches both alike
                compiler.enable(sorted(on))
                eager_s.append(runner.time_chunks(1))
                compiler.enable(sorted(on | {b}))
                comp_s.append(runner.time_chunks(1))
        finally:
            runner.close()
        e, c = statistics.median(eager_s), statistics.median(comp_s)
        failed = any(b in s.failed for s in compiler.steps.values())
        use = not failed and c < e * (1 - MIN_GAIN)
        if use:
            on.add(b)
        out.append(BucketTiming(b, e, None if failed else c, use))
        compiler.enable(sorted(on))
    return tuple(out)


def measure_packages(model: WorldModel, compiler: StepCompiler, store: PackageStore, *,
                     repeats: int = 3) -> tuple[PackageTiming, ...]:
    """Load the ahead-of-time packages of the buckets served compiled, check and time them, and serve
    each bucket from its packages where they pass the quality check and are faster (see the module
    docstring, phase 4).

    The check runs the same scripted sessions (same seeds, inputs and noise) `check_chunks` chunks from
    the graphs and from the packages; the packages pass when every frame's PSNR against the graphs' is
    at least `spec.precisions.min_psnr_db`. A package that fails to load or to run leaves its bucket
    on its graphs (logged).
    """
    graphs = compiler.enabled_buckets()
    if not graphs:
        return ()
    found = compiler.load_packages(store, model.device, graphs)
    if not found:
        logger.info("warm-up: no ahead-of-time packages for %s %s at batch %s in %s (`python -m "
                    "worldcast.engine.tuning.precompile` builds them; steps then skip oneDNN's per-call weight "
                    "reorder)",
                    model.spec.name, dtype_name(model.precision), list(graphs), store.root)
        return ()
    spec = model.spec.precisions
    context = check_context(model)
    served: set[int] = set()
    out: list[PackageTiming] = []
    for b in found:
        logger.info("warm-up: checking and timing the batch-%d packages against the graphs", b)
        base, pack = (ChunkRunner(model, batch=b, context=context) for _ in range(2))
        try:
            compiler.use_packages(sorted(served))
            ref = [f for _ in range(spec.check_chunks) for f in base.chunk()]
            compiler.use_packages(sorted(served | {b}))
            got = [f for _ in range(spec.check_chunks) for f in pack.chunk()]
            psnr = min_psnr_db(got, ref)
            g_s: list[float] = []
            p_s: list[float] = []
            for _ in range(repeats):
                compiler.use_packages(sorted(served))
                g_s.append(base.time_chunks(1))
                compiler.use_packages(sorted(served | {b}))
                p_s.append(pack.time_chunks(1))
        except Exception as e:  # noqa: BLE001 - a package that cannot run is not served
            logger.warning("warm-up: the batch-%d packages failed: %r", b, e)
            out.append(PackageTiming(b, math.nan, None, -math.inf, False))
            continue
        finally:
            for r in (base, pack):
                r.close()
        ran = b in compiler.package_buckets()  # a package whose arguments did not match left its bucket
        g, p = statistics.median(g_s), statistics.median(p_s)
        use = ran and psnr >= spec.min_psnr_db and p < g * (1 - MIN_GAIN)
        if use:
            served.add(b)
        elif psnr < spec.min_psnr_db:
            logger.warning("warm-up: the batch-%d packages' frames are %.1f dB from the graphs' (below %.1f): "
                           "not served", b, psnr, spec.min_psnr_db)
        out.append(PackageTiming(b, g, p if ran else None, psnr, use))
    compiler.use_packages(sorted(served))
    return tuple(out)


def timed(phases: dict[str, float], name: str) -> Callable[[], None]:
    """Start timing warm-up phase `name`; call the result to record its wall time in `phases`."""
    t0 = time.perf_counter()

    def done() -> None:
        phases[name] = time.perf_counter() - t0

    return done
