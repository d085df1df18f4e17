"""Compiled step functions: one graph per batch-size bucket, used where measurement says it is faster.

A model hands the engine its hot pure-tensor step functions
(`WorldModel.compile_steps`, `models.base.StepFn`); a `StepCompiler` wraps
each in a `CompiledStep`:

- CPU: `torch.compile` with TorchInductor (fused C++/OpenMP kernels for the
  elementwise work between matmuls). With `freeze` the weights become
  constants of the graph, so oneDNN's linears and convolutions run on
  prepacked weights with their activations fused (about 20 % off a compiled
  bfloat16 chunk here, BENCHMARKS.md); but oneDNN's packed weights cannot be
  pickled, so TorchInductor's FX graph cache skips frozen graphs and every
  start rebuilds them (about 15-20 s a graph on this 2-vCPU VM instead of
  2-5 s): off by default (`EngineConfig.compile_freeze`). Steps run under
  `torch.no_grad` and the weights never change after warm-up, as freezing
  requires.
- CUDA: the same plus CUDA graphs (`mode="reduce-overhead"`: the step's
  kernels replayed as one graph, the launch overhead of many small kernels
  gone). Outputs are cloned out of
  the graph's memory pool before they are returned, since the next replay
  overwrites them.
- anything else (or `enabled=False`): eager.

Each bucket (a batch size, e.g. 1, 2, 4) gets its own static-shape graph,
compiled during warm-up (`engine/tuning/warmup.py`) before `/readyz` says ready; a
batch between buckets runs in the next bucket up, its rows padded by
repeating the last one (the outputs' extra rows are dropped), so no batch
size compiles while serving. A bucket is used only where warm-up measured
its compiled chunk faster than eager (`enable`); a bucket whose graph fails
to build, or that would recompile while serving (guards run under
`torch.compiler.set_stance("fail_on_recompile")`), falls back to eager for
good and says so in the log.

A bucket may instead run from ahead-of-time packages (`engine/tuning/packages.py`:
frozen weights, built by `python -m worldcast.engine.tuning.precompile`, loaded by
`StepCompiler.load_packages` and switched on by `use_packages` once warm-up
has checked and timed them); a call whose arguments do not match the
package's specs runs from the graph instead.

Compiled artifacts are cached on disk (`configure_cache`): TorchInductor's
FX graph cache and AOTAutograd cache under `TORCHINDUCTOR_CACHE_DIR`
(default `~/.cache/worldcast/torch-compile`), so a restart re-traces the
steps (seconds) but does not re-generate or re-build their kernels
(minutes on a 2-vCPU machine).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from worldcast.engine.tuning.packages import ArgSpec, Package, PackageStore, package_key, weights_digest
from worldcast.models.base import StepFn

logger = logging.getLogger(__name__)

#: How a step runs: "inductor" (torch.compile, CPU), "cudagraphs" (torch.compile + CUDA graphs), "eager".
CompileMode = Literal["inductor", "cudagraphs", "eager"]

#: Default batch-size buckets compiled at warm-up.
DEFAULT_BUCKETS = (1, 2, 4)


def compile_mode_for(device: torch.device, *, enabled: bool = True) -> CompileMode:
    """The compile mode for steps on `device`: CUDA graphs on CUDA, Inductor on the CPU, eager elsewhere
    (MPS, ...) or when compilation is off."""
    if not enabled:
        return "eager"
    if device.type == "cuda":
        return "cudagraphs"
    if device.type == "cpu":
        return "inductor"
    return "eager"


#: TorchInductor settings while a frozen step's graphs are built (`torch._inductor.config.patch`): freezing is
#: read outside `torch.compile(options=...)`'s reach, so it is patched around the compiling calls instead.
FREEZE_CONFIG: dict[str, object] = {"freezing": True}


def compile_options(mode: CompileMode) -> dict[str, object]:
    """`torch.compile` arguments of a compile mode (CUDA graphs: `mode="reduce-overhead"`)."""
    return {"mode": "reduce-overhead"} if mode == "cudagraphs" else {}


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/worldcast/torch-compile` (XDG_CACHE_HOME defaults to ~/.cache)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "worldcast" / "torch-compile"


def configure_cache(cache_dir: Path | None) -> Path:
    """Point TorchInductor's on-disk caches at `cache_dir` (None: keep `TORCHINDUCTOR_CACHE_DIR` if the
    environment sets it, else `default_cache_dir()`), with the FX graph and AOTAutograd caches on.

    Returns:
        the directory in use (created).
    """
    if cache_dir is None:
        cache_dir = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir())
    cache_dir.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    import torch._dynamo.config as dynamo_config
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = True
    functorch_config.enable_autograd_cache = True
    # one graph per (step, bucket, precision): more than dynamo's default of 8 per function may be needed
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 64)
    return cache_dir


def bucket_for(batch: int, buckets: Sequence[int]) -> int | None:
    """The smallest bucket that holds `batch` sessions (None: larger than every bucket)."""
    fits = [b for b in buckets if b >= batch]
    return min(fits) if fits else None


def _canonical(x: Any) -> Any:
    """A tensor in plain contiguous layout (the layout graphs are specialised on); anything else as is."""
    if not isinstance(x, torch.Tensor):
        return x
    strides, acc = [], 1
    for n in reversed(x.shape):
        strides.append(acc)
        acc *= max(n, 1)
    if tuple(reversed(strides)) == x.stride():
        return x
    return x.clone(memory_format=torch.contiguous_format)


def _pad(x: Any, rows: int) -> Any:
    """`x` with its last row repeated up to `rows` rows (dim 0); non-tensors unchanged."""
    if not isinstance(x, torch.Tensor) or x.shape[0] >= rows:
        return x
    return torch.cat([x, x[-1:].expand(rows - x.shape[0], *x.shape[1:])])


def _map_out(out: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(out, torch.Tensor):
        return fn(out)
    if isinstance(out, tuple | list):
        return type(out)(_map_out(o, fn) for o in out)
    return out


@dataclass
class CompiledStep:
    """One step function with its compiled graphs per bucket (see the module docstring).

    Attributes:
        name: the model's name for the step ("denoise", "commit", "decode", ...).
        fn: the eager function.
        mode: how compiled graphs run (`compile_mode_for`).
        buckets: the batch sizes that get a graph.
        enabled: buckets whose graph runs (the rest run eager); empty until `StepCompiler.enable`.
        compiling: while True (warm-up) an enabled bucket may build its graph; otherwise a call that
            would build one (a recompile) falls back to eager.
        failed: bucket -> why its graph was dropped.
        freeze: build graphs with frozen weights (see the module docstring).
        specs: bucket -> each distinct set of padded arguments' specs the step was called with at that bucket
            (a step may be called two ways, e.g. a commit from init and from a chunk).
        packages: bucket -> specs -> its ahead-of-time package (`engine/tuning/packages.py`;
            `StepCompiler.load_packages`).
        use_packages: buckets served from their package (a subset of `enabled`; the rest from graphs).
        recording: while True, each call records its bucket's `specs` and runs eager (`StepCompiler.recording`).
    """

    name: str
    fn: StepFn
    mode: CompileMode
    buckets: tuple[int, ...]
    freeze: bool = False
    enabled: set[int] = field(default_factory=set)
    compiling: bool = False
    failed: dict[int, str] = field(default_factory=dict)
    specs: dict[int, list[tuple[ArgSpec, ...]]] = field(default_factory=dict)
    packages: dict[int, dict[tuple[ArgSpec, ...], Package]] = field(default_factory=dict)
    use_packages: set[int] = field(default_factory=set)
    recording: bool = False
    _compiled: StepFn | None = None
    _digest: str | None = None

    def __post_init__(self) -> None:
        if self.mode != "eager":
            self._compiled = torch.compile(self.fn, dynamic=False, **compile_options(self.mode))  # type: ignore[arg-type]

    def _bucket(self, batch: int) -> int | None:
        return bucket_for(batch, [b for b in self.buckets if b in self.enabled and b not in self.failed])

    def digest(self) -> str:
        """`packages.weights_digest` of the step (computed once: the weights never change after warm-up)."""
        if self._digest is None:
            self._digest = weights_digest(self.fn)
        return self._digest

    def package_keys(self, bucket: int, device: torch.device) -> list[tuple[str, tuple[ArgSpec, ...]]]:
        """(key, specs) of this step's packages at `bucket`, one per way it was called (empty: never called)."""
        return [(package_key(self.name, self.digest(), sp, device), sp) for sp in self.specs.get(bucket, [])]

    def _record(self, bucket: int, padded: Sequence[Any]) -> tuple[ArgSpec, ...] | None:
        if not all(isinstance(a, torch.Tensor) for a in padded):
            return None
        sp = tuple(ArgSpec.of(a) for a in padded)
        seen = self.specs.setdefault(bucket, [])
        if sp not in seen:
            seen.append(sp)
        return sp

    def __call__(self, *args: Any) -> Any:
        if not args or not isinstance(args[0], torch.Tensor):
            return self.fn(*args)
        batch = int(args[0].shape[0])
        if self.recording:
            b = bucket_for(batch, self.buckets)
            if b is not None:
                self._record(b, [_canonical(_pad(a, b)) for a in args])
            return self.fn(*args)
        if self._compiled is None:
            return self.fn(*args)
        bucket = self._bucket(batch)
        if bucket is None:
            return self.fn(*args)
        padded = [_canonical(_pad(a, bucket)) for a in args]
        package = None
        if self.compiling or bucket in self.use_packages:  # specs are needed to build graphs' keys or find a package
            sp = self._record(bucket, padded)
            package = self.packages.get(bucket, {}).get(sp) if bucket in self.use_packages and sp else None  # type: ignore[arg-type]
        if package is not None:
            try:
                out = package(*padded)
            except ValueError as e:  # arguments not as the package was built for: the graph serves instead
                logger.warning("CompiledStep(%s): batch bucket %d leaves its package (%s)", self.name, bucket, e)
                self.use_packages.discard(bucket)
            else:
                return out if bucket == batch else _map_out(out, lambda t: t[:batch])
        if self.compiling:
            import torch._inductor.config as inductor_config

            stance: contextlib.AbstractContextManager[Any] = (inductor_config.patch(FREEZE_CONFIG) if self.freeze
                                                               else contextlib.nullcontext())
        else:
            stance = torch.compiler.set_stance("fail_on_recompile")
        try:
            with stance:
                if self.mode == "cudagraphs":
                    torch.compiler.cudagraph_mark_step_begin()
                out = self._compiled(*padded)
        except Exception as e:  # noqa: BLE001 - a graph that cannot build or would recompile: eager from now on
            self.failed[bucket] = f"{type(e).__name__}: {str(e)[:300]}"
            self.enabled.discard(bucket)
            logger.warning("CompiledStep(%s): batch bucket %d runs eager from now on (%s)", self.name, bucket,
                           self.failed[bucket])
            return self.fn(*args)
        if self.mode == "cudagraphs":
            out = _map_out(out, lambda t: t.clone())  # the next replay overwrites the graph's outputs
        if bucket != batch:
            out = _map_out(out, lambda t: t[:batch])
        return out


class StepCompiler:
    """Makes `CompiledStep`s for a model's step functions and switches their buckets (one per device worker).

    Args:
        device: the model's device (picks the mode, `compile_mode_for`).
        buckets: batch sizes that get a graph.
        enabled: False: every step runs eager (the mode is "eager").
        freeze: build graphs with frozen weights (faster steps, not cached on disk: module docstring).
    """

    def __init__(self, device: torch.device, *, buckets: Sequence[int] = DEFAULT_BUCKETS, enabled: bool = True,
                 freeze: bool = False) -> None:
        if not buckets or any(b < 1 for b in buckets):
            raise ValueError(f"compile buckets must be positive batch sizes, got {tuple(buckets)}")
        self.mode = compile_mode_for(device, enabled=enabled)
        self.freeze = freeze
        self.buckets = tuple(sorted(set(buckets)))
        #: one set of wrappers per key (`select`; a model wraps each precision's steps once and keeps them)
        self._sets: dict[object, dict[str, CompiledStep]] = {}
        self.steps: dict[str, CompiledStep] = self._sets.setdefault(None, {})  #: the set in use, by step name
        self._all: list[CompiledStep] = []  #: every wrapper made

    def select(self, key: object) -> None:
        """Make the wrappers kept under `key` (e.g. a dtype) the steps in use, the set that `load_packages`,
        `use_packages`, `enabled_buckets` and `failed` read; `wrap` adds to it.

        Call it before the model's `set_precision` and `compile_steps`, with the key of the precision it will
        run in: the model wraps a precision's steps only the first time (in either call), and later returns
        those same wrappers.
        """
        self.steps = self._sets.setdefault(key, {})

    def wrap(self, name: str, fn: StepFn) -> StepFn:
        """A `models.base.StepWrap`: the step `fn` as a `CompiledStep`, kept in `steps` (the set selected)."""
        step = CompiledStep(name, fn, self.mode, self.buckets, freeze=self.freeze)
        self.steps[name] = step
        self._all.append(step)
        return step

    def failure_count(self) -> int:
        """Graphs dropped so far, over every wrapper."""
        return sum(len(s.failed) for s in self._all)

    @contextlib.contextmanager
    def compiling(self, buckets: Sequence[int] | None = None) -> Iterator[None]:
        """While inside, the steps run (and may build) their graphs for `buckets` (None: all); on exit the
        buckets in use are as before."""
        keep = [(s, s.compiling, set(s.enabled)) for s in self._all]
        for s in self._all:
            s.compiling = True
            s.enabled = set(s.buckets if buckets is None else [b for b in buckets if b in s.buckets])
        try:
            yield
        finally:
            for s, was, enabled in keep:
                s.compiling, s.enabled = was, enabled - set(s.failed)

    def enable(self, buckets: Sequence[int]) -> None:
        """Run these buckets from their graphs and the rest eager (buckets whose graph failed stay eager)."""
        for s in self._all:
            s.enabled = {b for b in buckets if b in s.buckets and b not in s.failed}

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """While inside, every step runs eager and records the argument specs of each call's bucket (what
        `python -m worldcast.engine.tuning.precompile` builds packages for, without compiling graphs)."""
        for s in self._all:
            s.recording = True
        try:
            yield
        finally:
            for s in self._all:
                s.recording = False

    def load_packages(self, store: PackageStore, device: torch.device,
                      buckets: Sequence[int] | None = None) -> tuple[int, ...]:
        """Load the packages of the steps in use, for `buckets` (None: all) where every step has at least one
        (a call whose arguments have no package runs from the graph).

        Nothing is served from them until `use_packages`. Returns the buckets whose packages loaded.
        """
        loaded = []
        for b in self.buckets if buckets is None else buckets:
            found: dict[str, dict[tuple[ArgSpec, ...], Package]] = {}
            for n, s in self.steps.items():
                got = {sp: store.load(k, sp) for k, sp in s.package_keys(b, device) if store.has(k)}
                found[n] = {sp: p for sp, p in got.items() if p is not None}
            if self.steps and all(found.values()):  # calls with other arguments run from the graph
                for n, ps in found.items():
                    self.steps[n].packages[b] = ps
                loaded.append(b)
        return tuple(loaded)

    def use_packages(self, buckets: Sequence[int]) -> None:
        """Serve these buckets (those enabled whose packages loaded) from their packages; the rest from graphs."""
        for s in self.steps.values():
            s.use_packages = {b for b in buckets if b in s.packages}

    def package_buckets(self) -> tuple[int, ...]:
        """Buckets every step in use serves from its package."""
        if not self.steps:
            return ()
        return tuple(sorted(set.intersection(*(s.use_packages & s.enabled for s in self.steps.values()))))

    @property
    def failed(self) -> dict[str, dict[int, str]]:
        """Step name -> bucket -> why its graph was dropped (the steps in use now)."""
        return {n: dict(s.failed) for n, s in self.steps.items() if s.failed}

    def enabled_buckets(self) -> tuple[int, ...]:
        """Buckets every step serves from its graph."""
        if not self.steps or self.mode == "eager":
            return ()
        common = set.intersection(*(s.enabled for s in self.steps.values()))
        return tuple(sorted(common))
