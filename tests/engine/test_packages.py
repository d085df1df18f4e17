"""Ahead-of-time step packages: keys that miss on any change, a real AOTInductor package served in its bucket,
broken files and mismatched arguments falling back, warm-up's quality gate, and what precompile builds."""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from worldcast.engine.tuning.compiled import CompiledStep, StepCompiler
from worldcast.engine.tuning.packages import ArgSpec, Package, PackageStore, package_key, weights_digest
from worldcast.engine.tuning.precompile import build_packages
from worldcast.engine.tuning.warmup import ChunkRunner, measure_packages, use_way
from worldcast.models import registry

CPU = torch.device("cpu")


def _lin(mod: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    y = mod(x.to(mod.weight.dtype))
    return y, y.sum(-1)


def test_a_key_changes_with_weights_shapes_dtypes_and_step() -> None:
    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    fa, fb = functools.partial(_lin, a), functools.partial(_lin, b)
    spec = (ArgSpec.of(torch.zeros(2, 4)),)
    key = package_key("lin", weights_digest(fa), spec, CPU)
    assert key == package_key("lin", weights_digest(functools.partial(_lin, a)), spec, CPU)  # deterministic
    assert key != package_key("lin", weights_digest(fb), spec, CPU)  # other weights
    assert key != package_key("other", weights_digest(fa), spec, CPU)
    assert key != package_key("lin", weights_digest(fa), (ArgSpec.of(torch.zeros(4, 4)),), CPU)
    assert key != package_key("lin", weights_digest(fa), (ArgSpec.of(torch.zeros(2, 4, dtype=torch.bfloat16)),), CPU)
    with torch.no_grad():
        a.weight[0, 0] += 1e-3  # one weight moved: a package built before no longer matches
    moved = package_key("lin", weights_digest(functools.partial(_lin, a)), spec, CPU)
    assert key != moved
    a.smoothing_px = 2.0  # a module's plain setting the traced code reads (TinyWorld's sampler smoothings)
    assert moved != package_key("lin", weights_digest(functools.partial(_lin, a)), spec, CPU)


def test_a_key_changes_with_the_code_of_the_step_and_its_module(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Editing the step's module (or the module class's) misses the cache: new code with old weights is never
    served a package compiled from the old code."""
    import importlib
    import sys

    src = tmp_path / "pkgstep.py"
    src.write_text("def step(mod, x):\n    return mod(x)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = importlib.import_module("pkgstep")
    lin = torch.nn.Linear(4, 4)
    before = weights_digest(functools.partial(mod.step, lin))
    src.write_text("def step(mod, x):\n    return mod(x) * 2\n")
    assert weights_digest(functools.partial(mod.step, lin)) != before
    sys.modules.pop("pkgstep", None)


def test_a_package_checks_its_arguments_before_running() -> None:
    ran = []
    pkg = Package(lambda *a: ran.append(a) or [a[0] + 1], (ArgSpec.of(torch.zeros(2, 3)),), Path("x.pt2"))
    assert torch.equal(pkg(torch.zeros(2, 3))[0], torch.ones(2, 3))  # a list comes back as a tuple
    for bad in (torch.zeros(3, 3), torch.zeros(2, 3, dtype=torch.float64), torch.zeros(3, 2).t()):
        with pytest.raises(ValueError, match="do not match"):
            pkg(bad)
    assert len(ran) == 1  # a mismatched call never reached the runner (an AOT package does not check shapes)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[PackageStore, CompiledStep, torch.nn.Module]:
    """A real package (torch.export + AOTInductor, frozen weights) of a small linear step at bucket 4."""
    torch.manual_seed(1)
    mod = torch.nn.Linear(8, 8).eval()
    for p in mod.parameters():
        p.requires_grad_(False)
    store = PackageStore(tmp_path_factory.mktemp("pk"))
    step = CompiledStep("lin", functools.partial(_lin, mod), "inductor", (4,))
    step.recording = True
    step(torch.zeros(3, 8))  # recorded at bucket 4 (padded), run eager
    step.recording = False
    (key, specs), = step.package_keys(4, CPU)
    store.build("lin", step.fn, specs, CPU)
    assert store.has(key)
    return store, step, mod


def test_a_built_package_serves_its_bucket_and_equals_eager(built) -> None:  # type: ignore[no-untyped-def]
    store, step, mod = built
    compiler = StepCompiler(CPU, buckets=(4,))
    compiler.steps, compiler._all = {"lin": step}, [step]
    compiler.enable([4])
    assert compiler.load_packages(store, CPU) == (4,)
    compiler.use_packages([4])
    assert compiler.package_buckets() == (4,)
    x = torch.randn(3, 8)
    with torch.no_grad():
        y, s = step(x)  # batch 3 in bucket 4: padded, run from the package, rows sliced
        ey, es = _lin(mod, x)
    assert y.shape == (3, 8) and s.shape == (3,)
    torch.testing.assert_close(y, ey, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, es, rtol=1e-5, atol=1e-5)
    # no graph was ever built for bucket 4: had the package not served, this call would have tried to
    # compile outside warm-up and dropped the bucket to eager
    assert 4 not in step.failed and step._compiled is not None


def test_arguments_a_package_was_not_built_for_run_another_way(built) -> None:  # type: ignore[no-untyped-def]
    store, step, mod = built
    step.packages.clear()
    compiler = StepCompiler(CPU, buckets=(4,))
    compiler.steps, compiler._all = {"lin": step}, [step]
    compiler.enable([4])
    compiler.load_packages(store, CPU)
    compiler.use_packages([4])
    x = torch.randn(2, 8, dtype=torch.float64)  # another dtype: no package for these specs
    with torch.no_grad():
        y, _ = step(x)
        torch.testing.assert_close(y, _lin(mod, x)[0])  # served another way (here: eager, as no graph exists)
    assert step.packages[4] and all(sp[0].dtype == "float32" for sp in step.packages[4])


def test_a_broken_package_file_is_removed_and_not_served(tmp_path: Path) -> None:
    store = PackageStore(tmp_path)
    spec = (ArgSpec.of(torch.zeros(1, 2)),)
    store.root.mkdir(parents=True, exist_ok=True)
    store.path("deadbeef").write_bytes(b"not a zip archive")
    assert store.has("deadbeef")
    assert store.load("deadbeef", spec) is None
    assert not store.has("deadbeef")  # the next precompile builds it anew
    assert store.load("missing", spec) is None


class FakePackage:
    """Fake (named so): a package stand-in that runs a Python function, so the warm-up logic is tested without
    building real packages (minutes here)."""

    def __init__(self, fn) -> None:  # type: ignore[no-untyped-def]
        self.fn = fn

    def __call__(self, *args: torch.Tensor):  # type: ignore[no-untyped-def]
        return self.fn(*args)


class FakeStore(PackageStore):
    """Fake (named so): every key is present; each load wraps the step function, perturbed where asked."""

    def __init__(self, steps: dict[str, CompiledStep], perturb: str | None) -> None:
        super().__init__(Path("/nonexistent"))
        self.by_key = {k: (n, s) for n, s in steps.items() for b in s.specs for k, _ in s.package_keys(b, CPU)}
        self.perturb = perturb

    def has(self, key: str) -> bool:
        return key in self.by_key

    def load(self, key, specs):  # type: ignore[no-untyped-def]
        name, step = self.by_key[key]
        if name != self.perturb:
            return FakePackage(step.fn)
        return FakePackage(lambda *a: step.fn(*a) + 0.5)  # a wrong package: its latents are off


def _fake_graphs(perturb: str | None):  # type: ignore[no-untyped-def]
    model = registry.load("tinyworld")
    compiler = StepCompiler(CPU, buckets=(1,))
    use_way(model, compiler, torch.float32, compiled=False)
    for s in compiler.steps.values():
        s._compiled = s.fn  # fake (named so): eager stands in for the bucket's graph (nothing compiles here)
    with compiler.recording():
        r = ChunkRunner(model, batch=1)
        r.chunk()
        r.close()
    compiler.enable([1])
    return model, compiler, FakeStore(compiler.steps, perturb)


def test_warm_up_checks_packages_against_the_graphs_and_refuses_wrong_ones() -> None:
    model, compiler, store = _fake_graphs(perturb="denoise")
    (t,) = measure_packages(model, compiler, store, repeats=1)
    assert t.batch == 1 and t.psnr_db < model.spec.precisions.min_psnr_db and not t.served
    assert compiler.package_buckets() == ()  # the graphs serve


def test_warm_up_takes_packages_that_match_the_graphs_only_if_measured_faster() -> None:
    model, compiler, store = _fake_graphs(perturb=None)
    (t,) = measure_packages(model, compiler, store, repeats=1)
    assert t.psnr_db == math.inf  # same function: identical frames
    assert t.packages_s is not None and t.graphs_s > 0
    assert t.served == (t.packages_s < t.graphs_s * 0.95)  # the rule; which way it goes is the machine's
    assert compiler.package_buckets() == ((1,) if t.served else ())


def test_no_packages_means_nothing_changes(tmp_path: Path) -> None:
    model, compiler, _ = _fake_graphs(perturb=None)
    assert measure_packages(model, compiler, PackageStore(tmp_path)) == ()
    assert compiler.package_buckets() == ()


class RecordingStore(PackageStore):
    """Fake (named so): records what would be built instead of running AOTInductor."""

    def __init__(self, root: Path, present: set[str]) -> None:
        super().__init__(root)
        self.present, self.built = present, []

    def has(self, key: str) -> bool:
        return key in self.present

    def build(self, name, fn, specs, device):  # type: ignore[no-untyped-def]
        self.built.append((name, specs[0].shape[0]))
        return self.path("x")


def test_precompile_builds_every_step_at_every_bucket_once(tmp_path: Path) -> None:
    model = registry.load("tinyworld")
    store = RecordingStore(tmp_path, present=set())
    rows = build_packages(model, store, dtype=torch.float32, buckets=(1, 2))
    steps = {r["step"] for r in rows}
    assert steps == {"denoise", "commit", "decode"} and not any(r["error"] for r in rows)
    assert {b for _, b in store.built} == {1, 2}
    assert all(r["built"] for r in rows) and len(store.built) == len(rows)
    # built already: nothing again
    again = RecordingStore(tmp_path, present={str(r["key"]) for r in rows})
    rows2 = build_packages(model, again, dtype=torch.float32, buckets=(1, 2))
    assert again.built == [] and not any(r["built"] for r in rows2)
    assert [r["key"] for r in rows2] == [r["key"] for r in rows]  # the same keys: recording is deterministic


def test_arg_spec_examples_have_the_spec() -> None:
    t = torch.zeros(2, 3, 4).permute(0, 2, 1)
    s = ArgSpec.of(t)
    e = s.example(CPU)
    assert s.matches(e) and e.dtype == torch.float32 and np.all(e.numpy() == 0)
