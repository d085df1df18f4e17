"""Ahead-of-time step packages: a step's graph with its weights frozen in, built once, loaded in milliseconds.

A compiled step (`engine/tuning/compiled.py`) is traced by TorchDynamo and its
kernels come from TorchInductor's on-disk cache, but the graph's weights
stay ordinary tensors: oneDNN then reorders every linear's and
convolution's weight into its blocked (AMX/VNNI) layout on each call.
Freezing the weights into the graph prepacks them once (a TinyWorld bfloat16
chunk at batch 1: 36.7 ms from graphs, 26.1 ms from packages, `python -m
worldcast.latency_bench.engine_bench --chunks`, BENCHMARKS.md), but
TorchInductor's FX graph cache cannot store oneDNN's packed tensors, so a
frozen `torch.compile` graph is rebuilt at every start.

A package is the other way to keep it: the step is exported
(`torch.export`) at one batch bucket and compiled by AOTInductor with
`freezing=True` into a `.pt2` archive (a shared library with the packed
weights in it; `torch._inductor.aoti_compile_and_package`), which
`torch._inductor.aoti_load_package` loads without tracing anything.
Building one takes about a minute of CPU per graph on the 2-vCPU VM, so it is
never done at start-up: `python -m worldcast.engine.tuning.precompile` (`make
precompile`) builds them ahead of time, and warm-up uses a bucket's packages
only after checking their frames against the graphs' and timing both
(`engine/tuning/warmup.py`, `measure_packages`).

A package is found by a key over everything its code and constants depend
on: the step's name and function, the content of the weights it closes over,
the shape, dtype and strides of every argument (a package runs one static
shape and does not check its inputs: `Package.__call__` does), the torch
version and the machine (`machine_kind`: the CPU's kernel capability, AMX,
oneDNN's ISA cap).
New weights or another machine miss the cache; nothing stale is ever loaded.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from worldcast.models.base import StepFn

logger = logging.getLogger(__name__)

#: Bumped when the way packages are built changes (old files then miss).
FORMAT = 1


@dataclass(frozen=True)
class ArgSpec:
    """One step argument as a package is specialised on it: shape, dtype name and strides."""

    shape: tuple[int, ...]
    dtype: str
    stride: tuple[int, ...]

    @classmethod
    def of(cls, t: torch.Tensor) -> ArgSpec:
        return cls(tuple(t.shape), str(t.dtype).removeprefix("torch."), tuple(t.stride()))

    def matches(self, t: torch.Tensor) -> bool:
        return tuple(t.shape) == self.shape and tuple(t.stride()) == self.stride and \
            str(t.dtype).removeprefix("torch.") == self.dtype

    def example(self, device: torch.device) -> torch.Tensor:
        """A zero tensor of this spec (export reads shapes only)."""
        dt = getattr(torch, self.dtype)
        return torch.empty_strided(self.shape, self.stride, dtype=dt, device=device).zero_()


def weights_digest(fn: StepFn) -> str:
    """sha256 over what a step's compiled code depends on besides its arguments: the function's
    qualified name and the source file of its module; every `nn.Module` or tensor among a
    `functools.partial`'s bound arguments (parameters and buffers, names and bytes; a module's
    plain settings, such as TinyWorld's sampler smoothings, and its class's source file). Editing
    either file or a setting misses the cache as new weights do; code in other modules they call
    (kernels, helpers) is not hashed. Hashing TinyWorld's 3 M
    parameters takes a few ms."""
    h = hashlib.sha256()
    base = fn.func if isinstance(fn, functools.partial) else fn
    h.update(f"{getattr(base, '__module__', '')}.{getattr(base, '__qualname__', repr(base))}".encode())
    _digest_source(h, getattr(base, "__module__", None))
    bound = [*fn.args, *fn.keywords.values()] if isinstance(fn, functools.partial) else []
    for obj in bound:
        tensors: list[tuple[str, torch.Tensor]] = []
        if isinstance(obj, torch.nn.Module):
            _digest_source(h, type(obj).__module__)
            for m in obj.modules():
                settings = sorted((k, v) for k, v in vars(m).items()
                                  if not k.startswith("_") and isinstance(v, (bool, int, float, str)))
                h.update(repr(settings).encode())
            tensors = [*obj.named_parameters(), *obj.named_buffers()]
        elif isinstance(obj, torch.Tensor):
            tensors = [("", obj)]
        for name, t in tensors:
            h.update(name.encode())
            h.update(str(t.dtype).encode())
            h.update(str(tuple(t.shape)).encode())
            h.update(t.detach().cpu().flatten().clone().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _digest_source(h: hashlib._Hash, module_name: str | None) -> None:
    """Feed `h` the bytes of `module_name`'s source file (nothing for a module without one)."""
    mod = sys.modules.get(module_name or "")
    path = getattr(mod, "__file__", None)
    if path and Path(path).is_file():
        h.update(Path(path).read_bytes())


def package_key(name: str, digest: str, specs: Sequence[ArgSpec], device: torch.device) -> str:
    """The cache key of one step's package (see the module docstring): 24 hex digits."""
    text = repr((FORMAT, torch.__version__, machine_kind(device), name, digest, tuple(specs)))
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def machine_kind(device: torch.device) -> str:
    """What a package's code and packed weights depend on besides itself: on a CPU, ATen's kernel capability
    (`ATEN_CPU_CAPABILITY` may lower it), whether AMX tiles are there and `ONEDNN_MAX_CPU_ISA` (which caps
    oneDNN's packing); on an accelerator, its name."""
    if device.type != "cpu":
        return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    amx = bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())
    return f"{torch.backends.cpu.get_cpu_capability()}/amx={amx}/onednn={os.environ.get('ONEDNN_MAX_CPU_ISA', '')}"


class Package:
    """A loaded package: the step at one static shape (callable like the step itself).

    Raises (on call):
        ValueError: an argument does not match the shape, dtype and strides it was built for
            (the caller falls back to its graph or eager; the package is not run).
    """

    def __init__(self, runner: Any, specs: Sequence[ArgSpec], path: Path) -> None:
        self.runner, self.specs, self.path = runner, tuple(specs), path

    def __call__(self, *args: torch.Tensor) -> Any:
        if len(args) != len(self.specs) or not all(
                isinstance(a, torch.Tensor) and s.matches(a) for a, s in zip(args, self.specs, strict=False)):
            raise ValueError(f"package {self.path.name}: arguments do not match its specs")
        out = self.runner(*args)
        return tuple(out) if isinstance(out, list) else out


class _StepModule(torch.nn.Module):
    """A step function as the module `torch.export` takes (its weights reach it through `fn`'s closure)."""

    def __init__(self, fn: StepFn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: torch.Tensor) -> Any:
        return self.fn(*args)


class PackageStore:
    """Packages on disk under `root` (one `<key>.pt2` each), built and loaded by key.

    Args:
        root: the directory (created on the first build).
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @classmethod
    def in_cache(cls, cache_dir: Path) -> PackageStore:
        """The store inside a compile cache directory (`compiled.configure_cache`): `<cache_dir>/aot-packages`."""
        return cls(Path(cache_dir) / "aot-packages")

    def path(self, key: str) -> Path:
        return self.root / f"{key}.pt2"

    def has(self, key: str) -> bool:
        return self.path(key).is_file()

    def load(self, key: str, specs: Sequence[ArgSpec]) -> Package | None:
        """The package of `key`, or None when there is none or it does not load (logged; a corrupt
        file is removed so the next build replaces it)."""
        p = self.path(key)
        if not p.is_file():
            return None
        try:
            return Package(torch._inductor.aoti_load_package(str(p)), specs, p)
        except Exception as e:  # noqa: BLE001 - a broken file must not stop the server: graphs serve instead
            logger.warning("PackageStore: %s does not load (%s: %s); removed", p, type(e).__name__, str(e)[:200])
            p.unlink(missing_ok=True)
            return None

    def build(self, name: str, fn: StepFn, specs: Sequence[ArgSpec], device: torch.device) -> Path:
        """Export `fn` at `specs` and compile it with frozen weights into the package of its key.

        Written to a temporary file first and renamed, so a reader never sees half a package.

        Returns:
            the package's path.

        Raises:
            Exception: whatever `torch.export` or AOTInductor raise (nothing is written).
        """
        key = package_key(name, weights_digest(fn), specs, device)
        self.root.mkdir(parents=True, exist_ok=True)
        args = tuple(s.example(device) for s in specs)
        t0 = time.perf_counter()
        with torch.no_grad():
            program = torch.export.export(_StepModule(fn), args)
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f"{key}.", suffix=".partial.pt2")
            os.close(fd)
            try:
                torch._inductor.aoti_compile_and_package(program, package_path=tmp,
                                                          inductor_configs={"freezing": True})
                os.replace(tmp, self.path(key))
            finally:
                Path(tmp).unlink(missing_ok=True)
        logger.info("PackageStore: built %s (%s, %s) in %.1f s", self.path(key).name, name,
                    ", ".join(f"{s.dtype}{list(s.shape)}" for s in specs), time.perf_counter() - t0)
        return self.path(key)
