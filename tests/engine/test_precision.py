"""Precision by measurement: the choice logic on made-up timings, the quality gate on the real model, and a
device worker serving the dtype it chose (eager here; `test_compiled.py` checks compiled equals eager)."""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest
import torch

from worldcast.engine.tuning.precision import MIN_GAIN, Trial, choose, frame_psnr_db, min_psnr_db, worth_compiling
from worldcast.models.spec import PrecisionSpec, dtype_from_name, dtype_name


def test_psnr_of_frames() -> None:
    a = np.full((4, 4, 3), 100, np.uint8)
    assert frame_psnr_db(a, a) == math.inf
    assert frame_psnr_db(a, a + 1) == pytest.approx(10 * math.log10(255**2))
    assert min_psnr_db([a, a], [a, a + 4]) == pytest.approx(10 * math.log10(255**2 / 16))
    with pytest.raises(ValueError):
        min_psnr_db([a], [a, a])
    with pytest.raises(ValueError):
        frame_psnr_db(a, a[:2])


def test_the_fastest_qualified_way_wins() -> None:
    trials = [Trial("float32", 0.026, 0.020), Trial("bfloat16", 0.025, 0.011, psnr_db=41.0, compiled_psnr_db=40.0)]
    c = choose(trials, min_psnr_db=30.0)
    assert (c.dtype, c.compiled) == ("bfloat16", True)
    assert "bfloat16" in c.describe() and "11.0 ms" in c.describe()


def test_a_dtype_below_the_tolerance_is_never_chosen_however_fast() -> None:
    trials = [Trial("float32", 0.026), Trial("bfloat16", 0.005, 0.004, psnr_db=25.0, compiled_psnr_db=25.0)]
    assert (choose(trials, min_psnr_db=30.0).dtype) == "float32"
    # its compiled frames alone below the tolerance: its eager way may still win
    trials = [Trial("float32", 0.026), Trial("bfloat16", 0.015, 0.004, psnr_db=35.0, compiled_psnr_db=20.0)]
    c = choose(trials, min_psnr_db=30.0)
    assert (c.dtype, c.compiled) == ("bfloat16", False)
    # and a reference whose compiled frames drift is served eager
    c = choose([Trial("float32", 0.026, 0.010, compiled_psnr_db=12.0)], min_psnr_db=30.0)
    assert not c.compiled


def test_a_more_complex_way_must_win_by_a_margin() -> None:
    just = 0.026 * (1 - MIN_GAIN / 2)
    assert choose([Trial("float32", 0.026, just)], min_psnr_db=30.0).compiled is False  # noise, not a gain
    assert choose([Trial("float32", 0.026, 0.020)], min_psnr_db=30.0).compiled is True
    c = choose([Trial("float32", 0.026), Trial("bfloat16", just, psnr_db=50.0)], min_psnr_db=30.0)
    assert c.dtype == "float32"


def test_a_dtype_that_failed_to_run_is_skipped_and_the_reference_must_run() -> None:
    c = choose([Trial("float32", 0.026), Trial("float16", None, error="RuntimeError: no kernel")], min_psnr_db=30.0)
    assert c.dtype == "float32" and "failed" in c.describe()
    with pytest.raises(ValueError):
        choose([Trial("float32", None, error="boom")], min_psnr_db=30.0)
    with pytest.raises(ValueError):
        choose([], min_psnr_db=30.0)


def test_a_dtype_far_slower_eager_gets_no_graphs_and_the_log_says_why() -> None:
    """An AVX2-only CPU runs bfloat16 eager 5-6x slower than float32 (BENCHMARKS.md): no graphs for it."""
    assert worth_compiling(0.30, 0.20) and worth_compiling(0.40, 0.20)
    assert not worth_compiling(0.41, 0.20)
    assert not worth_compiling(1.75, 0.34)
    assert worth_compiling(0.90, 0.20, max_ratio=5.0)
    c = choose([Trial("float32", 0.078, 0.070), Trial("bfloat16", 0.446, psnr_db=54.5,
                                                      compile_skipped="warm eager chunk 5.1x the reference's")],
               min_psnr_db=30.0)
    assert (c.dtype, c.compiled) == ("float32", True)
    assert "bfloat16: eager 446.0 ms (54.5 dB), compiled not built (warm eager chunk 5.1x" in c.describe()


def test_precision_spec_and_dtype_names_are_checked() -> None:
    assert dtype_name(torch.bfloat16) == "bfloat16" and dtype_from_name("float32") is torch.float32
    with pytest.raises(ValueError):
        dtype_from_name("int8")
    with pytest.raises(ValueError):
        PrecisionSpec(dtypes=())
    with pytest.raises(ValueError):
        PrecisionSpec(dtypes=(torch.float32, torch.float32))
    with pytest.raises(ValueError):
        PrecisionSpec(dtypes=(torch.int32,))
    assert PrecisionSpec().reference is torch.float32


@pytest.fixture
def fresh_model():  # type: ignore[no-untyped-def]
    """A TinyWorld of its own (the shared `model` fixture stays float32)."""
    from worldcast.models.tinyworld import TinyWorldModel

    return TinyWorldModel.from_pretrained()


def test_warmup_measures_each_dtype_and_bfloat16_passes_the_quality_gate(fresh_model) -> None:  # type: ignore[no-untyped-def]
    from worldcast.engine.tuning.compiled import StepCompiler
    from worldcast.engine.tuning.warmup import measure_precisions

    m = fresh_model
    choice = measure_precisions(m, StepCompiler(m.device, enabled=False), repeats=1)
    assert [t.dtype for t in choice.trials] == ["float32", "bfloat16"]
    ref, bf16 = choice.trials
    assert ref.psnr_db == math.inf and ref.eager_s is not None and ref.eager_s > 0
    assert m.spec.precisions.min_psnr_db <= bf16.psnr_db < math.inf, "bf16 frames are close to, not equal to, fp32's"
    assert choice.dtype in ("float32", "bfloat16") and not choice.compiled
    assert m.precision == dtype_from_name(choice.dtype)
    # the KV ring and the previous frame follow the precision; the draw noise is float32 in every precision (it
    # feeds the object draws' thresholds, `network.draw_objects`); the world memory keeps the frames as shown
    # (uint8) and the camera is integer in every precision
    dtypes = {s.name: getattr(s, "dtype", None) for s in m.spec.states}
    assert dtypes == {"kv": m.precision, "prev": m.precision, "noise": torch.float32, "memory": None,
                      "camera": torch.int64}, "the state follows the precision"
    assert m.spec.state("memory").tensors()["canvas"][1] == torch.uint8


def test_a_dtype_outside_the_models_tolerance_is_not_served(fresh_model, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import worldcast.models.tinyworld.model as tw
    from worldcast.engine.tuning.compiled import StepCompiler
    from worldcast.engine.tuning.warmup import measure_precisions

    monkeypatch.setattr(tw, "PRECISIONS", PrecisionSpec(dtypes=(torch.float32, torch.bfloat16), min_psnr_db=200.0,
                                                        check_chunks=2))
    m = fresh_model
    m.set_precision(torch.float32)  # the spec now carries the strict tolerance
    choice = measure_precisions(m, StepCompiler(m.device, enabled=False), repeats=1)
    assert choice.dtype == "float32" and "below tolerance" in choice.describe()
    assert m.precision is torch.float32


def test_the_device_worker_serves_the_dtype_it_chose(fresh_model) -> None:  # type: ignore[no-untyped-def]
    from tests.fakes import ScriptedConditioner
    from worldcast.engine.device_worker import DeviceWorker, EngineConfig

    m = fresh_model
    frames, lock = [], threading.Lock()

    def on_frames(fs):  # type: ignore[no-untyped-def]
        with lock:
            frames.extend(fs)

    w = DeviceWorker(m, EngineConfig(state_budget_bytes=2**26, max_batch=2, torch_threads=1, precision="bfloat16",
                                     compile=False), on_frames=on_frames, on_error=lambda s, r: None)
    w.warmup(chunks=1)
    report = w.snapshot.warmup
    assert report is not None and report.precision.dtype == "bfloat16" and not report.precision.measured
    assert w.pool.tensors["kv"]["k"].dtype is torch.bfloat16, "the pool was allocated anew in the served dtype"
    assert set(report.phases_s) == {"threads", "precision", "buckets", "costs", "total"}
    w.start()
    try:
        w.add_session("a", ScriptedConditioner(keys={"d": True}), seed=0)
        deadline = time.monotonic() + 60
        while True:
            with lock:
                if sum(1 for f in frames if f.session_id == "a") >= 4:
                    break
            assert time.monotonic() < deadline, "no frames in bfloat16"
            time.sleep(0.02)
    finally:
        w.stop()
    with lock:
        assert all(f.image.dtype == np.uint8 and f.image.std() > 1 for f in frames)


def test_a_restarted_engine_serves_its_predecessors_dtype_without_measuring(fresh_model) -> None:  # type: ignore[no-untyped-def]
    """`DeviceWorker.resume` (an engine process's restart): the predecessor's dtype (`ServedWay` of its warm-up
    report), the pool in that dtype, no measurement, the predecessor's report published."""
    from worldcast.engine.device_worker import DeviceWorker, EngineConfig
    from worldcast.engine.tuning.warmup import ServedWay

    m = fresh_model
    before = DeviceWorker(m, EngineConfig(state_budget_bytes=2**26, torch_threads=1, compile=False,
                                          precision="bfloat16"),
                          on_frames=lambda fs: None, on_error=lambda s, r: None)
    before.warmup(chunks=1)
    report = before.warmup_report
    assert ServedWay.from_report(report) == ServedWay("bfloat16", ()) and ServedWay.from_report(None) is None
    m.set_precision(torch.float32)  # a fresh process's model starts in its reference dtype
    w = DeviceWorker(m, EngineConfig(state_budget_bytes=2**26, torch_threads=1, compile=False),
                     on_frames=lambda fs: None, on_error=lambda s, r: None)
    assert w.pool.tensors["kv"]["k"].dtype is torch.float32
    w.resume(report)
    assert m.precision is torch.bfloat16 and w.pool.tensors["kv"]["k"].dtype is torch.bfloat16
    assert w.thread_choice is not None and not w.thread_choice.measured
    assert w.snapshot.warmup is report, "the predecessor's choice is what /metrics goes on exporting"


@pytest.mark.parametrize(("bf16_warm_s", "compiles"), [(0.020, True), (0.180, False)])
def test_graphs_are_built_by_warm_eager_chunks_not_first_call_costs(fresh_model, monkeypatch, bf16_warm_s,
                                                                    compiles) -> None:  # type: ignore[no-untyped-def]
    """A dtype's first chunk pays first-call costs that say nothing of its speed (an AVX-512 CPU's bfloat16 check
    ran 3.2x float32's, its warm chunks 0.87x): whether it gets graphs follows its warm chunks. Fake clock (chunk
    costs by dtype; a runner's first chunk 60 ms in float32, 600 ms in bfloat16), fake compiler (`torch.compile` returns the step itself)."""
    import worldcast.engine.tuning.warmup as warmup
    from worldcast.engine.tuning.compiled import StepCompiler

    m = fresh_model
    now = [0.0]
    warm = {torch.float32: 0.030, torch.bfloat16: bf16_warm_s}  # s a chunk once warm
    first = {torch.float32: 0.060, torch.bfloat16: 0.600}  # s of a runner's first chunk
    real_chunk = warmup.ChunkRunner.chunk

    def chunk(self):  # type: ignore[no-untyped-def]
        now[0] += warm[m.precision] if getattr(self, "_ran", False) else first[m.precision]
        self._ran = True
        return real_chunk(self)

    monkeypatch.setattr(warmup.ChunkRunner, "chunk", chunk)
    monkeypatch.setattr(warmup, "work_clock", lambda device: lambda: now[0])
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)  # the fake compiler: "graphs" are the eager steps
    compiler = StepCompiler(m.device, enabled=True)
    assert compiler.mode == "inductor"
    choice = warmup.measure_precisions(m, compiler, repeats=3)
    ref, bf16 = choice.trials
    assert ref.compiled_s is not None, "the reference always gets graphs"
    if compiles:
        assert bf16.compile_skipped is None and bf16.compiled_s is not None
        assert choice.dtype == "bfloat16", choice.describe()  # its warm chunk is a third faster
    else:
        assert bf16.compiled_s is None and bf16.compile_skipped == "warm eager chunk 6.0x the reference's"
        assert choice.dtype == "float32" and "compiled not built (warm eager chunk 6.0x" in choice.describe()
